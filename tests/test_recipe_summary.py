"""benchmarks/recipe_summary.py --pairs and --groups: the comparisons of two variants a compile default rests on
(seed by seed, and every seed of each side unpaired); and the folder forms' one line for a path that is no grid's."""
import json
import subprocess
import sys

import pytest

from tests.benchmark_scripts import load

recipe_summary = load("recipe_summary")


def row(backbone, method, seed, variant, knn, **extra):
    return {"backbone": backbone, "dataset": "textures", "method": method, "seed": str(seed), "variant": variant,
            "knn_top1": knn, **extra}


ROWS = [row("b1", "m", 0, "eager", 80.0), row("b1", "m", 0, "compiled", 78.0),
        row("b1", "m", 1, "eager", 82.0), row("b1", "m", 1, "compiled", 83.0),
        row("b1", "m", 2, "eager", 81.0),  # its compiled run failed: no pair
        row("b1", "m", 2, "compiled", 0.0, failed="pretrain"),
        row("b2", "m", 0, "eager", 70.0), row("b2", "m", 0, "compiled", 64.0),
        row("b1", "random-init", 0, "-", 50.0), row("b1", "other", 0, "auto", 60.0)]


def test_pairs_are_the_second_variant_minus_the_first_per_seed_and_per_method_over_every_backbone():
    lines = recipe_summary.pairs(ROWS, "eager", "compiled")
    assert lines[1] == "  b1 textures m: s0 -2.0, s1 +1.0; -0.5 ± 2.1 over 2 pairs, paired t -0.33"
    assert lines[2] == "  b2 textures m: s0 -6.0; -6.0 (one pair)"
    assert lines[3] == "m, every backbone and set: -2.3 ± 3.5 over 3 pairs, paired t -1.15"
    assert len(lines) == 4  # the random init and a method with one variant make no pair


def test_pairs_reads_results_files_under_any_name(tmp_path):
    a, b = tmp_path / "knn-textures.jsonl", tmp_path / "other" / "results.jsonl"
    b.parent.mkdir()
    a.write_text("\n".join(json.dumps(r) for r in ROWS[:6]) + "\n")
    b.write_text("\n".join(json.dumps(r) for r in ROWS[6:]) + "\n{\"cut short\n")  # a line a kill cut short
    done = subprocess.run([sys.executable, recipe_summary.__file__, "--pairs", "eager", "compiled", str(a), str(b)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "m, every backbone and set: -2.3 ± 3.5 over 3 pairs, paired t -1.15"


def test_pairs_names_a_missing_file_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, recipe_summary.__file__, "--pairs", "eager", "compiled",
                           str(tmp_path / "none.jsonl")], capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr == f"error: no results file {tmp_path / 'none.jsonl'}\n"


@pytest.mark.parametrize("mode", [[], ["--finished"]])
def test_a_path_that_is_not_a_grid_folder_is_named_in_one_line(tmp_path, mode):
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps(ROWS[0]) + "\n")
    run = [sys.executable, recipe_summary.__file__, *mode]
    done = subprocess.run([*run, str(results)], capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr == f"error: {results} is not a grid folder (no results.jsonl in it)\n"
    done = subprocess.run([*run, str(tmp_path)], capture_output=True, text=True)
    assert done.returncode == 0 and done.stderr == "", done.stderr  # its folder is one


def test_groups_compare_every_seed_of_each_side_unpaired_with_welch_t():
    lines = recipe_summary.groups(ROWS, "eager", "compiled")
    assert lines[1] == ("  b1 textures m: eager 81.0 ± 1.0 [80.0, 82.0] over 3; compiled 80.5 ± 3.5 [78.0, 83.0] "
                        "over 2; difference -0.5, Welch t -0.19")  # -0.5 / sqrt(1/3 + 12.5/2); the failed run left out
    assert lines[2] == ("  b2 textures m: eager 70.0 [70.0, 70.0] over 1; compiled 64.0 [64.0, 64.0] over 1; "
                        "difference -6.0")  # one seed a side: no t
    assert len(lines) == 3


def test_groups_join_variants_with_a_comma_and_count_a_cell_in_two_files_once(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    a.write_text("\n".join(json.dumps(r) for r in ROWS) + "\n")
    b.write_text("\n".join(json.dumps(r) for r in [ROWS[0], row("b1", "m", 3, "auto", 85.0)]) + "\n")
    done = subprocess.run([sys.executable, recipe_summary.__file__, "--groups", "eager,auto", "compiled", str(a),
                           str(b)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1].startswith("  b1 textures m: eager,auto 82.0 ± 2.2 [80.0, 85.0] over 4; ")
