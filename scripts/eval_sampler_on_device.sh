#!/usr/bin/env bash
# HumanEval single-line infilling of the shipped model under several sampler settings on one GPU, every
# problem: each setting's two halves run side by side (half 2 starts at seed 516, so problem i is filled
# with seed i as in one run over the whole file). Fills on the GPU, tests in sandboxed subprocesses.
#   bash scripts/eval_sampler_on_device.sh NAME='t_max=0.5;t_min=0.2' [NAME=SPEC ...]
# SPEC is one `dfim eval --sweep` grid of single values. MODEL overrides the checkpoint. Reads
# .carry/humaneval/part1.jsonl.gz and part2.jsonl.gz (516 + 517 problems); summaries land in $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
OUTDIR=${OUT:-/tmp/eval-out}
WORKERS=${WORKERS:-2}
MODEL=${MODEL:-engine/weights/dfim-small}
pids=()
for spec in "$@"; do
  name=${spec%%=*} grid=${spec#*=}
  for half in 1 2; do
    seed=$(( half == 1 ? 0 : 516 ))
    timeout "${LIMIT_S:-500}" python3 -m dfim eval ".carry/humaneval/part$half.jsonl.gz" --model "$MODEL" \
      --device cuda --workers "$WORKERS" --seed "$seed" --quiet --sweep "$grid" \
      --out "/tmp/eval-$name-p$half" > "/tmp/eval-$name-p$half.log" 2>&1 &
    pids+=($!)
  done
done
for pid in "${pids[@]}"; do wait "$pid" || echo "an eval stopped: $?"; done
for spec in "$@"; do
  name=${spec%%=*}
  for half in 1 2; do
    f=/tmp/eval-$name-p$half/summary.md
    if [ -f "$f" ]; then cp "$f" "$OUTDIR/he-$name-p$half.md"; echo "== $name half $half"; grep '^| [a-z_]*=' "$f"
    else echo "== $name half $half: no summary"; tail -5 "/tmp/eval-$name-p$half.log"; fi
  done
done
