"""Private on a shared machine: the root and what an upload writes are the owner's alone; with a users file each user
sees, streams, reads the log of, downloads, cancels and deletes only their own jobs (another's answers 404, as one
that does not exist); the report opens from a short-lived link, sandboxed so nothing in it reaches the page's token."""

from __future__ import annotations

import os
import stat

import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from pipeline.serve.options import describe  # noqa: E402
from pipeline.serve.store import Store  # noqa: E402
from tests.pipeline.serve_helpers import make_app, photos, token_of, zip_bytes  # noqa: E402

TOKEN_A, TOKEN_B = "a" * 43, "b" * 43
SMALL = {"batch_size": "8"}


@pytest.fixture(scope="module")
def described():
    return describe()


def users_file(tmp_path, text=f"# name token\nalice {TOKEN_A}\n\nbob {TOKEN_B}\n", mode=0o600):
    path = tmp_path / "users"
    path.write_text(text)
    os.chmod(path, mode)
    return path


@pytest.fixture
def two(tmp_path, described):
    root = tmp_path / "root"
    app = make_app(root, described, users_file=users_file(tmp_path))
    with TestClient(app) as a, TestClient(app) as b:
        a.headers["Authorization"], b.headers["Authorization"] = f"Bearer {TOKEN_A}", f"Bearer {TOKEN_B}"
        a.root = root
        yield a, b


def finished_with_files(root, job_id):
    """Mark a queued job succeeded with a report, a model and a log, as the runner would leave it."""
    run = root / job_id / "run"
    (run / "export").mkdir(parents=True)
    (run / "export" / "encoder.onnx").write_bytes(b"onnx bytes")
    (run / "report.html").write_text("<!doctype html><title>report</title><p>photos</p>")
    (root / job_id / "logs").mkdir()
    (root / job_id / "logs" / "pretrain.log").write_text(
        "".join(f"line {i} {root / job_id}/run\n" for i in range(100)) + "pretrain 50%|#    | 5/10\rpretrain 100%|#| 10/10\n")
    store = Store(root / "jobs.db")
    store.claim("cpu")
    store.update(job_id, stage="pretrain")
    store.finish(job_id, "succeeded")


def test_user_b_gets_404_on_user_a_jobs_and_artifacts(two):
    a, b = two
    job = a.post("/jobs", data={"data": "synthetic:48", **SMALL}).json()
    jid = job["id"]
    finished_with_files(a.root, jid)
    assert [j["id"] for j in a.get("/jobs").json()] == [jid]
    assert b.get("/jobs").json() == []
    for method, path in [("get", f"/jobs/{jid}"), ("get", f"/jobs/{jid}/events"), ("get", f"/jobs/{jid}/log"),
                         ("get", f"/jobs/{jid}/artifacts/encoder.onnx"), ("get", f"/jobs/{jid}/artifacts/report.html"),
                         ("post", f"/jobs/{jid}/report-link"), ("post", f"/jobs/{jid}/cancel"),
                         ("delete", f"/jobs/{jid}")]:
        r = b.request(method, path)
        assert r.status_code == 404 and r.json()["detail"] == f"no job {jid}", (path, r.text)
    assert b.post("/prune", params={"older_than": "0s"}).json() == {"removed": []}
    # A still has all of it
    assert a.get(f"/jobs/{jid}/artifacts/encoder.onnx").content == b"onnx bytes"
    assert a.get(f"/jobs/{jid}").json()["state"] == "succeeded"
    assert Store(a.root / "jobs.db").get(jid)["owner"] == "alice"
    bad = TestClient(a.app).get("/jobs", headers={"Authorization": "Bearer " + "c" * 43})
    assert bad.status_code == 401


def test_each_user_has_their_own_queue_cap(tmp_path, described):
    from pipeline.serve.limits import Limits

    app = make_app(tmp_path / "root", described, users_file=users_file(tmp_path), limits=Limits(max_unfinished=1))
    with TestClient(app) as c:
        post = lambda tok: c.post("/jobs", data={"data": "synthetic:48", **SMALL},  # noqa: E731
                                  headers={"Authorization": f"Bearer {tok}"})
        assert post(TOKEN_A).status_code == 201
        r = post(TOKEN_A)
        assert r.status_code == 429 and "1 jobs queued or running" in r.json()["detail"]
        assert post(TOKEN_B).status_code == 201


@pytest.mark.parametrize("text, mode, words", [
    (f"alice {TOKEN_A}\n", 0o644, "readable by others"),
    ("alice short\n", 0o600, "shorter than 32"),
    (f"alice {TOKEN_A}\nalice {TOKEN_B}\n", 0o600, "given twice"),
    (f"alice {TOKEN_A}\nbob {TOKEN_A}\n", 0o600, "given twice"),
    (f"al ice {TOKEN_A}\n", 0o600, "expected `NAME TOKEN`"),
    ("# nobody\n", 0o600, "names no user"),
])
def test_a_bad_users_file_is_refused(tmp_path, described, text, mode, words):
    with pytest.raises(Exception, match=words):
        make_app(tmp_path / "root", described, users_file=users_file(tmp_path, text, mode))


def test_pipeline_serve_refuses_a_bad_users_file_before_it_makes_its_root(tmp_path):
    from tests.cli_helpers import assert_one_line_error, cli

    root = tmp_path / "root"
    assert_one_line_error(cli("serve", "--root", root, "--users", tmp_path / "none"), "users file", "not found")
    bad = users_file(tmp_path, f"alice {TOKEN_A}\n", 0o644)
    assert_one_line_error(cli("serve", "--root", root, "--users", bad), "readable by others")
    assert not root.exists()


def test_the_root_and_an_upload_are_the_owner_s_alone(tmp_path, described):
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    with TestClient(make_app(root, described)) as c:
        c.headers["Authorization"] = "Bearer " + token_of(root)
        r = c.post("/jobs", files={"file": ("p.zip", zip_bytes(photos({"a": 10, "b": 10})))}, data=SMALL)
        assert r.status_code == 201, r.text
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    for p in (root / r.json()["id"]).rglob("*"):
        assert stat.S_IMODE(p.stat().st_mode) == (0o700 if p.is_dir() else 0o600), p


def test_the_report_opens_sandboxed_from_a_short_lived_link(two, monkeypatch):
    a, _ = two
    jid = a.post("/jobs", data={"data": "synthetic:48", **SMALL}).json()["id"]
    assert a.post(f"/jobs/{jid}/report-link").status_code == 404  # not finished: no report yet
    finished_with_files(a.root, jid)
    direct = a.get(f"/jobs/{jid}/artifacts/report.html")
    assert direct.headers["content-security-policy"].startswith("sandbox;")
    url = a.post(f"/jobs/{jid}/report-link").json()["url"]
    bare = TestClient(a.app)  # a browser tab opened on the link: no token
    r = bare.get(url)
    assert r.status_code == 200 and "<p>photos</p>" in r.text
    csp = r.headers["content-security-policy"]
    # an opaque origin (sandbox without allow-same-origin) and no script at all: the page's sessionStorage and its
    # token are out of reach of anything the report holds
    assert csp.split(";")[0] == "sandbox" and "default-src 'none'" in csp and "script-src" not in csp
    assert r.headers["referrer-policy"] == "no-referrer"
    assert bare.get("/reports/" + "x" * 43).status_code == 404
    import pipeline.serve.app as app_module

    monkeypatch.setattr(app_module, "REPORT_LINK_S", -1)
    expired = a.post(f"/jobs/{jid}/report-link").json()["url"]
    assert bare.get(expired).status_code == 404


def test_the_page_keeps_the_token_in_session_storage_only(two):
    a, _ = two
    page = TestClient(a.app).get("/")
    assert "sessionStorage" in page.text and "localStorage" not in page.text
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]


def test_the_log_shows_the_last_lines_without_server_paths(two):
    a, _ = two
    jid = a.post("/jobs", data={"data": "synthetic:48", **SMALL}).json()["id"]
    finished_with_files(a.root, jid)
    text = a.get(f"/jobs/{jid}/log", params={"lines": 3}).text
    assert text.splitlines() == ["line 98 run", "line 99 run", "pretrain 100%|#| 10/10"]
    assert str(a.root) not in a.get(f"/jobs/{jid}/log", params={"lines": 1000}).text


def test_docs_are_off_and_the_description_is_served(two):
    a, _ = two
    bare = TestClient(a.app)
    assert bare.get("/docs").status_code == 404 and bare.get("/redoc").status_code == 404
    assert bare.get("/openapi.json").json()["info"]["title"] == "ssl-edge-pipeline"
    assert 'href="/openapi.json"' in bare.get("/").text
