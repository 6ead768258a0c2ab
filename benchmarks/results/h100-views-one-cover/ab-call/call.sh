# MobileNetV3-Small at 224 px, the graph per count (05b019f, build/old.tar) against one cover graph (the sent tree),
# read A B B A in one call; then each tree's views probe.
START=$(date +%s); T=$OUT/ab.txt
left() { local l=$(( ${DEADLINE:-420} - ($(date +%s) - START) )); (( l < $1 )) && echo $l || echo $1; }
stamp() { echo "$1 $(( $(date +%s) - START )) s" >> $T; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
mkdir -p build/ab/main build/ab/old; tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C build/ab/main; tar -xf build/old.tar -C build/ab/old; stamp trees
A="--method simclr --image-size 224 --batch-size 256 --no-compile --warmup 5 --window-steps 10 --augment device --channels-last on --backbone mobilenet_v3_small"
printf "main mnv3s-224 $A\nold mnv3s-224 $A\nold mnv3s-224 $A\nmain mnv3s-224 $A\n" > /tmp/ab.lines
OUT=$OUT TREES=build/ab TIMEOUT=100 timeout $(left 360) bash build/ab/main/benchmarks/same_call.sh /tmp/ab.lines >> $T 2>&1; stamp lines
for t in old main; do (( $(left 999) > 30 )) && { (cd build/ab/$t && PYTHONPATH=. timeout $(left 45) python3 benchmarks/gpu_probe.py > $OUT/gpu_probe-$t.txt 2>&1); stamp probe-$t; }; done
true
