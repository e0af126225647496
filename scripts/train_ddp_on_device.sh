#!/usr/bin/env bash
# One chunk of data-parallel training on every GPU of the machine (<= 10 minutes a call). From the repo
# root there:   PRESET=base MINUTES_TOTAL=9.3 PLAN_MINUTES=25 bash scripts/train_ddp_on_device.sh
# As scripts/train_on_device.sh, but one process per GPU (torchrun): BATCH is per GPU, so the global
# batch is BATCH x GPUs; rank 0 logs, validates, saves and exports. Compiled unless EXTRA_TRAIN_ARGS
# says --no-compile. INIT_FROM (a carried export) starts a cold machine from its weights, e.g. the AR
# phase's export for the diffusion phase (EXTRA_TRAIN_ARGS="--causal-weight 1.0").
set -euo pipefail
RUN=${RUN:-/root/dfim-run}
MINUTES_TOTAL=${MINUTES_TOTAL:-9.3}
PLAN_MINUTES=${PLAN_MINUTES:-15}
PRESET=${PRESET:-base}
GPUS=${GPUS:-$(nvidia-smi --list-gpus | wc -l)}
RESERVE_MINUTES=${RESERVE_MINUTES:-1.5} source scripts/device_prelude.sh   # env, token shards, TRAIN_MINUTES
INIT=()
if [ ! -f "$RUN/state/trainer.json" ] && [ -n "${INIT_FROM:-}" ]; then
  INIT=(--init-from "$INIT_FROM" --warmup 50 --decay-share 0.6)
  PLAN_MINUTES=$TRAIN_MINUTES
  echo "no run state here; starting from the weights in $INIT_FROM"
fi
python3 -m torch.distributed.run --standalone --nproc_per_node="$GPUS" -m dfim.commands.train \
  --data "$DATA" --out "$RUN" --model-config "$PRESET" --resume "${INIT[@]}" \
  --minutes "$TRAIN_MINUTES" --plan-minutes "$PLAN_MINUTES" --batch-size "${BATCH:-128}" \
  --log-every 100 --eval-every 500 ${EXTRA_TRAIN_ARGS:-}

if [ -n "${OUT:-}" ]; then
  tar -C "$RUN" -czf /tmp/export.tgz export
  split -b 15m -d /tmp/export.tgz "$OUT/export.tgz.part"
  cp "$RUN/train_log.jsonl" "$OUT/" || true
  cp "$DATA/summary.json" "$OUT/data_summary.json" || true
  ls -la "$OUT"
fi
