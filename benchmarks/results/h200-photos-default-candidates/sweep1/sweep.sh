#!/usr/bin/env bash
# GPU sweep of make-all default candidates, 4 seeds each (fp32, CPU augment: close to the CPU run)
set -uo pipefail
export PYTHONPATH=$PWD TQDM_DISABLE=1
OUT=${OUT:-/tmp/out}
python3 benchmarks/recipe_datasets.py /tmp/rd --only photos > /dev/null 2>&1 || echo "no rd"
G="--precision fp32 --augment cpu --num-workers 2"
declare -A C=(
 [base]=""
 [t02]="--temperature 0.2"
 [t01]="--temperature 0.1"
 [c008]="--crop-min-scale 0.08"
 [c05]="--crop-min-scale 0.5"
 [lr03]="--lr 0.3"
 [moco]="--method mocov3"
 [byol]="--method byol"
 [e24]="--epochs 24"
 [s32]="--image-size 32 --small-stem on"
 [h2048]="--proj-hidden-dim 2048"
 [p10]="--data folder:/tmp/rd/photos/train --epochs 6"
 [r18]="--backbone resnet18 --image-size 32 --small-stem on"
 [mnl]="--backbone mobilenet_v3_large"
)
LIST=""
for k in "${!C[@]}"; do for s in 0 1 2 3; do LIST+="$k-s$s:${C[$k]} --seed $s $G;"; done; done
t0=$(date +%s)
CANDIDATES="${LIST%;}" DEVICE=cuda JOBS=${JOBS:-8} timeout ${T:-500} bash benchmarks/default_run_candidates.sh /tmp/sw > $OUT/all.txt 2>&1
echo "sweep $(( $(date +%s) - t0 )) s" >> $OUT/all.txt
for k in "${!C[@]}"; do
  runs=$(ls -d /tmp/sw/$k-s*/eval/linear.json 2>/dev/null | sed 's|/eval/linear.json||')
  [ -n "$runs" ] && { echo "## $k: ${C[$k]}"; python3 benchmarks/seed_spread.py $runs; } >> $OUT/spread.md
done
cp /tmp/sw/*.txt $OUT/ 2>/dev/null; mkdir -p $OUT/logs; cp /tmp/sw/*.log $OUT/logs/ 2>/dev/null
nvidia-smi --query-gpu=name --format=csv >> $OUT/all.txt; lscpu | grep "Model name" >> $OUT/all.txt
