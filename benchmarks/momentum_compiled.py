"""An experiment, not a mode of the pipeline: runs a Python command (what `python3` would run: `-m MODULE ARGS` or
`SCRIPT ARGS`) with `--compile` reaching the momentum branch too.

The pipeline compiles the online backbone's forward (train/training.build_training); the momentum copy of BYOL and
MoCo v3 (train.heads.frozen_copy, made before that) runs eager, so one loss's two branches compute with different
kernels. MoCo v3 compiled fell below eager's kNN on the mobile nets (docs/benchmarks.md, "torch.compile inside the
CUDA graphs") while a 20-step check did not single it out (benchmarks/results/h100-effb0-graph-check/): a full run
with both branches compiled, beside eager, says whether that split is why (measured on two mobile nets, it did not
single it out either: benchmarks/results/h100-knn-momentum-compiled/). As the recipe grid's interpreter, on a CUDA
machine from the repository's root:

    PYTHON="python3 benchmarks/momentum_compiled.py" BACKBONE="efficientnet_b0 mobilenet_v3_large" \
      DATASETS=textures METHODS=mocov3 VARIANTS="compiled-both:--compile --cuda-graphs on" JOBS=8 \
      bash benchmarks/recipes_gpu.sh OUT

then `python3 benchmarks/recipe_summary.py --pairs eager compiled-both OUT/results.jsonl
benchmarks/results/h100-knn-compiled-mnv3l-effb0/results.jsonl` pairs each seed with its eager run (same command,
same seeds, H100). Every other command the grid runs (strip, kNN, summaries) passes through unchanged.
"""
import runpy
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the repository's packages, from any working directory

import torch  # noqa: E402

from train import heads  # noqa: E402
from train.methods import byol, mocov3  # noqa: E402

COPIES: dict[int, torch.nn.Module] = {}  # id(online module) -> its momentum copy; both live as long as the model
_frozen_copy, _compile = heads.frozen_copy, torch.compile


def frozen_copy(module: torch.nn.Module) -> torch.nn.Module:
    """heads.frozen_copy, remembering which module the copy follows."""
    target = _frozen_copy(module)
    COPIES[id(module)] = target
    return target


def compile_both(model=None, **kwargs):
    """torch.compile; given a module's forward that has a momentum copy, compiles the copy's forward too, alike."""
    online = getattr(model, "__self__", None)
    if getattr(model, "__name__", "") == "forward" and id(online) in COPIES:
        target = COPIES[id(online)]
        target.forward = _compile(target.forward, **kwargs)
        print("momentum_compiled: the momentum copy's forward compiled too", file=sys.stderr)  # in the run's log
    return _compile(model, **kwargs)


def patch() -> None:
    """Before the model is built: the methods' momentum copies are recorded, and compiling a forward compiles its copy's."""
    byol.frozen_copy = mocov3.frozen_copy = frozen_copy
    torch.compile = compile_both


def main(argv: list[str]) -> None:
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        sys.exit("usage: python3 benchmarks/momentum_compiled.py (-m MODULE | SCRIPT) [ARGS...]")
    patch()
    if argv[0] == "-m":  # as `python -m` runs it: the working directory first on the path
        sys.path.insert(0, str(Path.cwd()))
        sys.argv = [argv[1], *argv[2:]]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:  # as `python SCRIPT` runs it: the script's folder first on the path
        sys.path.insert(0, str(Path(argv[0]).resolve().parent))
        sys.argv = argv
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
