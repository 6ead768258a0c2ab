"""`pipeline bench` on the CPU: one JSON object with consistent numbers, the table, one-line errors; and the
`--gpus` launcher's argument hand-over."""

import json

import pytest
from click.testing import CliRunner

from pipeline import cli
from stages import distributed

TINY = ["--device", "cpu", "--image-size", "16", "--batch-size", "8", "--warmup", "1", "--windows", "2",
        "--window-steps", "1"]


def test_bench_json_on_cpu():
    res = CliRunner().invoke(cli.main, ["bench", *TINY, "--augment", "device", "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.output.strip().splitlines()[-1])
    assert (r["augment"], r["processes"], r["batch_size"], r["device"]) == ("device", 1, 8, "cpu")
    assert r["e2e_img_s"] > 0 and r["ceiling_img_s"] > 0 and r["peak_mem_gib"] > 0
    assert r["ratio"] == pytest.approx(r["e2e_img_s"] / r["ceiling_img_s"], rel=1e-2)
    assert 0 <= r["data_wait_pct"] <= 100 and r["augment_ms_per_step"] > 0
    assert len(r["windows"]["e2e_img_s"]) == len(r["windows"]["ceiling_img_s"]) == 2


def test_bench_table_for_the_cpu_worker_recipe_and_bad_options():
    res = CliRunner().invoke(cli.main, ["bench", *TINY, "--augment", "cpu", "--num-workers", "0"])
    assert res.exit_code == 0, res.output
    assert "augment cpu" in res.output and "end-to-end" in res.output and "model-step ceiling" in res.output
    for bad, msg in [(["--windows", "0"], "--windows"), (["--image-size", "4"], "image size 4 is impossible")]:
        res = CliRunner().invoke(cli.main, ["bench", *TINY, *bad])
        assert res.exit_code == 2 and msg in res.output and len(res.output.strip().splitlines()) == 1


def test_gpus_hands_the_same_options_to_torchrun(monkeypatch, tmp_path):
    seen = {}
    monkeypatch.setattr(distributed, "launch", lambda n, args, device: seen.update(n=n, args=args, device=device) or 0)
    res = CliRunner().invoke(cli.main, ["pretrain", "--gpus", "2", "--device", "cpu", "--batch-size", "16",
                                        "--compile", "--no-sync-bn", "--out", str(tmp_path / "r")])
    assert res.exit_code == 0, res.output
    assert seen["n"] == 2 and seen["device"] == "cpu"
    args = seen["args"]
    assert args[0] == "pretrain" and "--gpus" not in args
    assert args[args.index("--batch-size") + 1] == "16" and "--compile" in args and "--no-sync-bn" in args
    assert args[args.index("--out") + 1] == str(tmp_path / "r")
    cmd = distributed.torchrun_command(2, args)
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"] and cmd[5:8] == ["-m", "pipeline", "pretrain"]


def test_gpus_needs_gpus(monkeypatch):
    monkeypatch.setattr(distributed.torch.cuda, "is_available", lambda: False)
    res = CliRunner().invoke(cli.main, ["bench", "--gpus", "2", "--device", "cuda"])
    assert res.exit_code == 2 and "needs CUDA GPUs" in res.output


def test_gpu_windows_wait_for_the_rate_to_settle(monkeypatch):
    """On an accelerator, untimed windows run until two in a row agree (here at once: every step takes 1 tick)."""
    from stages import bench

    clock = {"t": 0.0, "calls": 0}

    def step():
        clock["t"] += 1.0
        clock["calls"] += 1
        return 0.25

    monkeypatch.setattr(bench.time, "perf_counter", lambda: clock["t"])
    out = bench._windows(step, warmup=3, windows=4, steps=5, device=bench.torch.device("meta"))
    assert out == [(5.0, 1.25)] * 4
    assert clock["calls"] == 3 + 2 * 5 + 4 * 5  # warm-up, two settling windows that agree, the timed windows
