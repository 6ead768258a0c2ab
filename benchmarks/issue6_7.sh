#!/usr/bin/env bash
# Issue 6 / issue 7 measurements on a 2-GPU H200 machine, from the repository root. Each line is one
# `pipeline bench` process printing one JSON line; all are collected in $OUT/bench.jsonl (default ./bench-results).
# Usage: benchmarks/issue6_7.sh [usual|device|all]
#   usual:  the project's CPU-worker augmentation (15 DataLoader workers), NCHW: the usual recipe + NCHW ceiling
#   device: device augmentation, channels_last, on 1 GPU (CUDA_VISIBLE_DEVICES=0) and on 2 GPUs (weak scaling:
#           the same per-GPU batch, global batch doubled)
set -euo pipefail
export PYTHONPATH=. PYTHONUNBUFFERED=1
OUT=${OUT:-bench-results}
mkdir -p "$OUT"
part=${1:-all}
bench() { python3 -m pipeline bench --json "$@" | tee -a "$OUT/bench.jsonl"; }
S="--method simclr --backbone resnet18 --image-size 32"
L="--method simclr --backbone resnet50 --image-size 224 --warmup 5 --window-steps 10"

if [[ $part == usual || $part == all ]]; then
  CUDA_VISIBLE_DEVICES=0 bench $L --batch-size 256 --augment cpu --num-workers 15 --channels-last off
  CUDA_VISIBLE_DEVICES=0 bench $S --batch-size 512 --augment cpu --num-workers 15 --channels-last off
fi
if [[ $part == device || $part == all ]]; then
  CUDA_VISIBLE_DEVICES=0 bench $L --batch-size 256 --augment device --channels-last on
  bench $L --batch-size 512 --augment device --channels-last on --gpus 2
  CUDA_VISIBLE_DEVICES=0 bench $S --batch-size 512 --augment device --channels-last on
  bench $S --batch-size 1024 --augment device --channels-last on --gpus 2
fi
