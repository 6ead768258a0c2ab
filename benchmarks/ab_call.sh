# Sourced by a device call's script (benchmarks/results/*/call*.sh), run from the repository's root on the GPU
# machine with OUT set: START; T, the call's log ($OUT/ab.txt); `left N`, the seconds left of DEADLINE (default
# 540), at most N; `stamp NAME`, the seconds since START, logged; the GPU and the host's CPU in $OUT/gpu.txt; and the
# A/B's two trees under build/ab: new, the sent tree; old, build/old.tar (made beforehand with
# `git archive COMMIT > build/old.tar` and carried along).
START=$(date +%s); T=$OUT/ab.txt
left() { local l=$(( ${DEADLINE:-540} - ($(date +%s) - START) )); (( l < $1 )) && echo $l || echo $1; }
stamp() { echo "$1 $(( $(date +%s) - START )) s" >> $T; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt; lscpu | grep "Model name" >> $OUT/gpu.txt
mkdir -p build/ab/new build/ab/old; tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C build/ab/new; tar -xf build/old.tar -C build/ab/old; stamp trees
