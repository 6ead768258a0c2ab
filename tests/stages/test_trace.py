"""Trace: jit.trace where torch.export fails, and why, recorded in trace.json; the traced graph equals the eager
Encoder at batch sizes it never saw; a trace older than encoder.pt, or truncated, is refused. (The torch.export path
itself is traced, checked and converted in tests/export/test_onnx.py and test_coreml.py.)"""

import json
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from export.encoder import load_encoder
from core import rundir
from pipeline.cli import main
from core.errors import PipelineError
from stages import trace as trace_stage
from stages.strip import StripConfig, encoder_path
from stages.strip import run as strip
from core.rundir import TRACE_INFO
from export.traced import load_traced
from stages.trace import TraceConfig
from tests.tiny_run import pretrain_tiny


def _stripped(tmp_path: Path, overrides: dict) -> Path:
    out = tmp_path / "run"
    pretrain_tiny(out, **{**overrides, "max_steps": 1})
    strip(StripConfig(), out, say=lambda *_: None)
    return out


def test_trace_falls_back_to_jit_and_refuses_stale_or_truncated_traces(tmp_path, tiny_overrides, monkeypatch):
    out = _stripped(tmp_path, tiny_overrides)
    encoder, _ = load_encoder(encoder_path(out))
    x = torch.rand(5, 3, 16, 16) * 255  # a batch size the trace never saw
    with torch.no_grad():
        ref = encoder(x)
    stale = out / rundir.EXPORT / "encoder.pt2"
    stale.write_bytes(b"a trace of the other kind, from an earlier run")

    # torch.export failing (simulated): the fallback is used, and why is recorded; the other kind's file goes
    def broken(*_args, **_kwargs):
        raise RuntimeError("data-dependent control flow\nsecond line")

    monkeypatch.setattr(trace_stage, "trace_with_export", broken)
    res = CliRunner().invoke(main, ["trace", "--run", str(out)])
    assert res.exit_code == 0, res.output
    assert "falling back to torch.jit.trace" in res.output
    info = json.loads((out / rundir.EXPORT / TRACE_INFO).read_text())
    assert info["method"] == "jit.trace" and "RuntimeError: data-dependent control flow" in info["reason"]
    assert info["input_shape"] == ["batch", 3, 16, 16] and info["output_shape"] == ["batch", 512]
    assert info["checked_batches"] == [2, 1, 3] and info["max_abs_diff"] <= 1e-5
    assert "second line" not in info["reason"]
    assert (out / rundir.EXPORT / "encoder.ts").is_file() and not (out / rundir.EXPORT / "encoder.pt2").exists()
    program, loaded = load_traced(out)
    assert loaded["method"] == "jit.trace" and isinstance(program, torch.jit.ScriptModule)
    with torch.no_grad():
        assert torch.allclose(program(x), ref, atol=1e-5)  # batch 5 through a trace made at batch 2

    with pytest.raises(PipelineError, match="torch.export failed.*--method jit"):
        trace_stage.run(TraceConfig(method="export"), out, say=lambda *_: None)
    with pytest.raises(PipelineError, match="example_batch must be >= 2"):
        trace_stage.run(TraceConfig(example_batch=1), out, say=lambda *_: None)

    # re-stripping makes the trace stale: export must not convert a graph of other weights
    strip(StripConfig(l2_normalize=False), out, say=lambda *_: None)
    with pytest.raises(PipelineError, match="older .*re-run `pipeline trace`"):
        load_traced(out)
    # a truncated trace is a one-line error, not a traceback
    trace_stage.run(TraceConfig(method="jit"), out, say=lambda *_: None)
    ts = out / rundir.EXPORT / "encoder.ts"
    ts.write_bytes(ts.read_bytes()[:1000])
    with pytest.raises(PipelineError, match="unreadable or truncated"):
        load_traced(out)


def test_trace_without_strip_is_a_one_line_error(tmp_path):
    (tmp_path / "run" / rundir.CHECKPOINTS).mkdir(parents=True)
    (tmp_path / "run" / rundir.LAST_CHECKPOINT).write_bytes(b"")  # pretrained, not stripped
    res = CliRunner().invoke(main, ["trace", "--run", str(tmp_path / "run")])
    assert res.exit_code == 2 and res.output.startswith("error: no stripped encoder") and len(res.output.splitlines()) == 1
    assert "`pipeline strip --run" in res.output
