#!/usr/bin/env bash
# Two diffusion trainings side by side, one chunk of <= 10 minutes a call: run A and run B, each
# started from its own checkpoint (INIT_A, INIT_B) on the first call and resumed on later calls of the
# same warm machine. GPUS="0 1" puts them on two GPUs (nvidia-h200-x2); GPUS="0 0" shares one GPU (the
# model is small: one run leaves most of an H200 idle). Same data, batch, context and schedule for both;
# only INIT_* and ARGS_* differ, so the two exports compare one choice.
#   INIT_A=engine/weights/dfim-small ARGS_A="--context-lm-weight 0.5" \
#   INIT_B=.carry/new/ar/export      ARGS_B="--context-lm-weight 0.5" \
#   GPUS="0 0" MINUTES_TOTAL=8.3 PLAN=25 bash scripts/train_ab_on_device.sh
# INIT_B unset: run A alone (the whole GPU; pass WORKERS=12 to give it the data workers too).
# Back in $OUT every call: both train logs, the data summary and both exports (tar split in 15 MiB parts;
# EXPORT=0 leaves them out). Bring them back every call: the machine, the run state and the optimizer go
# when a lease ends early (an idle gap of 30 s is enough), and only what came back can be resumed from.
set -euo pipefail
PLAN=${PLAN:-24}                    # minutes of training planned per run over all calls (LR decay)
read -r GPU_A GPU_B <<< "${GPUS:-0 1}"
GPU_B=${GPU_B:-$GPU_A}              # GPUS="0": both runs on GPU 0
INIT_A=${INIT_A:?INIT_A: the checkpoint folder run A starts from}
WORKERS=${WORKERS:-7}               # data workers per run (7 + 7 on a 16-core one-GPU machine; 12 alone)
source scripts/device_prelude.sh    # env, token shards, TRAIN_MINUTES
# A continuation's schedule, passed on every call (a resumed run reads its LR from the arguments):
# short warm-up, flat, then decay over the last 35% of the plan.
common=(--data "$DATA" --resume --minutes "$TRAIN_MINUTES" --plan-minutes "$PLAN" --batch-size 128
        --no-compile --workers "$WORKERS" --log-every 100 --eval-every 500 --warmup 100 --lr "${LR:-1e-3}"
        --decay-share "${DECAY_SHARE:-0.35}" --pad-weight "${PAD_WEIGHT:-0.25}" --name dfim-small)

start_run() {  # name gpu init extra-args
  local name=$1 gpu=$2 init=$3 extra=$4 first=()
  if [ ! -f "/root/run-$name/state/trainer.json" ]; then
    first=(--init-from "$init")  # first call: the given weights, a fresh optimizer
  fi
  # shellcheck disable=SC2086
  CUDA_VISIBLE_DEVICES=$gpu python3 -m dfim.commands.train "${common[@]}" --out "/root/run-$name" \
    "${first[@]}" $extra > "/root/$name.log" 2>&1 &
}
start_run a "$GPU_A" "$INIT_A" "${ARGS_A:-}"
PID_A=$!
RUNS=(a)
status=0
if [ -n "${INIT_B:-}" ]; then
  start_run b "$GPU_B" "$INIT_B" "${ARGS_B:-}"
  RUNS+=(b)
  wait $! || status=$?
fi
wait $PID_A || status=$?
for run in "${RUNS[@]}"; do tail -n 14 "/root/$run.log"; done

if [ -n "${OUT:-}" ]; then
  for run in "${RUNS[@]}"; do
    cp "/root/run-$run/train_log.jsonl" "$OUT/${run}_log.jsonl" || true
    if [ "${EXPORT:-1}" = 1 ] && [ -d "/root/run-$run/export" ]; then
      tar -C "/root/run-$run" -czf "/tmp/$run.tgz" export
      split -b 15m -d "/tmp/$run.tgz" "$OUT/$run.tgz.part"
    fi
  done
  cp "$DATA/summary.json" "$OUT/data_summary.json" 2>/dev/null || true
  ls -la "$OUT"
fi
exit $status
