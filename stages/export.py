"""Export stage (`pipeline export`): the traced encoder to Core ML (.mlpackage, .mlmodel) and ONNX, one metadata
dict in every artifact, and the sidecar RUN/export/encoder.json listing each artifact with its size and sha256.

Reads RUN/export/encoder.pt, RUN/export/trace.json + the traced graph, and RUN/eval/linear.json when present.
All or nothing: every requested format is converted into a staging folder beside the artifacts first; only when
all succeeded are they moved into place (an .mlpackage directory too) and the sidecar rewritten. A failed
conversion leaves the previous artifacts and sidecar untouched and no partial file behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from export import compression
from export.encoder import load_encoder
from export.formats import FORMATS, artifact_file, for_backbone, minimum_os, option_names, select_formats
from export.targets import ipados
from export.metadata import build_metadata
from export.traced import example_input, load_traced
from core import rundir
from core.rundir import SIDECAR, artifact_digest, encoder_path
from core.errors import PipelineError
from core import provenance
from export.configs import ExportConfig



def _put_in_place(src: Path, dst: Path, trash: Path) -> None:
    """Move a finished artifact over the old one. A directory cannot be renamed over a non-empty directory, so the
    old one is first renamed into `trash` (same filesystem: both renames are atomic)."""
    if dst.is_dir() and not dst.is_symlink():
        os.replace(dst, trash / f"old-{dst.name}")
    os.replace(src, dst)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def _sweep_stale_staging(export_dir: Path, say) -> None:
    """A killed export (SIGKILL, power loss) never runs its cleanup and leaves its staging folder behind. Each
    staging folder is named after its process, so one whose process is gone is removed; a live export's is kept."""
    for d in sorted(export_dir.glob(".staging-*")):
        pid = d.name.split("-")[1]
        if d.is_dir() and pid.isdigit() and not _pid_alive(int(pid)):
            shutil.rmtree(d, ignore_errors=True)
            say(f"removed {d}: left by an export that was killed")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)


def _possible_files(f) -> list[str]:
    """Every file a format can write: its table name and one per compression it allows."""
    return list(dict.fromkeys(artifact_file(f, {"compress": c}) for c in f.options.get("compress", (None, (None,)))[1]))


def _previous_entries(export_dir: Path, encoder_sha: str, rewritten: set[str], say, left_out: set[str]) -> list[dict]:
    """Artifacts this export does not rewrite (other formats, other compressions): kept (and listed) if made from
    the same encoder.pt, removed if made from another one or in a format that cannot hold its backbone (left_out),
    so export/ never holds an artifact the sidecar does not vouch for."""
    sidecar = export_dir / SIDECAR
    old: dict[str, dict] = {}
    if sidecar.is_file():
        try:
            old = {a["file"]: a for a in rundir.load_json(sidecar, "export sidecar").get("artifacts", [])}
        except (PipelineError, AttributeError, KeyError, TypeError):
            old = {}  # a broken sidecar vouches for nothing
    kept = []
    for f in FORMATS.values():
        for file in _possible_files(f):
            path = export_dir / file
            if file in rewritten or not path.exists():
                continue
            entry = old.get(file)
            if f.key in left_out:
                _remove(path)
                say(f"removed {path}: its format cannot hold this backbone")
            elif entry and entry.get("encoder_sha256") == encoder_sha and entry.get("format") == f.key:
                kept.append(entry)
            else:
                _remove(path)
                say(f"removed {path}: not made from the current encoder.pt (export it again with --to {f.to})")
    return kept


def _order(entry: dict) -> tuple[int, int]:
    f = FORMATS[entry["format"]]
    files = _possible_files(f)
    return list(FORMATS).index(f.key), files.index(entry["file"]) if entry["file"] in files else len(files)


def run(cfg: ExportConfig, run_dir: Path, say=print) -> dict:
    options = {name: getattr(cfg, name) for name in option_names()}
    plan = select_formats(cfg.to, cfg.coreml_format, cfg.precision, options)  # refuse bad requests before any work
    _, state = load_encoder(encoder_path(run_dir))
    plan, left_out = for_backbone(plan, state["backbone"], cfg.coreml_format, say)
    made_from = provenance.of_encoder(state)  # `pipeline export` re-strips a stale encoder.pt before this runs
    provenance.check(encoder_path(run_dir), made_from, run_dir,
                     f"{provenance.command('strip', run_dir)} && {provenance.command('trace', run_dir)}")
    program, trace_info = load_traced(run_dir)
    meta = build_metadata(run_dir, state, trace_info, cfg.author, cfg.license, cfg.model_version, cfg.description, say)
    example = example_input(int(trace_info.get("example_batch", 2)), state["image_size"])
    export_dir = run_dir / rundir.EXPORT

    export_dir.mkdir(parents=True, exist_ok=True)
    _sweep_stale_staging(export_dir, say)
    staging = Path(tempfile.mkdtemp(prefix=f".staging-{os.getpid()}-", dir=export_dir))
    try:
        written = []
        for fmt, precision, own in plan:
            target, file = minimum_os(fmt.key, own), artifact_file(fmt, own)
            squeeze = f", weights {own['compress']}" if own.get("compress") not in (None, compression.NONE) else ""
            say(f"writing {file}: {fmt.what}{f' for {ipados(target)}' if target else ''}, {precision}{squeeze} ...")
            detail = fmt.writer(program, staging / file, meta, precision, {**own, "example": example})
            if not (staging / file).exists():
                raise PipelineError(f"the {fmt.key} writer finished without writing {file}")
            size, sha = artifact_digest(staging / file)
            written.append({"format": fmt.key, "file": file, **detail, "size_bytes": size, "sha256": sha,
                            "encoder_sha256": meta["encoder_sha256"]})
        for entry in written:
            _put_in_place(staging / entry["file"], export_dir / entry["file"], staging)
    finally:
        shutil.rmtree(staging, ignore_errors=True)

    artifacts = written + _previous_entries(export_dir, meta["encoder_sha256"], {e["file"] for e in written}, say, left_out)
    artifacts.sort(key=_order)
    sidecar = {**meta, "sha256_of_directory": "sha256 over each file in sorted relative-path order: its path, a NUL "
                                              "byte, its size (8 bytes, little-endian), its contents",
               "artifacts": artifacts}
    rundir.write_json_atomic(export_dir / SIDECAR, sidecar)
    for entry in written:
        say(f"wrote {export_dir / entry['file']} ({entry['precision']}, {entry['size_bytes'] / 1e6:.1f} MB)")
    say(f"wrote {export_dir / SIDECAR}")
    return sidecar
