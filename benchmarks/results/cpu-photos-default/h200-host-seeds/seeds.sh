#!/usr/bin/env bash
# configs/default.yaml (make all's run) over seeds 0-3 on the CPU path: --device cpu, 2 threads a run (the 2-core
# machine's), 4 runs at a time on a 16-core host; then the seed spread.
set -uo pipefail
export PYTHONPATH=$PWD
t0=$(date +%s)
CANDIDATES="s0:--seed 0;s1:--seed 1;s2:--seed 2;s3:--seed 3" DEVICE=cpu JOBS=4 timeout ${T:-560} \
  bash benchmarks/default_run_candidates.sh /tmp/cf > /tmp/cf-all.txt 2>&1
echo "seeds $(( $(date +%s) - t0 )) s on $(nproc) cores" >> /tmp/cf-all.txt
mkdir -p /tmp/res; cp /tmp/cf-all.txt /tmp/cf/*.txt /tmp/res/
runs=$(ls -d /tmp/cf/s*/eval/linear.json 2>/dev/null | sed 's|/eval/linear.json||')
python3 benchmarks/seed_spread.py $runs | tee /tmp/res/spread.md
tail -n 2 /tmp/cf-all.txt; tar czf $OUT/confirm.tgz -C /tmp/res .
