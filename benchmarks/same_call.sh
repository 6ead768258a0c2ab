#!/usr/bin/env bash
# `pipeline bench` lines, each in its own source tree, one after another in one call on a CUDA machine: an A/B of
# commits on the same machine, minutes apart. LINES is a file of "TREE LABEL BENCH-ARGS..." lines (# comments and
# blank lines skipped); TREE is a folder under TREES holding a full copy of one commit, made beforehand with
#   git archive COMMIT | tar -x -C TREES/TREE
# Each result is appended to $OUT/same_call.jsonl as bench's JSON with "tree" and "label" added; a line that fails
# or outruns TIMEOUT seconds (default 150) is noted in $OUT/err.txt and the next line runs.
#   OUT=DIR TREES=build/ab bash benchmarks/same_call.sh benchmarks/compile_ab.lines
set -uo pipefail
LINES=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
OUT=${OUT:?set OUT}; TREES=${TREES:?set TREES}; TIMEOUT=${TIMEOUT:-150}
mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)
export PYTHONUNBUFFERED=1 TQDM_DISABLE=1 CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-0}
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch; print(torch.__version__)"; } > "$OUT/env.txt" 2>&1
while read -r tree label args; do
  [[ -z "$tree" || "$tree" == \#* ]] && continue
  t0=$(date +%s)
  # shellcheck disable=SC2086
  if line=$(cd "$TREES/$tree" && PYTHONPATH=. timeout "$TIMEOUT" python3 -m pipeline bench --json $args 2>>"$OUT/err.txt" | tail -n 1) \
     && [[ "$line" == \{* ]]; then
    python3 -c 'import json, sys; d = json.loads(sys.argv[3]); print(json.dumps({"tree": sys.argv[1], "label": sys.argv[2], **d}))' \
      "$tree" "$label" "$line" >> "$OUT/same_call.jsonl"
    python3 -c 'import json, sys
d, tree, label = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
e2e, ceiling, ratio, setup = d["e2e_img_s"], d["ceiling_img_s"], d["ratio"], d.get("setup_s", 0)
print(f"{tree:>5s} {label:<30s} e2e {e2e:>9,.0f}  ceiling {ceiling:>9,.0f}  ratio {ratio:.3f}  setup {setup:.1f} s")' \
      "$line" "$tree" "$label"
  else
    echo "FAILED $tree $label after $(( $(date +%s) - t0 )) s" | tee -a "$OUT/err.txt"
  fi
done < "$LINES"
