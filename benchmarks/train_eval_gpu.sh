#!/usr/bin/env bash
# Pretraining and evaluation on one NVIDIA GPU: each method's paper recipe (configs/<method>.yaml) on digits at 32 px with
# ResNet-18 for EPOCHS epochs (batch 256: 6 steps per epoch), then linear-eval (all labels, and 5 per class over
# 5 draws) against the random init. All runs share the one GPU side by side; each writes LOGDIR/<name>.log.
# METHODS picks recipes (default: all three; " " for none); RUNS_EXTRA may add variants as "name:method:flags;..."
# (e.g. a BYOL learning rate). PRETRAIN_TIMEOUT (seconds, 0 = none) stops a pretraining early; its last checkpoint
# (written every --checkpoint-every-s) is then evaluated all the same and the log says so.
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
    timeout "${PRETRAIN_TIMEOUT:-0}" \
      $PY -m pipeline pretrain --config configs/$method.yaml --data digits --image-size 32 --batch-size 256 \
        --epochs "$EPOCHS" --warmup-epochs 10 --device "${DEVICE:-cuda}" --out "$run" --knn-every 25 --log-every 30 $flags
    rc=$?
    [[ $rc == 124 ]] && echo "$name pretrain STOPPED by PRETRAIN_TIMEOUT: its last checkpoint is evaluated"
    [[ $rc == 0 || $rc == 124 ]] \
      && echo "$name pretrain wall $(( $(date +%s) - start )) s" \
      && $PY -m pipeline linear-eval --run "$run" --device "${DEVICE:-cuda}" --labels-per-class 5 \
      && echo "$name total wall $(( $(date +%s) - start )) s"
  ) > "$LOGS/$name.log" 2>&1 &
done
wait
$PY benchmarks/summarize_runs.py "${names[@]}"
