#!/usr/bin/env bash
# Validation loss (the training runs' fixed validation batches, pads weighted 0.25 as in the continuations)
# and all 1,033 HumanEval single-line problems for each checkpoint, in one GPU call:
#   bash scripts/score_checkpoints_on_device.sh NAME=MODEL_DIR [NAME=MODEL_DIR ...]
# Validation comes from a one-step run at learning rate 0 (the weights do not move), so it is the trainer's
# own `validate`, i.i.d. and ordered noise both. HumanEval: scripts/eval_models_on_device.sh.
set -uo pipefail
MINUTES_TOTAL=${MINUTES_TOTAL:-9}
source scripts/device_prelude.sh    # environment and token shards ($DATA)
for spec in "$@"; do
  name=${spec%%=*} model=${spec#*=}
  python3 -m dfim.commands.train --data "$DATA" --out "/root/val-$name" --init-from "$model" --steps 1 --lr 0 \
    --warmup 1 --pad-weight 0.25 --context-lm-weight 0.5 --no-compile --workers 4 --log-every 1000 \
    --eval-every 1000 > "/root/val-$name.log" 2>&1 || tail -5 "/root/val-$name.log"
  echo "== $name validation: $(grep '"final"' "/root/val-$name/train_log.jsonl" | python3 -c \
    'import json,sys; r=json.load(sys.stdin); print({k: round(v, 4) for k, v in r.items() if k.startswith("val")})')"
done
bash scripts/eval_models_on_device.sh "$@"
