"""Ctrl-C keeps the work: SIGINT or SIGTERM during pretraining finishes the step under way, writes last.pt at it,
and exits 130 saying where --resume goes on; the resumed run equals one never interrupted, weight for weight. A
--resume of a finished run says so and changes nothing."""

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from core import rundir
from pipeline.cli import main
from stages import pretrain
from tests.tiny_run import TINY, pretrain_tiny

ROOT = Path(__file__).parents[2]
LONG = dict(TINY, epochs=4, checkpoint_every_s=1e7)  # 20 steps of 5 per epoch; last.pt only at the end or a stop


def _weights(run: Path) -> dict:
    return torch.load(run / rundir.LAST_CHECKPOINT, weights_only=False)


def _same_weights(a: Path, b: Path) -> None:
    wa, wb = _weights(a), _weights(b)
    assert wa["step"] == wb["step"]
    assert wa["model"].keys() == wb["model"].keys()
    for k, v in wa["model"].items():
        assert torch.equal(v, wb["model"][k]), k


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("stop") / "full"
    pretrain_tiny(out, **LONG)
    return out


@pytest.mark.parametrize("sig,count,workers", [(signal.SIGINT, 5, 1), (signal.SIGTERM, 1, 1)])
def test_a_signal_to_a_real_pretrain_writes_the_step_reached_and_resume_equals_uninterrupted(
        tmp_path, uninterrupted, sig, count, workers):
    """A real `pipeline pretrain` process, signalled as a terminal's Ctrl-C (or the job service's SIGTERM) signals
    it: its whole process group, DataLoader workers included. Several SIGINTs in a row, as an impatient user
    sends them: those after the first land during the stop and its checkpoint write, and those sent from the
    written checkpoint until the process exits land during its exit; none may change anything."""
    run = tmp_path / "run"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in {**LONG, "num_workers": workers}.items()]
    env = {**os.environ, "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"}  # one thread, as the reference (conftest):
    # another thread count sums convolutions in another order, and 20 steps carry that far past any tolerance
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "pretrain", *flags, "--out", str(run)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    metrics, deadline = run / rundir.METRICS, time.monotonic() + 300
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):  # a step or two in
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    for _ in range(count):
        os.killpg(proc.pid, sig)
        time.sleep(0.05)
    _signal_until_exit(proc, run, deadline, sig)  # still pressing while it exits
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, out + err
    step = _weights(run)["step"]
    assert 0 < step < 20, "the signal did not land while steps remained"
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines == [f"stopped by {sig.name} at step {step} of 20: {run / rundir.LAST_CHECKPOINT} holds it; "
                     f"`pipeline pretrain --resume --out {run}` goes on from step {step}"], err
    assert "Traceback" not in err and not list(run.rglob("*.tmp"))

    pretrain_tiny(run, resume=True)  # the bare --resume the line names
    _same_weights(run, uninterrupted)


def _signal_until_exit(proc: subprocess.Popen, run: Path, deadline: float, sig: int, pids=()) -> None:
    """Once `run`'s last.pt is written, `sig` every 10 ms until `proc` exits: to `pids`, or to proc's whole process
    group (os.kill of a negative pid) without them. Signals that land while a stopped run exits."""
    while not (run / rundir.LAST_CHECKPOINT).exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.005)
    while proc.poll() is None and time.monotonic() < deadline:
        for pid in pids or [-proc.pid]:
            with contextlib.suppress(ProcessLookupError):  # one that has exited already
                os.kill(pid, sig)
        time.sleep(0.01)


def _signal_during_step(monkeypatch, at: int, signals=(signal.SIGINT,)) -> None:
    """Sends this process `signals` from inside training step `at` (steps counted from 0), before its backward:
    the signal arrives mid-step, as it would from a user."""
    real = pretrain.train_step

    def step(t, views, done):
        if done == at:
            for s in signals:
                os.kill(os.getpid(), s)
        return real(t, views, done)

    monkeypatch.setattr(pretrain, "train_step", step)


def _stopped_run(out: Path, **over) -> dict:
    try:
        return pretrain_tiny(out, **{**LONG, **over})
    except KeyboardInterrupt:  # the signal was raised instead of noted: training lost its step
        pytest.fail("SIGINT interrupted training instead of stopping it after the step")


def test_the_step_under_way_is_finished_and_resume_is_exact_mid_epoch(tmp_path, uninterrupted, monkeypatch):
    _signal_during_step(monkeypatch, at=7)  # the 8th step, mid-epoch 2
    result = _stopped_run(tmp_path / "run")
    assert result["step"] == 8 and "at step 8 of 20" in result["stopped"]
    assert _weights(tmp_path / "run")["step"] == 8  # the step under way was applied, and saved
    monkeypatch.undo()
    pretrain_tiny(tmp_path / "run", resume=True)
    _same_weights(tmp_path / "run", uninterrupted)


def test_a_stop_at_an_epoch_end_runs_that_epochs_hooks(tmp_path, monkeypatch):
    """Stopped after the last step of an epoch, the epoch's own checkpoint (save_every) is written as an
    uninterrupted run writes it, and the resumed run writes the later ones."""
    _signal_during_step(monkeypatch, at=4)  # the last step of epoch 1
    result = _stopped_run(tmp_path / "run", save_every=1, epochs=2)
    assert result["step"] == 5
    assert sorted(p.name for p in (tmp_path / "run" / rundir.CHECKPOINTS).iterdir()) == ["epoch_0001.pt", "last.pt"]
    monkeypatch.undo()
    pretrain_tiny(tmp_path / "run", resume=True)
    assert sorted(p.name for p in (tmp_path / "run" / rundir.CHECKPOINTS).iterdir()) == \
        ["epoch_0001.pt", "epoch_0002.pt", "last.pt"]


def test_signals_during_the_checkpoint_write_change_nothing(tmp_path, uninterrupted, monkeypatch):
    """A second Ctrl-C and a SIGTERM while last.pt is being written: the write finishes, whole."""
    _signal_during_step(monkeypatch, at=2)
    real = rundir.torch_save_atomic

    def save_under_fire(path, obj):
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGTERM)
        real(path, obj)

    monkeypatch.setattr(rundir, "torch_save_atomic", save_under_fire)
    result = _stopped_run(tmp_path / "run")
    assert result["step"] == 3 and "stopped by SIGINT" in result["stopped"]
    monkeypatch.undo()
    assert _weights(tmp_path / "run")["step"] == 3 and not list((tmp_path / "run").rglob("*.tmp"))
    pretrain_tiny(tmp_path / "run", resume=True)
    _same_weights(tmp_path / "run", uninterrupted)


def test_the_signal_handlers_are_put_back(tmp_path, monkeypatch):
    """In a process that goes on after training (this one), finished or stopped: only a process that ends with
    the command (tested above, through `python -m pipeline`) keeps ignoring signals after a stop."""
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    pretrain_tiny(tmp_path / "run", max_steps=1)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
    _signal_during_step(monkeypatch, at=1)
    res = CliRunner().invoke(main, ["pretrain", "--out", str(tmp_path / "stopped"),
                                    *[f"--{k.replace('_', '-')}={v}" for k, v in LONG.items()]])
    assert res.exit_code == 130 and "stopped by SIGINT at step 2" in res.output, res.output
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_a_bare_resume_of_a_finished_run_says_so_and_changes_nothing(tmp_path, uninterrupted):
    import shutil

    run = tmp_path / "run"
    shutil.copytree(uninterrupted, run)
    before = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    res = CliRunner().invoke(main, ["pretrain", "--resume", "--out", str(run)])
    assert res.exit_code == 0, res.output
    assert res.output.splitlines() == [f"{run} has finished training (step 20 of 20): nothing to resume, "
                                       f"{run / rundir.LAST_CHECKPOINT} is unchanged; `--resume --epochs N` with N "
                                       f"above 4 trains on"]
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == before


def test_a_resume_of_a_run_cut_by_max_steps_names_the_way_on(tmp_path):
    run = tmp_path / "run"
    pretrain_tiny(run, max_steps=2)
    res = CliRunner().invoke(main, ["pretrain", "--resume", "--out", str(run)])
    assert res.exit_code == 0 and "finished training (step 2 of 2)" in res.output, res.output
    assert "`--resume --max-steps 0` trains on through every epoch" in res.output


def _children(pid: int) -> list[int]:
    """The processes whose parent is `pid`: from /proc where there is one (no procps needed), else pgrep."""
    if not Path("/proc/self/stat").exists():
        found = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
        return [int(p) for p in found.split()]
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:  # "pid (name) state ppid ..."
                kids.append(int(stat.parent.name))
    return kids


def test_ctrl_c_under_gpus_2_stops_both_processes_with_one_line(tmp_path):
    """`pipeline pretrain --gpus 2` (two CPU processes over gloo under torchrun's agent): a Ctrl-C reaches the
    launcher and both workers; the workers agree on a step, rank 0 writes it, and the launcher exits 130 once they
    are done, with rank 0's line alone (no torchrun warning or traceback). torchrun's agent passes the signal on
    to the workers as well, and on a loaded machine that copy can come after the checkpoint is written: SIGINTs sent
    to the workers from then until they exit stand for it, and change nothing."""
    run = tmp_path / "run"
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in LONG.items()]
    proc = subprocess.Popen([sys.executable, "-m", "pipeline", "pretrain", *flags, "--gpus", "2", "--out", str(run)],
                            cwd=ROOT, env={**os.environ, "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1"},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    metrics, deadline = run / rundir.METRICS, time.monotonic() + 300
    while not (metrics.is_file() and len(metrics.read_text().splitlines()) >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    workers = _children(proc.pid)
    assert len(workers) == 2, workers
    os.killpg(proc.pid, signal.SIGINT)
    _signal_until_exit(proc, run, deadline, signal.SIGINT, workers)  # the agent's late copies
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, out + err
    ckpt = _weights(run)
    step = ckpt["step"]
    assert 0 < step < 20 and ckpt["meta"]["world_size"] == 2
    assert [line for line in err.splitlines() if line.strip()] == [
        f"stopped by SIGINT at step {step} of 20: {run / rundir.LAST_CHECKPOINT} holds it; "
        f"`pipeline pretrain --resume --out {run} --gpus 2` goes on from step {step}"], err
