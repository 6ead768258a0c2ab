"""A run killed after its last checkpoint and resumed holds each step once in metrics.jsonl: the lines logged past
the checkpoint (those steps are trained again) and a line cut off by the kill are dropped before training goes on."""

from __future__ import annotations

import json

from core import rundir
from tests.tiny_run import pretrain_tiny


def test_a_resumed_run_logs_each_step_once(tmp_path):
    out = tmp_path / "run"
    pretrain_tiny(out, max_steps=5, checkpoint_every_s=0)  # last.pt at step 5 (one 5-step epoch)
    metrics = out / rundir.METRICS
    logged = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    assert logged == [1, 2, 3, 4, 5]
    # what a run killed at step 8 leaves: three more lines than its checkpoint, the last one half written
    with open(metrics, "a") as f:
        for step in (6, 7):
            f.write(json.dumps({"step": step, "epoch": 1, "loss": 9.0, "lr": 0.1, "img_s": 1.0, "data_wait": 0}) + "\n")
        f.write('{"step": 8, "epo')
    pretrain_tiny(out, resume=True, max_steps=0)
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, 11))
    assert all(r["loss"] != 9.0 for r in records)  # the retrained steps' own losses, not the dropped lines'
