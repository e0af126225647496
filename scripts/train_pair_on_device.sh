#!/usr/bin/env bash
# Two trainings at once on a 2-GPU machine (nvidia-h200-x2), one chunk of <= 10 minutes a call:
#   GPU 0: the diffusion model, continued from the shipped checkpoint (INIT_FROM) on the first call;
#   GPU 1: the same-size autoregressive FIM baseline (`--objective causal`), from scratch, stopped once
#          it has trained AR_MINUTES (the diffusion model's training minutes: the equal-budget rule).
# Both read the same token shards (built once per machine, as scripts/train_on_device.sh does) with
# the same tokenizer, batch size and context. Later calls on the same warm machine resume both runs.
#   MINUTES_TOTAL=9 DIFF_PLAN=24 AR_MINUTES=23.8 INIT_FROM=engine/weights/dfim-small \
#     bash scripts/train_pair_on_device.sh
# Back in $OUT: both exports (tar split in 15 MiB parts), both train logs, the data summary.
set -euo pipefail
DIFF_PLAN=${DIFF_PLAN:-24}          # minutes of diffusion training planned over all calls (LR decay)
AR_MINUTES=${AR_MINUTES:-23.8}      # the AR run's whole budget
source scripts/device_prelude.sh    # env, token shards, TRAIN_MINUTES
common=(--data "$DATA" --resume --minutes "$TRAIN_MINUTES" --batch-size 128 --no-compile --workers 12
        --log-every 100 --eval-every 500)

# The continuation's schedule (passed on every call: a resumed run reads its LR from the arguments):
# short warm-up to a lower peak than the first run's 2e-3, flat, then decay over the last 35%.
DIFF_ARGS=(--warmup 100 --lr 1e-3 --decay-share 0.35)
if [ ! -f /root/run-diff/state/trainer.json ] && [ -n "${INIT_FROM:-}" ]; then
  DIFF_ARGS+=(--init-from "$INIT_FROM")  # first call: the shipped weights, a fresh optimizer
fi
CUDA_VISIBLE_DEVICES=0 python3 -m dfim.commands.train "${common[@]}" --out /root/run-diff "${DIFF_ARGS[@]}" \
  --plan-minutes "$DIFF_PLAN" --pad-weight "${PAD_WEIGHT:-0.25}" --name dfim-small \
  > /root/diff.log 2>&1 &
DIFF_PID=$!
CUDA_VISIBLE_DEVICES=1 python3 -m dfim.commands.train "${common[@]}" --out /root/run-ar --model-config small \
  --objective causal --plan-minutes "$AR_MINUTES" --stop-at-plan --name dfim-small-ar \
  > /root/ar.log 2>&1 &
AR_PID=$!
status=0
wait $DIFF_PID || status=$?
wait $AR_PID || status=$?
tail -n 25 /root/diff.log /root/ar.log

if [ -n "${OUT:-}" ]; then
  for run in diff ar; do
    tar -C /root/run-$run -czf /tmp/$run.tgz export
    split -b 15m -d /tmp/$run.tgz "$OUT/$run.tgz.part"
    cp /root/run-$run/train_log.jsonl "$OUT/${run}_log.jsonl" || true
  done
  cp "$DATA/summary.json" "$OUT/data_summary.json" 2>/dev/null || true
  ls -la "$OUT"
fi
exit $status
