"""A bad input is one line, at once: data errors and missing inputs answer before torch is imported, name the path
(and the files skipped), name the command to run next, and leave no run folder behind; click's own usage errors
are one line too. The 1 s target itself is measured by benchmarks/error_latency.py; here the slack is generous."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.cli_helpers import assert_one_line_error, cli

ROOT = Path(__file__).resolve().parents[2]
SLACK_S = 5.0  # torch's import alone takes longer than this on the 2-core machine; the target is 1 s
TORCH_MARK = "torch imported: "
# The CLI in a fresh interpreter, reporting at exit whether torch was imported on the way to the error.
PROBE = ("import atexit, sys\n"
         f"atexit.register(lambda: print({TORCH_MARK!r} + str('torch' in sys.modules), file=sys.stderr))\n"
         "from pipeline.cli import main\n"
         "main(sys.argv[1:], prog_name='pipeline')\n")


def pipeline(*args, cwd: Path) -> tuple[int, list[str], bool, float]:
    """(exit status, the output's lines without the probe's, whether torch was imported, seconds)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    start = time.perf_counter()
    res = subprocess.run([sys.executable, "-c", PROBE, *map(str, args)], capture_output=True, text=True, cwd=cwd, env=env)
    took = time.perf_counter() - start
    lines = [line for line in (res.stdout + res.stderr).splitlines() if line.strip()]
    marks = [line for line in lines if line.startswith(TORCH_MARK)]
    assert len(marks) == 1, lines
    return res.returncode, [line for line in lines if not line.startswith(TORCH_MARK)], marks[0].endswith("True"), took


def assert_fast_one_line(tmp_path: Path, args: list, *needles: str) -> str:
    code, lines, torch_loaded, took = pipeline(*args, cwd=tmp_path)
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), lines
    for needle in needles:
        assert needle in lines[0], lines[0]
    assert not torch_loaded, f"torch was imported before the error: {lines[0]}"
    assert took < SLACK_S, f"{took:.1f} s: {lines[0]}"
    return lines[0]


def _png(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((12, 12, 3), 200, dtype=np.uint8)).save(path)


def data_cases(tmp: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (data SPEC, what its one line must name): every way a SPEC can give no image, made on disk."""
    (tmp / "empty").mkdir()
    (tmp / "a_file").write_text("x")
    for c in ("cats", "dogs"):
        (tmp / "empty_classes" / c).mkdir(parents=True)
    (tmp / "no_images").mkdir()
    for name in ("a.txt", "b.txt", "c.json", "d.csv", "e.md", "f.heic"):
        (tmp / "no_images" / name).write_text("not an image")
    for c in ("cats", "dogs"):
        (tmp / "unreadable" / c).mkdir(parents=True)
        (tmp / "unreadable" / c / "1.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    return {
        "missing folder": (f"folder:{tmp / 'nowhere'}", ["folder does not exist", str(tmp / "nowhere")]),
        "a file": (f"folder:{tmp / 'a_file'}", ["must be a directory", str(tmp / "a_file")]),
        "empty folder": (f"folder:{tmp / 'empty'}", ["no usable images", str(tmp / "empty"), "it is empty"]),
        "empty class folders": (f"folder:{tmp / 'empty_classes'}", ["no usable images", "(cats, dogs) hold no files"]),
        # six files skipped: the first three named, the rest counted
        "no images": (f"folder:{tmp / 'no_images'}", ["6 files skipped", "a.txt (not an image Pillow reads)",
                                                       "b.txt", "c.json", "and 3 more", str(tmp / "no_images")]),
        "unreadable images": (f"folder:{tmp / 'unreadable'}", ["2 files skipped", "cats/1.jpg", "dogs/1.jpg"]),
        "missing cifar": (f"cifar10:{tmp / 'nowhere'}", ["path does not exist", str(tmp / "nowhere")]),
        "bad synthetic": ("synthetic:many", ["integer N"]),
        "unknown kind": ("imagenet:/x", ["unknown data SPEC"]),
    }


CASES = ["missing folder", "a file", "empty folder", "empty class folders", "no images", "unreadable images",
         "missing cifar", "bad synthetic", "unknown kind"]


@pytest.mark.parametrize("case", CASES)
def test_pretrain_data_errors_are_one_fast_line_before_torch_and_leave_no_folder(tmp_path, case):
    spec, needles = data_cases(tmp_path)[case]
    out = tmp_path / "runs" / "new"
    assert_fast_one_line(tmp_path, ["pretrain", "--data", spec, "--out", out], *needles)
    assert not out.exists() and not (tmp_path / "runs").exists()


def run_and_side_cases(tmp: Path) -> dict[str, tuple[list[str], list[str]]]:
    """name -> (arguments, what its one line must name), run from `tmp`: what needs neither torch nor the images.
    A second `pipeline pretrain` into the same folder (`held`, made here), the two ways of going on from it, and
    an image side the backbone cannot take, for pretrain and for bench. None may leave `new` behind."""
    (tmp / "held" / "checkpoints").mkdir(parents=True)
    (tmp / "held" / "checkpoints" / "last.pt").write_bytes(b"kept")
    data, new = ["--data", "synthetic:64"], ["pretrain", "--out", "new"]
    return {
        "pretrain: holds a run": (["pretrain", "--out", "held", *data],
                                  ["held already holds a run (checkpoints/last.pt)", "--resume", "--overwrite"]),
        "pretrain: resume and overwrite": (["pretrain", "--out", "held", "--resume", "--overwrite", *data],
                                           ["exclude each other"]),
        "pretrain: resume, no checkpoint": ([*new, "--resume", *data],
                                            ["--resume: no checkpoint at new/checkpoints/last.pt"]),
        "pretrain: ViT side": ([*new, "--backbone", "vit_t_16", "--image-size", "30", *data],
                               ["image size 30 is not a multiple of vit_t_16's patch 4 (small stem): use 28 or 32"]),
        "pretrain: mobile net side": ([*new, "--backbone", "mobilenet_v3_small", "--image-size", "8", *data],
                                      ["image size 8 is impossible for mobilenet_v3_small with the small stem: "
                                       "use 16..1024"]),
        "bench: ViT side": (["bench", "--backbone", "vit_s_16", "--image-size", "31"],
                            ["not a multiple of vit_s_16's patch 4"]),
        "bench: impossible side": (["bench", "--image-size", "7"], ["image size 7 is impossible for resnet18"]),
    }


RUN_AND_SIDE = ["pretrain: holds a run", "pretrain: resume and overwrite", "pretrain: resume, no checkpoint",
                "pretrain: ViT side", "pretrain: mobile net side", "bench: ViT side", "bench: impossible side"]


@pytest.mark.parametrize("case", RUN_AND_SIDE)
def test_run_folder_and_image_side_errors_come_before_torch(tmp_path, case):
    args, needles = run_and_side_cases(tmp_path)[case]
    assert_fast_one_line(tmp_path, args, *needles)
    assert not (tmp_path / "new").exists() and (tmp_path / "held" / "checkpoints" / "last.pt").read_bytes() == b"kept"


def test_linear_eval_data_errors_come_before_torch(tmp_path):
    """--data of linear-eval, and the run's own recorded data gone since pretraining."""
    spec, needles = data_cases(tmp_path)["no images"]
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.pt").write_bytes(b"")  # present: only the data is wrong
    assert_fast_one_line(tmp_path, ["linear-eval", "--run", run, "--data", spec], *needles)
    (run / "config.yaml").write_text(f"data: folder:{tmp_path / 'gone'}\n")
    assert_fast_one_line(tmp_path, ["linear-eval", "--run", run], "folder does not exist", str(tmp_path / "gone"))
    assert_fast_one_line(tmp_path, ["validate", "--run", run], "nothing exported yet", "`pipeline export --run")


def test_validate_images_folder_without_images(tmp_path):
    run = tmp_path / "run"
    (run / "export").mkdir(parents=True)
    (run / "export" / "encoder.pt").write_bytes(b"")
    (run / "export" / "encoder.json").write_text("{}")
    (tmp_path / "photos").mkdir()
    (tmp_path / "photos" / "notes.txt").write_text("x")
    assert_fast_one_line(tmp_path, ["validate", "--run", run, "--images", tmp_path / "photos"],
                         "--images", "no readable images", "notes.txt")


@pytest.mark.parametrize("stage, have, next_command", [
    ("linear-eval", [], "pipeline pretrain --out {run}"),
    ("strip", [], "pipeline pretrain --out {run}"),
    ("trace", [], "pipeline pretrain --out {run}"),
    ("export", [], "pipeline pretrain --out {run}"),
    ("validate", [], "pipeline pretrain --out {run}"),
    ("trace", ["checkpoints/last.pt"], "pipeline strip --run {run}"),
    ("validate", ["checkpoints/last.pt"], "pipeline export --run {run}"),  # export runs strip and trace itself
    ("validate", ["checkpoints/last.pt", "export/encoder.pt"], "pipeline export --run {run}"),
])
def test_missing_input_names_the_command_to_run_next(tmp_path, stage, have, next_command):
    run = tmp_path / "run"
    run.mkdir()
    for rel in have:
        (run / rel).parent.mkdir(parents=True, exist_ok=True)
        (run / rel).write_bytes(b"")
    assert_fast_one_line(tmp_path, [stage, "--run", run], f"run `{next_command.format(run=run)}` first")


def test_the_default_run_is_named_without_flags(tmp_path):
    (tmp_path / "runs" / "default").mkdir(parents=True)
    code, lines, torch_loaded, _ = pipeline("validate", cwd=tmp_path)
    assert code == 2 and not torch_loaded
    assert lines == ["using run runs/default",
                     "error: no checkpoint at runs/default/checkpoints/last.pt: run `pipeline pretrain` first"]


def test_show_names_the_next_command(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    assert_fast_one_line(tmp_path, ["show", "--run", run], f"`pipeline pretrain --out {run}`")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "last.pt").write_bytes(b"")
    assert_fast_one_line(tmp_path, ["show", "--run", run], f"`pipeline linear-eval --run {run}`")


def test_a_missing_run_folder_says_how_it_is_made(tmp_path):
    assert_fast_one_line(tmp_path, ["strip", "--run", tmp_path / "typo"], "does not exist",
                         f"`pipeline pretrain --out {tmp_path / 'typo'}` makes it")


@pytest.mark.parametrize("args, where", [
    (["pretrain", "--no-such-flag", "1"], "pipeline pretrain"),
    (["pretrain", "--method", "dino"], "pipeline pretrain"),
    (["pretrain", "--epochs"], "pipeline pretrain"),  # click gives this one no context: the command is named anyway
    (["pretrain", "--epochs", "ten"], "pipeline pretrain"),
    (["export", "--to", "tflite"], "pipeline export"),
    (["linear-eval", "--knn-k", "x"], "pipeline linear-eval"),
    (["pretrian"], "pipeline"),
    (["--verbose"], "pipeline"),
])
def test_click_usage_errors_are_one_line(args, where):
    assert_one_line_error(cli(*args), f"See `{where} --help`.")


def test_bare_pipeline_prints_its_help_and_a_wrong_command_one_line():
    res = cli()
    assert "Commands:" in res.output and "pretrain" in res.output  # asked for by typing nothing: not an error line
    assert_one_line_error(cli("pretrian"), "No such command 'pretrian'", "See `pipeline --help`.")


def test_an_error_after_the_data_is_read_leaves_no_folder(tmp_path):
    """Found only once torch has the images (a batch larger than the train split): still no folder left."""
    out = tmp_path / "new"
    res = cli("pretrain", "--data", "synthetic:8", "--batch-size", "64", "--image-size", "16", "--device", "cpu",
              "--out", out)
    assert_one_line_error(res, "larger than the")
    assert not out.exists()
