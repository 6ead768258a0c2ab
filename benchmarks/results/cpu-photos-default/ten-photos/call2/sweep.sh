#!/usr/bin/env bash
# The `photos` SPEC as ten photographs, class = photograph (scikit-image's seven beside the three of scikit-learn and
# matplotlib), 240 train / 60 val patches each (216 steps of 128 in 12 epochs, as the default), val from each
# picture's right quarter: patches 64-128 px of the source (capped by the strip), at 64 px; configs/default.yaml with
# --temperature 0.2 (t02), --crop-min-scale 0.08 (c08) and --batch-size 256 (b256: 108 steps of 256, the rate scaled
# by the recipe) over seeds 0-3 on the CPU path (--device cpu, 2 threads a run, 12 runs at a time on a 16-core host).
# The variant is a patch of the call's copy of train/photos.py (the python block below), selected by PHOTOS_VARIANT.
set -uo pipefail
export PYTHONPATH=$PWD OMP_NUM_THREADS=2
python3 - <<'PY'
p = "train/photos.py"; s = open(p).read()
s = s.replace('''    return {k: np.ascontiguousarray(v[..., :3]) for k, v in pics.items()}''', '''    import os
    if os.environ.get("PHOTOS_VARIANT"):
        import skimage.data as sk
        pics.update({n: getattr(sk, n)() for n in ("astronaut", "chelsea", "coffee", "rocket", "retina", "immunohistochemistry")})
        pics["motorcycle"] = sk.stereo_motorcycle()[0]
    return {k: np.ascontiguousarray(v[..., :3]) for k, v in pics.items()}''')
s = s.replace('''SET_SEED = 0  # one set for every run''', '''SET_SEED = 0  # one set for every run
import os
if os.environ.get("PHOTOS_VARIANT"):
    GRID, TRAIN_PER_CLASS, VAL_PER_CLASS = (1, 1), 240, 60
    if os.environ["PHOTOS_VARIANT"] == "p10big":
        PATCH_RANGE = (64, 128)''')
s = s.replace('''for name in ("china", "flower", "grace_hopper")''', '''for name in photographs()''')
open(p, "w").write(s)
PY
python3 -c "import os; os.environ['PHOTOS_VARIANT']='p10big'; from train import photos; x=photos.build(64); print(x[0].shape, len(x[3]), x[2].sum())"
t0=$(date +%s)
declare -A C=([t02]="--temperature 0.2" [c08]="--crop-min-scale 0.08" [b256]="--batch-size 256")
for v in t02 c08 b256; do
  PHOTOS_VARIANT=p10big CANDIDATES="$v-s0:${C[$v]} --seed 0;$v-s1:${C[$v]} --seed 1;$v-s2:${C[$v]} --seed 2;$v-s3:${C[$v]} --seed 3" \
    DEVICE=cpu JOBS=4 timeout ${T:-560} bash benchmarks/default_run_candidates.sh /tmp/cf > /tmp/cf-$v.txt 2>&1 &
done
wait
echo "runs $(( $(date +%s) - t0 )) s on $(nproc --all) cores" | tee -a /tmp/cf-t02.txt
mkdir -p /tmp/res; cp /tmp/cf-*.txt /tmp/cf/*.txt /tmp/res/
for c in t02 c08 b256; do
  runs=$(ls -d /tmp/cf/$c-s*/eval/linear.json 2>/dev/null | sed 's|/eval/linear.json||')
  [ -n "$runs" ] && { echo "## $c"; python3 benchmarks/seed_spread.py $runs; } | tee -a /tmp/res/spread.md
done
tar czf $OUT/res.tgz -C /tmp/res .
