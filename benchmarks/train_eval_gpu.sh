#!/usr/bin/env bash
# Issues 2 and 3 on one NVIDIA GPU: each method's paper recipe (configs/<method>.yaml) on digits at 32 px with
# ResNet-18 for EPOCHS epochs (batch 256: 6 steps per epoch), then linear-eval (all labels and 5 per class) against
# the random init. The three methods run side by side on the one GPU; each writes LOGDIR/<method>.log as it goes.
# Usage: benchmarks/train_eval_gpu.sh [EPOCHS] [RUNDIR] [LOGDIR]
set -uo pipefail
EPOCHS=${1:-50}
RUNS=${2:-runs}
LOGS=${3:-$RUNS}
PY=${PY:-python3}
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1 TQDM_DISABLE=1
mkdir -p "$LOGS"
for m in simclr byol mocov3; do
  (
    run="$RUNS/gpu-$m"
    rm -rf "$run"
    start=$(date +%s)
    $PY -m pipeline pretrain --config configs/$m.yaml --data digits --image-size 32 --batch-size 256 \
        --epochs "$EPOCHS" --warmup-epochs 5 --device cuda --out "$run" --knn-every 10 --log-every 10 \
      && echo "$m pretrain wall $(( $(date +%s) - start )) s" \
      && $PY -m pipeline linear-eval --run "$run" --device cuda --labels-per-class 5 \
      && echo "$m total wall $(( $(date +%s) - start )) s"
  ) > "$LOGS/$m.log" 2>&1 &
done
wait
$PY benchmarks/summarize_runs.py "$RUNS"/gpu-simclr "$RUNS"/gpu-byol "$RUNS"/gpu-mocov3
