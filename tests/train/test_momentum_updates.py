"""BYOL's target and MoCo v3's momentum encoder, as training moves them: after each optimizer step of the real
training step, every momentum weight equals m * old + (1 - m) * the online weight just updated, with m from the
cosine schedule written out here by hand (1 - (1 - base) * (cos(pi * progress) + 1) / 2, progress = steps done /
total), and BatchNorm statistics copied.

The pinned losses cannot see a frozen target (it moves them by ~1e-5 relative), and the distributed test's
"momentum networks equal on every rank" holds trivially for networks that never move: these tests would fail for
both, and for a schedule left at its base value.
"""

import math

import pytest
import torch

from train import training
from train.configs import PretrainConfig
from train.runspec import resolve

# BYOL's and MoCo v3's (online, momentum) module pairs
PAIRS = {
    "byol": [("backbone", "target_backbone"), ("projector", "target_projector")],
    "mocov3": [("backbone", "momentum_backbone"), ("projector", "momentum_projector")],
}
BASE = 0.6  # far from 1, so the schedule's rise (0.6 -> 1) moves the expected weights by a visible amount


def scheduled_momentum(progress: float) -> float:
    return 1 - (1 - BASE) * (math.cos(math.pi * progress) + 1) / 2


def _snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("method", ["byol", "mocov3"])
def test_momentum_networks_follow_the_ema_with_the_scheduled_momentum(tiny_overrides, method):
    cfg = resolve(PretrainConfig(**{**tiny_overrides, "method": method, "momentum_base": BASE, "lr": 2.0}))
    torch.manual_seed(0)
    t, _ = training.build_training(cfg, torch.device("cpu"), steps_per_epoch=3)
    assert t.total_steps == 6
    x = [torch.rand(cfg.batch_size, 3, 16, 16) for _ in range(2)]
    for step in range(t.total_steps):
        before = {m: _snapshot(getattr(t.model, m)) for _, m in PAIRS[method]}
        training.train_step(t, x, step)
        m = scheduled_momentum((step + 1) / t.total_steps)
        for online_name, momentum_name in PAIRS[method]:
            online = dict(getattr(t.model, online_name).named_parameters())
            momentum = dict(getattr(t.model, momentum_name).named_parameters())
            assert online.keys() == momentum.keys()
            moved = 0.0
            for k, w in online.items():
                old = before[momentum_name][k]
                expected = m * old + (1 - m) * w.detach()
                torch.testing.assert_close(momentum[k], expected, rtol=1e-5, atol=1e-6,
                                           msg=f"{method} {momentum_name}.{k} at step {step}")
                moved = max(moved, (momentum[k] - old).abs().max().item())
            if step + 1 < t.total_steps:  # the last step's momentum is exactly 1: nothing moves
                assert moved > 1e-4, f"{method}: {momentum_name} did not move at step {step}"
            buffers = dict(getattr(t.model, momentum_name).named_buffers())
            for k, b in getattr(t.model, online_name).named_buffers():
                assert torch.equal(buffers[k], b), f"{method}: BN buffer {momentum_name}.{k} not copied"


@pytest.mark.parametrize("method", ["byol", "mocov3"])
def test_the_schedule_is_what_separates_the_expected_weights(tiny_overrides, method):
    """The test above can tell the schedule from a constant momentum: with m held at its base the momentum
    weights after a mid-run step differ from the scheduled ones by far more than its tolerance."""
    cfg = resolve(PretrainConfig(**{**tiny_overrides, "method": method, "momentum_base": BASE, "lr": 2.0}))
    torch.manual_seed(0)
    t, _ = training.build_training(cfg, torch.device("cpu"), steps_per_epoch=3)
    x = [torch.rand(cfg.batch_size, 3, 16, 16) for _ in range(2)]
    for step in range(3):
        training.train_step(t, x, step)
    online, momentum = (getattr(t.model, n) for n in PAIRS[method][1])
    old = [p.detach().clone() for p in momentum.parameters()]
    training.train_step(t, x, 3)
    m, constant = scheduled_momentum(4 / 6), BASE
    gap = max(((m - constant) * (o - w.detach())).abs().max().item() for o, w in zip(old, online.parameters()))
    assert gap > 1e-3  # >> assert_close's atol + rtol * |w| above
    assert t.model.momentum == pytest.approx(m)
