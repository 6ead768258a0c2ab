"""LARS against a naive per-parameter loop, and the warm-up + cosine schedule."""

import copy
import math

import pytest
import torch

from train import distributed
from train.optim import LARS, build_optimizer, fused_for, load_optimizer, param_groups, warmup_cosine
from tests.train.test_methods import _tiny_method


def naive_lars_step(params, state, lr, momentum, wd, eta):
    """The papers' LARS, one parameter at a time, written as plainly as possible."""
    with torch.no_grad():
        for p in params:
            if p.grad is None:
                continue
            d = p.grad.clone()
            if p.ndim > 1:
                d = d + wd * p
                pn, dn = p.norm(), d.norm()
                if pn > 0 and dn > 0:
                    d = d * (eta * pn / dn)
            buf = state.get(id(p))
            state[id(p)] = d.clone() if buf is None else buf * momentum + d
            p -= lr * state[id(p)]


def _model():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.Flatten(),
                            torch.nn.Linear(8 * 6 * 6, 5))
    with torch.no_grad():
        m[0].weight[0].zero_()  # a zero row does not make the whole tensor's norm zero; a zero tensor below does
    return m


@pytest.mark.parametrize("wd", [0.0, 1e-4])
def test_lars_matches_naive_loop(wd):
    model, ref = _model(), _model()
    frozen = torch.nn.Parameter(torch.zeros(4, 4))  # no gradient: untouched by both
    zero = torch.nn.Parameter(torch.zeros(3, 3))  # zero matrix: trust ratio 1, as the loop
    opt = LARS(list(model.parameters()) + [frozen, zero], lr=0.3, momentum=0.9, weight_decay=wd)
    zero_ref = torch.nn.Parameter(torch.zeros(3, 3))
    state = {}
    x = torch.randn(6, 3, 8, 8, generator=torch.Generator().manual_seed(1))
    for _ in range(4):
        for m, z in ((model, zero), (ref, zero_ref)):
            m.zero_grad()
            z.grad = None
            (m(x).square().mean() + (z + 1).square().sum()).backward()
        opt.step()
        naive_lars_step(list(ref.parameters()) + [zero_ref], state, 0.3, 0.9, wd, 0.001)
        for a, b in zip(model.parameters(), ref.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(zero, zero_ref, rtol=1e-5, atol=1e-6)
    assert frozen.abs().sum() == 0
    assert not zero.eq(0).all()  # it did move (trust 1 while its norm was 0)


def test_lars_state_round_trips():
    """A resumed optimizer continues exactly: state_dict holds every momentum buffer."""
    model = _model()
    opt = LARS(model.parameters(), lr=0.1, weight_decay=1e-4)
    x = torch.randn(2, 3, 8, 8)
    for _ in range(2):
        model.zero_grad()
        model(x).sum().backward()
        opt.step()
    twin = copy.deepcopy(model)
    opt2 = LARS(twin.parameters(), lr=0.1, weight_decay=1e-4)
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))  # as from disk: no buffer shared with opt
    for m, o in ((model, opt), (twin, opt2)):
        m.zero_grad()
        m(x).sum().backward()
        o.step()
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


def test_warmup_cosine_schedule():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=1.0)
    sched = warmup_cosine(opt, warmup_steps=4, total_steps=12)
    lrs = []
    for _ in range(12):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert lrs[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0])
    assert lrs[4] == pytest.approx(1.0)
    assert lrs[8] == pytest.approx(0.5)
    assert lrs[-1] == pytest.approx(0.5 * (1 + torch.cos(torch.tensor(7 / 8 * torch.pi)).item()))


@pytest.mark.parametrize("name", ["sgd", "lars", "adamw"])
def test_the_predictor_learns_at_its_multiple_of_the_rate_through_the_schedule(name):
    """--pred-lr 10: the predictor's parameters in a group of their own at 10 x the rate, every trainable parameter in
    exactly one group (the frozen target in none), and the warm-up + cosine schedule scaling both alike."""
    model, _ = _tiny_method("byol")
    opt = build_optimizer(name, param_groups(model, 10.0), 0.1, 1e-4, 0.02)
    rest, pred = opt.param_groups
    assert (rest["lr"], pred["lr"]) == (pytest.approx(0.1), pytest.approx(1.0))
    assert {id(p) for p in pred["params"]} == {id(p) for p in model.predictor.parameters()}
    trainable = [id(p) for p in model.parameters() if p.requires_grad]
    assert sorted(id(p) for g in opt.param_groups for p in g["params"]) == sorted(trainable)
    assert not any(id(p) in trainable for p in model.target_projector.parameters())
    sched = warmup_cosine(opt, 2, 10)
    seen = []
    for _ in range(5):
        assert pred["lr"] == pytest.approx(10 * rest["lr"])
        seen.append(rest["lr"])
        opt.step()
        sched.step()
    cosine = [0.1 * (0.5 + 0.5 * math.cos(math.pi * k / 8)) for k in range(3)]
    assert seen == pytest.approx([0.05, 0.1, *cosine])  # half-way up, the peak, then down the cosine from it


def test_one_group_unless_the_predictor_has_another_rate():
    """pred_lr 1 (or None), or a method without a predictor: one group, as every run had before the option, so
    their checkpoints' optimizer state loads as it was saved."""
    for method, pred_lr in (("byol", 1.0), ("byol", None), ("mocov3", 1.0), ("simclr", 10.0)):
        model, _ = _tiny_method(method)
        groups = param_groups(model, pred_lr)
        assert len(groups) == 1 and len(groups[0]["params"]) == sum(p.requires_grad for p in model.parameters())
        assert len(build_optimizer("sgd", groups, 0.1, 0.0, 0.001).param_groups) == 1


def test_a_predictor_step_at_ten_times_the_rate_moves_it_ten_times_as_far():
    """The multiple reaches the update, not only the group's label: one plain SGD step (no momentum history, no
    weight decay) with the same gradient everywhere."""
    model, _ = _tiny_method("mocov3")
    opt = build_optimizer("sgd", param_groups(model, 10.0), 0.01, 0.0, 0.001)
    before = {id(p): p.detach().clone() for p in model.parameters()}
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.ones_like(p)
    opt.step()
    moved = lambda m: [float((p.detach() - before[id(p)]).abs().max()) for p in m.parameters()]  # noqa: E731
    assert moved(model.predictor) == pytest.approx([0.1] * len(list(model.predictor.parameters())))
    assert moved(model.projector) == pytest.approx([0.01] * len(list(model.projector.parameters())))


def _steps(model, opt, n, seed=0):
    """n updates with the same gradients whatever the optimizer: drawn from their own generator per step."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        for p in model.parameters():
            if p.requires_grad:
                p.grad = torch.randn(p.shape, generator=g)
        opt.step()


def test_cuda_gets_torchs_fused_update_and_every_other_device_its_default():
    """The fused kernels on CUDA only; a build without them leaves torch's choice open (fused None, foreach None),
    which on CUDA is the multi-tensor update: fused=False would have turned that off as well."""
    assert fused_for(torch.device("cuda", 0)) and not fused_for(torch.device("cpu"))
    assert not fused_for(torch.device("mps"))
    model, _ = _tiny_method("byol")
    for name in ("sgd", "adamw"):
        fused = build_optimizer(name, param_groups(model, 10.0), 0.1, 1e-4, 0.02, fused=True)
        plain = build_optimizer(name, param_groups(model, 10.0), 0.1, 1e-4, 0.02)
        assert all(g["fused"] is True for g in fused.param_groups)
        assert all(g["fused"] is None and g["foreach"] is None for g in plain.param_groups)
    assert "fused" not in build_optimizer("lars", param_groups(model, None), 0.1, 1e-4, 0.02, fused=True).defaults


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_the_fused_update_is_the_same_method(name):
    """Learning rate, momentum, weight decay and the predictor's group reach torch's fused kernel as they reach its
    default: four steps of each from one init agree to float32 rounding (the CPU has the fused kernels too)."""
    model, _ = _tiny_method("byol")
    twin, start = copy.deepcopy(model), copy.deepcopy(model)
    _steps(model, build_optimizer(name, param_groups(model, 10.0), 0.05, 0.1, 0.02, fused=True), 4)
    _steps(twin, build_optimizer(name, param_groups(twin, 10.0), 0.05, 0.1, 0.02), 4)
    for a, b, s in zip(model.parameters(), twin.parameters(), start.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert not a.requires_grad or float((a - s).detach().abs().max()) > 1e-3  # every trained parameter moved


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_a_checkpoint_resumes_with_the_resuming_runs_kernels(name):
    """A CUDA run's (fused) optimizer state loaded on another device keeps that device's default, and the other way
    round; the state itself (momentum, AdamW's moments and step) arrives as saved, and a fused run resumed from
    its own checkpoint continues exactly as if never stopped."""
    model, _ = _tiny_method("simclr")
    start = copy.deepcopy(model.state_dict())
    build = lambda m, fused: build_optimizer(name, param_groups(m, None), 0.05, 0.1, 0.02, fused=fused)  # noqa: E731
    whole = build(model, True)
    _steps(model, whole, 2)
    saved = copy.deepcopy(whole.state_dict())
    plain = build(model, False)
    load_optimizer(plain, saved)
    assert plain.param_groups[0]["fused"] is None and plain.param_groups[0]["foreach"] is None
    fused = build(model, True)
    load_optimizer(fused, copy.deepcopy(plain.state_dict()))
    assert fused.param_groups[0]["fused"] is True
    for p in model.parameters():
        for key, value in whole.state[p].items():
            assert torch.equal(plain.state[p][key], value) and torch.equal(fused.state[p][key], value)
            assert fused.state[p][key].dtype == value.dtype
    after = copy.deepcopy(model.state_dict())
    _steps(model, whole, 1, seed=1)
    straight = copy.deepcopy(model.state_dict())
    model.load_state_dict(after)
    _steps(model, fused, 1, seed=1)
    for k, v in model.state_dict().items():
        assert torch.equal(v, straight[k]), k
    assert any(not torch.equal(v, start[k]) for k, v in straight.items())


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_the_fused_update_takes_gradients_that_view_one_flat_buffer(name):
    """Several processes without SyncBN keep every gradient as a view of one flat buffer (distributed.flat_gradients),
    a channels-last weight's with its own strides: the fused update reads them there as the default one does (three
    steps, the CPU's fused kernel) and leaves them views of that buffer."""
    torch.manual_seed(0)
    # no bias before the BatchNorm: its gradient would be rounding noise, which AdamW scales up to the full rate
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, bias=False), torch.nn.BatchNorm2d(8), torch.nn.Conv2d(8, 4, 1),
                                torch.nn.Flatten(), torch.nn.Linear(144, 5)).to(memory_format=torch.channels_last)
    twin = copy.deepcopy(model)
    assert not model[0].weight.is_contiguous()  # the case that matters: strides of its own
    for m, fused in ((model, True), (twin, False)):
        flat = distributed.flat_gradients(m.parameters())
        opt = build_optimizer(name, param_groups(m, None), 0.1, 0.01, 0.0, fused=fused)
        g = torch.Generator().manual_seed(1)
        for _ in range(3):
            flat.zero_()
            x = torch.rand(4, 3, 8, 8, generator=g).contiguous(memory_format=torch.channels_last)
            m(x).square().sum().backward()
            opt.step()
        assert all(p.grad.untyped_storage().data_ptr() == flat.untyped_storage().data_ptr() for p in m.parameters())
    for a, b in zip(model.parameters(), twin.parameters()):  # rounding apart (AdamW's divisions); a misread layout
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)  # would move weights by about lr = 0.1
