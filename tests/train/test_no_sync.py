"""The training step never makes the host wait for the device, device-to-host copies included.

tests/stages/test_pretrain.py records the step's ops on the CPU, where a device-to-host copy is no op at all:
`.tolist()`, `.cpu().numpy()` or `torch.equal` read CPU memory directly and leave no trace. Here the step runs on
torch's meta device (shapes and dtypes, no data), where every such read fails: `.item()`/`float()`/`bool()` (the
`_local_scalar_dense` a GPU waits for), `.tolist()`, `.cpu()`/`.to("cpu")`, `.numpy()`, `torch.equal`/`allclose`,
`nonzero` and boolean-mask indexing. A dispatch mode also records every op that mixes devices, which is how a
host-to-device copy made inside the step (a Python number turned into a device tensor) shows up.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from train import training
from train.configs import PretrainConfig
from train.runspec import resolve

META = torch.device("meta")


class CrossDeviceOps(TorchDispatchMode):
    """Records each op whose tensors (inputs and outputs) live on more than one device."""

    def __init__(self):
        super().__init__()
        self.ops = 0
        self.crossing: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        devices = {t.device for t in tree_leaves((args, kwargs, out)) if isinstance(t, torch.Tensor)}
        if len(devices) > 1:
            self.crossing.append(f"{func} {sorted(map(str, devices))}")
        return out


def _meta_training(tiny_overrides, method: str, queue_size: int = 0):
    # precision fp32: no autocast, the policy every device has; the model, optimizer state and batch are all meta
    cfg = resolve(PretrainConfig(**{**tiny_overrides, "method": method, "precision": "fp32", "queue_size": queue_size}))
    t, _ = training.build_training(cfg, META, steps_per_epoch=4)
    assert {p.device for p in t.model.parameters()} == {META}
    x = [torch.rand(cfg.batch_size, 3, cfg.image_size, cfg.image_size, device=META) for _ in range(2)]
    return t, x


def _steps_without_sync(t, x, steps=3):
    with CrossDeviceOps() as mode:
        for step in range(steps):  # the first step creates the optimizer state; later ones use it
            loss = training.train_step(t, x, step)
    assert mode.ops > 100  # the mode saw the step: forward, backward, optimizer, momentum update
    assert mode.crossing == [], mode.crossing
    assert loss.device == META and loss.shape == ()


@pytest.mark.parametrize("method", ["simclr", "byol", "mocov3"])
def test_training_step_reads_nothing_back_from_the_device(tiny_overrides, method):
    t, x = _meta_training(tiny_overrides, method)
    _steps_without_sync(t, x)


def test_mocov3_step_with_a_full_key_queue_reads_nothing_back(tiny_overrides):
    """The queue reads its fill count from the device only until the ring is full (KeyQueue.keys says why);
    the steady state after that, a full ring, must not read anything."""
    t, x = _meta_training(tiny_overrides, "mocov3", queue_size=16)
    t.model.queue._full = True  # what 16 / (2 x 8 keys per step) = 1 step on a real device leaves behind
    _steps_without_sync(t, x)


@pytest.mark.parametrize("read", [
    lambda loss: loss.tolist(),
    lambda loss: loss.detach().cpu().numpy(),
    lambda loss: torch.equal(loss, loss),
    lambda loss: loss.item(),
    lambda loss: float(loss),
    lambda loss: torch.tensor([1.0]).to(loss.device),  # a host tensor copied into the step
], ids=["tolist", "cpu_numpy", "torch_equal", "item", "float", "host_to_device"])
def test_the_check_sees_each_kind_of_device_read(tiny_overrides, monkeypatch, read):
    """The check itself can fail: each read, added to the step as a regression would add it, is caught."""
    from train import distributed

    real_mean = distributed.mean

    def mean_with_a_read(loss):
        read(loss)
        return real_mean(loss)

    monkeypatch.setattr(distributed, "mean", mean_with_a_read)
    t, x = _meta_training(tiny_overrides, "simclr")
    with pytest.raises((AssertionError, RuntimeError, NotImplementedError, TypeError)):
        _steps_without_sync(t, x, steps=1)
