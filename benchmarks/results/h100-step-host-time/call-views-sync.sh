# Whether the views' host calls wait for the GPU (views_sync_probe.py), then MobileNetV3-Small at 32 px profiled.
START=$(date +%s); T=$OUT/probe.txt
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt; lscpu | grep "Model name" >> $OUT/gpu.txt
timeout 120 python3 benchmarks/results/h100-step-host-time/views_sync_probe.py > $T 2>&1; echo "probe rc $? $(( $(date +%s) - START )) s" >> $T
TQDM_DISABLE=1 timeout 200 python3 -m pipeline bench --method simclr --backbone mobilenet_v3_small --image-size 32 --batch-size 512 --augment device --channels-last on --profile /tmp/prof > $OUT/bench_profile.txt 2>&1; echo "bench rc $? $(( $(date +%s) - START )) s" >> $T
true
