#!/usr/bin/env bash
# The whole dfim-base run, started in the background by `scripts/train_base_on_device.sh start`
# (it outlives the call that starts it): token shards, then phase 1 (AR FIM, `--objective causal`),
# then phase 2 (diffusion from the AR export, with the AR loss kept at weight 1.0 for the draft).
# Each step is skipped when its result is there already, so a restart continues where it stopped.
# Settings come from the environment the stage script writes to $RUN/settings.env.
set -euo pipefail
source "$RUN/settings.env"
cd "$CODE"
DFIM_SRC_ROOT=$CODE DFIM_MIRROR=$CODE/mirror source "$CODE/scripts/device_env.sh"
say() { echo "[$(date -u +%H:%M:%S)] $*"; }

# 1. Token shards: corpus shards + this machine's Python + permissively licensed C/C++ headers.
HEADERS=()
for dir in $HEADER_ROOTS; do [ -d "$dir" ] && HEADERS+=(--c-headers "$dir"); done
PY=()
[ -n "$PY_ROOTS" ] && PY=(--roots $PY_ROOTS)
say "data: $DATA (corpus $CORPUS_DIR, headers: ${HEADERS[*]:-none})"
python3 -m dfim.commands.data --out "$DATA" --tokenizer "$TOKENIZER" "${PY[@]}" \
  --corpus "$CORPUS_DIR"/train-*.jsonl.xz "${HEADERS[@]}" --permissive-only --hold-out ${HOLD_OUT:-} \
  --workers "$(nproc)" --skip-if-built > "$RUN/data.log" 2>&1 &
DATA_PID=$!
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
[ "$NGPU" -ge 1 ] || NGPU=1
# While the CPU builds the shards, the GPUs measure eager against compiled layers on synthetic batches
# (scripts/probe_train_speed.py); training then takes the faster. PROBE=0 skips it (COMPILE decides).
if [ "${PROBE:-1}" = 1 ] && [ "$NGPU" -ge 2 ] && [ ! -f "$RUN/compile.choice" ]; then
  for mode in none layers; do
    gpu=$([ $mode = none ] && echo 0 || echo 1)
    CUDA_VISIBLE_DEVICES=$gpu timeout 300 python3 scripts/probe_train_speed.py --compile $mode \
      --batch "${BATCH:-64}" --tokenizer "$TOKENIZER" $([ $mode = none ] && echo --profile) \
      --steps 20 --warmup 6 --out "$RUN/probe-$mode.json" > "$RUN/probe-$mode.log" 2>&1 &
  done
  wait_probes=1
fi
wait "$DATA_PID" || { tail -n 30 "$RUN/data.log"; exit 1; }
if [ "${wait_probes:-0}" = 1 ]; then
  say "data built; waiting for the speed probes"
  wait || true
  python3 - "$RUN" > "$RUN/compile.choice" <<'PY'
import json, pathlib, sys
run = pathlib.Path(sys.argv[1])
def rate(mode):
    try:
        result = json.loads((run / f"probe-{mode}.json").read_text())
        return result["tok_per_s"] if "failed" not in result["compile"] else 0
    except (OSError, ValueError, KeyError):
        return 0
eager, layers = rate("none"), rate("layers")
print("layers" if layers > 1.05 * eager else "none")
PY
  say "probe: eager $(cat "$RUN/probe-none.json" 2>/dev/null), layers $(cat "$RUN/probe-layers.json" 2>/dev/null) -> compile $(cat "$RUN/compile.choice")"
fi
cp "$DATA/summary.json" "$RUN/data_summary.json"
say "data ready: $(tail -n 1 "$RUN/data.log")"
if [ -z "${DEADLINE:-}" ]; then  # fixed once, so a restarted run keeps the first deadline
  DEADLINE=$(python3 -c "import time; print(int(time.time() + $TRAIN_MINUTES * 60))")
  echo "DEADLINE=$DEADLINE" >> "$RUN/settings.env"
fi

# 2. Training: both phases share TRAIN_MINUTES of wall clock, AR_SHARE of it for phase 1; with INIT_FROM
# (a checkpoint to continue, e.g. the shipped dfim-base) there is no AR phase and phase 2 gets it all.
COMPILE_ARGS=(--no-compile)
case "$(cat "$RUN/compile.choice" 2>/dev/null || echo "${COMPILE:-none}")" in
  layers) COMPILE_ARGS=(--compile --compile-scope layers) ;;
esac
AR_MIN=$(python3 -c "print(round($TRAIN_MINUTES * $AR_SHARE, 2))")
common=(--data "$DATA" --tokenizer "$TOKENIZER" --model-config base --resume --log-every 50 --eval-every 500
        --workers "$LOADER_WORKERS" "${COMPILE_ARGS[@]}" $EXTRA_TRAIN_ARGS)
[ -n "$BATCH" ] && common+=(--batch-size "$BATCH")
torchrun_once() {  # torchrun_once LOG MINUTES ARGS...: NPROC GPUs, with a hard stop a few minutes past the plan
  local log=$1 minutes=$2; shift 2
  local cmd=(torchrun --standalone --nproc_per_node="${NPROC:-$NGPU}" -m dfim.commands.train "$@")
  say "run: ${cmd[*]} > $log"
  if [ "$DRY_RUN" = 1 ]; then say "DRY_RUN: not started"; return 0; fi
  timeout --signal=TERM --kill-after=60 "$(python3 -c "print(int(($minutes + 4) * 60))")" "${cmd[@]}" > "$log" 2>&1
}
launch() {  # launch LOG MINUTES ARGS...: one retry, eager and with half the batch, for a failure in the first
  # minutes (a compile error or out of memory on a GPU not tried before): the machine is held for minutes only
  local log=$1 minutes=$2; shift 2
  local t0 took
  t0=$(date +%s)
  torchrun_once "$log" "$minutes" "$@" && return 0
  took=$(( $(date +%s) - t0 ))
  [ "$took" -lt 300 ] || return 1
  say "failed after ${took}s; the log's end:"; tail -n 25 "$log"; mv "$log" "$log.failed"
  local half=$(( ${BATCH:-64} / 2 ))
  say "retrying without torch.compile, batch $half per GPU"
  torchrun_once "$log" "$(python3 -c "print(max(1.0, $minutes - $took / 60))")" "$@" --no-compile --batch-size "$half"
}

if [ -n "${INIT_FROM:-}" ]; then
  for _ in $(seq 60); do [ -f "$INIT_FROM/config.json" ] && break; say "waiting for $INIT_FROM"; sleep 10; done
  say "phase 1 skipped: continuing $INIT_FROM"
elif [ -f "$RUN/ar/export/config.json" ]; then
  say "phase 1 (AR) done already: $RUN/ar/export"
else
  launch "$RUN/ar.log" "$AR_MIN" "${common[@]}" --out "$RUN/ar" --objective causal \
    --minutes "$AR_MIN" --plan-minutes "$AR_MIN" --name dfim-base-ar
fi

# Phase 2 gets what is left of the deadline (phase 1 or the data may have run long), at least 2 minutes.
DIFF_MIN=$(python3 -c "import time; print(round(max(2.0, ($DEADLINE - time.time()) / 60), 2))")
diffusion() {  # diffusion NAME ARGS...: phase 2 into $RUN/NAME, then its int8 copy (what ships and comes back)
  local name=$1; shift
  local init=()
  [ -f "$RUN/$name/state/trainer.json" ] || init=(--init-from "${INIT_FROM:-$RUN/ar/export}")
  if [ -f "$RUN/$name/export/config.json" ]; then
    say "phase 2 ($name) done already: $RUN/$name/export"
  else
    launch "$RUN/$name.log" "$DIFF_MIN" "${common[@]}" --out "$RUN/$name" "${init[@]}" --causal-weight 1.0 \
      --minutes "$DIFF_MIN" --plan-minutes "$DIFF_MIN" --name dfim-base "$@" || return 1
  fi
  if [ "$DRY_RUN" != 1 ] && [ ! -f "$RUN/$name/export-int8/config.json" ]; then
    python3 scripts/quantize_checkpoint.py "$RUN/$name/export" "$RUN/$name/export-int8" || say "int8 conversion failed"
  fi
}
if [ -n "${EXTRA_TRAIN_ARGS_B:-}" ] && [ "$NGPU" -ge 2 ]; then
  # A controlled comparison: run A (EXTRA_TRAIN_ARGS) on the first half of the GPUs and run B (the same
  # plus EXTRA_TRAIN_ARGS_B) on the second half, side by side with the same steps and deadline.
  half=$((NGPU / 2))
  say "side by side: diff on GPUs 0-$((half - 1)), diffb ($EXTRA_TRAIN_ARGS_B) on GPUs $half-$((NGPU - 1))"
  NPROC=$half CUDA_VISIBLE_DEVICES=$(seq -s, 0 $((half - 1))) diffusion diff &
  a_pid=$!
  NPROC=$half CUDA_VISIBLE_DEVICES=$(seq -s, "$half" $((NGPU - 1))) diffusion diffb $EXTRA_TRAIN_ARGS_B &
  b_pid=$!
  wait "$a_pid" || say "run A failed"
  wait "$b_pid" || say "run B failed"
else
  diffusion diff
fi
[ "$DRY_RUN" = 1 ] || touch "$RUN/DONE"
say "pipeline finished"
