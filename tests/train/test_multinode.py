"""Several hosts: `torchrun --nnodes 2 --node-rank R --rdzv-endpoint HOST:PORT -m pipeline pretrain ...`, as a user
launches it across machines (docs/multi-gpu.md), played here by two CPU processes over gloo on loopback, one
per "node". The two-node run equals the one-node two-process run (`--gpus 2`) loss for loss and weight for weight,
only global rank 0 writes, and a two-node run stopped early and resumed ends where the uninterrupted run does."""

import json
import os
import socket
import subprocess
import sys

import torch

ARGS = ["pretrain", "--data", "synthetic:40", "--image-size", "8", "--batch-size", "8", "--epochs", "1",
        "--proj-hidden-dim", "16", "--proj-dim", "8", "--device", "cpu", "--num-workers", "0", "--augment", "cpu",
        "--log-every", "1", "--seed", "0"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_nodes(outs, *extra):
    """Node ranks 0 and 1, each a torchrun of one process, meeting at a loopback endpoint (static rendezvous:
    torchrun's default, where --node-rank decides the ranks)."""
    port = _free_port()
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--node-rank", str(r),
                               "--nproc-per-node", "1", "--rdzv-endpoint", f"127.0.0.1:{port}", "-m", "pipeline",
                               *ARGS, "--out", str(out), *extra],
                              env=ENV, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r, out in enumerate(outs)]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], logs


def _losses(run):
    return [json.loads(line)["loss"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def _weights(run):
    return torch.load(run / "checkpoints" / "last.pt", weights_only=False)["model"]


def test_two_nodes_equal_one_node_and_resume_exactly(tmp_path):
    one_node = tmp_path / "one-node"
    res = subprocess.run([sys.executable, "-m", "pipeline", *ARGS, "--gpus", "2", "--out", str(one_node)], env=ENV,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr

    shared, other = tmp_path / "shared", tmp_path / "node1-local"
    _two_nodes([shared, other], "--max-steps", "2")  # node 1 is given its own folder: it must write nothing there
    assert not [p for p in other.rglob("*") if p.is_file()]
    assert _losses(shared) == _losses(one_node)[:2]

    _two_nodes([shared, shared], "--resume", "--max-steps", "0")  # every node reads the checkpoint: a shared folder
    assert _losses(shared) == _losses(one_node)
    a, b = _weights(shared), _weights(one_node)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
