"""Each loss against an obviously-correct loop; EMA, momentum schedule and the MoCo ring buffer."""

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from train.methods.byol import byol_loss
from train.heads import cosine_momentum, ema_update, frozen_copy
from train.methods.mocov3 import KeyQueue, info_nce
from train.methods.simclr import nt_xent


def naive_nt_xent(z1, z2, t):
    z = torch.cat([z1, z2]).double()
    z = z / z.norm(dim=1, keepdim=True)
    n2 = z.shape[0]
    n = n2 // 2
    total = 0.0
    for i in range(n2):
        pos = (i + n) % n2
        num = math.exp(float(z[i] @ z[pos]) / t)
        den = sum(math.exp(float(z[i] @ z[k]) / t) for k in range(n2) if k != i)
        total += -math.log(num / den)
    return total / n2


def naive_info_nce(q, k, t, queue=None):
    q = q.double() / q.double().norm(dim=1, keepdim=True)
    k = k.double() / k.double().norm(dim=1, keepdim=True)
    negs = k if queue is None else torch.cat([k, queue.double()])
    total = 0.0
    for i in range(q.shape[0]):
        logits = [float(q[i] @ negs[j]) / t for j in range(negs.shape[0])]
        total += -(logits[i] - math.log(sum(math.exp(v) for v in logits)))
    return total / q.shape[0] * 2 * t


@pytest.mark.parametrize("n,d", [(2, 3), (5, 8), (16, 32)])
@pytest.mark.parametrize("t", [0.07, 0.5, 1.0])
def test_nt_xent_matches_loop(n, d, t):
    g = torch.Generator().manual_seed(n * 100 + d)
    z1, z2 = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    assert nt_xent(z1, z2, t).item() == pytest.approx(naive_nt_xent(z1, z2, t), rel=1e-5)


def test_nt_xent_half_precision_inputs_do_not_overflow():
    z = torch.randn(64, 16).half() * 1000
    loss = nt_xent(z, z + 1, 0.01)
    assert torch.isfinite(loss)


@pytest.mark.parametrize("n,d,k", [(3, 4, 0), (8, 16, 5), (16, 8, 32)])
@pytest.mark.parametrize("t", [0.2, 1.0])
def test_info_nce_matches_loop(n, d, k, t):
    g = torch.Generator().manual_seed(n + d + k)
    q, key = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    queue = F.normalize(torch.randn(k, d, generator=g), dim=1) if k else None
    assert info_nce(q, key, t, queue).item() == pytest.approx(naive_info_nce(q, key, t, queue), rel=1e-5)


@pytest.mark.parametrize("n,d", [(1, 3), (7, 16)])
def test_byol_loss_matches_loop(n, d):
    g = torch.Generator().manual_seed(n)
    p, z = torch.randn(n, d, generator=g), torch.randn(n, d, generator=g)
    want = sum(float(((p[i] / p[i].norm() - z[i] / z[i].norm()) ** 2).sum()) for i in range(n)) / n
    assert byol_loss(p, z).item() == pytest.approx(want, rel=1e-5)


def test_ema_update_and_frozen_target():
    online = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    target = frozen_copy(online)
    assert all(not p.requires_grad for p in target.parameters())
    before = [p.clone() for p in target.parameters()]
    with torch.no_grad():
        for p in online.parameters():
            p.add_(1.0)
    online(torch.randn(8, 3))  # train mode: moves the BN running statistics
    ema_update(target, online, 0.9)
    for b, t, o in zip(before, target.parameters(), online.parameters()):
        torch.testing.assert_close(t, 0.9 * b + 0.1 * o)
    for t, o in zip(target.buffers(), online.buffers()):  # statistics copied, not averaged
        assert torch.equal(t, o)
    assert target[1].num_batches_tracked == 1


def test_cosine_momentum_schedule():
    assert cosine_momentum(0.99, 0.0) == pytest.approx(0.99)
    assert cosine_momentum(0.99, 0.5) == pytest.approx(0.995)
    assert cosine_momentum(0.99, 1.0) == pytest.approx(1.0)


def test_key_queue_wraps_around_in_place():
    q = KeyQueue(size=5, dim=2)
    storage = q.buffer.data_ptr()
    keys = [torch.tensor([[float(i + 1), 0.0]]) for i in range(3)]
    q.push(torch.cat(keys[:2]))  # rows 0, 1
    assert int(q.filled) == 2 and int(q.ptr) == 2
    q.push(torch.tensor([[0.0, 1.0], [0.0, 2.0], [0.0, 3.0], [0.0, 4.0]]))  # rows 2, 3, 4, then wraps to 0
    assert int(q.filled) == 5 and int(q.ptr) == 1
    assert q.buffer.data_ptr() == storage  # no reallocation, no growth
    torch.testing.assert_close(q.buffer[0], torch.tensor([0.0, 1.0]))  # overwritten by the 4th key of the push
    torch.testing.assert_close(q.buffer[1], torch.tensor([1.0, 0.0]))  # the second key of the first push survives
    torch.testing.assert_close(q.keys().norm(dim=1), torch.ones(5))  # stored normalised


def test_key_queue_push_larger_than_size_keeps_newest():
    q = KeyQueue(size=3, dim=2)
    angles = torch.arange(7.0) * 0.3
    keys = torch.stack([angles.cos(), angles.sin()], 1)
    q.push(keys)
    assert int(q.filled) == 3 and int(q.ptr) == 0
    torch.testing.assert_close(q.buffer, keys[4:])


# --- each method's forward: its heads on both views, combined as the paper does

def _tiny_method(name: str, **extra):
    from train.configs import PretrainConfig
    from train.runspec import build_model, resolve

    torch.manual_seed(0)
    cfg = resolve(PretrainConfig(method=name, backbone="resnet18", image_size=16, proj_dim=16, proj_hidden_dim=32,
                                 pred_hidden_dim=32, **extra))
    model, _ = build_model(cfg)
    return model.train(), [torch.randn(4, 3, 16, 16) for _ in range(2)]


FP32 = SimpleNamespace(backbone=lambda: torch.autocast("cpu", enabled=False), heads=lambda: torch.autocast("cpu", enabled=False),
                       head_dtype=None, param_dtype=torch.float32)


def test_byol_forward_is_the_symmetric_loss_against_the_target():
    model, (x1, x2) = _tiny_method("byol")
    loss = model([x1, x2], FP32)
    h = model.backbone(torch.cat([x1, x2]))
    p1, p2 = model.predictor(model.projector(h)).chunk(2)
    with torch.no_grad():
        z1, z2 = model.target_projector(model.target_backbone(torch.cat([x1, x2]))).chunk(2)
    expected = byol_loss(p1, z2) + byol_loss(p2, z1)
    torch.testing.assert_close(loss, expected)
    assert loss.requires_grad


def test_mocov3_forward_is_the_symmetric_info_nce_against_the_momentum_encoder():
    model, (x1, x2) = _tiny_method("mocov3")
    loss = model([x1, x2], FP32)
    h = model.backbone(torch.cat([x1, x2]))
    q1, q2 = model.predictor(model.projector(h)).chunk(2)
    with torch.no_grad():
        k1, k2 = model.momentum_projector(model.momentum_backbone(torch.cat([x1, x2]))).chunk(2)
    t = model.temperature
    torch.testing.assert_close(loss, info_nce(q1, k2, t) + info_nce(q2, k1, t))


def test_simclr_forward_is_nt_xent_of_the_projections():
    model, (x1, x2) = _tiny_method("simclr")
    loss = model([x1, x2], FP32)
    z1, z2 = model.projector(model.backbone(torch.cat([x1, x2]))).chunk(2)
    torch.testing.assert_close(loss, nt_xent(z1, z2, model.temperature))


@pytest.mark.parametrize("name", ["simclr", "byol", "mocov3"])
def test_half_precision_backbone_feeds_fp32_heads(name):
    """The MPS policy (backbone in reduced precision, heads and loss in fp32), emulated with bf16 autocast on the
    CPU: the backbone's output is cast up before the heads, and the loss is fp32 and close to the fp32 loss."""
    from core.device import Precision

    model, (x1, x2) = _tiny_method(name)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    reference = model([x1, x2], Precision("cpu", None, None))
    model.load_state_dict(state)  # BN statistics as before
    loss = model([x1, x2], Precision("cpu", torch.bfloat16, None))
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, reference, rtol=0.05, atol=0.05)


def _layers(seq):
    return [(type(m).__name__, getattr(m, "out_features", None), getattr(m, "affine", None)) for m in seq]


def test_heads_are_the_papers_mlps():
    """SimCLR and BYOL: Linear-BN-ReLU-Linear (2 layers); MoCo v3: a 3-layer projector and a 2-layer predictor,
    each ending in a BN without affine parameters. Hidden sizes and output sizes as configured."""
    lin, bn, relu = "Linear", "BatchNorm1d", "ReLU"
    two = [(lin, 32, None), (bn, None, True), (relu, None, None), (lin, 16, None)]
    simclr, _ = _tiny_method("simclr")
    assert _layers(simclr.projector) == two
    byol, _ = _tiny_method("byol", proj_last_bn="off")
    assert _layers(byol.projector) == _layers(byol.predictor) == _layers(byol.target_projector) == two
    assert byol.projector[-1].bias is not None
    # --proj-last-bn on (BYOL's small recipe): the projector, online and target, ends like MoCo v3's; the predictor
    # is unchanged
    centred, _ = _tiny_method("byol", proj_last_bn="on")
    assert _layers(centred.projector) == _layers(centred.target_projector) == two[:3] + [(lin, 16, None), (bn, None, False)]
    assert centred.projector[-2].bias is None and _layers(centred.predictor) == two
    moco, _ = _tiny_method("mocov3")
    assert _layers(moco.projector) == [(lin, 32, None), (bn, None, True), (relu, None, None), (lin, 32, None),
                                       (bn, None, True), (relu, None, None), (lin, 16, None), (bn, None, False)]
    assert _layers(moco.predictor) == [(lin, 32, None), (bn, None, True), (relu, None, None), (lin, 16, None), (bn, None, False)]
    assert all(m.bias is None for m in moco.projector if isinstance(m, torch.nn.Linear))


# --- one rank of several, emulated in one process: rank(), world_size() and the all-gather replaced by what
# torch.distributed would return, so the per-rank arithmetic (each rank's own columns, its positives' offset) is
# checked against the one-process loss of the global batch without starting processes.

def _as_rank(monkeypatch, rank: int, world: int, gathered: list[torch.Tensor]):
    """This process plays `rank` of `world`; the i-th all-gather returns gathered[i] with this rank's rows replaced
    by the tensor actually passed (so gradients still reach it)."""
    from train import distributed

    calls = iter(gathered)

    def gather(x):
        whole = next(calls)
        n = x.shape[0]
        return torch.cat([whole[: rank * n], x, whole[(rank + 1) * n:]])

    monkeypatch.setattr(distributed, "rank", lambda: rank)
    monkeypatch.setattr(distributed, "world_size", lambda: world)
    monkeypatch.setattr(distributed, "gather_with_grad", gather)


@pytest.mark.parametrize("world", [2, 3])
def test_nt_xent_mean_over_ranks_is_the_global_batch_loss(monkeypatch, world):
    n, d, t = 3, 8, 0.5
    g = torch.Generator().manual_seed(world)
    z1, z2 = torch.randn(world * n, d, generator=g), torch.randn(world * n, d, generator=g)
    whole = [F.normalize(z1, dim=1), F.normalize(z2, dim=1)]  # nt_xent gathers its normalised rows
    losses = []
    with monkeypatch.context() as m:
        for r in range(world):
            _as_rank(m, r, world, whole)
            rows = slice(r * n, (r + 1) * n)
            losses.append(nt_xent(z1[rows], z2[rows], t))
    assert torch.stack(losses).mean().item() == pytest.approx(naive_nt_xent(z1, z2, t), rel=1e-5)


def test_info_nce_first_positive_picks_this_ranks_keys():
    """Rank r's queries against every rank's keys, positives from row r * n: the ranks' mean is the global loss."""
    n, d, t, world = 3, 8, 0.2, 3
    g = torch.Generator().manual_seed(1)
    q, k = torch.randn(world * n, d, generator=g), torch.randn(world * n, d, generator=g)
    per_rank = [info_nce(q[r * n:(r + 1) * n], k, t, first_positive=r * n) for r in range(world)]
    assert torch.stack(per_rank).mean().item() == pytest.approx(naive_info_nce(q, k, t), rel=1e-5)


def _mocov3_parts(model, x1, x2):
    """The forward's queries and (un-gathered) keys, recomputed from the modules."""
    h = model.backbone(torch.cat([x1, x2]))
    q1, q2 = model.predictor(model.projector(h)).chunk(2)
    with torch.no_grad():
        k1, k2 = model.momentum_projector(model.momentum_backbone(torch.cat([x1, x2]))).chunk(2)
    return q1, q2, k1, k2


def test_mocov3_forward_on_rank_1_scores_against_every_ranks_keys(monkeypatch):
    model, (x1, x2) = _tiny_method("mocov3")
    other_k1, other_k2 = torch.randn(4, 16), torch.randn(4, 16)  # rank 0's keys
    with monkeypatch.context() as m:
        _as_rank(m, 1, 2, [torch.cat([other_k1, torch.zeros(4, 16)]), torch.cat([other_k2, torch.zeros(4, 16)])])
        loss = model([x1, x2], FP32)
    q1, q2, k1, k2 = _mocov3_parts(model, x1, x2)
    t = model.temperature
    expected = (info_nce(q1, torch.cat([other_k2, k2]), t, None, 4)
                + info_nce(q2, torch.cat([other_k1, k1]), t, None, 4))
    torch.testing.assert_close(loss, expected)


@pytest.mark.parametrize("size", [1, 16])
def test_mocov3_queue_adds_past_keys_as_negatives_and_takes_this_steps_keys(size):
    model, (x1, x2) = _tiny_method("mocov3", queue_size=size)
    model.queue.push(torch.randn(5, 16))
    queued = model.queue.keys().clone()
    assert queued.shape == (min(5, size), 16)
    loss = model([x1, x2], FP32)
    q1, q2, k1, k2 = _mocov3_parts(model, x1, x2)
    t = model.temperature
    torch.testing.assert_close(loss, info_nce(q1, k2, t, queued) + info_nce(q2, k1, t, queued))
    assert not torch.allclose(loss, info_nce(q1, k2, t) + info_nce(q2, k1, t))  # the queue did change the loss
    # the queue then holds the newest `size` of: the old keys, then this step's (both views, normalised)
    torch.testing.assert_close(model.queue.keys(), torch.cat([queued, F.normalize(torch.cat([k1, k2]), dim=1)])[-size:])
    model.eval()
    before = model.queue.keys().clone()
    model([x1, x2], FP32)
    torch.testing.assert_close(model.queue.keys(), before)  # evaluation never pushes


def test_key_queue_keys_are_the_filled_rows_until_full_then_every_row():
    q = KeyQueue(size=5, dim=2)
    assert q.keys().shape == (0, 2)
    q.push(torch.tensor([[1.0, 0.0], [0.0, 2.0]]))
    torch.testing.assert_close(q.keys(), torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    q.push(torch.ones(3, 2))
    assert q.keys().shape == (5, 2)
    # Full: a ring stays full, so the count (a device-to-host read on a GPU) is not read again.
    q.filled.zero_()
    assert q.keys().shape == (5, 2)


def test_key_queue_loaded_state_decides_the_filled_rows_again():
    full, partial = KeyQueue(size=4, dim=2), KeyQueue(size=4, dim=2)
    full.push(torch.ones(4, 2))
    assert full.keys().shape == (4, 2)
    partial.push(torch.tensor([[3.0, 4.0]]))
    full.load_state_dict(partial.state_dict())
    torch.testing.assert_close(full.keys(), torch.tensor([[0.6, 0.8]]))


def test_key_queue_counts_exactly_past_float32_integers():
    """2**24 + 1 keys: a count kept in float32 would stop at 2**24 (float32's last exact integer run)."""
    size = 2 ** 24 + 1
    q = KeyQueue(size=size, dim=1)
    q.push(torch.ones(size - 1, 1))
    q.push(torch.ones(1, 1))
    assert q.keys().shape == (size, 1)
