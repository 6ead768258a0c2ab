"""The tiny pretraining run most stage tests start from, written once."""

from __future__ import annotations

from pathlib import Path

# A pretraining config that runs a step in well under a second on one CPU core (benchmarks/pin_divergence.py
# measures the pinned losses of this same run).
TINY = dict(data="synthetic:48", backbone="resnet18", image_size=16, batch_size=8, epochs=2,
            proj_hidden_dim=32, proj_dim=16, pred_hidden_dim=32, device="cpu", num_workers=0,
            warmup_epochs=0.5, log_every=1, seed=0)


def pretrain_tiny(out: Path, resume: bool = False, say=None, **over) -> dict:
    """`pipeline pretrain` of TINY with `over` on top into `out` (resumed: `over` alone on top of the run's own
    config.yaml, as --resume reads it), quiet unless `say` is given; pretrain.run's result."""
    from stages import pretrain
    from train import runspec

    cfg = runspec.config_for_run(None, over if resume else {**TINY, **over}, out, resume)
    return pretrain.run(cfg, out, resume=resume, say=say or (lambda *_: None))
