#!/usr/bin/env bash
# Size against retrieval agreement for every --compress choice, on two backbones and two data sets:
#   bash benchmarks/compression.sh OUT        (CPU; about 40 minutes on 2 cores)
# - make all's run (configs/default.yaml: SimCLR ResNet-18 on the embedded digits, 8 px), and the same config
#   with mobilenet_v3_small (16 px, the smallest side its small stem takes);
# - the offline digits-sizes set of benchmarks/recipe_datasets.py (digits drawn at 12/20/28 px on 32 px), ResNet-18
#   and mobilenet_v3_small at 32 px, 10 epochs.
# Each run: pretrain, strip, trace, export every compression, validate; the validate/parity.json rows are the result
# (benchmarks/results/compression/<run>.json, summarised by benchmarks/compression_summary.py).
set -euo pipefail
OUT=${1:?usage: compression.sh OUT}
PY=${PYTHON:-python}
P="$PY -m pipeline"
mkdir -p "$OUT"
[ -d "$OUT/sets/digits-sizes" ] || $PY benchmarks/recipe_datasets.py "$OUT/sets" --only digits-sizes  # the sets without scikit-image
run() {  # name, pretrain flags...
  local name=$1; shift
  local r="$OUT/$name"
  [ -f "$r/checkpoints/last.pt" ] || $P pretrain --config configs/default.yaml --out "$r" --overwrite "$@"
  $P strip --run "$r" && $P trace --run "$r"
  $P export --run "$r" --to coreml
  for c in int8 palettize-6 palettize-4; do $P export --run "$r" --to coreml --compress "$c"; done
  $P export --run "$r" --to coreml --coreml-format mlpackage --compress prune-50
  $P validate --run "$r" --coreml-runtime off || true   # a failed gate is a result here, not the end
  mkdir -p benchmarks/results/compression
  cp "$r/validate/parity.json" "benchmarks/results/compression/$name.json"
  cp "$r/export/encoder.json" "benchmarks/results/compression/$name.encoder.json"
}
run digits-resnet18
run digits-mobilenet_v3_small --backbone mobilenet_v3_small --image-size 16
run sizes-resnet18 --data "folder:$OUT/sets/digits-sizes/train" --image-size 32 --epochs 10
run sizes-mobilenet_v3_small --data "folder:$OUT/sets/digits-sizes/train" --backbone mobilenet_v3_small --image-size 32 --epochs 10
