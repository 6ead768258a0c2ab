"""`pipeline serve` as a real uvicorn process on 127.0.0.1, started by the tests: a tiny CPU job end to end through
a SIGKILL of its server mid-training (same final weights as a run never interrupted, each step once in its metrics,
artifacts `pipeline validate` accepts, every file the owner's alone), a load test, and the web page driven in
headless Chromium through a kill and restart of its server."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from train import runspec
from train.backbones import BACKBONES
from pipeline.serve.store import Store

httpx = pytest.importorskip("httpx")
pytest.importorskip("fastapi")

PROJECT = Path(__file__).resolve().parents[2]
# the project first, then whatever the caller's environment adds (packages installed to a --target folder)
CHILD_PATH = os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")]))
TINY = dict(image_size=16, batch_size=8, epochs=2, proj_hidden_dim=32, proj_dim=16, pred_hidden_dim=32, device="cpu",
            num_workers=0, warmup_epochs=0.5, log_every=1, seed=0)
START_S = 180  # the server reads the options from a child that imports torch: slow on a busy 2-core machine
JOB_S = 540  # a whole tiny chain (six child processes, each importing torch) on a busy 2-core machine


class Server:
    def __init__(self, root: Path, *extra: str, port: int | None = None):
        self.root = root
        self.port = port  # a given port is taken again at once: uvicorn binds with SO_REUSEADDR
        if port is None:
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                self.port = s.getsockname()[1]
        env = dict(os.environ, PYTHONPATH=CHILD_PATH, OMP_NUM_THREADS="1", TQDM_DISABLE="1")
        self.log = open(root.parent / f"server-{root.name}.log", "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "pipeline", "serve", "--root", str(root), "--port",
                                      str(self.port), "--allow-data", "synthetic:48", *extra],
                                     stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=PROJECT)
        self.url = f"http://127.0.0.1:{self.port}"
        deadline = time.monotonic() + START_S
        while True:
            assert self.proc.poll() is None, self.output()
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not start: " + self.output()
            time.sleep(0.3)
        self.token = (root / "token").read_text().strip()
        self.client = httpx.Client(base_url=self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=60)

    def output(self) -> str:
        self.log.flush()
        return (self.root.parent / f"server-{self.root.name}.log").read_text(errors="replace")[-3000:]

    def wait(self, job_id: str, until=lambda job: job["state"] in ("succeeded", "failed", "cancelled"),
             timeout: float = JOB_S) -> dict:
        deadline = time.monotonic() + timeout
        while True:
            job = self.client.get(f"/jobs/{job_id}").json()
            if until(job):
                return job
            assert time.monotonic() < deadline, f"job {job_id} stuck: {job}\n{self.output()}"
            time.sleep(0.2)

    def stop(self, sig=signal.SIGTERM) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            self.proc.wait(60)
        self.log.close()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    server = Server(tmp_path_factory.mktemp("serve") / "jobs")
    yield server
    server.stop()


def test_load_50_submissions_500_polls_every_job_recorded_once(live):
    def submit(i):
        r = live.client.post("/jobs", data={"data": "synthetic:48", "seed": str(i), "epochs": "1", "batch_size": "8"})
        assert r.status_code == 201, r.text
        return r.json()["id"]

    with ThreadPoolExecutor(16) as pool:
        ids = list(pool.map(submit, range(50)))
        polls = list(pool.map(lambda i: live.client.get(f"/jobs/{ids[i % 50]}").status_code, range(500)))
    assert len(set(ids)) == 50 and polls == [200] * 500
    listed = [j for j in live.client.get("/jobs").json() if j["id"] in ids]
    assert sorted(j["id"] for j in listed) == sorted(ids)  # each once, none lost
    assert sorted(j["options"]["seed"] for j in listed) == list(range(50))
    # They would train for minutes: cancel them, newest first, so the runner, busy with the oldest until its own
    # cancel stops its child, never starts another
    for job_id in reversed(ids):
        assert live.client.post(f"/jobs/{job_id}/cancel").status_code in (200, 409)
    for job_id in ids:
        assert live.wait(job_id, timeout=120)["state"] == "cancelled"


def test_a_job_that_could_not_succeed_is_refused_at_once_by_the_real_server(live):
    # image size 4 used to be accepted and fail in pretraining's child seconds later
    t0 = time.monotonic()
    r = live.client.post("/jobs", data={"data": "synthetic:48", "image_size": "4", "batch_size": "8"})
    assert r.status_code == 422 and "image size 4 is impossible for resnet18" in r.json()["detail"]
    assert time.monotonic() - t0 < 1.0


def test_a_job_end_to_end_through_a_sigkill_to_the_same_weights_and_validated_downloads(tmp_path):
    """One tiny CPU job on synthetic data through the whole chain, its server SIGKILLed as soon as pretraining has
    written its first checkpoint and started again: the job resumes, succeeds, ends with the weights of a run never
    interrupted, and its downloaded artifacts pass `pipeline validate`. (One job for both: each costs a chain.)"""
    torch = pytest.importorskip("torch")
    from stages import pretrain

    options = dict(TINY, epochs=6, checkpoint_every_s=0)  # 30 steps, last.pt after every 5-step epoch
    root = tmp_path / "jobs"
    server = Server(root)
    r = server.client.post("/jobs", data={"data": "synthetic:48", **{k: str(v) for k, v in options.items()}})
    assert r.status_code == 201, r.text
    job_id = r.json()["id"]
    behind = server.client.post("/jobs", data={"data": "synthetic:48", "epochs": "1", "batch_size": "8"}).json()["id"]
    last = root / job_id / "run" / "checkpoints" / "last.pt"
    deadline = time.monotonic() + JOB_S
    while not last.is_file():  # watched here, not through the API: the kill must land while steps remain
        assert time.monotonic() < deadline and server.proc.poll() is None, server.output()
        time.sleep(0.02)
    server.proc.kill()  # SIGKILL: no shutdown code runs
    server.proc.wait()
    server.log.close()
    time.sleep(1)  # the child dies with the server (PR_SET_PDEATHSIG on Linux)
    at_kill = torch.load(last, weights_only=False)["step"]
    assert at_kill < 30, "pretraining ended before the kill: nothing was resumed"
    assert Store(root / "jobs.db").get(job_id)["state"] == "running"

    server = Server(root)
    try:
        # the job queued behind it is still queued (the resumed one has the device); it is not needed here
        assert server.client.get(f"/jobs/{behind}").json()["state"] == "queued"
        assert server.client.post(f"/jobs/{behind}/cancel").json()["state"] == "cancelled"
        events = []
        with server.client.stream("GET", f"/jobs/{job_id}/events", timeout=JOB_S) as stream:
            for line in stream.iter_lines():
                if line.startswith("data: "):
                    events.append(json.loads(line[6:]))
        job = events[-1]
        assert job["state"] == "succeeded", (job, server.output())
        assert job["resumes"] == 1 and job["step"] == job["total_steps"] == 30 and job["loss"] > 0 and job["img_s"] > 0
        assert any(e["stage"] == "pretrain" and e["state"] == "running" for e in events) or at_kill == 30
        assert job["eval"]["num_classes"] == 4 and job["parity"]["passed"]
        assert {a["artifact"] for a in job["parity"]["artifacts"]} == {"encoder.mlpackage", "encoder.mlmodel",
                                                                       "encoder.onnx"}
        assert set(job["artifacts"]) >= {"encoder.mlmodel", "encoder.mlpackage", "encoder.onnx"}
        logs = root / job_id / "logs"
        assert {p.name for p in logs.iterdir()} >= {"pretrain.log", "linear-eval.log", "strip.log", "trace.log",
                                                   "export.log", "validate.log"}
        log = (logs / "pretrain.log").read_text()
        assert "--resume" in log and f"resuming {root / job_id / 'run'} at step {at_kill}" in log
        metrics = [json.loads(line) for line in (root / job_id / "run" / "metrics.jsonl").read_text().splitlines()]
        assert [m["step"] for m in metrics if "loss" in m] == list(range(1, 31))  # each step once across the kill
        tail = server.client.get(f"/jobs/{job_id}/log", params={"lines": 5}).text
        assert tail.strip() and str(root) not in tail
        # private on a shared machine: the server's umask, inherited by every stage, leaves nothing for others
        for p in [root, *root.rglob("*")]:
            if not p.is_symlink():
                assert stat.S_IMODE(p.stat().st_mode) & 0o077 == 0, (p, oct(p.stat().st_mode))

        # The downloads, put in place of a copy of the run's artifacts: `pipeline validate` must accept them
        copy = tmp_path / "run"
        shutil.copytree(root / job_id / "run", copy)
        shutil.rmtree(copy / "export" / "encoder.mlpackage")
        for name in ("encoder.mlmodel", "encoder.onnx"):
            got = server.client.get(f"/jobs/{job_id}/artifacts/{name}")
            assert got.status_code == 200
            (copy / "export" / name).write_bytes(got.content)
        pkg = server.client.get(f"/jobs/{job_id}/artifacts/encoder.mlpackage")
        assert pkg.headers["content-type"] == "application/zip"
        zipfile.ZipFile(io.BytesIO(pkg.content)).extractall(copy / "export")
        assert server.client.get(f"/jobs/{job_id}/artifacts/report.html").status_code in (200, 404)
    finally:
        server.stop()
    done = subprocess.run([sys.executable, "-m", "pipeline", "validate", "--run", str(copy)], capture_output=True,
                          text=True, cwd=PROJECT, env=dict(os.environ, PYTHONPATH=CHILD_PATH))
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads((copy / "validate" / "parity.json").read_text())["passed"]

    ref = tmp_path / "ref"
    cfg = runspec.config_for_run(None, dict(options, data="synthetic:48"), ref, resume=False)
    pretrain.run(cfg, ref, say=lambda *a: None)
    got = torch.load(last, weights_only=False)["model"]
    want = torch.load(ref / "checkpoints" / "last.pt", weights_only=False)["model"]
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want), "resumed weights differ from an uninterrupted run"


# --- the web page in headless Chromium (Debian's chromium + chromium-driver)

def _zip_of_photos(path: Path) -> None:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    with zipfile.ZipFile(path, "w") as zf:
        for c, colour in enumerate(((200, 40, 40), (40, 200, 40), (40, 40, 200), (200, 200, 40))):
            for i in range(12):
                img = np.clip(rng.normal(colour, 40, (24, 24, 3)), 0, 255).astype(np.uint8)
                buf = io.BytesIO()
                Image.fromarray(img).save(buf, "PNG")
                zf.writestr(f"photos/class{c}/{i}.png", buf.getvalue())
        zf.writestr("photos/readme.txt", "not an image: the data stage skips and lists it")


def test_the_page_uploads_shows_progress_survives_a_restart_and_downloads(tmp_path):
    """The page watches a job through a SIGKILL of its server and a new server on the same port: its event stream
    reconnects and the panel ends on the job's true state, "succeeded". With 33 jobs in the table the panel is in
    view without scrolling; the bar starts from zero for each job watched; the log view shows the job's last lines."""
    pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select

    from tests import browser

    if browser.find() is None:
        pytest.skip("Debian's chromium and chromium-driver are not installed (make browser)")
    root = tmp_path / "jobs"
    server = Server(root)
    port = server.port
    downloads = tmp_path / "downloads"
    downloads.mkdir()
    try:
        # 33 earlier jobs, ended at once (cancelled newest first, so the runner never starts one)
        old = [server.client.post("/jobs", data={"data": "synthetic:48", "epochs": "1", "batch_size": "8"}).json()["id"]
               for _ in range(33)]
        for job_id in reversed(old):
            server.client.post(f"/jobs/{job_id}/cancel")
        for job_id in old:
            server.wait(job_id, timeout=120)
        with browser.chromium(height=900) as driver:
            # headless Chrome honours the download folder reliably only when told through DevTools
            driver.execute_cdp_cmd("Browser.setDownloadBehavior", {"behavior": "allow", "downloadPath": str(downloads)})
            photos = tmp_path / "photos.zip"
            _zip_of_photos(photos)
            driver.get(f"{server.url}/#token={server.token}")
            wait_for(lambda: driver.find_element(By.ID, "token-state").text == "ok")
            assert driver.execute_script("return sessionStorage.getItem('token')") == server.token
            assert driver.execute_script("return localStorage.length") == 0
            driver.find_element(By.ID, "file").send_keys(str(photos))
            Select(driver.find_element(By.ID, "method")).select_by_value("simclr")
            select = driver.find_element(By.ID, "backbone")
            backbone = Select(select)
            assert [o.get_attribute("value") for o in backbone.options] == list(BACKBONES)  # the registry's, in order
            assert backbone.first_selected_option.text == "resnet18"  # the default
            assert "mobilenet_v3_large" in select.get_attribute("title")  # which to ship in an app
            backbone.select_by_value("mobilenet_v3_small")
            # ONNX alone: the cheapest export; what the page does with a download does not depend on the format
            Select(driver.find_element(By.ID, "formats")).select_by_value("onnx")
            for name, value in (("epochs", "2"), ("image_size", "16"), ("batch_size", "8")):
                driver.find_element(By.ID, name).send_keys(value)
            driver.find_element(By.ID, "start").click()
            wait_for(lambda: "queued" in driver.find_element(By.ID, "submit-state").text)
            job_id = driver.find_element(By.ID, "submit-state").text.split()[1]  # "job <id> queued"
            in_view = "const r = document.getElementById('detail').getBoundingClientRect(); " \
                      "return r.top >= 0 && r.top < window.innerHeight - 100"
            wait_for(lambda: len(driver.find_elements(By.CSS_SELECTOR, "#jobs tr")) == 34)
            assert driver.execute_script(in_view), "the job panel is off-screen below the table"

            # killed while the job runs, and started again on the same port: the page must follow
            wait_for(lambda: driver.find_element(By.ID, "d-state").text == "running", JOB_S, 0.1)
            server.proc.kill()
            server.proc.wait()
            server.log.close()
            wait_for(lambda: "reconnecting" in driver.find_element(By.ID, "d-conn").text, 60)
            server = Server(root, port=port)
            seen, bar = set(), set()

            def finished():
                # the state first: the page sets state and bar in one render, so a bar read after a final state
                # is that state's bar (read before it, the last sample could miss the succeeded bar)
                state = driver.find_element(By.ID, "d-state").text
                seen.add(driver.find_element(By.ID, "d-line").text.split(" · ")[0])
                progress = driver.find_element(By.ID, "d-progress")
                bar.add((progress.get_attribute("value"), progress.get_attribute("max")))
                return state in ("succeeded", "failed", "cancelled")

            wait_for(finished, JOB_S, 0.2)
            assert driver.find_element(By.ID, "d-state").text == "succeeded", (
                driver.find_element(By.ID, "d-error").text, server.output())
            assert driver.find_element(By.ID, "d-conn").text == ""
            assert server.client.get(f"/jobs/{job_id}").json()["resumes"] == 1
            assert len({s.split(":")[0] for s in seen} & {"pretrain", "linear-eval", "strip", "trace", "export",
                                                         "validate"}) >= 2, seen
            assert ("1", "1") in bar, bar
            assert "1 files skipped" in driver.find_element(By.ID, "d-line").text  # readme.txt
            wait_for(lambda: driver.find_element(By.ID, "d-log").text.strip() != "", 20)
            log = driver.find_element(By.ID, "d-log").text
            assert str(root) not in log, log
            target = downloads / "encoder.onnx"
            for _ in range(3):  # a click that lands while the page re-renders on a busy machine is clicked again
                driver.find_element(By.ID, "get-encoder-onnx").click()
                try:
                    wait_for(lambda: target.is_file() and target.stat().st_size > 0, 40)
                    break
                except AssertionError:
                    pass
            assert target.is_file(), (f"no download: page error {driver.find_element(By.ID, 'd-error').text!r}, "
                                      f"console {driver.get_log('browser')}\n{server.output()}")
            served = root / job_id / "run" / "export" / "encoder.onnx"
            assert "simclr, mobilenet_v3_small" in driver.find_element(By.CSS_SELECTOR, f"#jobs tr[data-id='{job_id}']").text
            assert yaml.safe_load((root / job_id / "run" / "config.yaml").read_text())["backbone"] == "mobilenet_v3_small"
            assert hashlib.sha256(target.read_bytes()).digest() == hashlib.sha256(served.read_bytes()).digest()

            # another job watched: its bar starts from zero, not from the last one's end
            def watch_old() -> bool:  # the jobs table re-renders as it polls: a row found may be gone by the click
                driver.find_element(By.CSS_SELECTOR, f"#jobs tr[data-id='{old[0]}']").click()
                return driver.find_element(By.ID, "d-id").text == old[0]

            wait_for(watch_old, 30, 0.5)
            wait_for(lambda: driver.find_element(By.ID, "d-state").text == "cancelled")
            assert driver.find_element(By.ID, "d-progress").get_attribute("value") == "0"
    finally:
        server.stop()


def wait_for(cond, timeout: float = 60, every: float = 0.25):
    deadline = time.monotonic() + timeout
    while True:
        try:
            if cond():
                return
        except Exception:  # an element not rendered yet
            if time.monotonic() > deadline:
                raise
        assert time.monotonic() < deadline, "timed out waiting in the page"
        time.sleep(every)
