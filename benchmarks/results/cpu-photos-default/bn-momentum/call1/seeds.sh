#!/usr/bin/env bash
# configs/default.yaml (make all's run) with MobileNetV3's BatchNorm momentum at 0.1, and the same with T 0.2, over
# seeds 0-3 on the CPU path: --device cpu, 2 threads a run (the 2-core machine's), 8 runs at a time on a 16-core
# host; then each run's seed spread, and what recomputing the BatchNorm statistics on center views adds.
set -uo pipefail
export PYTHONPATH=$PWD OMP_NUM_THREADS=2
t0=$(date +%s)
CANDIDATES="m-s0:--seed 0;m-s1:--seed 1;m-s2:--seed 2;m-s3:--seed 3;t02-s0:--seed 0 --temperature 0.2;t02-s1:--seed 1 --temperature 0.2;t02-s2:--seed 2 --temperature 0.2;t02-s3:--seed 3 --temperature 0.2" \
  DEVICE=cpu JOBS=8 timeout ${T:-500} bash benchmarks/default_run_candidates.sh /tmp/cf > /tmp/cf-all.txt 2>&1
echo "runs $(( $(date +%s) - t0 )) s on $(nproc) cores" >> /tmp/cf-all.txt
mkdir -p /tmp/res; cp /tmp/cf-all.txt /tmp/cf/*.txt /tmp/res/
for c in m t02; do
  runs=$(ls -d /tmp/cf/$c-s*/eval/linear.json 2>/dev/null | sed 's|/eval/linear.json||')
  [ -n "$runs" ] && { echo "## $c"; python3 benchmarks/seed_spread.py $runs; } | tee -a /tmp/res/spread.md
done
for r in /tmp/cf/m-s*; do
  [ -f $r/eval/linear.json ] && timeout 60 python3 benchmarks/bn_recalibration.py $r > /tmp/res/recal-$(basename $r).txt 2>&1 &
done
wait
tar czf $OUT/res.tgz -C /tmp/res .
