# Where the 32 px step's remaining gap goes, in the sent tree (fused optimizer, "new") and 05c536c ("old"):
# bench --profile of the new tree (GPU busy, both phases), the old tree's training-thread host time (host_probe),
# MobileNetV3-Small 32 px read B A A B, then the views' GPU time (gpu_probe); each given what is left of DEADLINE.
source benchmarks/ab_call.sh  # START, T, left, stamp, gpu.txt, the trees new and old under build/ab
S="--method simclr --backbone mobilenet_v3_small --image-size 32 --batch-size 512 --augment device --channels-last on"
(cd build/ab/new && PYTHONPATH=. TQDM_DISABLE=1 timeout $(left 120) python3 -m pipeline bench $S --profile /tmp/prof > $OUT/profile-new.txt 2>&1); stamp profile
(cd build/ab/old && PYTHONPATH=. timeout $(left 90) python3 ../new/benchmarks/results/h100-step-host-time/host_probe.py > $OUT/host-probe-old.txt 2>&1); stamp host-probe-old
for t in old new new old; do echo "$t mnv3s-32 $S"; done > /tmp/ab.lines
OUT=$OUT TREES=build/ab TIMEOUT=100 timeout $(left 320) bash build/ab/new/benchmarks/same_call.sh /tmp/ab.lines >> $T 2>&1; stamp lines
(( $(left 999) > 40 )) && { (cd build/ab/new && PYTHONPATH=. timeout $(left 120) python3 benchmarks/gpu_probe.py > $OUT/gpu-probe.txt 2>&1); stamp gpu-probe; }
true
