#!/usr/bin/env bash
# Every backbone's `pipeline bench` line on one CUDA GPU (docs/benchmarks.md, "Every backbone"), from the repository
# root; one JSON line per bench appended to $OUT/backbones.jsonl (default ./bench-results). SimCLR, device
# augmentation, channels_last, CUDA graphs: the defaults on CUDA. Every line is also profiled (`--profile`, the
# traces and each line's stderr under $PROFILES, default $OUT/profiles; their summary is in the JSON line): its word
# says where a ratio below 0.95 goes.
# Usage: benchmarks/backbones_gpu.sh PART [PART ...]   (default: small large)
#   small:   every backbone, small stem, 32 px, batch 512
#   large:   the mobile nets, ViT-S/16 and ViT-Ti/16 (and ResNet-50 as the reference line), 224 px, batch 256
#   compile: torch.compile inside the CUDA graphs against the eager graphed step and the ungraphed compiled one
#            (ResNet-18 32 px for each method, ResNet-50 224 px); the compiled line twice, the second on the compile cache
set -euo pipefail
export PYTHONPATH=${PYTHONPATH:-.} PYTHONUNBUFFERED=1
OUT=${OUT:-bench-results}
PROFILES=${PROFILES:-$OUT/profiles}
mkdir -p "$OUT" "$PROFILES"
LIMIT=${LIMIT:-240}  # seconds one bench may take before it is cut (a cut line is reported as missing, not fatal); a MobileNet line took 51 s at 32 px (20 of them cuDNN timing its convolutions) and under 110 s at 224 px
PROFILE=${PROFILE:-1}  # 0: no --profile (its profiled window adds a minute or more a line; the speeds are the same)
bench() {  # NAME ARGS...: one line, profiled into $OUT/profiles/NAME unless PROFILE=0; eager (--no-compile) as the tables were measured
  local name=$1; shift
  local prof=(); [[ $PROFILE == 0 ]] || prof=(--profile "$PROFILES/$name")
  CUDA_VISIBLE_DEVICES=0 timeout "$LIMIT" python3 -m pipeline bench --json --no-compile "${prof[@]}" "$@" \
    > "$PROFILES/$name.out" 2> "$PROFILES/$name.err" || { echo "FAILED $name: $(tail -n 2 "$PROFILES/$name.err")"; return 0; }
  tail -n 1 "$PROFILES/$name.out" | python3 -c "import json,sys; r=json.load(sys.stdin); r['name']='$name'; print(json.dumps(r))" \
    >> "$OUT/backbones.jsonl"
  tail -n 1 "$OUT/backbones.jsonl" | python3 -c "import json,sys; r=json.load(sys.stdin); print(r['name'], r['e2e_img_s'], r['ceiling_img_s'], r['ratio'], r['setup_s'])"
}
BACKBONES=${BACKBONES:-"resnet18 resnet34 resnet50 mobilenet_v3_small mobilenet_v3_large efficientnet_b0 convnext_tiny vit_b_16 vit_s_16 vit_t_16"}  # the small part's
LARGE=${LARGE:-"mobilenet_v3_small mobilenet_v3_large efficientnet_b0 vit_t_16 vit_s_16 resnet50"}  # the large part's backbones
G="--augment device --channels-last on"

parts=("$@")
[[ ${#parts[@]} -gt 0 ]] || parts=(small large)
for part in "${parts[@]}"; do
  case $part in
    small) for b in $BACKBONES; do bench "$b-32" --method simclr --backbone "$b" --image-size 32 --batch-size 512 $G; done ;;
    large) for b in $LARGE; do bench "$b-224" --method simclr --backbone "$b" --image-size 224 --batch-size 256 \
             --warmup 5 --window-steps 10 $G; done ;;
    compile)
      for m in simclr byol mocov3; do
        bench "$m-resnet18-32-eager-graphs" --method $m --backbone resnet18 --image-size 32 --batch-size 512 $G --cuda-graphs on
        bench "$m-resnet18-32-compile-graphs" --method $m --backbone resnet18 --image-size 32 --batch-size 512 $G --compile --cuda-graphs on
      done
      bench "simclr-resnet18-32-compile-graphs-cached" --method simclr --backbone resnet18 --image-size 32 --batch-size 512 $G --compile --cuda-graphs on
      bench "simclr-resnet18-32-compile-nographs" --method simclr --backbone resnet18 --image-size 32 --batch-size 512 $G --compile --cuda-graphs off
      L="--method simclr --backbone resnet50 --image-size 224 --batch-size 256 --warmup 5 --window-steps 10"
      bench "simclr-resnet50-224-eager-graphs" $L $G --cuda-graphs on
      bench "simclr-resnet50-224-compile-graphs" $L $G --compile --cuda-graphs on ;;
    *) echo "unknown part $part (small | large | compile)" >&2; exit 2 ;;
  esac
done
