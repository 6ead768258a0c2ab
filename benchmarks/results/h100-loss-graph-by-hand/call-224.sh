# On the same machine right after call.sh (its trees under build/ab): MobileNetV3-Small at 224 px, new then old.
A="--method simclr --image-size 224 --batch-size 256 --no-compile --warmup 5 --window-steps 10 --augment device --channels-last on --backbone mobilenet_v3_small"
printf "new mnv3s-224 $A\nold mnv3s-224 $A\n" > /tmp/b.lines
OUT=$OUT TREES=build/ab TIMEOUT=85 timeout 175 bash build/ab/new/benchmarks/same_call.sh /tmp/b.lines; true
