# pipeline bench on the quiet 2-core machine, batch 32, two-step windows, every backbone one after another
OUT=${OUT:?set OUT to a folder}
for B in mobilenet_v3_small mobilenet_v3_large efficientnet_b0 vit_t_16 resnet18 convnext_tiny resnet34 resnet50 vit_s_16 vit_b_16; do
  .venv/bin/pipeline bench --device cpu --backbone $B --batch-size 32 --window-steps 2 --warmup 1 --json 2>$OUT/$B.err | tail -1 >> $OUT/bench.jsonl
done
