#!/usr/bin/env bash
# Size against retrieval agreement for every --compress choice, on trained MobileNetV3-Small/Large, ViT-Ti/16 and
# ResNet-18 encoders:
#   bash benchmarks/compression.sh OUT [NAME [RUN]]
# OUT holds the runs (OUT/NAME, trained on the CPU if OUT/NAME/checkpoints/last.pt is missing); NAME measures one run
# of the list below only; RUN measures a copy of an existing run directory as NAME (e.g. `make all`'s runs/default
# as photos-mobilenet_v3_small) instead of training it. Raw output: benchmarks/results/compression/NAME.*, the
# docs' table from `python benchmarks/compression_summary.py`.
#   photos-mobilenet_v3_small      configs/default.yaml, the run `make all` makes (216 steps of 128)
#   photos-resnet18                the same with --backbone resnet18 --image-size 32 --small-stem on, --epochs 3
#                                  (54 steps, a quarter of make all's: what the 2-core CPU time allowed)
#   photosset-mobilenet_v3_small   benchmarks/recipe_datasets.py's `photos` set (ten photographs, 32 px; needs the
#                                  `bench` extra's scikit-image), --image-size 32 --small-stem on, 2 epochs
#   photosset-resnet18             the same set, ResNet-18, 32 px, small stem, 1 epoch of 64
#   photosset-mobilenet_v3_large   the same set, MobileNetV3-Large (the backbone README advises an app to ship), 2 epochs
#   photosset-vit_t_16             the same set, ViT-Ti/16 (patch 4 at 32 px; its AdamW recipe), 4 epochs: its
#                                  recipe's rate (1.5e-4 x batch/256) moves the features less per step
#   photosset-vit_s_16             the same with ViT-S/16 (43 MB as fp16: where compression matters most)
#   digits-resnet18                configs/digits-cpu.yaml (ResNet-18 on the embedded digits at 8 px)
#   digits-mobilenet_v3_small      the same with --backbone mobilenet_v3_small --image-size 16 --epochs 5
#   digits-mobilenet_v3_large      the same with --backbone mobilenet_v3_large
#   digits-vit_t_16                the same with --backbone vit_t_16 (patch 4: 16 tokens)
# Each run: `pipeline export` of every format and compression, `pipeline validate` on its val split with its gates
# (each compressed artifact's own probe fitted on up to 1024 of its train images), then
# benchmarks/compression_measure.py --only onnx-int8 on the same images: ONNX with onnxruntime's 8-bit dynamic
# quantization, which the pipeline does not write.
set -euo pipefail
OUT=${1:?usage: compression.sh OUT [NAME [RUN]]}
ONLY=${2:-}
FROM=${3:-}
PY=${PYTHON:-python}
P="nice $PY -m pipeline"
RES=benchmarks/results/compression
mkdir -p "$OUT" "$RES"
run() {  # name, config, pretrain flags...
  local name=$1 config=$2; shift 2
  local r="$OUT/$name"
  if [ -n "$FROM" ] && [ ! -d "$r" ]; then cp -r "$FROM" "$r"; fi
  [ -f "$r/checkpoints/last.pt" ] || $P pretrain --config "$config" --device cpu --out "$r" --overwrite "$@"
  $P export --run "$r" --to all
  for c in int8 palettize-6 palettize-4; do $P export --run "$r" --to coreml --compress "$c"; done
  $P export --run "$r" --to coreml --coreml-format mlpackage --compress prune-50
  # a failed gate is a result, not the end of the measurement
  $P validate --run "$r" --coreml-runtime off > "$RES/$name.validate.txt" 2>&1 || true
  cp "$r/validate/parity.json" "$RES/$name.parity.json"
  cp "$r/export/encoder.json" "$RES/$name.encoder.json"
  nice $PY benchmarks/compression_measure.py "$r" --only onnx-int8 --out "$RES/$name.onnx-int8.json" > "$RES/$name.onnx-int8.txt"
}
want() { [ -z "$ONLY" ] || [ "$ONLY" = "$1" ]; }
photos_set() {
  [ -d "$OUT/sets/photos" ] || nice $PY benchmarks/recipe_datasets.py "$OUT/sets" --only photos >&2  # only the SPEC goes to stdout: the caller reads it
  echo "folder:$OUT/sets/photos/train"
}
RESNET="--backbone resnet18 --image-size 32 --small-stem on"
want photos-mobilenet_v3_small && run photos-mobilenet_v3_small configs/default.yaml
want photos-resnet18 && run photos-resnet18 configs/default.yaml $RESNET --epochs 3
want photosset-mobilenet_v3_small && run photosset-mobilenet_v3_small configs/default.yaml --data "$(photos_set)" \
  --image-size 32 --small-stem on --epochs 2
want photosset-resnet18 && run photosset-resnet18 configs/default.yaml --data "$(photos_set)" $RESNET --epochs 1 --batch-size 64
want photosset-mobilenet_v3_large && run photosset-mobilenet_v3_large configs/default.yaml --data "$(photos_set)" \
  --backbone mobilenet_v3_large --image-size 32 --small-stem on --epochs 2
for b in vit_t_16 vit_s_16; do
  want photosset-$b && run photosset-$b configs/default.yaml --data "$(photos_set)" --backbone $b \
    --image-size 32 --small-stem on --epochs 4
done
want digits-resnet18 && run digits-resnet18 configs/digits-cpu.yaml
for b in mobilenet_v3_small mobilenet_v3_large vit_t_16; do
  want digits-$b && run digits-$b configs/digits-cpu.yaml --backbone $b --image-size 16 --epochs 5
done
true
