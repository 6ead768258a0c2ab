"""The CLI's promise: bad input is one line on stderr and exit status 2, never a traceback."""

import pytest
from click.testing import CliRunner

from pipeline.cli import main


@pytest.mark.parametrize("args,msg", [
    (["pretrain", "--data", "imagenet:/x", "--out", "{tmp}/r"], "unknown data SPEC"),
    (["pretrain", "--data", "folder:/no/such/dir", "--out", "{tmp}/r"], "folder does not exist"),
    (["pretrain", "--data", "synthetic:8", "--batch-size", "64", "--image-size", "16", "--device", "cpu", "--out", "{tmp}/r"], "larger than the"),
    (["pretrain", "--config", "{tmp}/missing.yaml", "--out", "{tmp}/r"], "config file not found"),
    (["show", "--run", "{tmp}/nothing"], "does not exist"),
    (["linear-eval", "--run", "{tmp}"], "no checkpoint"),
    (["strip", "--run", "{tmp}"], "checkpoint"),
])
def test_bad_input_is_one_line(tmp_path, args, msg):
    result = CliRunner().invoke(main, [a.replace("{tmp}", str(tmp_path)) for a in args])
    assert result.exit_code == 2, result.output
    lines = [l for l in result.output.splitlines() if l.strip()]
    assert lines[-1].startswith("error: ") and msg in lines[-1], result.output
    assert "Traceback" not in result.output


def test_unknown_flag_is_refused():
    result = CliRunner().invoke(main, ["pretrain", "--no-such-flag", "1"])
    assert result.exit_code == 2 and "No such option" in result.output


def test_command_without_run_says_which_run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["show"])
    assert result.exit_code == 2 and "runs/default" in result.output


def test_doctor_reports_devices_and_coreml():
    result = CliRunner().invoke(main, ["doctor"])
    assert result.exit_code == 0, result.output
    assert "device cpu" in result.output and "Core ML predict:" in result.output


# Lines the project itself prints; anything else in these commands' output is another library's noise.
DOCTOR_LINES = ("python ", "torch ", "torchvision ", "coremltools ", "onnx ", "onnxruntime ", "device ", "auto picks: ",
                "Core ML predict: ")
EXPORT_LINES = ("ran `pipeline strip` first", "ran `pipeline trace` first", "writing encoder.", "wrote ")


def _pipeline(*args, env=None):
    import os
    import subprocess
    import sys

    env = {k: v for k, v in {**os.environ, **(env or {})}.items() if k != "TQDM_DISABLE"}  # bars as a user sees them
    res = subprocess.run([sys.executable, "-m", "pipeline", *map(str, args)], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    return [line for line in (res.stdout + res.stderr).splitlines() if line.strip()]


def test_doctor_prints_only_its_own_lines():
    lines = _pipeline("doctor")
    foreign = [line for line in lines if not line.startswith(DOCTOR_LINES)]
    assert not foreign, foreign


def test_export_right_after_pretrain_strips_traces_and_prints_only_its_own_lines(tmp_path, tiny_overrides):
    """The card's `pipeline export --to coreml` works on a run that was only pretrained: strip and trace run first,
    one line each; coremltools' import chatter and progress bars do not reach the user."""
    import os

    from tests.tiny_run import pretrain_tiny

    run = tmp_path / "run"
    pretrain_tiny(run, max_steps=1)
    lines = _pipeline("export", "--to", "coreml", "--run", run)
    assert [line for line in lines if not line.startswith(EXPORT_LINES)] == []
    assert lines[0].startswith("ran `pipeline strip` first (no ") and lines[1].startswith("ran `pipeline trace` first")
    assert (run / "export" / "encoder.mlpackage").is_dir() and (run / "export" / "encoder.mlmodel").is_file()

    encoder = run / "export" / "encoder.pt"  # older than the checkpoint, but stripped from it: not stale
    earlier = (run / "checkpoints" / "last.pt").stat().st_mtime - 5
    os.utime(encoder, (earlier, earlier))
    res = CliRunner().invoke(main, ["export", "--to", "onnx", "--run", str(run)])
    assert res.exit_code == 0 and "ran `pipeline" not in res.output, res.output
    pretrain_tiny(run, resume=True, max_steps=2)  # a new checkpoint: the encoder.pt is of an earlier one
    res = CliRunner().invoke(main, ["export", "--to", "onnx", "--run", str(run)])
    assert res.exit_code == 0, res.output
    assert "ran `pipeline strip` first" in res.output and "comes from an earlier checkpoint" in res.output
    res = CliRunner().invoke(main, ["export", "--to", "onnx", "--run", str(run)])  # now up to date: nothing re-run
    assert res.exit_code == 0 and "ran `pipeline" not in res.output, res.output


def test_coreml_conversion_bars_are_off_inside_and_restored_after():
    import tqdm

    from core.quiet import CONVERSION_BARS, conversion_bars_off, import_coremltools

    import_coremltools()
    import importlib

    with conversion_bars_off():
        for module, attr in CONVERSION_BARS:
            assert getattr(importlib.import_module(module), attr)(range(2)).disable, module
    for module, attr in CONVERSION_BARS:
        assert getattr(importlib.import_module(module), attr) is tqdm.tqdm
