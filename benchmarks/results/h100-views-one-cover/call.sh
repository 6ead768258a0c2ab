# The views' graph fix on a GPU: its CUDA tests, EfficientNet-B0 and ConvNeXt-T at 224 px (stochastic depth), MNv3-S
# at 224 px twice and at 32 px, then the views' probe; each given what is left of DEADLINE.
START=$(date +%s); T=$OUT/ab.txt
left() { local l=$(( ${DEADLINE:-570} - ($(date +%s) - START) )); (( l < $1 )) && echo $l || echo $1; }
stamp() { echo "$1 $(( $(date +%s) - START )) s" >> $T; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt; mkdir -p build/ab/main; tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C build/ab/main; stamp tree
(cd build/ab/main && PYTHONPATH=. timeout $(left 120) python3 -m pytest -p no:cacheprovider tests/train/test_device_augment.py tests/train/test_colour_kernel.py -k "cuda or hopper" -rA 2>&1 | grep -v DEBUG | tail -25 > $OUT/pytest.txt); stamp pytest
A="--method simclr --image-size 224 --batch-size 256 --no-compile --warmup 5 --window-steps 10 --augment device --channels-last on"
{ for b in efficientnet_b0 mobilenet_v3_small efficientnet_b0 mobilenet_v3_small convnext_tiny; do echo "main $b-224 $A --backbone $b"; done
  echo "main mobilenet_v3_small-32 --method simclr --backbone mobilenet_v3_small --image-size 32 --batch-size 512 --augment device --channels-last on"
} > /tmp/l224.lines
OUT=$OUT TREES=build/ab TIMEOUT=150 timeout $(left 500) bash build/ab/main/benchmarks/same_call.sh /tmp/l224.lines >> $T 2>&1; stamp lines
(( $(left 999) > 40 )) && { (cd build/ab/main && PYTHONPATH=. timeout $(left 60) python3 benchmarks/gpu_probe.py > $OUT/gpu_probe.txt 2>&1; echo rc $? >> $OUT/gpu_probe.txt); stamp probe; }
true
