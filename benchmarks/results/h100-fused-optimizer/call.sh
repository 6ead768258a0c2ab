# torch's fused SGD/AdamW on CUDA (the sent tree, "new") against 05c536c ("old", build/old.tar): the graphed ==
# eager check for MobileNetV3-Small, MobileNetV3-Small at 32 px read A B B A in one call, the training thread's host
# time in the new tree, then the check for EfficientNet-B0; each given what is left of DEADLINE.
source benchmarks/ab_call.sh  # START, T, left, stamp, gpu.txt, the trees new and old under build/ab
(cd build/ab/new && PYTHONPATH=. timeout $(left 110) python3 benchmarks/cuda_graph_check.py --backbone mobilenet_v3_small 2>&1 | grep -v DEBUG > $OUT/check-mnv3s.txt; echo "rc ${PIPESTATUS[0]}" >> $OUT/check-mnv3s.txt); stamp check-mnv3s
S="--method simclr --backbone mobilenet_v3_small --image-size 32 --batch-size 512 --augment device --channels-last on"
for t in new old old new; do echo "$t mnv3s-32 $S"; done > /tmp/ab.lines
OUT=$OUT TREES=build/ab TIMEOUT=100 timeout $(left 330) bash build/ab/new/benchmarks/same_call.sh /tmp/ab.lines >> $T 2>&1; stamp lines
(( $(left 999) > 70 )) && { (cd build/ab/new && PYTHONPATH=. timeout $(left 90) python3 benchmarks/results/h100-step-host-time/host_probe.py > $OUT/host-probe.txt 2>&1); stamp host-probe; }
(( $(left 999) > 40 )) && { (cd build/ab/new && PYTHONPATH=. timeout $(left 120) python3 benchmarks/cuda_graph_check.py --backbone efficientnet_b0 2>&1 | grep -v DEBUG > $OUT/check-effb0.txt; echo "rc ${PIPESTATUS[0]}" >> $OUT/check-effb0.txt); stamp check-effb0; }
true
