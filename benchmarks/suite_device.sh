#!/usr/bin/env bash
# The whole pytest suite on another machine's CPU (CUDA hidden), where the project cannot be pip-installed from an
# index: the packages that machine lacks come as wheels in .whl/ (downloaded where pip works, for its Python), put
# on PYTHONPATH from a --target folder. Prints the CPU, torch, pytest's summary and the reasons of any failure.
# From the repository root:   OUT=DIR bash benchmarks/suite_device.sh     (writes DIR/suite.txt)
# With MUTANTS='patterns' it then runs `mutmut run` on them with every core until TOTAL seconds (default 560) are
# used, and writes DIR/mutmut_results.txt (`mutmut results --all true`).
set -uo pipefail
OUT=${OUT:?set OUT to a folder}
t0=$(date +%s)
if ls .whl/*.whl >/dev/null 2>&1; then
  # compiled at install, as pip does by default: an uncompiled package prints its SyntaxWarnings on first import
  python3 -m pip install -q --no-index --no-deps --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    > "$OUT/pip.txt" 2>&1 || { echo "pip failed"; tail "$OUT/pip.txt"; exit 1; }
  export PYTHONPATH=/tmp/site PATH=/tmp/site/bin:$PATH
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} CUDA_VISIBLE_DEVICES= TQDM_DISABLE=1 PYTHONUNBUFFERED=1
{ lscpu | grep -E "Model name|^CPU\(s\)"
  python3 -c "import torch, PIL, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, torch.backends.cpu.get_cpu_capability(), 'pillow', PIL.__version__)"
  echo "install $(( $(date +%s) - t0 )) s"; } > "$OUT/suite.txt"
t1=$(date +%s)
timeout "${SUITE_T:-300}" python3 -m pytest -p no:cacheprovider -q -n "$(( $(nproc) - 2 ))" -rfEs tests >> "$OUT/suite.txt" 2>&1
echo "pytest rc $? in $(( $(date +%s) - t1 )) s" >> "$OUT/suite.txt"
grep -E "^(FAILED|ERROR|SKIPPED)|^pytest rc" "$OUT/suite.txt"
if [ -n "${MUTANTS:-}" ]; then
  left=$(( ${TOTAL:-560} - ($(date +%s) - t0) - 25 ))
  # shellcheck disable=SC2086
  timeout "$left" python3 -m mutmut run --max-children "$(nproc)" $MUTANTS > "$OUT/mutmut_run.txt" 2>&1
  echo "mutmut rc $? after ${left} s" | tee -a "$OUT/suite.txt"
  python3 -m mutmut results --all true > "$OUT/mutmut_results.txt" 2>&1
fi
