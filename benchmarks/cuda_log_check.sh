#!/usr/bin/env bash
# A CUDA `pipeline pretrain` (one GPU, CUDA graphs on by default) and, where two GPUs are visible, a
# `--gpus 2` one, as a user types them; every line they print that is not one of the project's own is listed
# (another library's warning, a torchrun notice). Exit status 1 if there is any.
# Usage: benchmarks/cuda_log_check.sh [OUTDIR]     (logs in OUTDIR/one-gpu.log and OUTDIR/two-gpus.log)
set -uo pipefail
OUT=${1:-/tmp/cuda-log-check}
PY=${PY:-python3}
export PYTHONPATH=${PYTHONPATH:-.}
mkdir -p "$OUT"
rm -rf "$OUT/one" "$OUT/two"
$PY -m pipeline pretrain --data digits --image-size 32 --batch-size 256 --epochs 10 --device cuda \
    --out "$OUT/one" > "$OUT/one-gpu.log" 2>&1
logs=("$OUT/one-gpu.log")
if [[ $($PY -c 'import torch; print(torch.cuda.device_count())') -ge 2 ]]; then
  $PY -m pipeline pretrain --gpus 2 --data digits --image-size 32 --batch-size 256 --epochs 10 --device cuda \
      --out "$OUT/two" > "$OUT/two-gpus.log" 2>&1
  logs+=("$OUT/two-gpus.log")
fi
status=0
for log in "${logs[@]}"; do
  # The project's pretrain lines: the run it uses, the recipe it chose and why, the one-line setup summary, resume/skip notes, the end line
  # (the progress bar is off when the output is not a terminal).
  foreign=$(tr '\r' '\n' < "$log" | grep -v '^\s*$' \
            | grep -vE '^(using run |recipe |pretraining |resuming |warning: skipped |done: step )')
  echo "== $log: $(wc -l < "$log") lines, foreign: $( [[ -z $foreign ]] && echo none || echo "$foreign" | wc -l)"
  [[ -n $foreign ]] && { echo "$foreign" | cut -c1-300; status=1; }
  grep -E '^(pretraining|done:)' "$log" | cut -c1-200
done
exit $status
