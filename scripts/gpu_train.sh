#!/usr/bin/env bash
# Train the shipped dfim-small model on one GPU machine (H100/H200), in resumable chunks.
#
#   MINUTES=8 PLAN_MINUTES=24 bash scripts/gpu_train.sh [extra engine.train options]
#
# Runs from the repository root with the machine's own python3 (torch, tokenizers, safetensors,
# numpy preinstalled; no network). Each call:
#   1. builds token shards from this machine's stdlib + site-packages into $DATA (skipped when a
#      build for this tokenizer is already there: a warm machine keeps /root between calls);
#   2. trains with --resume into $RUN until MINUTES of this call's wall time are spent (the data
#      build is subtracted), saving state every 4 minutes and at the end;
#   3. exports the bf16 checkpoint and copies it into $OUT (at most 8 files of at most 16 MiB):
#      config.json, generation_config.json, tokenizer.json, model.safetensors.index.json, dfim.json,
#      2 weight shards, and logs.tar.gz (train_log.jsonl, stdout, data summary.json).
#
# PLAN_MINUTES is the training time planned over ALL calls: the learning rate stays flat and decays
# linearly over the last 25% of the plan, so the call that crosses 75% of it starts the cool-down.
# A cold machine loses $RUN; set INIT_FROM to a carried export folder to continue from its weights
# (with a fresh optimizer).
#
# Throughput assumptions (not measured here; the log prints tokens/s every 50 steps):
#   - data build: ~390 MB of .py over 16 workers at ~1 MB/s/worker of BPE -> ~30-60 s, once;
#   - model: 15.5 M parameters; a step is batch 128 x (512 context + 16..128 canvas) ~ 70-80 k tokens,
#     ~7 TFLOP with self-conditioning on half the steps; at 100-200 TFLOP/s effective for these small
#     matrices that is 35-70 ms/step, i.e. ~1-2 M tokens/s and ~7-14 k steps in 8 minutes;
#   - torch.compile costs ~1-2 minutes on the first call (three graphs: train, self-conditioned
#     train, no-grad); later calls on a warm machine hit the inductor cache. COMPILE=0 skips it;
#   - 12 data-loader workers at ~2-3 ms per example give ~30-40 batches/s, above the GPU's rate.
set -euo pipefail
export PYTHONUNBUFFERED=1
export TOKENIZERS_PARALLELISM=false

START=$(date +%s)
MINUTES=${MINUTES:-8}
PLAN_MINUTES=${PLAN_MINUTES:-24}
DATA=${DATA:-/root/dfim-data}
RUN=${RUN:-/root/dfim-run}
OUT=${OUT:-$RUN/out}
COMPILE=${COMPILE:-1}
TOKENIZER=engine/weights/dfim-small/tokenizer.json
NPROC=$(nproc)
WORKERS=${WORKERS:-$(( NPROC > 4 ? (NPROC - 4 < 12 ? NPROC - 4 : 12) : 0 ))}
mkdir -p "$RUN" "$OUT"

python3 - <<'EOF'
import torch, sys
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, cuda {torch.cuda.is_available()}", flush=True)
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"gpu {p.name}, {p.total_memory / 2**30:.0f} GiB", flush=True)
EOF

echo "== data: $DATA"
python3 -m engine.data --out "$DATA" --tokenizer "$TOKENIZER" --workers "$NPROC" --skip-if-built
python3 -c "import json; s = json.load(open('$DATA/summary.json')); print('data:', s['files_kept'], 'files', s['tokens'], 'tokens, dropped', s['dropped'])"

ELAPSED=$(( $(date +%s) - START ))
TRAIN_MINUTES=$(python3 -c "print(f'{max(1.0, $MINUTES - $ELAPSED / 60):.2f}')")
EXTRA=()
if [ ! -f "$RUN/state/trainer.json" ] && [ -n "${INIT_FROM:-}" ]; then
    EXTRA+=(--init-from "$INIT_FROM")
fi
if [ "$COMPILE" = "1" ]; then EXTRA+=(--compile); else EXTRA+=(--no-compile); fi

echo "== train: $TRAIN_MINUTES minutes of a $PLAN_MINUTES-minute plan, workers $WORKERS, run $RUN"
python3 -m engine.train --data "$DATA" --out "$RUN" --resume --model-config small \
    --minutes "$TRAIN_MINUTES" --plan-minutes "$PLAN_MINUTES" --workers "$WORKERS" \
    "${EXTRA[@]}" "$@" 2>&1 | tee -a "$RUN/stdout.log"

echo "== export -> $OUT"
cp "$RUN"/export/*.json "$RUN"/export/*.safetensors "$OUT"/
cp "$DATA/summary.json" "$RUN/data_summary.json"
tar -czf "$OUT/logs.tar.gz" -C "$RUN" train_log.jsonl stdout.log data_summary.json
ls -la "$OUT"
tail -n 2 "$RUN/train_log.jsonl"
echo "total $(( $(date +%s) - START )) s"
