"""`pipeline bench` on the CPU: one JSON object with consistent numbers, the table, one-line errors; and the
`--gpus` launcher's argument hand-over."""

import json

import pytest
from click.testing import CliRunner

from pipeline import cli
from train import distributed

TINY = ["--device", "cpu", "--image-size", "16", "--batch-size", "8", "--warmup", "1", "--windows", "2",
        "--window-steps", "1"]


def test_bench_json_on_cpu():
    res = CliRunner().invoke(cli.main, ["bench", *TINY, "--augment", "device", "--json"])
    assert res.exit_code == 0, res.output
    r = json.loads(res.output.strip().splitlines()[-1])
    assert (r["augment"], r["processes"], r["batch_size"], r["device"]) == ("device", 1, 8, "cpu")
    assert r["e2e_img_s"] > 0 and r["ceiling_img_s"] > 0 and r["peak_mem_gib"] > 0
    assert r["ratio"] == pytest.approx(r["e2e_img_s"] / r["ceiling_img_s"], rel=1e-2)
    assert 0 <= r["data_wait_pct"] <= 100 and r["augment_ms_per_step"] > 0 and r["setup_s"] > 0
    assert len(r["windows"]["e2e_img_s"]) == len(r["windows"]["ceiling_img_s"]) == 2


def test_bench_table_for_the_cpu_worker_recipe_and_bad_options():
    res = CliRunner().invoke(cli.main, ["bench", *TINY, "--augment", "cpu", "--num-workers", "0"])
    assert res.exit_code == 0, res.output
    assert "augment cpu" in res.output and "end-to-end" in res.output and "model-step ceiling" in res.output
    for bad, msg in [(["--windows", "0"], "--windows"), (["--window-steps", "0"], "--window-steps"),
                     (["--warmup", "-1"], "--warmup"), (["--batch-size", "1"], "--batch-size"),
                     (["--image-size", "4"], "image size 4 is impossible")]:
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
    assert "--batch-size=16" in args and "--compile" in args and "--no-sync-bn" in args  # core.config.as_flags
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


def test_trace_summary_merges_overlapping_kernels_and_names_the_main_stream():
    """Two streams overlapping for 2 us of 10 us wall, a host sync of 3 us: every number is checkable by hand."""
    from stages.bench import summarize_trace

    k = lambda name, ts, dur, stream: {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur,  # noqa: E731
                                      "args": {"stream": stream}}
    events = [
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0.0, "dur": 1.0},
        k("conv", 1.0, 4.0, 7), k("colour", 3.0, 3.0, 20), k("conv", 8.0, 2.0, 7),
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 6.0, "dur": 3.0},
    ]
    s = summarize_trace(events, steps=1)
    assert s["wall_ms_per_step"] == pytest.approx(0.010)  # 0 .. 10 us
    assert s["gpu_ms_per_step"] == pytest.approx(0.007)  # 1..6 and 8..10
    assert s["gpu_busy_pct"] == pytest.approx(70.0)
    assert s["host_wait_ms_per_step"] == pytest.approx(0.003)
    assert s["stream_kernel_ms_per_step"] == {"main": pytest.approx(0.006), "stream 20": pytest.approx(0.003)}
    assert list(s["top_kernels_ms_per_step"]) == ["conv", "colour"]
    assert s["kernel_families_ms_per_step"] == {"convolution": pytest.approx(0.006), "other": pytest.approx(0.003)}
    assert summarize_trace([], steps=1) == {}


@pytest.mark.parametrize("name, family", [
    # names as an H200's profiles of the backbones print them
    ("sm90_xmma_dgrad_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128", "convolution"),
    ("void cudnn::cnn::wgrad2d_grouped_direct_kernel<false", "convolution"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4", "attention"),
    ("nvjet_sm90_tst_192x192_64x3_1x2_h_bz_coopB_NNN", "matrix product"),
    ("void at::native::batch_norm_backward_reduce_channels_last_kernel<4", "BatchNorm"),
    ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<float", "layer norm"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda", "copy"),
    ("void at::native::vectorized_elementwise_kernel<8, at::native::CUDAFunctor_add<c10::BFloat16>", "elementwise"),
    ("void at::native::reduce_kernel<128, 4, at::native::ReduceOp<c10::BFloat16", "reduction, softmax"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<TensorListMetadata<3>", "multi-tensor (optimizer, momentum update)"),
    ("triton_per_fused__native_batch_norm_legit_functional_relu_0", "compiled (Triton)"),
    ("some_new_kernel", "other"),
])
def test_kernel_families_name_each_kernel_by_the_first_pattern_it_matches(name, family):
    from stages.bench import kernel_family

    assert kernel_family(name) == family


def test_a_trace_memcpy_is_a_copy_whatever_its_name():
    from stages.bench import kernel_family

    assert kernel_family("Memcpy HtoD (Pinned -> Device)", "gpu_memcpy") == "copy"
    assert kernel_family("Memset (Device)", "gpu_memset") == "copy"


def test_profile_needs_cuda():
    res = CliRunner().invoke(cli.main, ["bench", *TINY, "--profile", "/tmp/never-written"])
    assert res.exit_code == 2 and "--profile records CUDA kernels" in res.output


def test_profile_phase_writes_a_trace_and_times_the_steps(tmp_path):
    """The profiler plumbing end to end (on the CPU there are no kernels to count, only the wall and the trace)."""
    import torch

    from stages.bench import profile_phase

    x = torch.randn(64, 64)
    r = profile_phase(lambda: x @ x, 3, torch.device("cpu"), tmp_path / "p" / "trace.json")
    assert (tmp_path / "p" / "trace.json").is_file() and not list((tmp_path / "p").glob("*.tmp"))
    assert r["wall_ms_per_step"] > 0 and r["gpu_busy_pct"] == 0.0 and r["trace"].endswith("trace.json")
