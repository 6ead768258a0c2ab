"""The HTTP API and web page. Every /jobs call needs the bearer token from `<root>/token`; /health does not, nor
do the static page and the API description (they hold no job data: the page asks for the token and sends it).

A submission is checked whole before anything is written: the options by core/config.py against
PretrainConfig's own fields (422 naming the option), the body against the size cap while it streams in (413), the
zip entry by entry (uploads.py). Only then does the job get its folder, and only then its row in the store.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import stat
import zipfile
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from fastapi import Depends, FastAPI, HTTPException, Path as PathParam, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import FileResponse, HTMLResponse, Response, StreamingResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel
from starlette.datastructures import UploadFile

from core.config import load_config
from core.errors import PipelineError
from core import rundir
from core.rundir import atomic_path
from export.formats import FORMATS
from train.configs import PretrainConfig
from pipeline.serve import uploads
from pipeline.serve.options import CONFIG_DIR, SERVER_SET, config_names
from pipeline.serve.runner import RUN, Runner
from pipeline.serve.store import TERMINAL, Store

TOKEN_FILE = "token"
DB_FILE = "jobs.db"
PAGE = Path(__file__).with_name("page.html")
JOB_ID = r"^[0-9a-f]{16}$"


def artifacts() -> dict[str, str]:
    """name a client asks for -> file in the run: each format's file (the format table's), and the report. A
    directory is sent as a zip made once, inside the job's folder."""
    return {**{f.file: f"{rundir.EXPORT}/{f.file}" for f in FORMATS.values()}, rundir.REPORT: rundir.REPORT}

SUBMIT_FIELDS = ("file", "data", "recipe", "formats")


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


def load_or_create_token(root: Path) -> str:
    """The bearer token: made at first start into a file only its owner can read; a file others can read is
    refused (the token would be theirs too)."""
    path = root / TOKEN_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        mode = stat.S_IMODE(path.stat().st_mode)
        if mode & 0o077:
            raise PipelineError(f"token file {path} is readable by others (mode {mode:04o}): chmod 600 {path}")
        token = path.read_text().strip()
        if len(token) < 32:
            raise PipelineError(f"token file {path} is damaged: delete it and start again for a new token")
        return token
    token = secrets.token_urlsafe(32)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token


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


def _capped(receive, limit: int):
    """The request body, counted as it streams in: past `limit` bytes reading stops (a body without a length)."""
    seen = 0

    async def wrapped():
        nonlocal seen
        message = await receive()
        if message["type"] == "http.request":
            seen += len(message.get("body", b""))
            if seen > limit:
                raise _BodyTooLarge()
        return message

    return wrapped


@dataclass
class Service:
    """What every route needs: the job folder and its store, the runner, and what submissions may hold."""

    root: Path
    store: Store
    runner: Runner
    token: str
    described: dict  # options.describe()'s answer: fields, formats, auto_device
    options_cls: type  # what a submission's options are loaded as: PretrainConfig
    advertised: list  # the fields a client may set, as GET /options lists them
    allow_data: tuple[str, ...]
    max_upload: int
    caps: uploads.ZipCaps
    run_jobs: bool
    poll_s: float

    def job(self, job_id: str) -> dict:
        job = self.store.get(job_id)
        if job is None:
            raise HTTPException(404, f"no job {job_id}")
        return job


def create_app(root: Path, described: dict, *, allow_data: tuple[str, ...] = ("digits",),
               max_upload: int = 512 << 20, caps: uploads.ZipCaps | None = None, run_jobs: bool = True,
               poll_s: float = 0.5) -> FastAPI:
    """The service over `root` (jobs.db, token, one folder per job). `described` is options.describe()'s answer;
    run_jobs=False accepts and queues jobs without running them (the unit tests)."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    store = Store(root / DB_FILE)
    _remove_unrecorded(root, store)
    svc = Service(root, store, Runner(store, root, poll_s=poll_s), load_or_create_token(root),
                  described, PretrainConfig, [f for f in described["fields"] if f["name"] not in SERVER_SET],
                  allow_data, max_upload, caps or uploads.ZipCaps(), run_jobs, poll_s)

    @asynccontextmanager
    async def lifespan(app):
        if run_jobs:
            svc.runner.start()
        yield
        svc.runner.stop()

    app = FastAPI(title="ssl-edge-pipeline", version="1", lifespan=lifespan,
                  description="Training jobs: upload images, pretrain, evaluate, export and validate an encoder.")
    app.state.store, app.state.runner, app.state.root = store, svc.runner, root
    bearer = HTTPBearer(auto_error=False)

    def auth(cred: Optional[HTTPAuthorizationCredentials] = Depends(bearer)) -> None:
        if cred is None or not secrets.compare_digest(cred.credentials.encode(), svc.token.encode()):
            raise HTTPException(401, "a valid bearer token is required (Authorization: Bearer <the token file's text>)",
                                headers={"WWW-Authenticate": "Bearer"})

    _info_routes(app, svc, Depends(auth))
    _job_routes(app, svc, Depends(auth))
    return app


def _info_routes(app: FastAPI, svc: Service, authed) -> None:
    @app.get("/", include_in_schema=False)
    def page() -> HTMLResponse:
        return HTMLResponse(PAGE.read_text(), headers={"Cache-Control": "no-store"})

    @app.get("/health", response_model=Health)
    def health() -> dict:
        return {"status": "ok"}

    @app.get("/options", dependencies=[authed])
    def options() -> dict:
        """What POST /jobs accepts: pretraining options (type, default, choices, why), recipes, formats, data SPECs."""
        return {"options": svc.advertised, "recipes": config_names(), "formats": svc.described["formats"],
                "data": list(svc.allow_data), "max_upload_bytes": svc.max_upload}


JSON_TYPE = {"int": "integer", "float": "number", "str": "string", "bool": "boolean"}


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
                           **({"enum": f["choices"]} if f["choices"] else {})} for f in svc.advertised}}}}}}}


def _job_routes(app: FastAPI, svc: Service, authed) -> None:
    job_id_param = PathParam(pattern=JOB_ID, description="a job id as POST /jobs returned it")

    @app.post("/jobs", status_code=201, response_model=Job, dependencies=[authed], openapi_extra=submit_schema(svc),
              responses={413: {"description": "upload too large"}, 422: {"description": "a bad option or upload"}})
    async def submit(request: Request) -> dict:
        return await receive_submission(svc, request)

    @app.get("/jobs", response_model=list[Job], dependencies=[authed])
    def list_jobs() -> list[dict]:
        return [public(j, svc.root) for j in svc.store.list()]

    @app.get("/jobs/{job_id}", response_model=Job, dependencies=[authed], responses={404: {}})
    def job_status(job_id: str = job_id_param) -> dict:
        return public(svc.job(job_id), svc.root)

    @app.get("/jobs/{job_id}/events", dependencies=[authed], response_class=StreamingResponse,
             responses={200: {"content": {"text/event-stream": {}},
                              "description": "server-sent events: `job` with the job's JSON whenever it changes, "
                                             "until it has ended"}, 404: {}})
    async def job_events(request: Request, job_id: str = job_id_param) -> StreamingResponse:
        svc.job(job_id)
        return StreamingResponse(job_event_stream(svc, request, job_id), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.post("/jobs/{job_id}/cancel", response_model=Job, dependencies=[authed],
              responses={404: {}, 409: {"description": "the job has already ended"}})
    def cancel(job_id: str = job_id_param) -> dict:
        svc.job(job_id)
        if svc.store.cancel(job_id) is None:
            raise HTTPException(409, f"job {job_id} has already ended")
        return public(svc.job(job_id), svc.root)

    @app.delete("/jobs/{job_id}", status_code=204, dependencies=[authed],
                responses={404: {}, 409: {"description": "the job is running: cancel it first"}})
    def delete(job_id: str = job_id_param) -> Response:
        svc.job(job_id)
        if not svc.store.delete(job_id):
            raise HTTPException(409, f"job {job_id} is running: cancel it first")
        shutil.rmtree(svc.root / job_id, ignore_errors=True)
        return Response(status_code=204)

    @app.get("/jobs/{job_id}/artifacts/{name}", dependencies=[authed], response_class=FileResponse,
             responses={200: {"content": {"application/octet-stream": {}}}, 404: {}})
    def artifact(name: str, job_id: str = job_id_param) -> FileResponse:
        return artifact_response(svc, svc.job(job_id), name)


async def receive_submission(svc: Service, request: Request) -> dict:
    """The body read under the size cap (413 past it), then checked and queued off the event loop."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > svc.max_upload:
        raise HTTPException(413, f"the upload is {int(length)} bytes, more than the limit of {svc.max_upload}")
    try:
        form = await Request(request.scope, _capped(request.receive, svc.max_upload)).form(max_files=1, max_fields=200)
    except _BodyTooLarge:
        raise HTTPException(413, f"the upload is more than the limit of {svc.max_upload} bytes") from None
    try:
        return await run_in_threadpool(accept_submission, svc, form)
    finally:
        await form.close()


def _form_fields(svc: Service, form) -> tuple[dict, UploadFile | None, str | None, str | None, str]:
    """(options, upload, data SPEC, recipe, formats) from the form, each checked; 422 naming the first fault."""
    fields = {}
    for key, value in form.multi_items():
        if key in fields:
            raise HTTPException(422, f"`{key}` is given twice")
        fields[key] = value
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
    overrides = {k.replace("-", "_"): v for k, v in fields.items() if v != ""}
    for key in overrides:
        if key in SERVER_SET:
            raise HTTPException(422, f"`{key}` is set by the server (upload a zip or pick `data`)")
    return overrides, upload, spec, recipe, formats


def accept_submission(svc: Service, form) -> dict:
    """Check the whole submission, then give the job its folder (an upload is extracted there) and its row."""
    overrides, upload, spec, recipe, formats = _form_fields(svc, form)
    try:
        cfg = load_config(svc.options_cls, CONFIG_DIR / f"{recipe}.yaml" if recipe else None, overrides)
    except PipelineError as e:
        raise HTTPException(422, str(e)) from None
    common = dict(device=cfg.device if cfg.device != "auto" else svc.described["auto_device"], recipe=recipe,
                  formats=formats, options={k: getattr(cfg, k) for k in overrides})
    job_id = _new_job_id(svc.root, svc.store)
    if upload is None:
        kind, _, arg = spec.partition(":")
        folder = Path(arg)
        labelled = kind != "folder" or (folder.is_dir() and any(p.is_dir() for p in folder.iterdir()))
        job = svc.store.add(job_id=job_id, data=spec, source=spec, labelled=labelled, skipped=[], **common)
    else:
        job_dir = svc.root / job_id
        try:
            got = uploads.extract(upload.file, job_dir / "data", svc.caps)
        except uploads.UploadError as e:
            shutil.rmtree(job_dir, ignore_errors=True)
            raise HTTPException(422, str(e)) from None
        name = Path(upload.filename or "upload.zip").name
        job = svc.store.add(job_id=job_id, data=f"folder:{got.root}", source=f"{name} ({got.files} files)",
                            labelled=got.labelled, skipped=got.skipped, **common)
    if svc.run_jobs:
        svc.runner.kick(common["device"])
    return public(job, svc.root)


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
    media = "text/html" if name.endswith(".html") else "application/octet-stream"
    return FileResponse(path, media_type=media, filename=None if media == "text/html" else name)


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
          caps: uploads.ZipCaps, say=print) -> None:
    """`pipeline serve`: one server per root (a lock file), the options read from a child, then uvicorn."""
    import fcntl

    import uvicorn

    from pipeline.serve.options import describe

    if not is_loopback(host):
        if not allow_remote:
            raise PipelineError(f"--host {host} is not a loopback address: anyone who can reach it may try the token; "
                                "add --allow-remote to bind it anyway")
        say(f"warning: listening on {host}, reachable from other machines: every call but /health needs the token; "
            "put TLS in front of it (the token travels in clear over plain HTTP)")
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    lock = open(root / "serve.lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        raise PipelineError(f"another `pipeline serve` is using {root}: stop it or give another --root") from None
    try:
        described = describe()
    except RuntimeError as e:
        raise PipelineError(str(e)) from None
    # Starlette spools an uploaded file over 1 MiB to a temporary file while it parses the form: keep those under
    # the root too (same disk as the jobs, removed when the request ends), not in the machine's shared /tmp
    import tempfile

    spool = root / ".uploads"
    shutil.rmtree(spool, ignore_errors=True)  # what a killed server was receiving; only this server uses it
    spool.mkdir(mode=0o700)
    tempfile.tempdir = str(spool)
    app = create_app(root, described, allow_data=allow_data, max_upload=max_upload, caps=caps)
    shown = f"[{host}]" if ":" in host else host
    say(f"jobs in {root}; token in {root / TOKEN_FILE} (mode 0600)")
    say(f"open http://{shown}:{port}/#token={load_or_create_token(root)}  (API description: /docs)")
    # access_log off: request lines are noise here; a bounded graceful shutdown: an open progress stream (a
    # browser tab) must not keep Ctrl-C from stopping the server (the running job resumes at the next start)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False, timeout_graceful_shutdown=3)
