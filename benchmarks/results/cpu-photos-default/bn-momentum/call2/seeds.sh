#!/usr/bin/env bash
# configs/default.yaml (make all's run) with MobileNetV3's BatchNorm momentum at 0.1, at 32 px with the small stem, and at 64 px for 16 epochs, over
# seeds 0-3 on the CPU path: --device cpu, 2 threads a run (the 2-core machine's), 8 runs at a time on a 16-core
# host; then each candidate's seed spread.
set -uo pipefail
export PYTHONPATH=$PWD OMP_NUM_THREADS=2
t0=$(date +%s)
CANDIDATES="p32-s0:--seed 0 --image-size 32 --small-stem on;p32-s1:--seed 1 --image-size 32 --small-stem on;p32-s2:--seed 2 --image-size 32 --small-stem on;p32-s3:--seed 3 --image-size 32 --small-stem on;e16-s0:--seed 0 --epochs 16;e16-s1:--seed 1 --epochs 16;e16-s2:--seed 2 --epochs 16;e16-s3:--seed 3 --epochs 16" \
  DEVICE=cpu JOBS=8 timeout ${T:-500} bash benchmarks/default_run_candidates.sh /tmp/cf > /tmp/cf-all.txt 2>&1
echo "runs $(( $(date +%s) - t0 )) s on $(nproc) cores" >> /tmp/cf-all.txt
mkdir -p /tmp/res; cp /tmp/cf-all.txt /tmp/cf/*.txt /tmp/res/
for c in p32 e16; do
  runs=$(ls -d /tmp/cf/$c-s*/eval/linear.json 2>/dev/null | sed 's|/eval/linear.json||')
  [ -n "$runs" ] && { echo "## $c"; python3 benchmarks/seed_spread.py $runs; } | tee -a /tmp/res/spread.md
done
tar czf $OUT/res.tgz -C /tmp/res .
