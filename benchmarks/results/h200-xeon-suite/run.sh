#!/usr/bin/env bash
# The whole pytest suite on the H200 host's Intel Xeon CPU (CUDA hidden), then the held-out mutants.
set -uo pipefail
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl > $OUT/pip.txt 2>&1 || { echo pip failed; tail $OUT/pip.txt; exit 1; }
export PYTHONPATH=$PWD:/tmp/site PATH=/tmp/site/bin:$PATH CUDA_VISIBLE_DEVICES= TQDM_DISABLE=1 PYTHONUNBUFFERED=1
{ lscpu | grep -E "Model name|^CPU\(s\)"; python3 -c "import torch,sys; print('python', sys.version.split()[0], 'torch', torch.__version__, torch.backends.cpu.get_cpu_capability())"; } > $OUT/suite.txt
echo "install $(( $(date +%s) - t0 )) s" >> $OUT/suite.txt
t1=$(date +%s)
timeout ${SUITE_T:-300} python3 -m pytest -p no:cacheprovider -q -n 14 -rfEs tests >> $OUT/suite.txt 2>&1; echo "pytest rc $? in $(( $(date +%s) - t1 )) s" >> $OUT/suite.txt
tail -5 $OUT/suite.txt
left=$(( ${TOTAL:-560} - ($(date +%s) - t0) - 25 ))
HELD=$(make -s -f - <<<'include Makefile
p:; @echo $(HELDOUT_MUTANTS)' p 2>/dev/null)
echo "mutants for ${left} s: $HELD" > $OUT/mutants.txt
( timeout $left python3 -m mutmut run --max-children 15 $HELD > $OUT/mutmut_run.txt 2>&1; echo "mutmut rc $?" >> $OUT/mutants.txt )
python3 -m mutmut results --all true > $OUT/mutmut_results.txt 2>&1
tail -c 1500 $OUT/mutmut_run.txt >> $OUT/mutants.txt
cd $OUT && tar czf intel.tgz *.txt && rm -f *.txt
