#!/usr/bin/env bash
# HumanEval single-line infilling of several checkpoints (or sampler settings) on one GPU, every problem:
# each spec's two halves of the file run side by side (half 2 starts at seed 516, so problem i is filled
# with seed i as in one run over the whole file). Fills on the GPU, tests in sandboxed subprocesses.
#   bash scripts/eval_models_on_device.sh NAME=MODEL_DIR[@SWEEP] [NAME=MODEL_DIR[@SWEEP] ...]
# SWEEP is one `dfim eval --sweep` grid of single values, e.g. v5eb5=engine/weights/dfim-small@entropy_bound=0.5.
# Reads .carry/humaneval/part1.jsonl.gz and part2.jsonl.gz (516 + 517 problems); summaries land in $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUTDIR=${OUT:-/tmp/eval-out}
WORKERS=${WORKERS:-4}
pids=()
for spec in "$@"; do
  name=${spec%%=*} target=${spec#*=}
  model=${target%%@*} grid=${target#"$model"}
  [ -d "$model" ] || { echo "skip $name: no folder $model"; continue; }
  for half in 1 2; do
    seed=$(( half == 1 ? 0 : 516 ))
    timeout "${LIMIT_S:-500}" python3 -m dfim eval ".carry/humaneval/part$half.jsonl.gz" --model "$model" \
      --device cuda --workers "$WORKERS" --seed "$seed" --quiet ${grid:+--sweep "${grid#@}"} \
      --out "/tmp/eval-$name-p$half" > "/tmp/eval-$name-p$half.log" 2>&1 &
    pids+=($!)
  done
done
for pid in "${pids[@]}"; do wait "$pid" || echo "an eval stopped: $?"; done
for spec in "$@"; do
  name=${spec%%=*}
  for half in 1 2; do
    f=/tmp/eval-$name-p$half/summary.md
    if [ -f "$f" ]; then cp "$f" "$OUTDIR/he-$name-p$half.md"; echo "== $name half $half"; grep -E '^\| (default|[a-z_]+=)' "$f"
    else echo "== $name half $half: no summary"; tail -5 "/tmp/eval-$name-p$half.log"; fi
  done
done
