#!/usr/bin/env bash
# One chunk of training on the GPU machine (<= 10 minutes a call). Run from the repo root there:
#   MINUTES_TOTAL=9.3 PLAN_MINUTES=15 bash scripts/train_on_device.sh
# First call: builds token shards from that machine's Python stdlib + site-packages (skipped when
# already built), then trains; later calls on the same (warm) machine resume from /root/dfim-run.
# What comes back ($OUT): the exported checkpoint as a tar split in <= 15 MiB parts, the train log
# and the data summary (sources, licenses, token counts).
set -euo pipefail
RUN=${RUN:-/root/dfim-run}
MINUTES_TOTAL=${MINUTES_TOTAL:-9.3}   # budget of this whole call, data build included
PLAN_MINUTES=${PLAN_MINUTES:-15}     # training time planned over all chunks (drives the LR schedule)
PRESET=${PRESET:-small}
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
RESERVE_MINUTES=0.6 source scripts/device_prelude.sh   # env, token shards, TRAIN_MINUTES
INIT=()
if [ ! -f "$RUN/state/trainer.json" ] && [ -n "${INIT_FROM:-}" ]; then
  # A cold machine lost the run state: continue from the carried export, with a fresh optimizer
  # whose schedule spans just this call (short warm-up, then decay over most of it).
  INIT=(--init-from "$INIT_FROM" --warmup 50 --decay-share 0.6)
  PLAN_MINUTES=$TRAIN_MINUTES
  echo "no run state here; starting from the weights in $INIT_FROM"
fi
python3 -m dfim.commands.train --data "$DATA" --out "$RUN" --model-config "$PRESET" --resume "${INIT[@]}" \
  --minutes "$TRAIN_MINUTES" --plan-minutes "$PLAN_MINUTES" --batch-size "${BATCH:-128}" \
  --no-compile --workers 12 --log-every 100 --eval-every 500 ${EXTRA_TRAIN_ARGS:-}

if [ -n "${OUT:-}" ]; then
  tar -C "$RUN" -czf /tmp/export.tgz export
  split -b 15m -d /tmp/export.tgz "$OUT/export.tgz.part"
  cp "$RUN/train_log.jsonl" "$OUT/" || true
  cp "$DATA/summary.json" "$OUT/data_summary.json" || true
  ls -la "$OUT"
fi
