#!/usr/bin/env bash
# The throughput lines of docs/benchmarks.md on a CUDA machine, from the repository root. Each line is one `pipeline bench`
# process printing one JSON line; all are collected in $OUT/bench.jsonl (default ./bench-results).
# Usage: benchmarks/bench_gpu.sh PART [PART ...]   (default: usual device scaling)
#   usual:   the project's CPU-worker augmentation (15 DataLoader workers), NCHW: the usual recipe + NCHW ceiling
#   device:  device augmentation, channels_last, one GPU (CUDA_VISIBLE_DEVICES=0)
#   scaling: the same on 2 GPUs (weak scaling: the same per-GPU batch, global batch doubled); needs 2 GPUs
set -euo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-bench-results}
mkdir -p "$OUT"
# --no-compile: these are the tables' eager lines (a ResNet on CUDA compiles when --compile is unset)
bench() { python3 -m pipeline bench --json --no-compile "$@" >> "$OUT/bench.jsonl"; tail -n 1 "$OUT/bench.jsonl"; }
S="--method simclr --backbone resnet18 --image-size 32"
L="--method simclr --backbone resnet50 --image-size 224 --warmup 5 --window-steps 10"

parts=("$@")
[[ ${#parts[@]} -gt 0 ]] || parts=(usual device scaling)
for part in "${parts[@]}"; do
  case $part in
    usual)
      CUDA_VISIBLE_DEVICES=0 bench $S --batch-size 512 --augment cpu --num-workers 15 --channels-last off
      CUDA_VISIBLE_DEVICES=0 bench $L --batch-size 256 --augment cpu --num-workers 15 --channels-last off --warmup 3 --windows 3 ;;
    device)
      CUDA_VISIBLE_DEVICES=0 bench $S --batch-size 512 --augment device --channels-last on
      CUDA_VISIBLE_DEVICES=0 bench $L --batch-size 256 --augment device --channels-last on ;;
    scaling)
      bench $S --batch-size 1024 --augment device --channels-last on --gpus 2
      bench $L --batch-size 512 --augment device --channels-last on --gpus 2 ;;
    *) echo "unknown part $part (usual | device | scaling)" >&2; exit 2 ;;
  esac
done
