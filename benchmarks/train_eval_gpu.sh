#!/usr/bin/env bash
# Issues 2 and 3 on one NVIDIA GPU: each method's paper recipe (configs/<method>.yaml) on digits at 32 px with
# ResNet-18 for EPOCHS epochs, then linear-eval (with and without 5 labels per class) against the random init.
# Usage: benchmarks/train_eval_gpu.sh [EPOCHS] [OUTDIR]   (on the device machine: PYTHONPATH=. python3 is used)
set -euo pipefail
EPOCHS=${1:-300}
OUT=${2:-runs}
PY=${PY:-python3}
export PYTHONPATH=${PYTHONPATH:-.}
for m in simclr byol mocov3; do
  run="$OUT/gpu-$m"
  rm -rf "$run"
  /usr/bin/time -f "$m pretrain wall %e s" $PY -m pipeline pretrain --config configs/$m.yaml --data digits \
      --image-size 32 --batch-size 256 --epochs "$EPOCHS" --warmup-epochs 10 --device cuda --out "$run" \
      --knn-every 50 --log-every 20
  $PY -m pipeline linear-eval --run "$run" --device cuda --labels-per-class 5
done
$PY benchmarks/summarize_runs.py "$OUT"/gpu-simclr "$OUT"/gpu-byol "$OUT"/gpu-mocov3
