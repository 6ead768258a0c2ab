# SimCLR, MoCo v3 and BYOL pretraining wall time, 3 repeats interleaved, on one machine in one call.
mkdir -p build/rt; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
REPEATS=3 timeout -k 10 560 bash benchmarks/recipe_timing.sh build/rt > $OUT/stdout.txt 2>&1; echo rc $? >> $OUT/stdout.txt
cp build/rt/timing.jsonl build/rt/timing.txt $OUT/ 2>/dev/null; tar -czf $OUT/logs.tgz -C build/rt logs; true
