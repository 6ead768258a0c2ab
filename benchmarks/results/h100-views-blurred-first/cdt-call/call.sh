# One call: the blurred-first views (views.patch) against main, with a deadline so each step gets what is left.
START=$(date +%s); T=$OUT/ab.txt
left() { local l=$(( 200 - ($(date +%s) - START) )); (( l < $1 )) && echo $l || echo $1; }
stamp() { echo "$1 $(( $(date +%s) - START )) s" >> $T; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/env.txt
mkdir -p build/ab/head; tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C build/ab/head
cp -a build/ab/head build/ab/new; (cd build/ab/new && patch -p1 -s < views.patch) || { echo patch failed >> $T; exit 1; }
cd build/ab/new; stamp trees
PYTHONPATH=. timeout $(left 90) python3 benchmarks/results/h100-views-blurred-first/diag_views.py > $OUT/diag.txt 2>&1; echo rc $? >> $OUT/diag.txt; stamp diag
PYTHONPATH=. timeout $(left 120) python3 -m pytest -p no:cacheprovider tests/train/test_device_augment.py tests/train/test_colour_kernel.py -k "cuda or hopper" -rA 2>&1 | grep -v DEBUG > $OUT/pytest.txt; stamp pytest
grep -v '^#' benchmarks/views_ab.lines | grep mnv3s-224 > /tmp/a224.lines; grep -v '^#' benchmarks/views_ab.lines | grep mnv3s-32 > /tmp/a32.lines
cd ../../..
OUT=$OUT TREES=build/ab TIMEOUT=80 timeout $(left 330) bash build/ab/new/benchmarks/same_call.sh /tmp/a224.lines >> $OUT/ab.txt 2>&1; stamp ab224
for t in new head; do (cd build/ab/$t && PYTHONPATH=. timeout $(left 60) python3 benchmarks/gpu_probe.py > $OUT/gpu_probe-$t.txt 2>&1; echo rc $? >> $OUT/gpu_probe-$t.txt); stamp probe-$t; done
(( $(left 999) > 150 )) && { OUT=$OUT TREES=build/ab TIMEOUT=75 timeout $(left 170) bash build/ab/new/benchmarks/same_call.sh /tmp/a32.lines >> $OUT/ab.txt 2>&1; stamp ab32; }
true
