"""The committed Swift fixtures are what the pipeline's current code makes of their inputs, and the generator writes
fixtures that pass that check. (`swift test` in swift_demo/ checks the Swift port against the same files.)"""

import hashlib
import json

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from core import rundir
from pipeline.cli import main
from stages import swift_fixtures as sf
from train.backbones import build_backbone


RESNET_FIXTURES = sf.FIXTURES_DIR.parent / "Fixtures-resnet18"  # a ResNet-18 on digits, kept beside the default's
COMMITTED = [sf.FIXTURES_DIR, RESNET_FIXTURES]


@pytest.mark.parametrize("folder", COMMITTED, ids=lambda p: p.name)
def test_committed_fixtures_are_current(folder):
    assert sf.stale_reasons(folder) == [], "run `make swift-fixtures` (then `swift test` in swift_demo/)"


def test_the_default_fixtures_are_of_make_alls_model():
    """The app's self-test judges the model `make all` makes: Fixtures/ (the app's Golden/) is of a run of
    configs/default.yaml trained to its end, and the ResNet set beside it is another backbone."""
    import yaml

    from train import photos

    default = yaml.safe_load((sf.FIXTURES_DIR.parents[3] / "configs" / "default.yaml").read_text())
    sidecar = json.loads((sf.FIXTURES_DIR / "encoder.json").read_text())
    for key in ("method", "backbone", "image_size", "data", "epochs"):
        assert sidecar[key] == default[key], key
    assert sidecar["small_stem"] is (default["small_stem"] == "on")
    steps = (int(sidecar["step"]), default["epochs"] * (photos.train_count() // default["batch_size"]))
    assert steps[0] == steps[1], f"trained {steps[0]} of {steps[1]} steps"
    assert json.loads((RESNET_FIXTURES / "encoder.json").read_text())["backbone"] == "resnet18"


@pytest.mark.parametrize("folder", COMMITTED, ids=lambda p: p.name)
def test_committed_fixtures_are_small_and_cover_every_case(folder):
    total = sum(p.stat().st_size for p in folder.iterdir() if p.is_file())
    assert total < 1_000_000
    m = json.loads((folder / "manifest.json").read_text())
    assert {q["orientation"] for q in m["queries"]} == set(range(1, 9))
    assert {q["layout"] for q in m["queries"]} == set(sf.LAYOUT_ORDER)
    assert any(q["alpha"] for q in m["queries"])


@pytest.mark.parametrize("folder", COMMITTED, ids=lambda p: p.name)
def test_the_parity_variants_span_the_gates_verdicts(folder):
    """What the app's self-test must tell apart: fp16 rounding passes fp16's gates; 3 % noise fails them and passes
    a compressed model's (its weights move every embedding that much); one image turned around fails every gate."""
    variants = json.loads((folder / "manifest.json").read_text())["parity"]["variants"]
    verdicts = {name: tuple(v[f"fails_{p}"] for p in ("fp16", "compressed")) for name, v in variants.items()}
    assert verdicts == {"fp16": (False, False), "noisy": (True, False), "flipped": (True, True)}


def test_a_changed_crop_or_prediction_is_reported(tmp_path):
    for p in sf.FIXTURES_DIR.iterdir():
        (tmp_path / p.name).write_bytes(p.read_bytes())
    crops = bytearray((tmp_path / "crops.u8").read_bytes())
    crops[5] ^= 1
    (tmp_path / "crops.u8").write_bytes(bytes(crops))
    m = json.loads((tmp_path / "manifest.json").read_text())
    m["expected"]["queries"][2]["knn_label"] += 1
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    reasons = sf.stale_reasons(tmp_path)
    assert any(r.startswith("query 0: decode_image") for r in reasons)
    assert any(r.startswith("query 2: kNN") for r in reasons)


def test_layouts_round_trip():
    rgba = np.random.default_rng(0).integers(0, 256, (3, 5, 4), dtype=np.uint8)
    for layout in ("rgba", "bgra", "argb"):
        assert np.array_equal(sf.from_layout(sf.to_layout(rgba, layout), 5, 3, layout), rgba)
    assert sf.to_layout(rgba, "bgra")[:4] == bytes(rgba[0, 0, [2, 1, 0, 3]])


def _tiny_run(tmp_path, size=16):
    """A run directory with what the generator reads: split.json, export/encoder.pt, export/encoder.json."""
    run = tmp_path / "run"
    (run / "export").mkdir(parents=True)
    torch.manual_seed(0)
    backbone, feat_dim = build_backbone("resnet18", True)
    state = {"state_dict": backbone.state_dict(), "backbone": "resnet18", "small_stem": True, "feat_dim": feat_dim,
             "image_size": size, "mean": [0.5, 0.5, 0.5], "std": [0.25, 0.25, 0.25], "l2_normalize": True,
             "metadata": {"method": "simclr", "run_id": "run"}}
    torch.save(state, run / "export" / "encoder.pt")
    sha = hashlib.sha256((run / "export" / "encoder.pt").read_bytes()).hexdigest()
    rundir.write_json_atomic(run / "export" / "encoder.json", {"run_id": "run", "encoder_sha256": sha, "artifacts": []})
    rundir.write_json_atomic(run / "split.json", {"spec": "synthetic:120", "seed": 0, "train": list(range(80)),
                                                   "val": list(range(80, 120))})
    return run, sha


def test_generator_writes_current_fixtures(tmp_path, monkeypatch):
    run, sha = _tiny_run(tmp_path)
    # Reading a real Core ML model needs an export (minutes); the reader is swapped for its output's shape.
    monkeypatch.setattr(sf, "_model_metadata", lambda export_dir, sidecar: {
        "file": "encoder.mlmodel", "user_defined_metadata": {"encoder_sha256": sidecar["encoder_sha256"]},
        "input_names": ["image"], "output_names": ["embedding"]})
    out = sf.run(sf.SwiftFixturesConfig(out=str(tmp_path / "fx"), bank_per_class=5), run, say=lambda s: None)
    assert sf.stale_reasons(out) == []
    m = json.loads((out / "manifest.json").read_text())
    assert m["encoder_sha256"] == sha and len(m["bank"]) == 20 and len(m["queries"]) == len(sf.CASES)
    assert (out / "embeddings.f32").stat().st_size == (20 + len(sf.CASES)) * 512 * 4
    assert any(q["centroid_label"] is None for q in m["expected"]["queries"])
    with pytest.raises(sf.PipelineError, match="--max-bytes"):
        sf.run(sf.SwiftFixturesConfig(out=str(tmp_path / "fx2"), max_bytes=1000), run, say=lambda s: None)
    assert not (tmp_path / "fx2").exists()


def test_generator_refuses_a_sidecar_of_another_encoder(tmp_path):
    run, _ = _tiny_run(tmp_path)
    rundir.write_json_atomic(run / "export" / "encoder.json", {"encoder_sha256": "0" * 64, "artifacts": []})
    with pytest.raises(sf.PipelineError, match="another encoder.pt"):
        sf.run(sf.SwiftFixturesConfig(out=str(tmp_path / "fx")), run, say=lambda s: None)


def test_cli_errors_are_one_line(tmp_path):
    result = CliRunner().invoke(main, ["swift-fixtures", "--run", str(tmp_path / "missing")])
    assert result.exit_code == 2
    assert result.output.strip().startswith("error: ") and len(result.output.strip().splitlines()) == 1


def test_cli_check_says_whether_the_fixtures_are_current(tmp_path):
    result = CliRunner().invoke(main, ["swift-fixtures", "--check"])
    assert result.exit_code == 0 and "fixtures are current" in result.output
    for p in sf.FIXTURES_DIR.iterdir():
        (tmp_path / p.name).write_bytes(p.read_bytes())
    m = json.loads((tmp_path / "manifest.json").read_text())
    m["expected"]["queries"][0]["top_ids"].reverse()
    (tmp_path / "manifest.json").write_text(json.dumps(m))
    result = CliRunner().invoke(main, ["swift-fixtures", "--check", "--out", str(tmp_path)])
    assert result.exit_code == 2 and result.output.strip().splitlines()[-1].startswith("error: 1 fixture(s) out of date")
