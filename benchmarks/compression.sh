#!/usr/bin/env bash
# Size against retrieval agreement for every --compress choice, for ResNet-18 and mobilenet_v3_small:
#   bash benchmarks/compression.sh OUT [NAME]   (CPU; about an hour on 2 shared cores; NAME: one run only)
# - digits-resnet18: configs/digits-cpu.yaml (SimCLR ResNet-18 on the embedded digits, 8 px: make all's run before its photos default);
# - digits-mobilenet_v3_small: the same config with --backbone mobilenet_v3_small --image-size 16 (the smallest
#   side its small stem takes) --epochs 5 (a quarter of make all's steps, to fit the CPU time);
# each measured on its own val split (`pipeline validate`, its gates) and on the eval split of the offline
# digits-sizes set of benchmarks/recipe_datasets.py (digits drawn at 12/20/28 px on 32 px, class folders; the one
# set it builds without scikit-image), through benchmarks/compression_measure.py, which adds ONNX with
# onnxruntime's 8-bit dynamic quantization. Raw output: benchmarks/results/compression/.
set -euo pipefail
OUT=${1:?usage: compression.sh OUT}
PY=${PYTHON:-python}
P="$PY -m pipeline"
RES=benchmarks/results/compression
mkdir -p "$OUT" "$RES"
[ -d "$OUT/sets/digits-sizes" ] || $PY benchmarks/recipe_datasets.py "$OUT/sets" --only digits-sizes
run() {  # name, pretrain flags...
  local name=$1; shift
  local r="$OUT/$name"
  [ -f "$r/checkpoints/last.pt" ] || $P pretrain --config configs/digits-cpu.yaml --out "$r" --overwrite "$@"
  $P export --run "$r" --to all
  for c in int8 palettize-6 palettize-4; do $P export --run "$r" --to coreml --compress "$c"; done
  $P export --run "$r" --to coreml --coreml-format mlpackage --compress prune-50
  $P validate --run "$r" --coreml-runtime off > "$RES/$name.validate.txt" 2>&1 || true  # a failed gate is a result
  cp "$r/validate/parity.json" "$RES/$name.parity.json"
  cp "$r/export/encoder.json" "$RES/$name.encoder.json"
  $PY benchmarks/compression_measure.py "$r" --folder "$OUT/sets/digits-sizes/eval" --out "$RES/$name.digits-sizes.json" \
    > "$RES/$name.digits-sizes.txt"
}
want() { [ -z "${2:-}" ] || [ "$2" = "$1" ]; }
want digits-resnet18 "${2:-}" && run digits-resnet18
want digits-mobilenet_v3_small "${2:-}" && run digits-mobilenet_v3_small --backbone mobilenet_v3_small --image-size 16 --epochs 5
