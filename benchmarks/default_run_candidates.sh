#!/usr/bin/env bash
# Which settings make `make all`'s default run (CPU) end with a clear gain over random init, and its seed spread.
# Each candidate is `pipeline pretrain --config $CONFIG --device cpu FLAGS` (CONFIG: configs/default.yaml unless set) then `pipeline linear-eval
# --labels-per-class 5` (what `make all` runs), printing the pretraining wall time and linear-eval's table
# (pretrained vs random init: linear and kNN top-1, and the 5-labels-per-class probes over 5 draws).
#
#   CANDIDATES="label:flags;label2:flags" JOBS=2 bash benchmarks/default_run_candidates.sh OUT_DIR
#   CANDIDATES="s0:--seed 0;s1:--seed 1;s2:--seed 2;s3:--seed 3" JOBS=2 bash benchmarks/default_run_candidates.sh OUT_DIR
#   python benchmarks/seed_spread.py OUT_DIR/s0 OUT_DIR/s1 OUT_DIR/s2 OUT_DIR/s3     # mean ± std of the gains
#
# Each candidate runs with OMP_NUM_THREADS=2 (the 2-core machine's threads); JOBS candidates at a time, so wall
# times are only comparable with JOBS matching the free cores / 2. Default CANDIDATES: the shipped default only.
set -euo pipefail
OUT=${1:?usage: bash benchmarks/default_run_candidates.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
JOBS=${JOBS:-1}
CANDIDATES=${CANDIDATES:-default:}
CONFIG=${CONFIG:-configs/default.yaml}
DEVICE=${DEVICE:-cpu}  # cuda: a quick sweep of candidates on a GPU host (its numbers differ a little from the CPU run's)
export OMP_NUM_THREADS=2 TQDM_DISABLE=1 PYTHONUNBUFFERED=1

one() {
  local label=$1 flags=$2 run="$OUT/$1" t0 t1
  rm -rf "$run"
  t0=$(date +%s)
  # shellcheck disable=SC2086
  { $PY -m pipeline pretrain --config "$CONFIG" --device "$DEVICE" --out "$run" $flags > "$OUT/$label.log" 2>&1 \
    && t1=$(date +%s) \
    && $PY -m pipeline linear-eval --run "$run" --labels-per-class 5 >> "$OUT/$label.log" 2>&1 \
    && { echo "== $label ($flags): pretrain $((t1 - t0)) s, pretrain + linear-eval $(( $(date +%s) - t0 )) s"
         sed -n '/^metric/,/^(/p' "$OUT/$label.log"; } > "$OUT/$label.txt"; } \
    || echo "== $label ($flags): FAILED, see $OUT/$label.log" > "$OUT/$label.txt"
  cat "$OUT/$label.txt"
}

IFS=';' read -r -a LIST <<< "$CANDIDATES"
running=0
for c in "${LIST[@]}"; do
  one "${c%%:*}" "${c#*:}" &
  running=$((running + 1))
  if (( running >= JOBS )); then wait -n || true; running=$((running - 1)); fi
done
wait
