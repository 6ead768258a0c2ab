#!/usr/bin/env bash
# Issues 2 and 3 on one NVIDIA GPU: each method's paper recipe (configs/<method>.yaml) on digits at 32 px with
# ResNet-18 for EPOCHS epochs (batch 256: 6 steps per epoch), then linear-eval (all labels, and 5 per class over
# 5 draws) against the random init. All runs share the one GPU side by side; each writes LOGDIR/<name>.log.
# METHODS picks recipes (default: all three); RUNS_EXTRA may add variants as "name:method:flags;..." (e.g. a BYOL learning rate).
# Usage: benchmarks/train_eval_gpu.sh [EPOCHS] [RUNDIR] [LOGDIR]
set -uo pipefail
EPOCHS=${1:-50}
RUNS=${2:-runs}
LOGS=${3:-$RUNS}
PY=${PY:-python3}
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1 TQDM_DISABLE=1
mkdir -p "$LOGS"
specs=""
for m in ${METHODS:-simclr byol mocov3}; do specs+="$m:$m:;"; done
specs+="${RUNS_EXTRA:-}"
names=()
IFS=';' read -ra entries <<< "$specs"
for entry in "${entries[@]}"; do
  [[ -z $entry ]] && continue
  IFS=':' read -r name method flags <<< "$entry"
  names+=("$RUNS/gpu-$name")
  (
    run="$RUNS/gpu-$name"
    rm -rf "$run"
    start=$(date +%s)
    # shellcheck disable=SC2086  # flags are words on purpose
    $PY -m pipeline pretrain --config configs/$method.yaml --data digits --image-size 32 --batch-size 256 \
        --epochs "$EPOCHS" --warmup-epochs 10 --device cuda --out "$run" --knn-every 25 --log-every 30 $flags \
      && echo "$name pretrain wall $(( $(date +%s) - start )) s" \
      && $PY -m pipeline linear-eval --run "$run" --device cuda --labels-per-class 5 \
      && echo "$name total wall $(( $(date +%s) - start )) s"
  ) > "$LOGS/$name.log" 2>&1 &
done
wait
$PY benchmarks/summarize_runs.py "${names[@]}"
