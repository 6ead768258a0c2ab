#!/bin/bash
# R18-32 b512 and R50-224 b256 e2e and ceiling, the commit before the floors layout and the current tree, alternated
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 CUDA_VISIBLE_DEVICES=0
cd "${TREES:-.gpu}"  # holding old/ (the commit before the floors layout, eb3fa4e) and new/ (this tree): each its packages
{ nvidia-smi --query-gpu=name,driver_version --format=csv; python3 -c "import torch; print(torch.__version__)"; } > $OUT/env.txt 2>&1
S="--method simclr --backbone resnet18 --image-size 32 --batch-size 512 --augment device --channels-last on"
L="--method simclr --backbone resnet50 --image-size 224 --batch-size 256 --augment device --channels-last on --warmup 5 --window-steps 10"
for round in 1; do for tree in old new; do
  (cd $tree && PYTHONPATH=. timeout 100 python3 -m pipeline bench --json $S | tail -n 1 | sed "s/^/$tree r18 $round /") >> $OUT/same_call.txt 2>>$OUT/err.txt
done; done
for tree in old new; do
  (cd $tree && PYTHONPATH=. timeout 120 python3 -m pipeline bench --json $L | tail -n 1 | sed "s/^/$tree r50 1 /") >> $OUT/same_call.txt 2>>$OUT/err.txt
done
cut -c1-400 $OUT/same_call.txt; tail -5 $OUT/err.txt
