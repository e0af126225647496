#!/usr/bin/env bash
# HumanEval single-line infilling of the shipped model on the GPU machine (fills on the GPU, tests in
# sandboxed subprocesses on its 16 cores), plus a settings sweep on the first problems.
#   LIMIT=400 SWEEP_LIMIT=120 bash scripts/eval_on_device.sh DATA.jsonl.gz
set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
DATA=$1
OUTDIR=${OUT:-/tmp/eval-out}
timeout 300 python3 -m dfim eval "$DATA" --device cuda --workers 12 --seed 0 --quiet \
  --limit "${LIMIT:-400}" --out "$OUTDIR/default" || echo "default run stopped: $?"
timeout 220 python3 -m dfim eval "$DATA" --device cuda --workers 12 --seed 0 --quiet \
  --limit "${SWEEP_LIMIT:-120}" \
  --sweep "early_stop=on,off|t_max=0.3;t_min=0.1;entropy_bound=0.1,1.0" \
  --out "$OUTDIR/sweep" || echo "sweep stopped: $?"
for f in "$OUTDIR"/*/summary.md; do echo "== $f"; cat "$f"; done
