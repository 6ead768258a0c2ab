#!/usr/bin/env bash
# What writing checkpoints/last.pt after every epoch cost on small data: configs/byol-small.yaml on digits (6 steps
# of 256 images per epoch, a ~190 MB checkpoint), --checkpoint-every-s 0 (a write after every epoch)
# against the default (every 120 s and at the end), REPEATS runs of each, interleaved.
# Prints per run the wall time and the median img/s over its 30-step log windows (which include the writes).
# Usage: benchmarks/checkpoint_cost.sh [EPOCHS] [REPEATS] [OUTDIR]
set -euo pipefail
EPOCHS=${1:-100}
REPEATS=${2:-3}
OUT=${3:-runs/checkpoint-cost}
PY=${PY:-python3}
export PYTHONPATH=${PYTHONPATH:-.} TQDM_DISABLE=1
mkdir -p "$OUT"
for r in $(seq 1 "$REPEATS"); do
  for every in 0 120; do
    run="$OUT/every$every-r$r"
    rm -rf "$run"
    start=$(date +%s%N)
    $PY -m pipeline pretrain --config configs/byol-small.yaml --data digits --epochs "$EPOCHS" --log-every 30 \
        --device "${DEVICE:-cuda}" --out "$run" --checkpoint-every-s "$every" > "$run.log" 2>&1
    wall=$(( ($(date +%s%N) - start) / 1000000 ))
    med=$($PY -c "import json, statistics, sys; print(round(statistics.median(json.loads(l)['img_s'] for l in open(sys.argv[1]) if 'img_s' in l)))" "$run/metrics.jsonl")
    echo "checkpoint_every_s $every  repeat $r  wall $(( wall / 1000 )).$(( wall % 1000 / 100 )) s  median img/s $med"
  done
done
