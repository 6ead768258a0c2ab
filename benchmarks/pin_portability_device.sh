#!/usr/bin/env bash
# The pinned-loss tests on another machine's CPU, CUDA hidden, under each ATen kernel build that CPU has: the
# subprocess test (tests/stages/test_pin_portability.py, which runs every pinned run under every other build) once,
# then the in-process pin tests of tests/stages/test_pretrain.py under each ATEN_CPU_CAPABILITY. From the
# repository root; prints the CPU, torch and every pytest summary.   bash benchmarks/pin_portability_device.sh
set -uo pipefail
export PYTHONPATH=${PYTHONPATH:-.} CUDA_VISIBLE_DEVICES= TQDM_DISABLE=1
lscpu | grep -E "Model name|^CPU\(s\)|Flags" | sed 's/^Flags:.*/flags with avx512f: '"$(grep -c avx512f /proc/cpuinfo)"' of '"$(nproc)"' cpus/'
python3 -c "import torch; print('torch', torch.__version__, 'best capability', torch.backends.cpu.get_cpu_capability())"
caps="default avx2"; grep -q avx512f /proc/cpuinfo && caps+=" avx512"
echo "== tests/stages/test_pin_portability.py (subprocesses under: $caps, but the process's own)"
python3 -m pytest -p no:cacheprovider -q -x -n 4 tests/stages/test_pin_portability.py 2>&1 | tail -n 30
for cap in $caps; do
  echo "== ATEN_CPU_CAPABILITY=$cap tests/stages/test_pretrain.py -k pin"
  ATEN_CPU_CAPABILITY=$cap python3 -m pytest -p no:cacheprovider -q -n 4 tests/stages/test_pretrain.py -k pin 2>&1 | tail -n 30
done
