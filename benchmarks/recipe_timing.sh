#!/usr/bin/env bash
# One pretraining run's wall time: each method alone on the device, REPEATS times, the whole command as a user types it
# (start-up, data loading and the last checkpoint included), then the median and range per method:
#   pipeline pretrain --method M --data folder:TRAIN --image-size 32 --epochs EPOCHS --batch-size 512 --device cuda
# Runs go one at a time, methods interleaved (simclr, mocov3, byol, simclr, ...), so a slow minute of the machine
# lands on every method rather than on one. photos (benchmarks/recipe_datasets.py) has 4,050 train images once its
# val split is held out: 175 epochs are 1,225 steps of 512.
#
#   REPEATS=3 bash benchmarks/recipe_timing.sh OUT_DIR     # ~50 s a run on one H200: 9 runs, ~8 minutes
#
# Knobs: METHODS ("simclr mocov3 byol"), REPEATS (3), DATASET (photos), EPOCHS (175), BATCH (512), IMAGE_SIZE (32),
# DEVICE (cuda), DATA (OUT_DIR/data), PYTHON (python3). Writes OUT_DIR/timing.jsonl (one line a run) and
# OUT_DIR/timing.txt (the table, with each run split into its steps' time and the rest, read from its metrics.jsonl,
# which is kept as OUT_DIR/logs/M-R.metrics.jsonl beside the run's log). A smoke test on a CPU:
#   DATASET=digits EPOCHS=1 BATCH=64 IMAGE_SIZE=16 REPEATS=2 DEVICE=cpu bash benchmarks/recipe_timing.sh /tmp/t
set -euo pipefail
OUT=${1:?usage: bash benchmarks/recipe_timing.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
METHODS=${METHODS:-simclr mocov3 byol}
REPEATS=${REPEATS:-3}
DATASET=${DATASET:-photos}
EPOCHS=${EPOCHS:-175}
BATCH=${BATCH:-512}
IMAGE_SIZE=${IMAGE_SIZE:-32}
DEVICE=${DEVICE:-cuda}
DATA=${DATA:-$OUT/data}
# The repo root on the path: recipe_datasets.py imports the project, which a bare machine has not installed
export TQDM_DISABLE=1 PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
[[ -d "$DATA/$DATASET/train" ]] || $PY benchmarks/recipe_datasets.py "$DATA" --only "$DATASET"
: > "$OUT/timing.jsonl"
mkdir -p "$OUT/logs"
for r in $(seq 1 "$REPEATS"); do
  for m in $METHODS; do
    run="$OUT/runs/$m-$r" log="$OUT/logs/$m-$r.log"
    rm -rf "$run"
    t0=$(date +%s%N)
    $PY -m pipeline pretrain --method "$m" --data "folder:$DATA/$DATASET/train" --image-size "$IMAGE_SIZE" \
      --epochs "$EPOCHS" --batch-size "$BATCH" --device "$DEVICE" --seed 0 --out "$run" > "$log" 2>&1
    t1=$(date +%s%N)
    # Where the wall time went, from the run's metrics.jsonl (benchmarks/timing_split.py): its step count, the
    # steps' time, the first window's share of it, the steady img/s; wall - train_s is start-up (the graph capture
    # in it, and the compiling where the run compiles), data loading and the checkpoint.
    split=$($PY benchmarks/timing_split.py split "$run/metrics.jsonl" "$BATCH") || split='"steps": 0, "train_s": null'
    echo "{\"method\": \"$m\", \"repeat\": $r, \"wall_s\": $(( (t1 - t0) / 1000000 ))e-3, $split}" \
      | tee -a "$OUT/timing.jsonl"
    cp "$run/metrics.jsonl" "$OUT/logs/$m-$r.metrics.jsonl" 2>/dev/null || true
    rm -rf "$run/checkpoints"  # 100-400 MB a run, and only the time is wanted
  done
done
$PY benchmarks/timing_split.py table "$OUT/timing.jsonl" "$DATASET" "$EPOCHS" "$BATCH" "$DEVICE" | tee "$OUT/timing.txt"
