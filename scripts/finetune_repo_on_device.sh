#!/usr/bin/env bash
# Fine-tune the shipped model on one repository, on one GPU, in one call: the workflow of
# docs/model-card-dfim-base.md ("Fine-tune on your own repository"), measured. From the repo root:
#
#   REPO=.carry/zod EPOCHS=3 bash scripts/finetune_repo_on_device.sh
#
# The repository's files are split by file (--val-fraction): a tenth is held out, never trained on, and
# its lines measure what the fine-tune buys (scripts/eval_through_server.py, before and after, on a CPU).
# Back in $OUT: the export in 15 MiB parts (ft-export.tgz.partNN), train_log.jsonl, the data summary and
# heldout_files.txt (the held-out files, relative to REPO).
#   EPOCHS=3       passes over the repository's training tokens (a small repository overfits fast)
#   LR=2e-4        peak learning rate (warm-up 10% of the steps, then the usual WSD decay)
#   BATCH=32       examples per step (1,024 context tokens + canvas each)
#   INIT=engine/weights/dfim-base   the checkpoint to start from (int8 weights load dequantized)
set -euo pipefail
REPO=${REPO:?REPO must name the repository folder to fine-tune on}
EPOCHS=${EPOCHS:-3}
LR=${LR:-2e-4}
BATCH=${BATCH:-32}
INIT=${INIT:-engine/weights/dfim-base}
WORK=${WORK:-/tmp/dfim-finetune}
: "${OUT:?OUT must name the folder that comes back}"
source scripts/device_env.sh
say() { echo "[$(date -u +%H:%M:%S)] $*"; }
rm -rf "$WORK" && mkdir -p "$WORK"
t0=$(date +%s)
python3 -m dfim.commands.data --out "$WORK/data" --tokenizer "$INIT/tokenizer.json" --roots "$REPO" \
  --val-fraction 0.1 --workers "$(nproc)" 2>&1 | tail -n 3
t_data=$(( $(date +%s) - t0 ))
read -r TRAIN_TOKENS CONTEXT < <(python3 - "$WORK/data/summary.json" "$INIT/dfim.json" <<'PY'
import json, sys
summary, info = (json.load(open(p)) for p in sys.argv[1:])
print(summary["tokens"]["train"], info.get("context_tokens") or 1024)
PY
)
STEPS=$(python3 -c "import math; print(max(10, math.ceil($EPOCHS * $TRAIN_TOKENS / ($BATCH * $CONTEXT))))")
WARMUP=$(( STEPS / 10 + 1 ))
say "data: $TRAIN_TOKENS training tokens in ${t_data}s; $EPOCHS epochs = $STEPS steps of $BATCH x $CONTEXT"
# Eager: a fine-tune of a few hundred steps is over before torch.compile would have paid for itself.
t1=$(date +%s)
python3 -m dfim.commands.train --data "$WORK/data" --out "$WORK/run" --init-from "$INIT" --name dfim-base-ft \
  --tokenizer "$INIT/tokenizer.json" \
  --causal-weight 1.0 --lr "$LR" --warmup "$WARMUP" --total-steps "$STEPS" --steps "$STEPS" \
  --batch-size "$BATCH" --context-tokens "$CONTEXT" --no-compile --log-every 20 --eval-every 40 \
  --workers 8 2>&1 | grep -v "^\s*$" | tail -n 40
t_train=$(( $(date +%s) - t1 ))
say "fine-tune: ${t_train}s wall for $STEPS steps (model load, validation and export included)"
python3 - "$WORK/data/manifest.jsonl" > "$OUT/heldout_files.txt" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    row = json.loads(line)
    if row["split"] == "val":
        print(row["path"].split(":", 1)[1])
PY
say "held out: $(wc -l < "$OUT/heldout_files.txt") files"
cp "$WORK/data/summary.json" "$OUT/ft_data_summary.json"
cp "$WORK/run/train_log.jsonl" "$OUT/ft_train_log.jsonl"
echo "{\"data_s\": $t_data, \"train_wall_s\": $t_train, \"steps\": $STEPS, \"epochs\": $EPOCHS, \"train_tokens\": $TRAIN_TOKENS}" > "$OUT/ft_timing.json"
tar -C "$WORK/run" -czf /tmp/ft-export.tgz export
split -b 15m -d /tmp/ft-export.tgz "$OUT/ft-export.tgz.part"
ls -la "$OUT"
