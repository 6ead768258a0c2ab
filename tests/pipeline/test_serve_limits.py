"""Bounded: a disk quota over uploads and runs (507 saying what is free), a cap on each user's unfinished jobs (429),
pruning of old jobs, and, on a real uvicorn on loopback with the server's own settings, a deadline on request heads
(a slow-header client cannot hold the server), an idle deadline on bodies (408) and a cap on open connections."""

from __future__ import annotations

import socket
import time

import httpx
import pytest

pytest.importorskip("fastapi")
from fastapi.testclient import TestClient  # noqa: E402

from pipeline.serve.options import describe  # noqa: E402
from pipeline.serve.limits import Limits, parse_age  # noqa: E402
from pipeline.serve.store import Store  # noqa: E402
from tests.pipeline.serve_helpers import (closed_within, files_under, make_app, photos, token_of,  # noqa: E402
                                          uvicorn_thread, zip_bytes)

SMALL = {"batch_size": "8"}


@pytest.fixture(scope="module")
def described():
    return describe()


def client_for(root, described, **kw):
    c = TestClient(make_app(root, described, **kw))
    c.headers["Authorization"] = "Bearer " + token_of(root)
    return c


def test_past_the_quota_an_upload_is_507_saying_what_is_free(tmp_path, described):
    root = tmp_path / "root"
    body = zip_bytes(photos({"a": 10, "b": 10}))
    with client_for(root, described, limits=Limits(quota=200 << 10)) as c:
        (root / "filler").write_bytes(b"\0" * (190 << 10))  # runs and uploads already there
        before = files_under(tmp_path)
        r = c.post("/jobs", files={"file": ("p.zip", body)}, data=SMALL)
        assert r.status_code == 507, r.text
        assert "MiB is free under the server's 0 MiB quota" in r.json()["detail"]
        assert files_under(tmp_path) == before and c.get("/jobs").json() == []
        (root / "filler").unlink()
        assert c.post("/jobs", files={"file": ("p.zip", body)}, data=SMALL).status_code == 201


def test_a_zip_that_unpacks_past_the_quota_is_507_before_a_byte_is_written(tmp_path, described):
    root = tmp_path / "root"
    entries = photos({"a": 10, "b": 10})
    entries["photos/a/zeros.bin"] = b"\0" * (300 << 10)  # compresses to almost nothing: the body passes
    with client_for(root, described, limits=Limits(quota=250 << 10)) as c:
        before = files_under(tmp_path)
        r = c.post("/jobs", files={"file": ("p.zip", zip_bytes(entries))}, data=SMALL)
        assert r.status_code == 507 and "it needs 0.3 MiB" in r.json()["detail"], r.text
        assert files_under(tmp_path) == before


def test_a_user_may_have_only_so_many_unfinished_jobs(tmp_path, described):
    with client_for(tmp_path / "root", described, limits=Limits(max_unfinished=2)) as c:
        ids = [c.post("/jobs", data={"data": "synthetic:48", **SMALL}).json()["id"] for _ in range(2)]
        r = c.post("/jobs", data={"data": "synthetic:48", **SMALL})
        assert r.status_code == 429 and "2 jobs queued or running, the most allowed" in r.json()["detail"]
        c.post(f"/jobs/{ids[0]}/cancel")  # an ended job frees its place
        assert c.post("/jobs", data={"data": "synthetic:48", **SMALL}).status_code == 201


def test_old_jobs_are_pruned_by_the_api_and_at_start(tmp_path, described):
    root = tmp_path / "root"
    with client_for(root, described) as c:
        old, recent, waiting = (c.post("/jobs", data={"data": "synthetic:48", **SMALL}).json()["id"] for _ in range(3))
        for jid in (old, recent):
            c.post(f"/jobs/{jid}/cancel")
        (root / old / "run").mkdir(parents=True)
        store = Store(root / "jobs.db")
        store.update(old, finished=time.time() - 3 * 86400)
        assert c.post("/prune", params={"older_than": "2d"}).json() == {"removed": [old]}
        assert not (root / old).exists() and c.get(f"/jobs/{old}").status_code == 404
        assert c.post("/prune", params={"older_than": "two days"}).status_code == 422
        store.update(recent, finished=time.time() - 7200)
    # `pipeline serve --prune-older-than 1h` prunes at start (and hourly): the queued job is never pruned
    with client_for(root, described, prune_after_s=parse_age("1h")) as c:
        time.sleep(0.5)
        assert [j["id"] for j in c.get("/jobs").json()] == [waiting]
    assert parse_age("90m") == 5400 and parse_age("45") == 45
    with pytest.raises(ValueError):
        parse_age("-3d")


def test_a_slow_header_client_is_cut_off_and_cannot_hold_the_server(tmp_path, described):
    limits = Limits(header_timeout_s=1.0, max_connections=4)
    with uvicorn_thread(make_app(tmp_path / "root", described), limits) as port:
        slow = []
        for _ in range(4):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")  # and never the blank line that ends the head
            slow.append(s)
        time.sleep(0.2)
        extra = socket.create_connection(("127.0.0.1", port))  # past the cap: closed at once, nothing read
        assert closed_within(extra, 0.8)
        t0 = time.monotonic()
        assert all(closed_within(s, 5) for s in slow)
        assert time.monotonic() - t0 < 5  # each cut off at its 1 s deadline (a busy machine adds its delay)
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).json() == {"status": "ok"}
        # a client trickling a byte at a time is cut off at the same deadline, however busy it looks
        drip = socket.create_connection(("127.0.0.1", port))
        t0 = time.monotonic()
        closed = False
        for b in b"GET /health HTTP/1.1\r\nHost: xxxxxxxxxxxxxxxxxxxxxxxx\r\n":
            try:
                drip.sendall(bytes([b]))
            except OSError:
                closed = True
                break
            time.sleep(0.1)
        assert closed or closed_within(drip, 5)
        assert time.monotonic() - t0 < 8  # the trickle alone would take 5.4 s, then the connection would be kept
        # a request whose head arrives in time is not cut off by the deadline while its (slow) answer streams
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=5).status_code == 200
        for s in slow + [extra, drip]:
            s.close()


def test_a_stalled_upload_body_is_408(tmp_path, described):
    root = tmp_path / "root"
    limits = Limits(body_idle_s=0.5)
    with uvicorn_thread(make_app(root, described, limits=limits), limits) as port:
        s = socket.create_connection(("127.0.0.1", port))
        head = (f"POST /jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token_of(root)}\r\n"
                "Content-Type: multipart/form-data; boundary=b\r\nContent-Length: 100000\r\n\r\n")
        s.sendall(head.encode() + b"--b\r\nContent-Disposition: form-data; name=\"data\"\r\n\r\nsyn")
        s.settimeout(15)
        t0 = time.monotonic()
        answer = b""
        while b"stalled" not in answer:  # the head and the body may come in two packets
            chunk = s.recv(4096)
            if not chunk:
                break
            answer += chunk
        answer = answer.decode()
        assert answer.startswith("HTTP/1.1 408"), answer
        assert "the upload stalled: no data for 0.5 s" in answer and time.monotonic() - t0 < 10
        s.close()
