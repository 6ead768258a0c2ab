"""Load on `pipeline serve`, measured: N jobs of a real tiny dataset submitted at once through the HTTP API, every
one run to the end; each must succeed and each artifact it lists download byte-equal to the server's file.

The data: 48 of scikit-learn's bundled digit scans (real handwriting, 4 classes x 12, as PNGs in class folders),
zipped once and uploaded by every job. The jobs: 1 epoch at 16 px, batch 8, a small projector, ONNX export (the
service's load, not the model, is what is measured). One queue per device: on a CPU host the jobs run one after
another, each its six stages as child processes.

    nice python benchmarks/serve_load.py --jobs 50        # prints the wall time; exit 1 unless all succeed

Not a test: minutes of CPU. docs/serve-load.md gives the time it took.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import zipfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

PROJECT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT))  # run from anywhere: the repository's packages

from core import rundir  # noqa: E402
from pipeline.serve.runner import RUN  # noqa: E402

OPTIONS = dict(epochs=1, image_size=16, batch_size=8, proj_hidden_dim=32, proj_dim=16, num_workers=0,
               warmup_epochs=0.5, log_every=1, device="cpu", formats="onnx")
TERMINAL = ("succeeded", "failed", "cancelled")


def digits_zip(per_class: int = 12, classes: int = 4) -> bytes:
    import numpy as np
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for c in range(classes):
            for i, k in enumerate(np.flatnonzero(digits.target == c)[:per_class]):
                img = Image.fromarray((digits.images[k] * 255 / 16).astype(np.uint8)).convert("RGB").resize((16, 16))
                out = io.BytesIO()
                img.save(out, "PNG")
                zf.writestr(f"digits/{c}/{i}.png", out.getvalue())
    return buf.getvalue()


def server_file(run: Path, name: str) -> Path:
    """The file a downloaded artifact was sent from: the report at the top of the run, every other in its export/."""
    return run / (rundir.REPORT if name == rundir.REPORT else f"{rundir.EXPORT}/{name}")


def start_server(root: Path, jobs: int) -> tuple[subprocess.Popen, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(PROJECT), os.environ.get("PYTHONPATH")])),
               OMP_NUM_THREADS="1", TQDM_DISABLE="1")
    log = open(root.parent / "server.log", "ab")
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "serve", "--root", str(root), "--port", str(port),
                             "--max-queued", str(jobs)], stdout=log, stderr=subprocess.STDOUT, env=env, cwd=PROJECT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited: {(root.parent / 'server.log').read_text()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("the server did not start within 300 s")
        time.sleep(0.5)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=50)
    ap.add_argument("--keep", action="store_true", help="keep the jobs' folder (printed) instead of removing it")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="serve-load-"))
    root = work / "jobs"
    body = digits_zip()
    t_start = time.monotonic()
    proc, url = start_server(root, args.jobs)
    t_up = time.monotonic()
    token = (root / "token").read_text().strip()
    client = httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=120)
    try:
        def submit(i: int) -> str:
            r = client.post("/jobs", files={"file": ("digits.zip", body, "application/zip")},
                            data={**{k: str(v) for k, v in OPTIONS.items()}, "seed": str(i)})
            if r.status_code != 201:
                raise SystemExit(f"job {i} refused: {r.status_code} {r.text}")
            return r.json()["id"]

        with ThreadPoolExecutor(16) as pool:
            ids = list(pool.map(submit, range(args.jobs)))
        t_submitted = time.monotonic()
        print(f"server up in {t_up - t_start:.0f} s; {len(ids)} jobs submitted in {t_submitted - t_up:.1f} s", flush=True)
        done: dict[str, dict] = {}
        while len(done) < len(ids):
            for job in client.get("/jobs").json():
                if job["id"] in ids and job["state"] in TERMINAL and job["id"] not in done:
                    done[job["id"]] = job
                    print(f"  {len(done):3d}/{len(ids)} {job['id']} {job['state']} at "
                          f"{time.monotonic() - t_submitted:.0f} s{': ' + job['error'] if job['error'] else ''}",
                          flush=True)
            time.sleep(2)
        t_ran = time.monotonic()
        compared = 0
        for job_id in ids:
            job = done[job_id]
            for name in job["artifacts"]:
                got = client.get(f"/jobs/{job_id}/artifacts/{name}")
                assert got.status_code == 200, (job_id, name, got.status_code)
                served = server_file(root / job_id / RUN, name)
                if served.is_file():  # an .mlpackage is a folder, sent as a zip made on the way out
                    same = hashlib.sha256(got.content).digest() == hashlib.sha256(served.read_bytes()).digest()
                    assert same, f"{job_id}/{name}: the download differs from the server's file"
                    compared += 1
        states = [done[j]["state"] for j in ids]
        print(f"{states.count('succeeded')}/{len(ids)} succeeded; {compared} artifacts downloaded byte-equal; "
              f"jobs ran {t_ran - t_submitted:.0f} s ({(t_ran - t_submitted) / len(ids):.1f} s a job), "
              f"total {t_ran - t_start:.0f} s wall")
        if states.count("succeeded") != len(ids):
            sys.exit(1)
    finally:
        client.close()
        proc.terminate()
        proc.wait(60)
        if args.keep:
            print(f"jobs kept in {root}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
