"""The Swift port of decode/crop against Pillow at model sizes other than the committed fixtures' 16 px.

For each size: a random-init ResNet-18 encoder.pt and a split over `synthetic:200` (coloured textures), fixtures
written by stages/swift_fixtures.py into a temp folder (the Core ML metadata reader is bypassed: no export needed),
then `embedding-demo check` on them. Needs `swift build` done in swift_demo/ first. Usage, from the repo root:
    (cd swift_demo && swift build) && python benchmarks/swift_crop_sizes.py 24 37 64
"""

import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from core import rundir  # noqa: E402
from stages import swift_fixtures as sf  # noqa: E402
from train.backbones import build_backbone  # noqa: E402

DEMO = Path(__file__).resolve().parents[1] / "swift_demo" / ".build" / "debug" / "embedding-demo"


def main(sizes: list[int]) -> int:
    sf._model_metadata = lambda export_dir, sidecar: {"file": "none", "input_names": [], "output_names": [],
                                                      "user_defined_metadata": {"encoder_sha256": sidecar["encoder_sha256"]}}
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            run = Path(tmp) / f"run{size}"
            (run / "export").mkdir(parents=True)
            torch.manual_seed(0)
            backbone, dim = build_backbone("resnet18", True)
            torch.save({"state_dict": backbone.state_dict(), "backbone": "resnet18", "small_stem": True, "feat_dim": dim,
                        "image_size": size, "mean": [0.5] * 3, "std": [0.25] * 3, "l2_normalize": True, "metadata": {}},
                       run / "export" / "encoder.pt")
            sha = hashlib.sha256((run / "export" / "encoder.pt").read_bytes()).hexdigest()
            rundir.write_json_atomic(run / "export" / "encoder.json", {"encoder_sha256": sha, "artifacts": []})
            rundir.write_json_atomic(run / "split.json", {"spec": "synthetic:200", "seed": 0, "train": list(range(150)),
                                                          "val": list(range(150, 200))})
            out = sf.run(sf.SwiftFixturesConfig(out=str(Path(tmp) / f"fx{size}"), bank_per_class=5, max_bytes=10**8), run, say=lambda s: None)
            result = subprocess.run([str(DEMO), "check", str(out)], capture_output=True, text=True)
            print(f"{size} px: {result.stdout.strip().splitlines()[-1]}")
            failed += result.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main([int(s) for s in sys.argv[1:]] or [24, 37, 64]))
