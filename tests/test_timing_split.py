"""benchmarks/timing_split.py: the split of a pretraining run's wall time that recipe_timing.sh reports."""
import json
import math
import subprocess
import sys

from tests.benchmark_scripts import load

timing_split = load("timing_split")

# Three windows of 10, 10 and 5 steps of batch 100: 2 s (capture in it), 1 s, 0.5 s; a loss line without img_s.
ROWS = [{"step": 10, "img_s": 500.0}, {"step": 10, "loss": 3.0}, {"step": 20, "img_s": 1000.0},
        {"step": 25, "img_s": 1000.0}]


def test_split_sums_the_windows_and_sets_the_first_apart():
    assert timing_split.split(ROWS, 100) == {"steps": 25, "train_s": 3.5, "first_s": 2.0, "img_s": 1000.0}


def test_split_of_a_run_with_one_window_has_no_steady_rate():
    assert timing_split.split(ROWS[:1], 100) == {"steps": 10, "train_s": 2.0, "first_s": 2.0, "img_s": 0.0}


def test_table_gives_medians_per_method_in_the_order_they_ran():
    rows = [{"method": "simclr", "wall_s": w, "steps": 25, "train_s": w - 2, "first_s": 1.0, "img_s": 900.0}
            for w in (10.0, 12.0, 30.0)] + [{"method": "byol", "wall_s": 8.0, "steps": 25, "train_s": None}]
    lines = timing_split.table(rows, "photos", "175", "512", "cuda").splitlines()
    assert lines[0] == "wall time of the whole command, photos, 175 epochs, batch 512, cuda"
    simclr, byol = lines[2].split(), lines[3].split()
    assert simclr == ["simclr", "3", "25", "12.0", "10.0", "30.0", "10.0", "1.0", "900", "2.0"]
    assert byol[0] == "byol" and all(math.isnan(float(v)) for v in byol[6:])  # its split failed: no made-up numbers


def test_split_from_the_command_line_is_one_json_objects_fields(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    out = subprocess.run([sys.executable, timing_split.__file__, "split", str(metrics), "100"],
                         capture_output=True, text=True, check=True).stdout
    assert json.loads("{" + out + "}") == {"steps": 25, "train_s": 3.5, "first_s": 2.0, "img_s": 1000.0}


def test_an_unknown_verb_fails_with_one_line():
    done = subprocess.run([sys.executable, timing_split.__file__, "splt", "x.jsonl", "100"],
                          capture_output=True, text=True)
    assert done.returncode != 0 and done.stderr.strip() == "timing_split: unknown verb 'splt': split or table"
