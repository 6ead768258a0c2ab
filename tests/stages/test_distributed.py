"""Two CPU processes over gloo, as torchrun would start them: the contrastive losses equal the one-process loss of
the same global batch (and so do the gradients DDP averages), momentum networks stay identical on every rank,
and a 2-process run resumes exactly. One spawn runs every scenario (starting processes is the costly part)."""

import os
import socket
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pipeline.device import precision_for
from pipeline.errors import PipelineError
from stages import configs, distributed, pretrain, runspec
from stages.methods.mocov3 import info_nce
from stages.methods.simclr import nt_xent

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

    # the methods' forward (eval-mode BatchNorm: per-image, so shards see what the whole batch sees) under DDP
    for method in ("simclr", "mocov3"):
        torch.manual_seed(0)
        model, _ = runspec.build_model(runspec.resolve(configs.PretrainConfig(**_tiny(method))))
        model.eval()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        x1, x2 = (x[rank * 4:(rank + 1) * 4] for x in _views())
        loss = ddp(x1, x2, precision_for(torch.device("cpu")))
        loss.backward()
        res[method] = (distributed.mean(loss).item(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None})

    # 2-process pretraining: uninterrupted vs stopped after 3 steps and resumed; momentum networks per rank
    run = _tiny("mocov3", queue_size=8)
    for name, overrides, resume in [("full", run, False), ("part", {**run, "max_steps": 2}, False), ("part", {"max_steps": 0}, True)]:
        cfg = runspec.config_for_run(None, overrides, out / name, resume)
        done = pretrain.run(cfg, out / name, resume=resume, say=lambda *_: None)
        dist.barrier()  # rank 0's checkpoint is on disk before anyone reads it
    res["momentum"] = {k: v.clone() for k, v in done["model"].momentum_backbone.state_dict().items()}
    res["queue"] = done["model"].queue.buffer.clone()
    torch.save(res, out / f"rank{rank}.pt")
    dist.destroy_process_group()


def test_two_gloo_processes(tmp_path):
    """One spawn, every check (pytest-xdist would run a shared fixture once per worker)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(port, tmp_path), nprocs=WORLD, join=True)
    res = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    _simclr_loss_and_gradients_equal_one_process_on_the_global_batch(res)
    _mocov3_loss_and_gradients_equal_one_process_on_the_global_batch(res)
    for method in ("simclr", "mocov3"):
        _method_forward_under_ddp_equals_one_process(res, method)
    _momentum_network_and_queue_identical_on_every_rank(res)
    _two_process_run_resumes_exactly_and_only_with_two(tmp_path)


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


def _method_forward_under_ddp_equals_one_process(res, method):
    torch.manual_seed(0)
    model, _ = runspec.build_model(runspec.resolve(configs.PretrainConfig(**_tiny(method))))
    model.eval()
    loss = model(*_views(), precision_for(torch.device("cpu")))
    loss.backward()
    assert res[0][method][0] == pytest.approx(loss.item(), rel=1e-5)
    for name, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(res[0][method][1][name], p.grad, atol=1e-5, rtol=1e-4)


def _momentum_network_and_queue_identical_on_every_rank(res):
    for name, p in res[0]["momentum"].items():
        if p.is_floating_point() and "running" not in name:  # weights (BN running stats are per-rank, unused in training)
            assert torch.equal(p, res[1]["momentum"][name]), name
    assert torch.equal(res[0]["queue"], res[1]["queue"]) and res[0]["queue"].abs().sum() > 0


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
