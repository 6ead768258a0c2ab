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
