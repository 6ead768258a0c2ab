"""A disk that fills during a write: one line naming the file, exit 2, and the files written before left whole.

The full disk is real: the command runs in a child process whose file-size limit (RLIMIT_FSIZE, `ulimit -f`) is
below a checkpoint's size, so the kernel refuses the write (EFBIG) as it refuses one on a full disk (ENOSPC).
"""

import errno
import os
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from core import rundir
from tests.cli_helpers import assert_one_line_error, cli
from tests.tiny_run import TINY, pretrain_tiny

ROOT = Path(__file__).parents[2]
LIMIT = 20_000_000  # bytes: a ResNet-18 checkpoint with its optimizer is ~128 MB; config and metrics are tiny


def _cap() -> None:
    """In the child, before it runs: no file past LIMIT bytes."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # else the kernel kills the process instead of failing write()
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def _limited(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pipeline.cli", *args], preexec_fn=_cap, capture_output=True,
                          text=True, timeout=300, cwd=ROOT, env={"TQDM_DISABLE": "1", "PATH": "/usr/bin:/bin",
                                                     "OMP_NUM_THREADS": os.environ["OMP_NUM_THREADS"]})


def _flags(**over) -> list[str]:
    return [f"--{k.replace('_', '-')}={v}" for k, v in {**TINY, **over}.items()]


def _one_error_line(res: subprocess.CompletedProcess, *needles: str) -> str:
    assert res.returncode == 2, res.stdout + res.stderr
    assert "Traceback" not in res.stderr, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: could not write "), res.stderr
    for needle in needles:
        assert needle in errors[0], errors[0]
    return errors[0]


def test_a_full_disk_at_the_first_checkpoint_is_one_line_and_leaves_no_temp_file(tmp_path):
    run = tmp_path / "run"
    res = _limited("pretrain", "--out", str(run), *_flags())
    _one_error_line(res, str(run / "checkpoints" / "last.pt"), "free some space")
    assert not list(run.rglob("*.tmp")), "a half-written temp file was left behind"
    assert (run / "config.yaml").is_file()  # written before the failure, still there


def test_a_full_disk_while_resuming_keeps_the_last_checkpoint_whole(tmp_path):
    torch = pytest.importorskip("torch")
    run = tmp_path / "run"
    pretrain_tiny(run, epochs=1)
    last = run / "checkpoints" / "last.pt"
    before = last.read_bytes()
    res = _limited("pretrain", "--out", str(run), "--resume", "--epochs=3")
    _one_error_line(res, str(last))
    assert last.read_bytes() == before  # the old checkpoint, byte for byte: a resume from it still works
    assert torch.load(last, weights_only=False)[rundir.CKPT_EPOCHS_DONE] == 1
    assert not list(run.rglob("*.tmp"))


def test_a_small_atomic_write_on_a_full_disk_names_the_file(tmp_path):
    code = ("import sys; from core import rundir; from core.errors import PipelineError\n"
            "try: rundir.write_text_atomic(sys.argv[1], 'x' * 30_000_000)\n"
            "except PipelineError as e: print(e); sys.exit(2)")
    target = tmp_path / "big.txt"
    target.write_text("kept")
    res = subprocess.run([sys.executable, "-c", code, str(target)], preexec_fn=_cap, capture_output=True, text=True,
                         cwd=ROOT)
    assert res.returncode == 2, res.stderr
    assert res.stdout.startswith(f"could not write {target}: File too large"), res.stdout
    assert target.read_text() == "kept" and not list(tmp_path.glob(".*.tmp"))


def test_the_cli_turns_a_full_disk_outside_the_atomic_writes_into_one_line(monkeypatch, tmp_path):
    """An append or a library's own write (metrics.jsonl, coremltools' package) fails with the OSError itself."""
    from stages import pretrain

    def full(*_, **__):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "run" / "metrics.jsonl"))

    monkeypatch.setattr(pretrain, "run", full)
    res = cli("pretrain", "--out", tmp_path / "run", "--data", "synthetic:48")
    assert_one_line_error(res, "could not write", "metrics.jsonl", "No space left on device", "free some space")


def test_other_os_errors_are_not_mistaken_for_a_full_disk(monkeypatch, tmp_path):
    from stages import pretrain

    def denied(*_, **__):
        raise PermissionError(errno.EACCES, "Permission denied", "x")

    monkeypatch.setattr(pretrain, "run", denied)
    res = cli("pretrain", "--out", tmp_path / "run", "--data", "synthetic:48")
    assert "could not write" not in res.output
    assert isinstance(res.exception, PermissionError)
