"""One queue per device: a thread takes the next job and runs its stages as child processes, one after another.

pretrain -> linear-eval -> strip -> trace -> export -> validate -> report, each
`python -m pipeline <stage> --run <job>/run`, output in `<job>/logs/<stage>.log`. The stage a job has reached is
committed before the stage starts, so after a crash the job continues at that stage; pretraining continues from
`checkpoints/last.pt` with `--resume`, which ends with the same weights as a run never interrupted.

Children get their own process group (a cancel stops DataLoader workers too) and, on Linux, die with the server
(PR_SET_PDEATHSIG): a SIGKILLed server leaves no training behind. On a restart, a child recorded as running that is
still alive (macOS has no death signal) is killed before its job is resumed, so two processes never write one run.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from core import rundir
from core.config import as_flags
from pipeline.serve.options import CONFIG_DIR, PROJECT, child_env
from pipeline.serve.store import Store

CHAIN = ("pretrain", "linear-eval", "strip", "trace", "export", "validate", "report")
RUN = "run"  # the pipeline run directory inside a job's folder
LOGS = "logs"
_TOTAL = re.compile(r"(\d+) steps/epoch, (\d+) steps")

if sys.platform.startswith("linux"):
    import ctypes

    _libc = ctypes.CDLL(None, use_errno=True)

    def _die_with_parent() -> None:
        _libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: the kernel kills the child when its parent dies
else:
    _die_with_parent = None


def chain(job: dict, job_dir: Path) -> list[tuple[str, list[str]]]:
    """The (stage, arguments) a job runs; a folder without class sub-folders has no labels to evaluate with."""
    run = str(job_dir / RUN)
    recipe = ["--config", str(CONFIG_DIR / f"{job['recipe']}.yaml")] if job["recipe"] else []
    device = ["--device", job["options"]["device"]] if "device" in job["options"] else []
    steps = [("pretrain", [*recipe, *as_flags(job["options"]), "--data", job["data"], "--out", run])]
    if job["labelled"]:
        steps.append(("linear-eval", [*device, "--run", run]))
    steps += [("strip", ["--run", run]), ("trace", ["--run", run]), ("export", ["--to", job["formats"], "--run", run]),
              ("validate", ["--run", run]), ("report", ["--run", run])]
    return steps


class Runner:
    def __init__(self, store: Store, root: Path, poll_s: float = 0.5):
        self.store, self.root, self.poll_s = store, Path(root), poll_s
        self.stopping = threading.Event()
        self._threads: dict[str, threading.Thread] = {}
        self._wake: dict[str, threading.Event] = {}
        self._children: dict[str, subprocess.Popen] = {}
        self._lock = threading.Lock()
        for job in store.list():
            if job["state"] == "running" and job["pid"]:
                kill_orphan(job["pid"], self.root / job["id"] / RUN)

    def start(self) -> None:
        for device in self.store.devices():
            self.kick(device)

    def kick(self, device: str) -> None:
        """Make sure `device` has a runner thread and wake it: a job was queued there."""
        with self._lock:
            if device not in self._threads:
                self._wake[device] = threading.Event()
                t = threading.Thread(target=self._loop, args=(device,), name=f"runner-{device}", daemon=True)
                self._threads[device] = t
                t.start()
            self._wake[device].set()

    def stop(self, timeout: float = 10) -> None:
        """Server shutdown: stop the children; their jobs stay `running` and resume at the next start."""
        self.stopping.set()
        for ev in list(self._wake.values()):
            ev.set()
        for proc in list(self._children.values()):
            _kill_group(proc.pid, signal.SIGTERM)
        for t in list(self._threads.values()):
            t.join(timeout)

    def _loop(self, device: str) -> None:
        wake = self._wake[device]
        while not self.stopping.is_set():
            job = self.store.claim(device)
            if job is None:
                wake.wait(5)
                wake.clear()
                continue
            try:
                self._run(job)
            except Exception as e:  # a bug here must fail the job, not kill the device's queue
                self.store.finish(job["id"], "failed", f"server: {type(e).__name__}: {e}")

    def _run(self, job: dict) -> None:
        job_dir = self.root / job["id"]
        run = job_dir / RUN
        (job_dir / LOGS).mkdir(parents=True, exist_ok=True)
        steps = chain(job, job_dir)
        names = [name for name, _ in steps]
        start = names.index(job["stage"]) if job["stage"] in names else 0
        for name, args in steps[start:]:
            if self.store.cancel_requested(job["id"]):
                self.store.finish(job["id"], "cancelled")
                return
            self.store.update(job["id"], stage=name)
            if name == "pretrain" and (run / rundir.LAST_CHECKPOINT).is_file():
                args = [*args, "--resume"]  # only this job ever wrote here: it was interrupted
            rc = self._child(job["id"], name, args, job_dir / LOGS / f"{name}.log", run)
            if self.stopping.is_set():
                return
            if self.store.cancel_requested(job["id"]):
                self.store.finish(job["id"], "cancelled")
                return
            if rc != 0:
                line = hide_paths(error_line(job_dir / LOGS / f"{name}.log", rc), job_dir, self.root)
                self.store.finish(job["id"], "failed", f"{name}: {line}")
                return
            self._after(job, name, run)
        self.store.finish(job["id"], "succeeded")

    def _child(self, job_id: str, name: str, args: list[str], log: Path, run: Path) -> int:
        cmd = [sys.executable, "-m", "pipeline", name, *args]
        with open(log, "a") as out:
            out.write(f"$ {' '.join(cmd)}\n")
            out.flush()
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    cwd=log.parent.parent, env=child_env(), start_new_session=True,
                                    preexec_fn=_die_with_parent)
        self._children[job_id] = proc
        self.store.update(job_id, pid=proc.pid)
        progress = Progress(run, log) if name == "pretrain" else None
        stop_sent = None
        try:
            while proc.poll() is None:
                time.sleep(self.poll_s)
                if progress:
                    self.store.update(job_id, **progress.read())
                if stop_sent is None and (self.stopping.is_set() or self.store.cancel_requested(job_id)):
                    _kill_group(proc.pid, signal.SIGTERM)
                    stop_sent = time.monotonic()
                elif stop_sent is not None and time.monotonic() - stop_sent > 10:
                    _kill_group(proc.pid, signal.SIGKILL)
        finally:
            self._children.pop(job_id, None)
        if progress:
            self.store.update(job_id, **progress.read())
        return proc.returncode

    def _after(self, job: dict, name: str, run: Path) -> None:
        """Summaries a client reads without opening the run's files."""
        if name == "pretrain" and (run / rundir.SKIPPED).is_file():
            listed = [line.strip() for line in (run / rundir.SKIPPED).read_text().splitlines() if line.strip()]
            self.store.update(job["id"], skipped=(job["skipped"] or []) + listed[:1000])
        elif name == "linear-eval":
            ev = json.loads((run / rundir.EVAL / rundir.LINEAR_EVAL).read_text())
            base = ev.get("baseline") or {}
            self.store.update(job["id"], eval={
                "linear_top1": ev.get("top1"), "knn_top1": ev.get("knn_top1"),
                "random_init_linear_top1": base.get("top1"), "random_init_knn_top1": base.get("knn_top1"),
                "num_train": ev.get("num_train"), "num_val": ev.get("num_val"), "num_classes": ev.get("num_classes")})
        elif name == "validate":
            par = json.loads((run / rundir.VALIDATE / rundir.PARITY).read_text())
            self.store.update(job["id"], parity={"passed": par.get("passed"), "artifacts": [
                {k: row.get(k) for k in ("artifact", "runtime", "precision", "worst_cosine", "worst_rel_l2",
                                         "max_abs", "topk_agreement", "passed")} for row in par.get("rows", [])]})


class Progress:
    """Reads pretraining's progress as it is written: metrics.jsonl lines and the step total from the log."""

    def __init__(self, run: Path, log: Path):
        self.metrics, self.log, self.offset, self.total = run / rundir.METRICS, log, 0, None

    def read(self) -> dict:
        out = {}
        if self.total is None and self.log.is_file():
            m = _TOTAL.search(self.log.read_text(errors="replace"))
            if m:
                self.total = out["total_steps"] = int(m.group(2))
        if self.metrics.is_file():
            with open(self.metrics) as f:
                f.seek(self.offset)
                chunk = f.read()
            whole = chunk[: chunk.rfind("\n") + 1]  # a line still being written is read next time
            self.offset += len(whole.encode())
            for line in whole.splitlines():
                rec = json.loads(line)
                if "loss" in rec:
                    out.update(step=rec["step"], loss=rec["loss"], img_s=rec["img_s"])
        return out


def error_line(log: Path, rc: int) -> str:
    """The child's one-line `error: ...` if it printed one, else its last line."""
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()] if log.is_file() else []
    for ln in reversed(lines):
        if ln.startswith("error:"):
            return ln[len("error:"):].strip()
    return (lines[-1] if lines else "no output") + f" (exit status {rc})"


def hide_paths(text: str, job_dir: Path | None = None, root: Path | None = None) -> str:
    """A line for a client, without the server's own paths: names inside the job's folder become relative to it
    (`data/photos/a.png`), and the jobs' root, the code's folder and the interpreter's disappear."""
    text = text.replace(sys.executable, "python")
    for path, instead in ((job_dir, "."), (root, "."), (PROJECT, "."), (Path(sys.prefix), "<python>"),
                          (Path(sys.base_prefix), "<python>")):
        if path is not None:
            text = text.replace(f"{path}{os.sep}", "" if instead == "." else f"{instead}{os.sep}")
            text = text.replace(str(path), instead)
    return text


def _kill_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def kill_orphan(pid: int, run: Path, wait_s: float = 30) -> None:
    """A child of a killed server that still runs on `run`: stop it (and its workers) before anything resumes."""
    if not _is_child_of_run(pid, run):
        return
    _kill_group(pid, signal.SIGKILL)
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and _is_child_of_run(pid, run):
        time.sleep(0.1)


def _is_child_of_run(pid: int, run: Path) -> bool:
    try:
        proc = Path(f"/proc/{pid}")
        if proc.is_dir():
            if (proc / "stat").read_text().rsplit(")", 1)[-1].split()[0] == "Z":
                return False  # a zombie has finished; only its parent's wait is missing
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        else:
            cmd = subprocess.run(["ps", "-o", "command=", "-p", str(pid)], capture_output=True, text=True).stdout
    except OSError:
        return False
    return "pipeline" in cmd and str(run) in cmd
