#!/usr/bin/env bash
# The exact commands behind the model card's HumanEval single-line infilling numbers (see docs/eval.md).
#
#   scripts/eval_humaneval.sh            # shipped model, CPU, full set (1,033 problems)
#   MODEL=path/to/ckpt DEVICE=cuda LIMIT=100 scripts/eval_humaneval.sh
#   SWEEP=full scripts/eval_humaneval.sh # also the steps x entropy-bound x early-stop grid
#
# Writes runs/eval/humaneval-<name>/{results.json,summary.md} and prints the tables.
set -euo pipefail
cd "$(dirname "$0")/.."

DATA=${DATA:-../shared/data/humaneval-infilling/HumanEval-SingleLineInfilling.jsonl.gz}
DEVICE=${DEVICE:-cpu}
WORKERS=${WORKERS:-4}
SEED=${SEED:-0}
OUT=${OUT:-runs/eval}
model_args=()
[[ -n "${MODEL:-}" ]] && model_args+=(--model "$MODEL")
limit_args=()
[[ -n "${LIMIT:-}" ]] && limit_args+=(--limit "$LIMIT")
# The repository's own environment when there is one (./install.sh makes .venv), else python3 on PATH.
if [[ -x .venv/bin/python ]]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
dfim=("$PYTHON" -m dfim.cli eval "$DATA" "${model_args[@]}" "${limit_args[@]}" --device "$DEVICE"
      --workers "$WORKERS" --seed "$SEED" --max-tokens 32 --timeout 10)

# 0. The harness itself: the canonical lines must all pass (100.0), or the sandbox is broken.
"${dfim[@]}" --reference --out "$OUT/humaneval-reference" --quiet

# 1. Model card numbers: the checkpoint's own sampler settings, with early stopping on (the product's
#    setting) and off (every step runs) in one run; the table's last line checks the target
#    "early stopping cuts mean steps >= 2x for <= 1 point of pass@1".
"${dfim[@]}" --sweep "early_stop=on,off" --out "$OUT/humaneval-card"

# 2. Optional: settings sweep (steps, entropy bound, early stopping, canvas bucket).
if [[ "${SWEEP:-}" == "full" ]]; then
  "${dfim[@]}" --sweep "steps=8,16,48;entropy_bound=0.05,0.1,0.2;early_stop=on,off | steps=48;bucket=64" \
    --out "$OUT/humaneval-sweep"
fi
