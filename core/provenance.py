"""Which checkpoint each file of a run comes from, so that no command pairs a checkpoint with an evaluation, an
export or a parity result made from an earlier one.

Every write of a checkpoint stores an id of its weights beside its step (`weights_id`). Each file made from it records
that pair, {"step", "id"} (`of_checkpoint`): eval/linear.json and export/encoder.pt from the checkpoint itself,
export/trace.json, validate/parity.json and report.html from the encoder.pt they were made from, and every exported
artifact and export/encoder.json as `step` and `checkpoint_id` among their metadata. A reader compares the record of what it reads with checkpoints/last.pt's own (`current`), which it reads with
mmap: the id sits in the checkpoint's pickle beside the tensors' headers and no weight is read (0.25-0.5 s for a
308 MB ResNet-50 checkpoint on 2 busy cores, where its sha256 took 2.5 s, on every command). An id and not the step
alone: a retrained or copied-in checkpoint reaches the same step with other weights. Of the weights and not random:
the same training gives the same checkpoint bytes, so files that pin a model by its hash (the Swift demo's golden
fixtures) match every `make all` whose float32 arithmetic agrees.
"""

from __future__ import annotations

import hashlib
import html
import json
import re
from pathlib import Path

from core import rundir
from core.errors import PipelineError


def weights_id(state_dict: dict) -> str:
    """A checkpoint's id: a hash of its model's tensors (names, dtypes, shapes, bytes). It draws nothing, so the
    training's RNG streams are untouched. Once per checkpoint write: ResNet-50's 102 MB of weights took 0.22-0.35 s
    on 2 busy cores."""
    import torch  # here, not at the top: the CLI's light commands import this module without torch

    h = hashlib.blake2b(digest_size=8)
    for name in sorted(state_dict):
        t = state_dict[name].detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def of_checkpoint(ckpt: dict) -> dict:
    return {"step": ckpt.get(rundir.CKPT_STEP), "id": ckpt.get(rundir.CKPT_ID)}


def of_encoder(state: dict) -> dict:
    """The checkpoint an export/encoder.pt (`pipeline strip`) was stripped from, as its metadata records it."""
    meta = state.get("metadata") or {}
    return {"step": meta.get("step"), "id": meta.get("checkpoint_id")}


def current(run_dir: Path) -> dict | None:
    """{"step", "id"} of RUN/checkpoints/last.pt, its weights left unread; None when there is none (the run's
    later files are then their own origin: nothing newer exists to pair them with)."""
    path = Path(run_dir) / rundir.LAST_CHECKPOINT
    if not path.is_file():
        return None
    return of_checkpoint(rundir.load_checkpoint(path, mmap=True))


def same(recorded: dict | None, now: dict) -> bool:
    """Whether a file's record names the checkpoint `now`. Files and checkpoints written before ids existed
    carry none: between two of those only the step can tell."""
    recorded = recorded or {}
    if now.get("id") is None and recorded.get("id") is None:
        return recorded.get("step") in (None, now.get("step"))
    return recorded.get("id") == now.get("id")


def command(name: str, run_dir: Path, *extra: str) -> str:
    return rundir.command_for(name, run_dir, *extra)


def check(path: Path, recorded: dict | None, run_dir: Path, rerun: str, now: dict | None = None) -> None:
    """Refuse `path` when it was made from another checkpoint than RUN/checkpoints/last.pt, naming `rerun`, the
    command that makes it again."""
    now = current(run_dir) if now is None else now
    if now is None or same(recorded, now):
        return
    step = (recorded or {}).get("step")
    raise PipelineError(f"{path} comes from an earlier checkpoint{f' (step {step})' if step is not None else ''} "
                        f"than {Path(run_dir) / rundir.LAST_CHECKPOINT} (step {now['step']}): run `{rerun}`")


def steps_to_train(epochs: int, max_steps: int, steps_per_epoch: int) -> int:
    """Where a run ends: every epoch's steps, or --max-steps when it is set (never more: runspec refuses that)."""
    total = steps_per_epoch * epochs
    return min(total, max_steps) if max_steps > 0 else total


def unfinished(ckpt: dict, run_dir: Path) -> str | None:
    """A warning when the checkpoint stopped before the end its own config sets (interrupted, or killed): its
    evaluation or export is of a model part way through training."""
    cfg, meta, step = ckpt.get(rundir.CKPT_CONFIG) or {}, ckpt.get(rundir.CKPT_META) or {}, ckpt.get(rundir.CKPT_STEP)
    if not isinstance(meta.get("steps_per_epoch"), int) or not isinstance(step, int):
        return None
    end = steps_to_train(int(cfg.get("epochs", 0)), int(cfg.get("max_steps") or 0), meta["steps_per_epoch"])
    if step >= end:
        return None
    world = meta.get("world_size", 1)
    resume = rundir.resume_command(run_dir, world)
    return (f"warning: {Path(run_dir) / rundir.LAST_CHECKPOINT} is of an unfinished run (step {step} of {end}): "
            f"`{resume}` trains it to the end")


LINEAR, SIDECAR, PARITY = f"{rundir.EVAL}/{rundir.LINEAR_EVAL}", f"{rundir.EXPORT}/{rundir.SIDECAR}", f"{rundir.VALIDATE}/{rundir.PARITY}"
REMAKE = {LINEAR: "linear-eval", SIDECAR: "export", PARITY: "validate"}  # the results and the commands that make them


def _validated_other(parity: dict, sidecar: dict | None) -> bool:
    """Whether parity.json checked other artifacts than encoder.json lists (an export re-run after validate)."""
    if not isinstance(sidecar, dict) or not isinstance(parity.get("artifacts_sha256"), dict):
        return False
    listed = {str(a.get("file")): a.get("sha256") for a in sidecar.get("artifacts") or [] if isinstance(a, dict)}
    return parity["artifacts_sha256"] != listed


def check_results(run_dir: Path) -> None:
    """Refuse a run whose results are not all of checkpoints/last.pt: eval/linear.json, export/encoder.json and
    validate/parity.json (each where present) from an earlier checkpoint, or parity.json of other artifacts than
    encoder.json lists. One line naming the files and, in order, the commands that make them again."""
    run_dir = Path(run_dir)
    now = current(run_dir)
    read = {rel: rundir.load_json(run_dir / rel, "result") for rel in REMAKE if (run_dir / rel).is_file()}
    record = {rel: r.get("checkpoint") if isinstance(r, dict) else None for rel, r in read.items()}
    if isinstance(read.get(SIDECAR), dict):  # the sidecar holds the artifacts' metadata, the record among it
        record[SIDECAR] = {"step": read[SIDECAR].get("step"), "id": read[SIDECAR].get("checkpoint_id")}
    older = [rel for rel in read if now is not None and not same(record[rel], now)]
    other = PARITY in read and PARITY not in older and (SIDECAR in older or _validated_other(read[PARITY], read.get(SIDECAR)))
    if not (older or other):
        return
    said = []
    if older:
        said.append(f"{', '.join(str(run_dir / rel) for rel in older)} {'comes' if len(older) == 1 else 'come'} from "
                    f"an earlier checkpoint than {run_dir / rundir.LAST_CHECKPOINT} (step {now['step']})")
    if other:
        said.append(f"{run_dir / PARITY} validated other artifacts than {run_dir / SIDECAR} lists")
    again = [REMAKE[rel] for rel in REMAKE if rel in older or (rel == PARITY and other)]
    raise PipelineError("; ".join(said) + ": run " + " then ".join(f"`{command(c, run_dir)}`" for c in again))


REPORT_TAG = "pipeline-checkpoint"  # <meta name=... content=...> in report.html: the record of the checkpoint shown


def report_tag(run_dir: Path) -> str:
    now = current(run_dir)
    content = html.escape(json.dumps(now) if now else "null", quote=True)
    return f'<meta name="{REPORT_TAG}" content="{content}">'


def of_report(path: Path) -> dict | None:
    """The record a report.html carries (`report_tag`), or None for a page without one."""
    m = re.search(rf'<meta name="{REPORT_TAG}" content="([^"]*)">', Path(path).read_text(errors="replace")[:20000])
    try:
        return json.loads(html.unescape(m.group(1))) if m else None
    except json.JSONDecodeError:
        return None
