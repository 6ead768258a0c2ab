#!/usr/bin/env bash
# The recipe grid on the GPUs of one machine. For every dataset x method x seed: pretrain exactly as a user types it,
#   pipeline pretrain --method M --data folder:TRAIN --image-size 32 --epochs 100 --batch-size 512 --device cuda \
#       --seed S --out RUN
# then `pipeline strip --run RUN`, then the kNN (k = 200, T = 0.1, cosine) of RUN/export/encoder.pt's features,
# eval images against train images (benchmarks/recipe_knn.py); the random init of every seed as the baseline; then
# benchmarks/recipe_summary.py prints mean ± spread per method and dataset with the wall times.
#
#   bash benchmarks/recipes_gpu.sh OUT_DIR
#
# The same command again on the same OUT_DIR goes on where the last one stopped: a cell with a result line is kept,
# a training that a signal stopped resumes exactly from its checkpoints/last.pt (pipeline pretrain --resume), and
# anything else (a failed cell, a run stopped before its first checkpoint) runs afresh. `timeout -k 60 SECONDS bash
# ...` and Ctrl-C reach every process of the grid: each training stops after its step under way and writes its
# checkpoint, and the grid exits 130 once they have; a TERM sent to the script alone starts no further cell and
# lets those under way finish. A 10-minute GPU call can so take up a grid where the previous call left it, on a
# machine that kept OUT_DIR.
#
# Everything is written under OUT_DIR: data/ (benchmarks/recipe_datasets.py's sets, unless DATA names a built
# copy), runs/[<backbone>/]<dataset>/<method>-s<seed>[-<variant>]/ (full run directories), logs/, results.jsonl (one
# line per kNN), new.jsonl (the lines this command added: what one call ran, apart from the lines an earlier call or a
# copied-in file left in results.jsonl), wall.txt, summary.txt. Sized for about 12 minutes on one H200 with the
# defaults: 4 sets (~4,400 train images each, 8 steps an epoch; digits 2), 3 methods, 3 seeds, JOBS trainings at
# once on each GPU (a 32 px ResNet-18 step is too small to fill an H200 alone, and the runs' start-up, strip and kNN
# overlap others' steps).
# Each training holds its whole working set on the GPU (at 32 px, batch 512: 6-9 GiB for ResNet-18/34 and the mobile
# nets, up to ~16 GiB for ConvNeXt-T and ViT-S/16, 17-21 GiB for ResNet-50, 26-29 GiB for ViT-B/16): 16 of the first
# kind fit an H200's 140 GiB and 24 ran it out of memory; 8 of the second fit and 15 did not; 5 ResNet-50 and 1
# ViT-B/16 fit. Count every grid sharing the GPU.
#
# Environment knobs: METHODS ("simclr byol mocov3"), SEEDS ("0 1 2"), DATASETS ("digits digits-sizes textures
# photos"), BACKBONE (resnet18; several names, e.g. "resnet34 vit_s_16", run as one grid under one JOBS cap, so a
# call can fill the GPU with several backbones without two grids' caps adding up), EPOCHS (100), BATCH (512),
# IMAGE_SIZE (32), DEVICE (cuda), JOBS (4, per GPU), DATA (OUT_DIR/data), GPUS (with DEVICE=cuda: the GPUs to spread
# the cells over, e.g. "0 1"; default every GPU in CUDA_VISIBLE_DEVICES or, unset, every one nvidia-smi lists: each
# cell starts on the GPU running fewest and is pinned to it by CUDA_VISIBLE_DEVICES, since a training uses one GPU),
# START_BY (seconds: no cell starts later than this after the grid began; for a call whose machine may not outlive
# it, where a cell started late would only share the GPU with the others and be lost half done), PYTHON (python3),
# VARIANTS: "label:extra pretrain flags;label2:flags" runs every cell once per variant, e.g.
# VARIANTS="auto:;paper:--recipe paper" (default: one variant "auto" with no extra flag: what a user gets).
# A smoke test on a CPU: EPOCHS=1 SEEDS=0 DEVICE=cpu JOBS=2 bash benchmarks/recipes_gpu.sh /tmp/recipes-smoke
set -euo pipefail
(( BASH_VERSINFO[0] > 5 || (BASH_VERSINFO[0] == 5 && BASH_VERSINFO[1] >= 1) )) \
  || { echo "error: recipes_gpu.sh needs bash 5.1 or later (wait -n -p); this is bash $BASH_VERSION" >&2; exit 2; }
OUT=${1:?usage: bash benchmarks/recipes_gpu.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
METHODS=${METHODS:-simclr byol mocov3}
SEEDS=${SEEDS:-0 1 2}
DATASETS=${DATASETS:-digits digits-sizes textures photos}
EPOCHS=${EPOCHS:-100}
BATCH=${BATCH:-512}
IMAGE_SIZE=${IMAGE_SIZE:-32}
BACKBONE=${BACKBONE:-resnet18}
DEVICE=${DEVICE:-cuda}
JOBS=${JOBS:-4}
START_BY=${START_BY:-}
[[ -z $START_BY || $START_BY =~ ^[0-9]+$ ]] || { echo "error: START_BY is whole seconds, not '$START_BY'" >&2; exit 2; }
DATA=${DATA:-$OUT/data}
if [[ -z ${GPUS:-} && $DEVICE == cuda ]]; then
  if [[ -n ${CUDA_VISIBLE_DEVICES:-} ]]; then GPUS=${CUDA_VISIBLE_DEVICES//,/ }
  elif command -v nvidia-smi >/dev/null; then  # one that cannot list (no driver) leaves one GPU, unpinned
    GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | tr '\n' ' ') || GPUS=""
  fi
fi
read -r -a GPU_LIST <<< "${GPUS:-}"
(( ${#GPU_LIST[@]} > 1 )) || GPU_LIST=("")  # one GPU or none: no pinning, the environment as the caller set it
VARIANTS=${VARIANTS:-auto:}
read -r -a BACKBONES <<< "$BACKBONE"  # split once: the job list and the run folders read this
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} TQDM_DISABLE=1 PYTHONUNBUFFERED=1
mkdir -p "$OUT/logs" "$OUT/runs"
RESULTS=$OUT/results.jsonl
touch "$RESULTS"
[[ -z $(tail -c 1 "$RESULTS") ]] || echo >> "$RESULTS"  # a line a kill cut short stays alone on its line
FIRST_NEW=$(( $(wc -l < "$RESULTS") + 1 ))  # new.jsonl: this command's lines start here
START=$(date +%s)
STOP=0  # set by a TERM or INT: no further cell starts
trap 'STOP=1' TERM INT

# The cells an earlier run of this grid finished (backbone, dataset, method, seed, variant), as the summary reads
# them; read whole, not through a process substitution, so the scheduler's `wait -n` sees the cells alone.
declare -A DONE=()
FINISHED=$($PY benchmarks/recipe_summary.py --finished "$OUT")
while IFS= read -r key; do if [[ -n $key ]]; then DONE[$key]=1; fi; done <<< "$FINISHED"

missing=""
for ds in $DATASETS; do [[ -d "$DATA/$ds/train" && -d "$DATA/$ds/eval" ]] || missing+=" $ds"; done
if [[ -n "$missing" ]]; then
  echo "building datasets:$missing -> $DATA"
  # shellcheck disable=SC2086
  $PY benchmarks/recipe_datasets.py "$DATA" --only $missing
fi

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# One cell: pretrain, strip, kNN; a failure is recorded as a result line (and its log kept), never fatal.
run_cell() {
  local backbone=$1 ds=$2 method=$3 seed=$4 label=$5 flags=$6
  local where="$ds" what="$ds"  # one backbone: the layout it always had; several: each backbone's own folder
  (( ${#BACKBONES[@]} > 1 )) && where="$backbone/$ds" what="$backbone $ds"
  if [[ $method == random-init ]]; then  # the baseline: the random init of the seeds in $seed (a few seconds)
    local log="$OUT/logs/${where//\//-}-random-init.log"
    # shellcheck disable=SC2086
    $PY benchmarks/recipe_knn.py --train "$DATA/$ds/train" --eval "$DATA/$ds/eval" --random-init --seed $seed \
      --backbone "$backbone" --image-size "$IMAGE_SIZE" --device "$DEVICE" --results "$RESULTS" --tag "backbone=$backbone" \
      --tag "dataset=$ds" --tag "method=random-init" \
      --tag "variant=-" --tag "recipe=-" >"$log" 2>&1 \
      && echo "done $what random init" \
      || { echo "FAILED random init on $what: see $log"; tail -n 3 "$log"; }
    return
  fi
  local name="$method-s$seed"; [[ "$label" != auto ]] && name+="-$label"
  local run="$OUT/runs/$where/$name" log="$OUT/logs/${where//\//-}-$name.log" t0 t1 t2 rc=0
  local spent="$log.pretrain_ms" resume=""  # each attempt's pretraining milliseconds, one line each
  if [[ -f "$run/checkpoints/last.pt" ]]; then
    resume="--resume"; echo "resuming $what $name from its checkpoint"
  else
    rm -rf "$run" "$spent"; : > "$log"
  fi
  local stage=pretrain
  t0=$(now_ms)
  # shellcheck disable=SC2086
  $PY -m pipeline pretrain --method "$method" --backbone "$backbone" --data "folder:$DATA/$ds/train" --image-size "$IMAGE_SIZE" \
      --epochs "$EPOCHS" --batch-size "$BATCH" --device "$DEVICE" --seed "$seed" --out "$run" $flags $resume >>"$log" 2>&1 || rc=$?
  t1=$(now_ms)
  echo $((t1 - t0)) >> "$spent"
  if (( rc == 0 )); then
    stage=strip
    $PY -m pipeline strip --run "$run" >>"$log" 2>&1 || rc=$?
  fi
  if (( rc == 0 )); then
    t2=$(now_ms) stage=knn
    local recipe ms; recipe=$(sed -n 's/^recipe: //p' "$run/config.yaml"); ms=$(( $(paste -sd+ "$spent") ))
    $PY benchmarks/recipe_knn.py --train "$DATA/$ds/train" --eval "$DATA/$ds/eval" --encoder "$run/export/encoder.pt" \
      --device "$DEVICE" --results "$RESULTS" --tag "backbone=$backbone" --tag "dataset=$ds" --tag "method=$method" --tag "seed=$seed" \
      --tag "variant=$label" --tag "recipe=$recipe" --tag "flags=$flags" --tag "pretrain_ms=$ms" \
      --tag "pretrain_attempts=$(wc -l < "$spent")" --tag "strip_ms=$((t2 - t1))" >>"$log" 2>&1 || rc=$?
    if (( rc == 0 )); then
      echo "done $what $name ($(( ms / 1000 )) s pretrain, recipe $recipe)"
      return
    fi
  fi
  if (( rc == 130 || rc == 143 )); then  # a signal: pretrain exits 130 after its checkpoint, strip and kNN die on TERM
    echo "stopped $what $name (the same command again goes on from here)"
    return
  fi
  echo "{\"backbone\": \"$backbone\", \"dataset\": \"$ds\", \"method\": \"$method\", \"seed\": \"$seed\", \"variant\": \"$label\", \"failed\": \"$stage\", \"log\": \"$log\"}" >>"$RESULTS"
  echo "FAILED $what $name: see $log"; tail -n 3 "$log" || true
}

# The job list: the baselines first, then seeds outermost (backbones next, in the order given: name the slowest
# first, so the last jobs to start are short ones), so an early look at results.jsonl has every cell once. Cells an
# earlier run finished are left out, and a baseline runs for the seeds it lacks.
JOBFILE=$OUT/jobs.tsv
: > "$JOBFILE"
KEPT=0
for bb in "${BACKBONES[@]}"; do
  for ds in $DATASETS; do
    missing=""
    for seed in $SEEDS; do [[ -n ${DONE[$bb$'\t'$ds$'\t'random-init$'\t'$seed$'\t'-]:-} ]] || missing+=" $seed"; done
    if [[ -n $missing ]]; then printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$bb" "$ds" random-init "${missing# }" - "" >>"$JOBFILE"; fi
  done
done
IFS=';' read -r -a VARIANT_LIST <<< "$VARIANTS"
for seed in $SEEDS; do
  for bb in "${BACKBONES[@]}"; do
    for ds in $DATASETS; do
      for method in $METHODS; do
        for v in "${VARIANT_LIST[@]}"; do
          [[ -n ${DONE[$bb$'\t'$ds$'\t'$method$'\t'$seed$'\t'${v%%:*}]:-} ]] && { KEPT=$((KEPT + 1)); continue; }
          printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$bb" "$ds" "$method" "$seed" "${v%%:*}" "${v#*:}" >>"$JOBFILE"
        done
      done
    done
  done
done
WHERE=$DEVICE; [[ -n ${GPU_LIST[0]} ]] && WHERE="each of GPUs ${GPU_LIST[*]}"
echo "$(grep -vc random-init "$JOBFILE") trainings of $BACKBONE (and the random-init baselines) to run, $KEPT finished earlier and kept;" \
  "$JOBS jobs at a time on $WHERE; logs in $OUT/logs"

# Each cell goes to the GPU with the fewest cells running. When even that one runs JOBS, wait for a cell to end: its
# PID says which GPU it freed, now the least busy.
declare -A LOAD=() GPU_OF=()
for g in "${GPU_LIST[@]}"; do LOAD[x$g]=0; done
while (( ! STOP )) && IFS=$'\t' read -r bb ds method seed label flags; do
  gpu=${GPU_LIST[0]}
  for g in "${GPU_LIST[@]}"; do (( ${LOAD[x$g]} < ${LOAD[x$gpu]} )) && gpu=$g; done
  if (( ${LOAD[x$gpu]} >= JOBS )); then
    done_pid=""
    wait -n -p done_pid || true  # a failed cell wrote its own line; a signal leaves done_pid empty
    [[ -n ${done_pid:-} ]] || break
    gpu=${GPU_OF[$done_pid]}
    LOAD[x$gpu]=$(( ${LOAD[x$gpu]} - 1 ))
  fi
  if [[ -n $START_BY ]] && (( $(date +%s) - START > START_BY )); then
    echo "no further cell starts: more than START_BY=$START_BY s have passed (the same command again goes on from here)"
    break
  fi
  (
    trap : TERM  # the cell outlives the signal that stops its training, to say what became of it
    [[ -n $gpu ]] && export CUDA_VISIBLE_DEVICES=$gpu && echo "GPU $gpu: $bb $ds $method seed $seed $label"
    run_cell "$bb" "$ds" "$method" "$seed" "$label" "$flags"
  ) </dev/null &  # stdin kept off the job list
  GPU_OF[$!]=$gpu
  LOAD[x$gpu]=$(( ${LOAD[x$gpu]} + 1 ))
done < "$JOBFILE"
until wait; do (( $? > 128 )) || break; done  # a signal cuts `wait` short; the cells under way still end

WALL=$(( $(date +%s) - START ))
echo "grid wall time: $WALL s (${JOBS} trainings at once on $WHERE)" | tee "$OUT/wall.txt"
tail -n "+$FIRST_NEW" "$RESULTS" > "$OUT/new.jsonl"
$PY benchmarks/recipe_summary.py "$OUT" | tee "$OUT/summary.txt"
if (( STOP )); then echo "stopped by a signal: the same command again goes on from here"; exit 130; fi
