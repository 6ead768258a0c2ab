#!/usr/bin/env bash
# Sweep 3: longer schedules, a lower temperature, a higher rate, smaller crops, 4 seeds each, views made on the
# GPU (--augment device) so 8 runs at a time take about a minute each; the winner is confirmed on the CPU path.
set -uo pipefail
export PYTHONPATH=$PWD TQDM_DISABLE=1
G="--precision fp32 --augment device"
declare -A C=(
 [base]=""
 [e20]="--epochs 20"
 [e20t02]="--epochs 20 --temperature 0.2"
 [e20lr03]="--epochs 20 --lr 0.3"
 [e20c008]="--epochs 20 --crop-min-scale 0.08"
 [t02]="--temperature 0.2"
 [e20t02lr03]="--epochs 20 --temperature 0.2 --lr 0.3"
 [e20t02c008]="--epochs 20 --temperature 0.2 --crop-min-scale 0.08"
)
LIST=""
for s in 0 1 2 3; do for k in base e20 e20t02 e20lr03 e20c008 t02 e20t02lr03 e20t02c008; do LIST+="$k-s$s:${C[$k]} --seed $s $G;"; done; done
t0=$(date +%s)
CANDIDATES="${LIST%;}" DEVICE=cuda JOBS=8 timeout ${T:-500} bash benchmarks/default_run_candidates.sh /tmp/sw > /tmp/sw-all.txt 2>&1
echo "sweep $(( $(date +%s) - t0 )) s" >> /tmp/sw-all.txt
mkdir -p /tmp/res; cp /tmp/sw-all.txt /tmp/sw/*.txt /tmp/res/ 2>/dev/null
for k in base e20 e20t02 e20lr03 e20c008 t02 e20t02lr03 e20t02c008; do
  runs=$(ls -d /tmp/sw/$k-s*/eval/linear.json 2>/dev/null | sed 's|/eval/linear.json||')
  [ -n "$runs" ] && { echo "## $k: ${C[$k]}"; python3 benchmarks/seed_spread.py $runs; } >> /tmp/res/spread.md
done
cat /tmp/res/spread.md; tail -n 3 /tmp/sw-all.txt; tar czf $OUT/sweep3.tgz -C /tmp/res .
