"""Runs are safe: pretraining into a folder that holds a run needs --resume or --overwrite (which removes the old
run's files, never mixes them), --max-steps past the epochs is refused, and no command pairs a checkpoint with an
evaluation, export or parity result of an earlier one (core/provenance.py)."""

import json
import os
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from core import rundir
from pipeline.cli import main
from core.errors import PipelineError
from tests.cli_helpers import assert_one_line_error
from tests.tiny_run import TINY, pretrain_tiny


def _cli(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _flags(**over) -> list[str]:
    return [f"--{k.replace('_', '-')}={v}" for k, v in {**TINY, **over}.items()]


def _step_and_id(run: Path) -> tuple:
    import torch

    ckpt = torch.load(run / rundir.LAST_CHECKPOINT, weights_only=False)
    return ckpt["step"], ckpt["id"]


# ---------------------------------------------------------------- a folder that holds a run

def test_pretrain_into_a_run_is_refused_naming_both_ways_out(tmp_path):
    run = tmp_path / "run"
    pretrain_tiny(run, max_steps=1)
    before = (run / rundir.LAST_CHECKPOINT).read_bytes()
    res = _cli("pretrain", *_flags(max_steps=2), "--out", run)
    assert_one_line_error(res, f"{run} already holds a run (checkpoints/last.pt)", "--resume", "--overwrite")
    assert (run / rundir.LAST_CHECKPOINT).read_bytes() == before
    assert_one_line_error(_cli("pretrain", "--out", run, "--resume", "--overwrite"), "exclude each other")


def test_later_stages_alone_make_a_run_too(tmp_path):
    run = tmp_path / "run"
    (run / rundir.EXPORT).mkdir(parents=True)
    (run / rundir.REPORT).write_text("<html>")
    assert_one_line_error(_cli("pretrain", *_flags(max_steps=1), "--out", run), "already holds a run (export/, report.html)")


def test_what_a_pretraining_stopped_before_its_first_checkpoint_left_is_no_run(tmp_path):
    """config.yaml, split.json and metrics.jsonl without a checkpoint hold no work: a fresh pretrain starts there
    (the job service retries a job killed that early without --resume), and none of the old lines stays."""
    run = tmp_path / "run"
    run.mkdir()
    for name in (rundir.CONFIG, rundir.SPLIT, rundir.SKIPPED):
        (run / name).write_text("left by a killed run\n")
    (run / rundir.METRICS).write_text(json.dumps({"step": 99, "loss": 1.0}) + "\n")
    pretrain_tiny(run, max_steps=1)
    assert [json.loads(line)["step"] for line in (run / rundir.METRICS).read_text().splitlines()] == [1]
    assert not (run / rundir.SKIPPED).exists()


def test_overwrite_removes_the_old_runs_files_and_nothing_else(tmp_path):
    run = tmp_path / "run"
    pretrain_tiny(run, max_steps=1, save_every=1, epochs=1)
    _, old_id = _step_and_id(run)
    for rel in ("eval/linear.json", "export/encoder.onnx", "export/encoder.mlpackage/Manifest.json",
                "validate/parity.json", "report.html"):
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text("of the old run")
    (run / "notes.txt").write_text("the user's own file")
    res = _cli("pretrain", *_flags(max_steps=2), "--out", run, "--overwrite")
    assert res.exit_code == 0, res.output
    assert sorted(p.relative_to(run).as_posix() for p in run.rglob("*")) == [
        "checkpoints", "checkpoints/last.pt", "config.yaml", "metrics.jsonl", "notes.txt", "split.json"]
    step, new_id = _step_and_id(run)
    assert step == 2 and new_id != old_id


def test_a_removal_that_fails_part_way_puts_everything_back(tmp_path, monkeypatch):
    run = tmp_path / "run"
    for rel in ("report.html", "export/encoder.onnx", "eval/linear.json", "checkpoints/last.pt", "config.yaml"):
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_text(rel)
    real, calls = os.replace, []

    def failing(src, dst):
        calls.append(Path(src).name)
        if len(calls) == 3:  # the third entry: eval/, after report.html and export/ went
            raise PermissionError(13, "Permission denied", str(src))
        real(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(PipelineError, match="could not remove the old run .* it is intact"):
        rundir.remove_run(run)
    monkeypatch.undo()
    assert calls[:3] == ["report.html", "export", "eval"]  # later stages first
    assert sorted(p.relative_to(run).as_posix() for p in run.rglob("*") if p.is_file()) == [
        "checkpoints/last.pt", "config.yaml", "eval/linear.json", "export/encoder.onnx", "report.html"]


def test_a_removal_killed_before_its_delete_is_swept_next_time(tmp_path):
    run = tmp_path / "run"
    (run / (rundir.REMOVING + "abc") / "checkpoints").mkdir(parents=True)
    (run / rundir.CONFIG).write_text("x")
    rundir.remove_run(run)
    assert list(run.iterdir()) == []


# ---------------------------------------------------------------- --max-steps

def test_max_steps_past_the_epochs_is_refused_before_anything_is_written(tmp_path):
    run = tmp_path / "run"
    res = _cli("pretrain", *_flags(max_steps=11), "--out", run)  # TINY: 44 train images / 8 = 5 steps x 2 epochs
    assert_one_line_error(res, "--max-steps 11 is more than the 10 steps of 2 epochs (5 per epoch: 44 train images "
                               "in batches of 8): raise --epochs to 3, or lower --max-steps")
    assert not run.exists()


# ---------------------------------------------------------------- no stale result beside a new checkpoint

@pytest.fixture(scope="module")
def evaluated_and_exported(tmp_path_factory) -> Path:
    """A tiny run through linear-eval, strip, trace, export (ONNX) and validate, then trained on by one step: every
    later file now comes from the checkpoint before."""
    run = tmp_path_factory.mktemp("safety") / "run"
    pretrain_tiny(run, max_steps=1)
    for args in (["linear-eval"], ["export", "--to", "onnx"], ["validate", "--max-images", "8"], ["report"]):
        res = _cli(*args, "--run", run)
        assert res.exit_code == 0, res.output
    res = _cli("show", "--run", run)
    assert res.exit_code == 0 and f"report: {run / rundir.REPORT}\n" in res.output, res.output
    pretrain_tiny(run, resume=True, max_steps=2)
    return run


def _of(run: Path, name: str) -> str:
    return f"`pipeline {name} --run {run}`"


def test_validate_refuses_an_export_of_an_earlier_checkpoint(evaluated_and_exported):
    run = evaluated_and_exported
    before = (run / "validate" / "parity.json").read_bytes()
    assert_one_line_error(_cli("validate", "--run", run), f"{run / rundir.ENCODER} comes from an earlier checkpoint "
                          f"(step 1) than {run / rundir.LAST_CHECKPOINT} (step 2): run {_of(run, 'export')}")
    assert (run / "validate" / "parity.json").read_bytes() == before  # nothing rewritten


def test_show_and_report_refuse_results_of_an_earlier_checkpoint(evaluated_and_exported):
    run = evaluated_and_exported
    page = (run / rundir.REPORT).read_bytes()
    said = (f"{run}/eval/linear.json, {run}/export/encoder.json, {run}/validate/parity.json come from an earlier "
            f"checkpoint than {run / rundir.LAST_CHECKPOINT} (step 2): run {_of(run, 'linear-eval')} then "
            f"{_of(run, 'export')} then {_of(run, 'validate')}")
    assert_one_line_error(_cli("show", "--run", run), said)
    assert_one_line_error(_cli("report", "--run", run), said)
    assert (run / rundir.REPORT).read_bytes() == page


def test_trace_refuses_an_encoder_of_an_earlier_checkpoint(evaluated_and_exported):
    run = evaluated_and_exported
    assert_one_line_error(_cli("trace", "--run", run), f"{run / rundir.ENCODER} comes from an earlier checkpoint "
                          f"(step 1)", f"run {_of(run, 'strip')}")


def test_the_commands_named_make_the_run_whole_again(evaluated_and_exported, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(evaluated_and_exported, run, symlinks=True)
    res = _cli("export", "--to", "onnx", "--run", run)  # re-strips and re-traces first, as it says
    assert res.exit_code == 0 and "ran `pipeline strip` first" in res.output, res.output
    for args in (["linear-eval"], ["validate", "--max-images", "8"]):
        res = _cli(*args, "--run", run)
        assert res.exit_code == 0, res.output
    res = _cli("show", "--run", run)  # fresh results; the report page still shows the earlier checkpoint
    assert res.exit_code == 0, res.output
    assert res.output.rstrip().endswith(f"report: {run / rundir.REPORT} shows an earlier checkpoint: "
                                        f"{_of(run, 'report')} makes it again")
    recorded = {rel: json.loads((run / rel).read_text())["checkpoint"]
                for rel in ("eval/linear.json", "export/trace.json", "validate/parity.json")}
    sidecar = json.loads((run / "export" / "encoder.json").read_text())  # as in every artifact's metadata
    recorded["export/encoder.json"] = {"step": sidecar["step"], "id": sidecar["checkpoint_id"]}
    step, ckpt_id = _step_and_id(run)
    assert all(r["step"] == step and r["id"] == ckpt_id for r in recorded.values()), recorded

    sidecar = json.loads((run / "export" / "encoder.json").read_text())  # an export made after validate
    sidecar["artifacts"][0]["sha256"] = "0" * 64
    (run / "export" / "encoder.json").write_text(json.dumps(sidecar))
    assert_one_line_error(_cli("show", "--run", run), "validate/parity.json validated other artifacts than",
                          f"run {_of(run, 'validate')}")
