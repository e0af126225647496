#!/usr/bin/env bash
# Diffusion vs autoregressive, same size, same data, same GPU minutes (issue #5 item 5), in one run:
# HumanEval single-line infilling (pass@1, EM, ES, latency per fill) and a typing replay through the
# real server (acceptance, latency per accepted edit), for both checkpoints on this machine's CPU.
#   bash scripts/compare_ar.sh DIFFUSION_CKPT AR_CKPT [LIMIT] [OUT]
# The AR checkpoint comes from `scripts/train_pair_on_device.sh` (GPU 1); it is not shipped.
set -euo pipefail
DIFF=${1:?diffusion checkpoint folder}
AR=${2:?autoregressive checkpoint folder}
LIMIT=${3:-400}
OUT=${4:-runs/compare-ar}
DATA=${DATA:-../shared/data/humaneval-infilling/HumanEval-SingleLineInfilling.jsonl.gz}
PY=${PY:-.venv/bin/python}
mkdir -p "$OUT"
# Code neither model trained on, typed line by line through the server.
REPLAY_FILES=(fixtures/example.py fixtures/realcode/project/textkit/*.py)
for name in ar diffusion; do
  ckpt=$DIFF; [ "$name" = ar ] && ckpt=$AR
  "$PY" -m dfim.cli eval "$DATA" --model "$ckpt" --limit "$LIMIT" --workers 2 --quiet --out "$OUT/eval-$name"
  "$PY" -m dfim.cli replay "${REPLAY_FILES[@]}" --model "$ckpt" --trigger line --quiet \
    --out "$OUT/replay-$name"
done
"$PY" - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
print("| model | pass@1 | EM | ES | mean steps | fill p50 ms | replay acceptance | chars saved | replay p50 ms | ms per accepted edit |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name in ("diffusion", "ar"):
    ev = json.loads((out / f"eval-{name}" / "results.json").read_text())["summary"][0]
    rp = json.loads((out / f"replay-{name}" / "report.json").read_text())["summary"]
    pct = lambda v: "n/a" if v is None else f"{100 * v:.1f}%"
    num = lambda v: "n/a" if v is None else f"{v:.0f}"
    print(f"| {name} | {ev['pass_at_1']:.1f}% | {ev['exact_match']:.1f}% | {ev['edit_similarity']:.1f} | "
          f"{ev['mean_steps']:.1f} | {num(ev.get('latency_p50_ms'))} | {pct(rp['acceptance_rate'])} | "
          f"{pct(rp['chars_saved'])} | {num(rp['latency_p50_ms'])} | {num(rp['latency_per_accepted_ms'])} |")
PY
