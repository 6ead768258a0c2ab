#!/usr/bin/env bash
# Two-GPU weak scaling, in one call on a 2-GPU machine (from the repository root):
#
#   bash benchmarks/scaling_gpu.sh OUT_DIR
#
# 1. `pipeline bench` of both configurations of docs/benchmarks.md on one GPU and then on two (weak scaling: the same per-GPU
#    batch, so the global batch doubles), this tree's code, back to back: OUT_DIR/bench.jsonl, one JSON line each,
#    and the 2-GPU 32 px run also profiled (OUT_DIR/profile/); then the scaling table (scaling = 2-GPU e2e /
#    (2 x 1-GPU e2e), and each 2-GPU e2e against its own ceiling).
# 2. A real `pipeline pretrain --gpus 2` (SimCLR, digits-sizes of benchmarks/recipe_datasets.py, 32 px, 100 epochs,
#    batch 1024 = 512 per GPU), `pipeline strip`, and the held-out kNN of its encoder (benchmarks/recipe_knn.py).
set -euo pipefail
OUT=${1:?usage: bash benchmarks/scaling_gpu.sh OUT_DIR}
mkdir -p "$OUT"
export PYTHONPATH=. PYTHONUNBUFFERED=1 TQDM_DISABLE=1
PY=${PYTHON:-python3}
# --no-compile: the eager step the table measured (a ResNet on CUDA compiles when --compile is unset)
bench() { $PY -m pipeline bench --json --no-compile "$@" >> "$OUT/bench.jsonl"; tail -n 1 "$OUT/bench.jsonl"; }
S="--method simclr --backbone resnet18 --image-size 32 --augment device --channels-last on"
L="--method simclr --backbone resnet50 --image-size 224 --augment device --channels-last on --warmup 5 --window-steps 10"
: > "$OUT/bench.jsonl"
CUDA_VISIBLE_DEVICES=0 bench $S --batch-size 512
bench $S --batch-size 1024 --gpus 2 --profile "$OUT/profile"
CUDA_VISIBLE_DEVICES=0 bench $L --batch-size 256
bench $L --batch-size 512 --gpus 2
$PY - "$OUT/bench.jsonl" <<'PYEOF' | tee "$OUT/scaling.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
one = {(r["backbone"], r["image_size"]): r for r in rows if r["processes"] == 1}
print("| config | 1 GPU e2e (ratio) | 2 GPUs e2e | scaling = 2-GPU / (2 x 1-GPU) | 2-GPU ceiling | 2-GPU ratio | CUDA graphs |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    if r["processes"] != 2:
        continue
    o = one[(r["backbone"], r["image_size"])]
    print(f"| {r['backbone']}, {r['image_size']} px, {r['per_process_batch']} per GPU | {o['e2e_img_s']:,.0f} img/s "
          f"({o['ratio']:.3f}) | {r['e2e_img_s']:,.0f} img/s | **{r['e2e_img_s'] / (2 * o['e2e_img_s']):.3f}** | "
          f"{r['ceiling_img_s']:,.0f} | **{r['ratio']:.3f}** | {r['cuda_graphs']} |")
PYEOF
# 2. a real two-GPU training run, as a user types it
$PY benchmarks/recipe_datasets.py "$OUT/data" --only digits-sizes > /dev/null
START=$(date +%s)
$PY -m pipeline pretrain --method simclr --data "folder:$OUT/data/digits-sizes/train" --image-size 32 --epochs 100 \
    --batch-size 1024 --device cuda --gpus 2 --no-compile --out "$OUT/run-2gpu" 2>&1 | tail -n 4
echo "pretrain --gpus 2 wall: $(( $(date +%s) - START )) s"
$PY -m pipeline strip --run "$OUT/run-2gpu" | tail -n 1
$PY benchmarks/recipe_knn.py --train "$OUT/data/digits-sizes/train" --eval "$OUT/data/digits-sizes/eval" \
    --encoder "$OUT/run-2gpu/export/encoder.pt" --device cuda
