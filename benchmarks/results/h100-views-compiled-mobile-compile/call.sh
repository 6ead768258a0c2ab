# The views beside MobileNetV3-Small's 32 px step, three trees: "new", the sent tree (f992bd9: the resize's two
# matrices in one compiled function); "old", its parent 7c1e4d6 (build/old.tar); "swi", old with Python's thread
# switch interval at 0.5 ms instead of 5 ms (a sitecustomize.py at its root, read at start-up through PYTHONPATH),
# to see whether the training thread's wait for views is the views' worker holding the GIL. The views' GPU time in
# new (gpu_probe), the lines interleaved, then old's views; each given what is left of DEADLINE.
source benchmarks/ab_call.sh  # START, T, left, stamp, gpu.txt, the trees new and old under build/ab
mkdir -p build/ab/swi && tar -xf build/old.tar -C build/ab/swi && echo "import sys; sys.setswitchinterval(0.0005); print('sitecustomize: switch interval', sys.getswitchinterval(), file=sys.stderr)" > build/ab/swi/sitecustomize.py
(cd build/ab/new && PYTHONPATH=. timeout $(left 100) python3 benchmarks/gpu_probe.py > $OUT/gpu-probe-new.txt 2>&1); stamp gpu-probe-new
S="--method simclr --backbone mobilenet_v3_small --image-size 32 --batch-size 512 --augment device --channels-last on"
for t in old new swi swi new old; do echo "$t mnv3s-32 $S"; done > /tmp/ab.lines
OUT=$OUT TREES=build/ab TIMEOUT=90 timeout $(left 400) bash build/ab/new/benchmarks/same_call.sh /tmp/ab.lines >> $T 2>&1; stamp lines
(( $(left 999) > 45 )) && { (cd build/ab/old && PYTHONPATH=. timeout $(left 100) python3 ../new/benchmarks/gpu_probe.py > $OUT/gpu-probe-old.txt 2>&1); stamp gpu-probe-old; }
true
