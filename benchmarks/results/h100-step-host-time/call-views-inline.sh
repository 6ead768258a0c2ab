# MobileNetV3-Small at 32 px (host-bound): the views made by a worker thread on a side stream (main), on the
# caller's thread and stream in series with the step (inline.patch), and on the caller's thread but the side
# stream (sidehost.patch), read in the order A B C B A C in one call; then EfficientNet-B0 at 224 px.
START=$(date +%s); T=$OUT/ab.txt
left() { local l=$(( ${DEADLINE:-560} - ($(date +%s) - START) )); (( l < $1 )) && echo $l || echo $1; }
stamp() { echo "$1 $(( $(date +%s) - START )) s" >> $T; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt; nproc >> $OUT/gpu.txt; lscpu | grep "Model name" >> $OUT/gpu.txt
for t in main inline sidehost; do mkdir -p build/ab/$t; tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C build/ab/$t; done
patch -d build/ab/inline -p1 < benchmarks/results/h100-step-host-time/inline.patch >> $T && patch -d build/ab/sidehost -p1 < benchmarks/results/h100-step-host-time/sidehost.patch >> $T; stamp trees
S="--method simclr --backbone mobilenet_v3_small --image-size 32 --batch-size 512 --augment device --channels-last on"
for t in main inline sidehost inline main sidehost; do echo "$t mnv3s-32 $S"; done > /tmp/ab.lines
OUT=$OUT TREES=build/ab TIMEOUT=100 timeout $(left 470) bash build/ab/main/benchmarks/same_call.sh /tmp/ab.lines >> $T 2>&1; stamp lines
(( $(left 999) > 85 )) && { echo "main effb0-224 --method simclr --image-size 224 --batch-size 256 --no-compile --warmup 5 --window-steps 10 --augment device --channels-last on --backbone efficientnet_b0" > /tmp/e.lines
  OUT=$OUT TREES=build/ab TIMEOUT=$(left 100) bash build/ab/main/benchmarks/same_call.sh /tmp/e.lines >> $T 2>&1; stamp effb0; }
true
