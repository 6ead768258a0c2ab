"""Two CPU processes over gloo, as torchrun would start them: the contrastive losses equal the one-process loss of
the same global batch (and so do the gradients and the weights after a training step), momentum networks stay identical on every rank,
a 2-process run resumes exactly, and a signal to one rank alone stops both after the same step. One spawn runs every
scenario (starting processes is the costly part)."""

import os
import signal
import socket
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from core.errors import PipelineError
from train import configs, distributed, runspec, training
from stages import pretrain
from train.methods.mocov3 import info_nce
from train.methods.simclr import nt_xent

WORLD = 2
N, D = 6, 5  # global batch rows and embedding size for the loss-level checks


def _embeddings():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(N, D, generator=g) for _ in range(2)]


def _tiny(method, **extra):
    return dict(method=method, data="synthetic:40", backbone="resnet18", image_size=8, batch_size=8, epochs=1,
                proj_hidden_dim=16, proj_dim=8, pred_hidden_dim=16, device="cpu", num_workers=0, augment="cpu",
                warmup_epochs=0.5, log_every=1, seed=0, **extra)


def _views(n=8):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, 3, 8, 8, generator=g), torch.randn(n, 3, 8, 8, generator=g)


def _worker(rank, port, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(WORLD),
                      LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rows = slice(rank * N // WORLD, (rank + 1) * N // WORLD)
    res = {}

    # losses on this rank's rows, negatives from every rank
    z1, z2 = (z[rows].clone().requires_grad_() for z in _embeddings())
    loss = nt_xent(z1, z2, 0.5)
    loss.backward()
    res["nt_xent"] = (distributed.mean(loss).item(), z1.grad, z2.grad)
    q, k = (z[rows].clone().requires_grad_() for z in _embeddings())
    loss = info_nce(q, distributed.gather_with_grad(k.detach()), 0.7, None, rank * (N // WORLD))
    loss.backward()
    res["info_nce"] = (distributed.mean(loss).item(), q.grad)

    # one training step of every method (eval-mode BatchNorm: per-image, so shards see what the whole batch sees):
    # the flat gradient buffer averaged over ranks, then LARS, the schedule and the momentum update
    for method in ("simclr", "byol", "mocov3"):
        res[method] = _one_step(method, rank)
    # 2-process pretraining: uninterrupted vs stopped after 3 steps and resumed; momentum networks per rank
    run = _tiny("mocov3", queue_size=8)
    for name, overrides, resume in [("full", run, False), ("part", {**run, "max_steps": 2}, False), ("part", {"max_steps": 0}, True)]:
        cfg = runspec.config_for_run(None, overrides, out / name, resume)
        done = pretrain.run(cfg, out / name, resume=resume, say=lambda *_: None)
        dist.barrier()  # rank 0's checkpoint is on disk before anyone reads it
    res["momentum"] = {k: v.clone() for k, v in done["model"].momentum_backbone.state_dict().items()}
    res["queue"] = done["model"].queue.buffer.clone()
    res["stopped"] = _stopped_by_a_signal_to_rank_1(rank, run, out / "stopped")
    torch.save(res, out / f"rank{rank}.pt")
    dist.destroy_process_group()


def _stopped_by_a_signal_to_rank_1(rank, run, out):
    """SIGTERM to rank 1 alone during its second step: both ranks must stop after that step (rank 0 would
    otherwise wait in the next step's all-reduce for ever), rank 0 writes last.pt, and the run resumes."""
    real = pretrain.train_step

    def step(t, views, done):
        if rank == 1 and done == 1:
            os.kill(os.getpid(), signal.SIGTERM)
        return real(t, views, done)

    pretrain.train_step = step
    try:
        stopped = pretrain.run(runspec.config_for_run(None, run, out, False), out, say=lambda *_: None)
    finally:
        pretrain.train_step = real
    dist.barrier()
    pretrain.run(runspec.config_for_run(None, {}, out, True), out, resume=True, say=lambda *_: None)
    dist.barrier()
    return stopped["step"], stopped["stopped"]


def _one_step(method, rank=None):
    """Loss and weights after one training step on the global batch of _views(): all of it in one process
    (rank None), or this rank's half of it."""
    torch.manual_seed(0)
    t, _ = training.build_training(runspec.resolve(configs.PretrainConfig(**_tiny(method))), torch.device("cpu"), 5)
    t.model.eval()
    x1, x2 = _views()
    if rank is not None:
        x1, x2 = x1[rank * 4:(rank + 1) * 4], x2[rank * 4:(rank + 1) * 4]
    loss = training.train_step(t, [x1, x2], 0)
    views_of_buffer = t.grads is not None and all(
        t.grads.data_ptr() <= p.grad.data_ptr() < t.grads.data_ptr() + t.grads.numel() * t.grads.element_size()
        for p in t.model.parameters() if p.requires_grad)
    return loss.item(), {k: v.clone() for k, v in t.model.state_dict().items()}, views_of_buffer


def test_two_gloo_processes(tmp_path):
    """One spawn, every check (pytest-xdist would run a shared fixture once per worker)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, tmp_path), nprocs=WORLD, join=True)
    res = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    _simclr_loss_and_gradients_equal_one_process_on_the_global_batch(res)
    _mocov3_loss_and_gradients_equal_one_process_on_the_global_batch(res)
    for method in ("simclr", "byol", "mocov3"):
        _training_step_equals_one_process(res, method)
    _momentum_network_and_queue_identical_on_every_rank(res)
    _two_process_run_resumes_exactly_and_only_with_two(tmp_path)
    _a_signal_to_one_rank_stops_both_after_the_same_step(res, tmp_path)


def _simclr_loss_and_gradients_equal_one_process_on_the_global_batch(res):
    z1, z2 = (z.clone().requires_grad_() for z in _embeddings())
    loss = nt_xent(z1, z2, 0.5)
    loss.backward()
    assert res[0]["nt_xent"][0] == pytest.approx(loss.item(), rel=1e-6) == res[1]["nt_xent"][0]
    # each rank's gradient is that of the sum of the ranks' losses; DDP divides by the world size
    got = torch.cat([r["nt_xent"][1] for r in res]) / WORLD
    torch.testing.assert_close(got, z1.grad, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(torch.cat([r["nt_xent"][2] for r in res]) / WORLD, z2.grad, atol=1e-6, rtol=1e-5)


def _mocov3_loss_and_gradients_equal_one_process_on_the_global_batch(res):
    q, k = (z.clone().requires_grad_() for z in _embeddings())
    loss = info_nce(q, k.detach(), 0.7)
    loss.backward()
    assert res[0]["info_nce"][0] == pytest.approx(loss.item(), rel=1e-6)
    torch.testing.assert_close(torch.cat([r["info_nce"][1] for r in res]) / WORLD, q.grad, atol=1e-6, rtol=1e-5)


def _training_step_equals_one_process(res, method):
    loss, weights, _ = _one_step(method)
    for r in res:
        assert r[method][2], "the gradients are not views of the flat buffer the step averages"
        assert r[method][0] == pytest.approx(loss, rel=1e-5)
        for name, w in weights.items():
            if w.is_floating_point() and "running" not in name:  # BN running stats are per rank (unused in training)
                torch.testing.assert_close(r[method][1][name], w, atol=1e-6, rtol=1e-5, msg=name)
    # the step moved the weights: the comparison above is of a trained step, not of the init twice
    torch.manual_seed(0)
    init = runspec.build_model(runspec.resolve(configs.PretrainConfig(**_tiny(method))))[0].state_dict()
    assert any(not torch.equal(init[k], weights[k]) for k in init if "running" not in k and init[k].is_floating_point())


def _momentum_network_and_queue_identical_on_every_rank(res):
    for name, p in res[0]["momentum"].items():
        if p.is_floating_point() and "running" not in name:  # weights (BN running stats are per-rank, unused in training)
            assert torch.equal(p, res[1]["momentum"][name]), name
    assert torch.equal(res[0]["queue"], res[1]["queue"]) and res[0]["queue"].abs().sum() > 0


def _a_signal_to_one_rank_stops_both_after_the_same_step(res, out):
    assert res[0]["stopped"][0] == res[1]["stopped"][0] == 2
    assert res[0]["stopped"][1].startswith("stopped by SIGTERM at step 2 of 4") and "--gpus 2" in res[0]["stopped"][1]
    a = torch.load(out / "full/checkpoints/last.pt", weights_only=False)
    b = torch.load(out / "stopped/checkpoints/last.pt", weights_only=False)
    assert b["step"] == 4 and all(torch.equal(v, b["model"][k]) for k, v in a["model"].items())


def _two_process_run_resumes_exactly_and_only_with_two(out):
    a = torch.load(out / "full/checkpoints/last.pt", weights_only=False)
    b = torch.load(out / "part/checkpoints/last.pt", weights_only=False)
    assert a["step"] == b["step"] == 4 and a["meta"]["world_size"] == 2 and a["meta"]["per_process_batch"] == 4
    for k, v in a["model"].items():
        assert torch.equal(v, b["model"][k]), k
    assert "2 process(es) x 4 images per process = global batch 8" in (out / "full/config.yaml").read_text()
    with pytest.raises(PipelineError, match="trained by 2 process"):
        cfg = runspec.config_for_run(None, {"max_steps": 0}, out / "full", True)
        pretrain.run(cfg, out / "full", resume=True, say=lambda *_: None)


def test_helpers_are_the_identity_in_one_process():
    x = torch.randn(3, 2)
    assert distributed.world_size() == 1 and distributed.rank() == 0 and distributed.is_main()
    assert distributed.gather_with_grad(x) is x and torch.equal(distributed.mean(x), x)
    assert distributed.setup(torch.device("cpu")) == torch.device("cpu")
