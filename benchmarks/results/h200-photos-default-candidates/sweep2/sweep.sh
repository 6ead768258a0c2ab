#!/usr/bin/env bash
set -uo pipefail
export PYTHONPATH=$PWD TQDM_DISABLE=1
sed -i 's/nn.BatchNorm1d(hidden_dim), nn.ReLU/(nn.BatchNorm1d(hidden_dim) if hidden_dim != 513 else nn.Identity()), nn.ReLU/' train/heads.py
grep -c "513" train/heads.py
python3 benchmarks/recipe_datasets.py /tmp/rd --only photos > /dev/null 2>&1 || echo "no rd"
G="--precision fp32 --augment cpu --num-workers 2"
declare -A C=(
 [p10]="--data folder:/tmp/rd/photos/train --epochs 6 --image-size 32 --small-stem on"
 [nobn]="--proj-hidden-dim 513"
 [s32nobn]="--image-size 32 --small-stem on --proj-hidden-dim 513"
 [s32c008]="--image-size 32 --small-stem on --crop-min-scale 0.08"
)
LIST=""
for s in 0 1 2 3; do for k in p10 nobn s32nobn s32c008; do LIST+="$k-s$s:${C[$k]} --seed $s $G;"; done; done
t0=$(date +%s)
CANDIDATES="${LIST%;}" DEVICE=cuda JOBS=8 timeout ${T:-380} bash benchmarks/default_run_candidates.sh /tmp/sw > /tmp/sw-all.txt 2>&1
echo "sweep $(( $(date +%s) - t0 )) s" >> /tmp/sw-all.txt
mkdir -p /tmp/res; cp /tmp/sw-all.txt /tmp/sw/*.txt /tmp/res/ 2>/dev/null
for k in "${!C[@]}"; do
  runs=$(ls -d /tmp/sw/$k-s*/eval/linear.json 2>/dev/null | sed 's|/eval/linear.json||')
  [ -n "$runs" ] && { echo "## $k: ${C[$k]}"; python3 benchmarks/seed_spread.py $runs; } >> /tmp/res/spread.md
done
cat /tmp/res/spread.md; tar czf $OUT/sweep2.tgz -C /tmp/res .
