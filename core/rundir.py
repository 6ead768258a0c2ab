"""The run directory: the only state shared between stages. Every write here is atomic (temp file + rename),
so an interrupted stage never leaves a half-written file where a finished one was."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shlex
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from core.errors import PipelineError

_UMASK = os.umask(0o022)
os.umask(_UMASK)

DEFAULT_RUN = Path("runs/default")  # what `make all` writes, and what a command without --run reads

CONFIG = "config.yaml"
SPLIT = "split.json"
METRICS = "metrics.jsonl"
SKIPPED = "skipped.txt"
CHECKPOINTS = "checkpoints"
LAST_CHECKPOINT = "checkpoints/last.pt"
EVAL = "eval"
EXPORT = "export"
VALIDATE = "validate"
REPORT = "report.html"  # written by `pipeline report`; `pipeline show` points at it
ENCODER = "export/encoder.pt"  # the stripped backbone (`pipeline strip`), what trace and export start from
# checkpoints/*.pt keys: `pipeline pretrain` writes them, --resume, strip and linear-eval read them.
CKPT_MODEL, CKPT_OPTIMIZER, CKPT_SCHEDULER, CKPT_SCALER = "model", "optimizer", "scheduler", "scaler"
CKPT_STEP, CKPT_EPOCHS_DONE, CKPT_RNG, CKPT_CONFIG, CKPT_META = "step", "epochs_done", "rng", "config", "meta"
CKPT_ID = "id"  # a hash of the weights: what each file made from the checkpoint records (core/provenance.py)
SIDECAR = "encoder.json"  # in export/: every artifact with its format, size and sha256 (the Swift demo reads it)
TRACE_INFO = "trace.json"  # in export/: which tracer made the graph, from which encoder.pt (`pipeline trace`)
TRACED = {"torch.export": "encoder.pt2", "jit.trace": "encoder.ts"}  # in export/: the one traced graph, by tracer
LINEAR_EVAL = "linear.json"  # in eval/: `pipeline linear-eval`'s result
FEATURES = {"pretrained": "features_pretrained.pt", "random": "features_random.pt"}  # in eval/: its feature cache
COMPRESSED_INFIX = "{stem}.{compression}{suffix}"  # in export/: encoder.int8.mlpackage beside encoder.mlpackage
UNCOMPRESSED = "fp16"  # the compression whose artifact keeps the plain name (export/compression.py's NONE)
PARITY = "parity.json"  # in validate/: `pipeline validate`'s result, one row per artifact and runtime


def tagged(name: str, tag: str) -> str:
    """An eval/ file of linear-eval on another --data SPEC than the run's own: the data's tag before the suffix."""
    stem, _, suffix = name.rpartition(".")
    return f"{stem}{tag}.{suffix}"


@contextmanager
def atomic_path(path: Path | str) -> Iterator[Path]:
    """Yield a temp path beside `path`; rename it over `path` only if the block finished without error."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, 0o666 & ~_UMASK)  # mkstemp makes 0600; a finished file gets the usual permissions
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    except OSError as e:
        if e.errno not in DISK_FULL:
            raise
        raise PipelineError(not_written(path, e.strerror)) from None
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


# a full disk, a full quota, a file-size limit (ulimit -f): the user frees space; nothing else is wrong
DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def not_written(path: Path, why: str) -> str:
    """The one line for a write the disk refused (DISK_FULL), with the space left where it was going."""
    free = shutil.disk_usage(path.parent if path.parent.is_dir() else ".").free / 1e9
    return (f"could not write {path}: {why} ({free:.1f} GB free on its disk); free some space and run the command "
            "again (files already written are intact)")


def write_text_atomic(path: Path | str, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def write_json_atomic(path: Path | str, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def torch_save_atomic(path: Path | str, obj: Any) -> None:
    import torch

    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        try:  # into a file object: torch then names the zip's folder "archive/", not after the temp file
            torch.save(obj, f)
        except RuntimeError as e:  # torch's zip writer reports a failed write ("unexpected pos") without an errno
            raise PipelineError(not_written(Path(path), f"write failed ({str(e).strip().splitlines()[-1]})")) from None


def append_jsonl(path: Path | str, obj: Any) -> None:
    """One line per call; a crash mid-run loses at most the line being written, never earlier ones."""
    with open(path, "a") as f:
        f.write(json.dumps(obj) + "\n")
        f.flush()


# A run's own files, later stages first: `pretrain --overwrite` moves them aside in this order, so a removal cut
# short leaves an older run without its later stages, never an export beside a checkpoint it did not come from.
RUN_ENTRIES = (REPORT, VALIDATE, EXPORT, EVAL, CHECKPOINTS, METRICS, SKIPPED, SPLIT, CONFIG)
REMOVING = ".removing-"  # the folder inside a run that its old files are moved into before they are deleted


def run_outputs(run_dir: Path | str) -> list[str]:
    """What in run_dir a new pretraining would destroy: any checkpoint, and the later stages' files. (config.yaml,
    split.json and metrics.jsonl alone are what a pretraining stopped before its first checkpoint leaves.)"""
    run_dir = Path(run_dir)
    found = [LAST_CHECKPOINT] if (run_dir / LAST_CHECKPOINT).is_file() else \
        [f"{CHECKPOINTS}/*.pt"] if any((run_dir / CHECKPOINTS).glob("*.pt")) else []
    return found + [name + ("/" if (run_dir / name).is_dir() else "") for name in (EVAL, EXPORT, VALIDATE, REPORT)
                    if (run_dir / name).exists()]


def check_out(run_dir: Path | str, resume: bool, overwrite: bool) -> None:
    """A folder that holds a run is trained into only when asked how: --resume goes on from its checkpoint (which
    must be there), --overwrite deletes its files first (stages/pretrain.py, remove_run). Otherwise a new checkpoint
    would replace the old one beside the old one's evaluation and export. Files only, no torch: the CLI asks before
    torch loads."""
    run_dir = Path(run_dir)
    if resume and overwrite:
        raise PipelineError("--resume and --overwrite exclude each other: --resume goes on training the run in --out, "
                            "--overwrite deletes it and trains afresh")
    if resume and not (run_dir / LAST_CHECKPOINT).is_file():
        raise PipelineError(f"--resume: no checkpoint at {run_dir / LAST_CHECKPOINT}")
    found = [] if resume or overwrite else run_outputs(run_dir)
    if found:
        raise PipelineError(f"{run_dir} already holds a run ({', '.join(found)}): add --resume to go on training it, "
                            f"or --overwrite to delete it and train afresh (or give another --out)")


def remove_run(run_dir: Path | str) -> None:
    """Delete the run's own files (RUN_ENTRIES; nothing else in the folder). Each is first renamed into one folder
    beside them, later stages first: a rename is atomic, so a removal that fails or is killed part way leaves an
    older run without its later stages (and a folder the next call sweeps), never a mix of two runs."""
    run_dir = Path(run_dir)
    for left in run_dir.glob(REMOVING + "*"):  # a removal killed before its delete finished
        shutil.rmtree(left, ignore_errors=True)
    present = [name for name in RUN_ENTRIES if (run_dir / name).exists() or (run_dir / name).is_symlink()]
    if not present:
        return
    trash = Path(tempfile.mkdtemp(prefix=REMOVING, dir=run_dir))
    moved = []
    try:
        for name in present:
            os.replace(run_dir / name, trash / name)
            moved.append(name)
    except OSError as e:
        for name in reversed(moved):  # put back what was moved: the old run stays whole
            os.replace(trash / name, run_dir / name)
        shutil.rmtree(trash, ignore_errors=True)
        raise PipelineError(f"could not remove the old run in {run_dir} ({e.strerror}: {e.filename}); it is intact") from None
    shutil.rmtree(trash, ignore_errors=True)


def resolve_run(run: str | Path | None, *, must_exist: bool = True, say=print) -> Path:
    """The run a command works on: --run if given, else the one `make all` made. Says which, so the user knows."""
    path = Path(run) if run else DEFAULT_RUN
    if must_exist and not path.is_dir():
        hint = " (run `make all` or `pipeline pretrain` first)" if run is None else f" (`pipeline pretrain --out {path}` makes it)"
        raise PipelineError(f"run directory {path} does not exist{hint}")
    if run is None:
        say(f"using run {path}")
    return path


def load_json(path: Path | str, what: str) -> Any:
    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"{what} not found: {path}")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise PipelineError(f"{what} {path} is not valid JSON ({e.msg} at line {e.lineno})") from None


def load_checkpoint(path: Path | str, map_location: str = "cpu", mmap: bool = False) -> dict:
    """Load a checkpoint written by pretrain; a missing, truncated or foreign file is a one-line error.
    mmap=True maps the tensors instead of reading them: for a reader that wants only the step or the meta."""
    import torch

    path = Path(path)
    if not path.is_file():
        raise PipelineError(f"no checkpoint at {path}: run `pipeline pretrain` for this run first")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=False, mmap=mmap)
    except Exception as e:  # torch raises several types for truncated zips / pickles
        raise PipelineError(f"checkpoint {path} is unreadable or truncated ({type(e).__name__}): re-run pretraining") from None
    if not isinstance(ckpt, dict) or CKPT_MODEL not in ckpt or CKPT_CONFIG not in ckpt:
        raise PipelineError(f"{path} is not a checkpoint written by `pipeline pretrain`")
    return ckpt


def encoder_path(run_dir: Path) -> Path:
    return Path(run_dir) / ENCODER


def file_sha256(path: Path | str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def compressed_file(file: str, compression: str | None) -> str:
    """encoder.mlpackage -> encoder.palettize-4.mlpackage; the uncompressed file keeps its name."""
    if compression in (None, UNCOMPRESSED):
        return file
    stem, dot, suffix = file.partition(".")
    return COMPRESSED_INFIX.format(stem=stem, compression=compression, suffix=dot + suffix)


def artifact_digest(path: Path) -> tuple[int, str]:
    """(size in bytes, sha256). For a directory (.mlpackage): the sum of file sizes, and sha256 over, for each
    file in sorted relative-path order, its relative path, a NUL byte, its size as 8 bytes and its contents."""
    if path.is_file():
        return path.stat().st_size, file_sha256(path)
    h, size = hashlib.sha256(), 0
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        rel = f.relative_to(path).as_posix().encode()
        n = f.stat().st_size
        h.update(rel + b"\0" + n.to_bytes(8, "little"))
        with open(f, "rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                h.update(chunk)
        size += n
    return size, h.hexdigest()


def command_for(name: str, run_dir: Path, *extra: str) -> str:
    """The command line that makes a stage's files for this run, as the user would type it (no --run for the
    default run, which every command reads when --run is left out)."""
    here = [] if Path(run_dir) == DEFAULT_RUN else ["--out" if name == "pretrain" else "--run", str(run_dir)]
    return shlex.join(["pipeline", name, *here, *extra])


def resume_command(run_dir: Path, world: int = 1) -> str:
    """The command that trains a stopped or unfinished run on from its last.pt, with its own number of processes."""
    return shlex.join(["pipeline", "pretrain", "--resume", "--out", str(run_dir), *(["--gpus", str(world)] if world > 1 else [])])
