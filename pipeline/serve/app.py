"""The HTTP API and web page. Every job call needs a bearer token (users.py: one token, or one per user, each user
seeing only their own jobs); /health, the page and the API description do not (they hold no job data).

A submission is refused at the door, before its job exists, when it could not succeed: each option by core/config.py
against PretrainConfig's declared choices and bounds (422 naming the option), what spans options, the machine and the
data by checks.py (422), the body against the size cap and an idle deadline while it streams in (413, 408), the zip
entry by entry (uploads.py, 422), the disk quota (507, saying what is free) and the user's queue (429). Only then does
the job get its folder and its row. No answer names a path on the server.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import time
import zipfile
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from fastapi import Depends, FastAPI, HTTPException, Path as PathParam, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, HTMLResponse, PlainTextResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from starlette.datastructures import UploadFile

from core.config import load_config
from core.errors import PipelineError
from core import rundir
from core.rundir import atomic_path
from export.formats import FORMATS
from train.configs import PretrainConfig
from pipeline.serve import checks, uploads
from pipeline.serve.limits import Limits, no_room_message, parse_age, room
from pipeline.serve.options import CONFIG_DIR, SERVER_SET, config_names
from pipeline.serve.runner import CHAIN, LOGS, RUN, Runner, hide_paths
from pipeline.serve.store import TERMINAL, Store
from pipeline.serve.users import SINGLE_USER, TOKEN_FILE, load_or_create_token, read_users, who

DB_FILE = "jobs.db"
PAGE = Path(__file__).with_name("page.html")
JOB_ID = r"^[0-9a-f]{16}$"
AGE = r"^[0-9]{1,9}(\.[0-9]{1,6})?[smhd]?$"  # what limits.parse_age reads
SUBMIT_FIELDS = ("file", "data", "recipe", "formats")
# The report is a page of the job's own content (names from the upload among it): served sandboxed, an origin of its
# own that no script of it could leave (it has none: figures are data: URIs, styles inline), so it can never reach
# the token the job page holds
REPORT_CSP = "sandbox; default-src 'none'; img-src data:; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'"
PAGE_CSP = ("default-src 'self'; script-src 'self' 'unsafe-inline'; style-src 'unsafe-inline'; img-src 'self' data: "
            "blob:; connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'")
REPORT_LINK_S = 300  # a report link works this long: opened at once by the page, useless once it leaks later
PRUNE_EVERY_S = 3600


class Job(BaseModel):
    id: str
    state: str
    device: str
    source: str
    recipe: Optional[str]
    formats: str
    options: dict[str, Any]
    created: float
    started: Optional[float]
    finished: Optional[float]
    stage: Optional[str]
    step: Optional[int]
    total_steps: Optional[int]
    loss: Optional[float]
    img_s: Optional[float]
    eval: Optional[dict[str, Any]]
    parity: Optional[dict[str, Any]]
    skipped: list[str]
    error: Optional[str]
    resumes: int
    artifacts: list[str]


class Health(BaseModel):
    status: str


class Pruned(BaseModel):
    removed: list[str]


class Link(BaseModel):
    url: str


def artifacts() -> dict[str, str]:
    """name a client asks for -> file in the run: each format's file (the format table's), and the report. A
    directory is sent as a zip made once, inside the job's folder."""
    return {**{f.file: f"{rundir.EXPORT}/{f.file}" for f in FORMATS.values()}, rundir.REPORT: rundir.REPORT}


def artifact_path(run: Path, name: str) -> Path | None:
    rel = artifacts().get(name)
    if rel is None:
        return None
    path = run / rel
    if name == rundir.REPORT and not path.is_file():
        found = sorted(run.glob(f"*/{rundir.REPORT}"))  # the report stage may keep its page in a folder of its own
        path = found[0] if found else path
    return path if path.exists() else None


def public(job: dict, root: Path) -> dict:
    run = root / job["id"] / RUN
    out = {k: job.get(k) for k in Job.model_fields if k != "artifacts"}
    out["skipped"] = job["skipped"] or []
    out["artifacts"] = [name for name in artifacts() if artifact_path(run, name) is not None] if job["state"] in TERMINAL else []
    return out


class _BodyTooLarge(Exception):
    pass


class _BodyTooSlow(Exception):
    pass


def _capped(receive, limit: int, idle_s: float):
    """The request body, counted as it streams in: past `limit` bytes reading stops (a body without a length), and
    so it does when the next chunk takes longer than `idle_s` (a client trickling its upload holds a worker)."""
    seen = 0

    async def wrapped():
        nonlocal seen
        try:
            message = await asyncio.wait_for(receive(), idle_s)
        except asyncio.TimeoutError:
            raise _BodyTooSlow() from None
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise _BodyTooLarge()
        return message

    return wrapped


@dataclass
class Service:
    """What every route needs: the job folder and its store, the runner, who may call, and what submissions may
    hold."""

    root: Path
    store: Store
    runner: Runner
    users: dict[str, str]  # token -> user name
    described: dict  # options.describe()'s answer: fields, formats, devices, auto_device, coreml_predicts, own_options
    options_cls: type  # what a submission's options are loaded as: PretrainConfig
    advertised: list  # the fields a client may set, as GET /options lists them
    allow_data: tuple[str, ...]
    max_upload: int
    caps: uploads.ZipCaps
    run_jobs: bool
    poll_s: float
    limits: Limits
    prune_after_s: float | None = None
    spec_images: dict = field(default_factory=dict)  # allowed SPEC -> checks.Images, counted once
    links: dict = field(default_factory=dict)  # report link secret -> (job id, user, expiry)

    def job(self, job_id: str, user: str) -> dict:
        """The job, if it is this user's: another's answers as one that does not exist."""
        job = self.store.get(job_id)
        if job is None or job["owner"] != user:
            raise HTTPException(404, f"no job {job_id}")
        return job

    def hide(self, text: str, job_id: str | None = None) -> str:
        return hide_paths(text, self.root / job_id if job_id else None, self.root)

    def prune(self, older_than_s: float, user: str | None = None) -> list[str]:
        """Remove the jobs (rows and folders) that ended more than `older_than_s` ago; every user's when None."""
        removed = []
        for job_id in self.store.ended_before(time.time() - older_than_s, user):
            if self.store.delete(job_id):
                shutil.rmtree(self.root / job_id, ignore_errors=True)
                removed.append(job_id)
        return removed


def create_app(root: Path, described: dict, *, allow_data: tuple[str, ...] = ("digits",),
               max_upload: int = 512 << 20, caps: uploads.ZipCaps | None = None, run_jobs: bool = True,
               poll_s: float = 0.5, limits: Limits | None = None, users_file: Path | None = None,
               prune_after_s: float | None = None) -> FastAPI:
    """The service over `root` (jobs.db, token, one folder per job), readable by its owner alone. `described` is
    options.describe()'s answer; run_jobs=False accepts and queues jobs without running them (the unit tests)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(root, 0o700)  # a root made before, or by hand, becomes private too
    store = Store(root / DB_FILE)
    _remove_unrecorded(root, store)
    users = read_users(users_file) if users_file else {load_or_create_token(root): SINGLE_USER}
    svc = Service(root, store, Runner(store, root, poll_s=poll_s), users, described,
                  PretrainConfig, [f for f in described["fields"] if f["name"] not in SERVER_SET],
                  allow_data, max_upload, caps or uploads.ZipCaps(), run_jobs, poll_s, limits or Limits(),
                  prune_after_s)

    @asynccontextmanager
    async def lifespan(app):
        pruning = asyncio.create_task(_prune_forever(svc)) if prune_after_s is not None else None
        if run_jobs:
            svc.runner.start()
        yield
        if pruning:
            pruning.cancel()
        svc.runner.stop()

    # /docs and /redoc are off: their pages load Swagger UI from a CDN, blank offline, and no installed package
    # ships its assets; the page links /openapi.json, which every OpenAPI tool reads
    app = FastAPI(title="ssl-edge-pipeline", version="1", lifespan=lifespan, docs_url=None, redoc_url=None,
                  description="Training jobs: upload images, pretrain, evaluate, export and validate an encoder.")
    app.state.store, app.state.runner, app.state.root, app.state.service = store, svc.runner, root, svc
    bearer = HTTPBearer(auto_error=False)

    def auth(cred: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> str:
        user = who(svc.users, cred.credentials) if cred is not None else None
        if user is None:
            raise HTTPException(401, "a valid bearer token is required (Authorization: Bearer <your token>)",
                                headers={"WWW-Authenticate": "Bearer"})
        return user

    _info_routes(app, svc, Depends(auth))
    _job_routes(app, svc, Depends(auth))
    return app


async def _prune_forever(svc: Service) -> None:
    while True:
        await run_in_threadpool(svc.prune, svc.prune_after_s)
        await asyncio.sleep(PRUNE_EVERY_S)


def _info_routes(app: FastAPI, svc: Service, authed) -> None:
    @app.get("/", include_in_schema=False)
    def page() -> HTMLResponse:
        return HTMLResponse(PAGE.read_text(), headers={"Cache-Control": "no-store", "Content-Security-Policy": PAGE_CSP,
                                                       "Referrer-Policy": "no-referrer"})

    @app.get("/health", response_model=Health)
    def health() -> dict:
        return {"status": "ok"}

    @app.get("/options", dependencies=[authed])
    def options() -> dict:
        """What POST /jobs accepts: pretraining options (type, default, choices, range, why), recipes, formats,
        devices, data SPECs, and the limits a submission meets."""
        lim = svc.limits
        return {"options": svc.advertised, "recipes": config_names(), "formats": svc.described["formats"],
                "devices": ["auto", *svc.described["devices"]], "data": list(svc.allow_data),
                "max_upload_bytes": svc.max_upload, "max_unfinished_jobs": lim.max_unfinished,
                "quota_bytes": lim.quota}


JSON_TYPE = {"int": "integer", "float": "number", "str": "string", "bool": "boolean"}


def _range_schema(bounds) -> dict:
    if not bounds:
        return {}
    lo, hi, lo_open, hi_open = bounds  # None: that side is open-ended
    return {**({"exclusiveMinimum" if lo_open else "minimum": lo} if lo is not None else {}),
            **({"exclusiveMaximum" if hi_open else "maximum": hi} if hi is not None else {})}


def submit_schema(svc: Service) -> dict:
    """POST /jobs's multipart body for the OpenAPI description (FastAPI cannot infer a form read by hand)."""
    return {"requestBody": {"required": True, "content": {"multipart/form-data": {"schema": {
        "type": "object", "additionalProperties": False,
        "oneOf": [{"required": ["file"]}, {"required": ["data"]}],
        "description": "a zip of images (`file`) or an allowed data SPEC (`data`), and any pretraining options by "
                       "name (GET /options gives each one's default and reason), e.g. method=byol, epochs=5",
        "properties": {
            "file": {"type": "string", "format": "binary", "description": "zip of images: class sub-folders or flat"},
            # not listed here: the description is public, the allowed SPECs (maybe server paths) are not
            "data": {"type": "string", "description": "a data SPEC the server allows (GET /options lists them)"},
            "recipe": {"type": "string", "enum": config_names(), "description": "start from configs/<recipe>.yaml"},
            "formats": {"type": "string", "enum": svc.described["formats"], "description": "what export writes"},
            **{f["name"]: {"type": JSON_TYPE[f["type"]], "description": f["why"],
                           **({"enum": f["choices"]} if f["choices"] else {}), **_range_schema(f.get("range"))}
               for f in svc.advertised}}}}}}}


def _job_routes(app: FastAPI, svc: Service, authed) -> None:
    job_id_param = PathParam(pattern=JOB_ID, description="a job id as POST /jobs returned it")

    @app.post("/jobs", status_code=201, response_model=Job, openapi_extra=submit_schema(svc),
              responses={408: {"description": "the upload stalled"}, 413: {"description": "upload too large"},
                         422: {"description": "a bad option or upload, or data too few for the job"},
                         429: {"description": "too many of your jobs are queued or running"},
                         507: {"description": "no room under the disk quota"}})
    async def submit(request: Request, user: str = authed) -> dict:
        return await receive_submission(svc, request, user)

    @app.get("/jobs", response_model=list[Job])
    def list_jobs(user: str = authed) -> list[dict]:
        return [public(j, svc.root) for j in svc.store.list(user)]

    @app.get("/jobs/{job_id}", response_model=Job, responses={404: {}})
    def job_status(job_id: str = job_id_param, user: str = authed) -> dict:
        return public(svc.job(job_id, user), svc.root)

    @app.get("/jobs/{job_id}/events", response_class=StreamingResponse,
             responses={200: {"content": {"text/event-stream": {}},
                              "description": "server-sent events: `job` with the job's JSON whenever it changes, "
                                             "until it has ended"}, 404: {}})
    async def job_events(request: Request, job_id: str = job_id_param, user: str = authed) -> StreamingResponse:
        svc.job(job_id, user)
        return StreamingResponse(job_event_stream(svc, request, job_id), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.get("/jobs/{job_id}/log", response_class=PlainTextResponse,
             responses={200: {"content": {"text/plain": {}}, "description": "the last lines of the job's latest "
                                                                            "stage log"}, 404: {}})
    def job_log(job_id: str = job_id_param, lines: int = Query(40, ge=1, le=1000), user: str = authed) -> Response:
        job = svc.job(job_id, user)
        return PlainTextResponse(svc.hide(log_tail(svc.root / job_id / LOGS, job["stage"], lines), job_id),
                                 headers={"Cache-Control": "no-store"})

    @app.post("/jobs/{job_id}/cancel", response_model=Job,
              responses={404: {}, 409: {"description": "the job has already ended"}})
    def cancel(job_id: str = job_id_param, user: str = authed) -> dict:
        svc.job(job_id, user)
        if svc.store.cancel(job_id) is None:
            raise HTTPException(409, f"job {job_id} has already ended")
        return public(svc.job(job_id, user), svc.root)

    @app.delete("/jobs/{job_id}", status_code=204,
                responses={404: {}, 409: {"description": "the job is running: cancel it first"}})
    def delete(job_id: str = job_id_param, user: str = authed) -> Response:
        svc.job(job_id, user)
        if not svc.store.delete(job_id):
            raise HTTPException(409, f"job {job_id} is running: cancel it first")
        shutil.rmtree(svc.root / job_id, ignore_errors=True)
        return Response(status_code=204)

    @app.post("/prune", response_model=Pruned, responses={422: {"description": "a bad age"}})
    def prune(older_than: str = Query(..., pattern=AGE, description="remove your jobs that ended longer ago than "
                                                                   "this: 30d, 12h, 90m, 45s"),
              user: str = authed) -> dict:
        try:
            age = parse_age(older_than)
        except ValueError:
            raise HTTPException(422, f"`older_than` must be a number with s, m, h or d after it; got {older_than!r}") from None
        return {"removed": svc.prune(age, user)}

    @app.get("/jobs/{job_id}/artifacts/{name}", response_class=FileResponse,
             responses={200: {"content": {"application/octet-stream": {}}}, 404: {}})
    def artifact(name: str, job_id: str = job_id_param, user: str = authed) -> FileResponse:
        return artifact_response(svc, svc.job(job_id, user), name)

    @app.post("/jobs/{job_id}/report-link", response_model=Link, responses={404: {}})
    def report_link(job_id: str = job_id_param, user: str = authed) -> dict:
        """A link that opens the job's report in a browser without the token, for a few minutes: the report is then
        a page of its own, sandboxed (REPORT_CSP), never a document of the job page's origin."""
        artifact_response(svc, svc.job(job_id, user), "report.html")  # 404 unless there is one
        now = time.time()
        for secret, (_, _, until) in list(svc.links.items()):
            if until < now:
                del svc.links[secret]
        secret = secrets.token_urlsafe(32)
        svc.links[secret] = (job_id, user, now + REPORT_LINK_S)
        return {"url": f"/reports/{secret}"}

    @app.get("/reports/{secret}", response_class=FileResponse, responses={200: {"content": {"text/html": {}}},
                                                                          404: {}})
    def report_by_link(secret: str = PathParam(pattern=r"^[A-Za-z0-9_-]{20,64}$")) -> FileResponse:
        job_id, user, until = svc.links.get(secret, (None, None, 0.0))
        if until < time.time():
            raise HTTPException(404, "this report link is unknown or has expired: open the report again from the page")
        return artifact_response(svc, svc.job(job_id, user), "report.html")


async def receive_submission(svc: Service, request: Request, user: str) -> dict:
    """Refusals that need no body first (size, queue, quota), then the body under the size cap and the idle deadline,
    then the rest checked and queued off the event loop."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > svc.max_upload:
        raise HTTPException(413, f"the upload is {int(length)} bytes, more than the limit of {svc.max_upload}")
    _check_queue(svc, user)
    free = await run_in_threadpool(room, svc.root, svc.limits)
    if length.isdigit() and int(length) > free:
        raise HTTPException(507, no_room_message(int(length), free, svc.limits))
    try:
        form = await Request(request.scope, _capped(request.receive, svc.max_upload, svc.limits.body_idle_s)).form(
            max_files=1, max_fields=200)
    except _BodyTooLarge:
        raise HTTPException(413, f"the upload is more than the limit of {svc.max_upload} bytes") from None
    except _BodyTooSlow:
        raise HTTPException(408, f"the upload stalled: no data for {svc.limits.body_idle_s:g} s") from None
    try:
        return await run_in_threadpool(accept_submission, svc, form, user)
    finally:
        await form.close()


def _check_queue(svc: Service, user: str) -> None:
    if svc.store.unfinished(user) >= svc.limits.max_unfinished:
        raise HTTPException(429, f"you have {svc.limits.max_unfinished} jobs queued or running, the most allowed: "
                                 "wait for one to end or cancel one")


def _form_fields(svc: Service, form) -> tuple[dict, UploadFile | None, str | None, str | None, str]:
    """(options, upload, data SPEC, recipe, formats) from the form, each checked; 422 naming the first fault."""
    fields = {}
    for key, value in form.multi_items():
        name = key.replace("-", "_")  # max-steps and max_steps are one option: given both, neither silently wins
        if name in fields:
            raise HTTPException(422, f"`{name}` is given twice" + (f" (as `{key}` too)" if key != name else ""))
        fields[name] = value
    upload = fields.pop("file", None)
    if upload is not None and not isinstance(upload, UploadFile):
        raise HTTPException(422, "`file` must be a file upload (a zip of images)")
    if any(isinstance(v, UploadFile) for v in fields.values()):
        raise HTTPException(422, "only `file` may be a file upload")
    spec = fields.pop("data", "") or None
    recipe = fields.pop("recipe", "") or None
    formats = fields.pop("formats", "") or "all"
    allowed = svc.allow_data
    if (upload is None) == (spec is None):
        raise HTTPException(422, f"give either `file` (a zip of images) or `data` (one of: {', '.join(allowed)})")
    if spec is not None and spec not in allowed:
        raise HTTPException(422, f"`data` {spec!r} is not allowed here (allowed: {', '.join(allowed)}); "
                                 "upload a zip instead")
    if recipe is not None and recipe not in config_names():
        raise HTTPException(422, f"`recipe` {recipe!r} is unknown (known: {', '.join(config_names())})")
    if formats not in svc.described["formats"]:
        raise HTTPException(422, f"`formats` must be one of {', '.join(svc.described['formats'])}; got {formats!r}")
    overrides = {k: v for k, v in fields.items() if v != ""}
    for key in overrides:
        if key in SERVER_SET:
            raise HTTPException(422, f"`{key}` is set by the server (upload a zip or pick `data`)")
    return overrides, upload, spec, recipe, formats


def accept_submission(svc: Service, form, user: str) -> dict:
    """Check the whole submission, then give the job its folder (an upload is extracted there and its images
    counted) and its row."""
    overrides, upload, spec, recipe, formats = _form_fields(svc, form)
    try:
        cfg = load_config(svc.options_cls, CONFIG_DIR / f"{recipe}.yaml" if recipe else None, overrides)
        checks.check_options(cfg, svc.described)
        device = checks.check_machine(cfg, svc.described)
    except (PipelineError, checks.Refused) as e:
        raise HTTPException(422, svc.hide(str(e))) from None
    common = dict(device=device, recipe=recipe, formats=formats, options={k: getattr(cfg, k) for k in overrides},
                  owner=user, max_unfinished=svc.limits.max_unfinished)
    job_id = _new_job_id(svc.root, svc.store)
    job_dir = svc.root / job_id
    try:
        if upload is None:
            images = _spec_images(svc, spec)
            if images is not None:
                checks.check_images(images, cfg.batch_size, cfg.val_fraction)
            labelled = images.labelled if images is not None else True
            job = svc.store.add(job_id=job_id, data=spec, source=spec, labelled=labelled, skipped=[], **common)
        else:
            job_dir.mkdir(mode=0o700)
            got = uploads.extract(upload.file, job_dir / "data", svc.caps, room=room(svc.root, svc.limits))
            checks.check_images(checks.folder_images(got.root), cfg.batch_size, cfg.val_fraction)
            name = Path(upload.filename or "upload.zip").name
            job = svc.store.add(job_id=job_id, data=f"folder:{got.root}", source=f"{name} ({got.files} files)",
                                labelled=got.labelled, skipped=got.skipped, **common)
    except uploads.NoRoom as e:
        shutil.rmtree(job_dir, ignore_errors=True)
        raise HTTPException(507, no_room_message(e.needed, room(svc.root, svc.limits), svc.limits)) from None
    except (uploads.UploadError, checks.Refused) as e:
        shutil.rmtree(job_dir, ignore_errors=True)
        raise HTTPException(422, svc.hide(str(e), job_id)) from None
    except BaseException:
        shutil.rmtree(job_dir, ignore_errors=True)
        raise
    if job is None:  # another submission of this user's took the last place in the meantime
        shutil.rmtree(job_dir, ignore_errors=True)
        raise HTTPException(429, f"you have {svc.limits.max_unfinished} jobs queued or running, the most allowed: "
                                 "wait for one to end or cancel one")
    if svc.run_jobs:
        svc.runner.kick(device)
    return public(job, svc.root)


def _spec_images(svc: Service, spec: str) -> checks.Images | None:
    if spec not in svc.spec_images:
        svc.spec_images[spec] = checks.spec_images(spec)
    return svc.spec_images[spec]


async def job_event_stream(svc: Service, request: Request, job_id: str):
    """Server-sent events: the job's JSON whenever it changes, a comment every 15 quiet seconds, until it ends."""
    last, quiet = None, 0.0
    while not await request.is_disconnected():
        job = await run_in_threadpool(svc.store.get, job_id)
        if job is None:
            yield "event: deleted\ndata: {}\n\n"
            return
        body = json.dumps(public(job, svc.root))
        if body != last:
            yield f"event: job\ndata: {body}\n\n"
            last, quiet = body, 0.0
        elif quiet >= 15:
            yield ": still here\n\n"  # keeps proxies and idle timeouts from closing a quiet stream
            quiet = 0.0
        if job["state"] in TERMINAL:
            return
        await asyncio.sleep(svc.poll_s)
        quiet += svc.poll_s


def log_tail(logs: Path, stage: str | None, lines: int, read: int = 64 << 10) -> str:
    """The last `lines` lines of the log of `stage` (the one running, or the last that ran), or of the latest log."""
    path = logs / f"{stage}.log" if stage else None
    if path is None or not path.is_file():
        found = [logs / f"{name}.log" for name in CHAIN if (logs / f"{name}.log").is_file()]
        if not found:
            return ""
        path = found[-1]
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - read))
        text = f.read().decode(errors="replace")
    # tqdm's bar redraws one line with carriage returns: its latest state is what a reader wants
    shown = [line.rsplit("\r", 1)[-1] for line in text.rstrip("\n").split("\n")]
    return "\n".join(shown[-lines:]) + "\n"


def artifact_response(svc: Service, job: dict, name: str) -> FileResponse:
    """A finished job's file (a folder such as the .mlpackage as a zip made once); 404 for anything else."""
    if name not in artifacts():
        raise HTTPException(404, f"unknown artifact {name!r} (one of: {', '.join(artifacts())})")
    run = svc.root / job["id"] / RUN
    path = artifact_path(run, name) if job["state"] in TERMINAL else None
    if path is None:
        raise HTTPException(404, f"job {job['id']} has no {name} (state {job['state']})")
    if path.is_dir():
        path = _zip_once(path, svc.root / job["id"] / "downloads" / f"{name}.zip")
        return FileResponse(path, media_type="application/zip", filename=f"{name}.zip")
    if name.endswith(".html"):
        return FileResponse(path, media_type="text/html", headers={
            "Content-Security-Policy": REPORT_CSP, "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer", "Cache-Control": "no-store"})
    return FileResponse(path, media_type="application/octet-stream", filename=name)


def _zip_once(folder: Path, out: Path) -> Path:
    """A directory artifact (.mlpackage) as one zip, made at the first download inside the job's folder; the job
    has ended, so it never changes after."""
    if not out.is_file():
        with atomic_path(out) as tmp:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
                for p in sorted(folder.rglob("*")):
                    if p.is_file():
                        zf.write(p, Path(folder.name) / p.relative_to(folder))
    return out


def _new_job_id(root: Path, store: Store) -> str:
    from pipeline.serve.store import new_id

    while True:
        job_id = new_id()
        if not (root / job_id).exists():
            return job_id


def _remove_unrecorded(root: Path, store: Store) -> None:
    """Folders of uploads a killed server was extracting when it died: no row was written, so no job has them."""
    known = store.ids()
    for p in root.iterdir():
        if p.is_dir() and len(p.name) == 16 and all(c in "0123456789abcdef" for c in p.name) and p.name not in known:
            shutil.rmtree(p, ignore_errors=True)


def is_loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(host: str, port: int, root: Path, *, allow_remote: bool, allow_data: tuple[str, ...], max_upload: int,
          caps: uploads.ZipCaps, limits: Limits | None = None, users_file: Path | None = None,
          prune_after_s: float | None = None, say=print) -> None:
    """`pipeline serve`: one server per root (a lock file), the options read from a child, then uvicorn."""
    import fcntl

    import uvicorn

    from pipeline.serve.limits import listening_socket, uvicorn_config
    from pipeline.serve.options import describe

    # Everything the server and its jobs write (the job table, uploads, runs, models) is its owner's alone on a
    # shared machine; the children inherit the mask
    os.umask(0o077)
    if not is_loopback(host):
        if not allow_remote:
            raise PipelineError(f"--host {host} is not a loopback address: anyone who can reach it may try the token; "
                                "add --allow-remote to bind it anyway")
        say(f"warning: listening on {host}, reachable from other machines: every call but /health needs the token; "
            "put TLS in front of it (the token travels in clear over plain HTTP)")
    if users_file:
        read_users(users_file)  # a bad file is one line before anything is made or the machine's facts are read
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    lock = open(root / "serve.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise PipelineError(f"another `pipeline serve` is using {root}: stop it or give another --root") from None
    sock = listening_socket(host, port)  # before anything is announced: a port in use is one line
    try:
        described = describe()
    except RuntimeError as e:
        raise PipelineError(str(e)) from None
    # Starlette spools an uploaded file over 1 MiB to a temporary file while it parses the form: keep those under
    # the root too (same disk as the jobs, inside the quota, removed when the request ends), not in the shared /tmp
    import tempfile

    spool = root / ".uploads"
    shutil.rmtree(spool, ignore_errors=True)  # what a killed server was receiving; only this server uses it
    spool.mkdir(mode=0o700)
    tempfile.tempdir = str(spool)
    limits = limits or Limits()
    app = create_app(root, described, allow_data=allow_data, max_upload=max_upload, caps=caps, limits=limits,
                     users_file=users_file, prune_after_s=prune_after_s)
    shown = f"[{host}]" if ":" in host else host
    if users_file:
        say(f"jobs in {root}; {len(app.state.service.users)} users from {users_file}")
        say(f"open http://{shown}:{port}/#token=<your token>  (API description: /openapi.json)")
    else:
        say(f"jobs in {root}; token in {root / TOKEN_FILE} (mode 0600)")
        say(f"open http://{shown}:{port}/#token={load_or_create_token(root)}  (API description: /openapi.json)")
    uvicorn.Server(uvicorn_config(app, host, port, limits)).run(sockets=[sock])
