# The training thread's host time a step (host_probe.py), the views' host work (views_host.py), numpy's build.
START=$(date +%s); T=$OUT/host.txt
lscpu | grep -E "Model name|MHz|^CPU\(s\)" > $OUT/cpu.txt; python3 -c "import numpy, torch; print(numpy.__version__, torch.__version__)" >> $OUT/cpu.txt
python3 -c "import numpy; numpy.show_config()" >> $OUT/cpu.txt 2>&1
OMP_NUM_THREADS=1 timeout 60 python3 benchmarks/views_host.py --repeats 5 --steps 50 > $OUT/views_host.txt 2>&1
timeout 60 python3 benchmarks/views_host.py --repeats 5 --steps 50 >> $OUT/views_host.txt 2>&1
TQDM_DISABLE=1 timeout 300 python3 benchmarks/results/h100-step-host-time/host_probe.py > $T 2>&1; echo "rc $? $(( $(date +%s) - START )) s" >> $T
true
