#!/usr/bin/env bash
# dfim-base on a 4-GPU machine, driven in calls of at most 10 minutes on a machine that stays warm
# (/root persists between calls; $OUT is emptied before each). Run from the repo root there:
#
#   bash scripts/train_base_on_device.sh unpack        # once per carried .corpus/train-NN.jsonl.xz
#   bash scripts/train_base_on_device.sh start         # shards + both training phases, in the background
#   bash scripts/train_base_on_device.sh wait 9        # log tails every minute; when the run has ended,
#                                                      # fetches as below in the same call
#   bash scripts/train_base_on_device.sh fetch         # export (15 MiB parts), logs, data summary -> $OUT
#   bash scripts/train_base_on_device.sh status       # what is there, what runs
#
# The machine goes back after about 30 s without a call, and the run dies with it: issue the `wait` calls
# back to back, and do nothing else between the calls of a running lease.
#
# Every stage can be run again: unpack skips shards already there, start does nothing while a run is
# alive and continues a stopped one, fetch copies whatever is finished. Settings (environment):
#   TRAIN_MINUTES=21  wall clock of both phases together, from the end of the data build
#   AR_SHARE=0.33     share of it for phase 1 (AR); phase 2 (diffusion) gets the rest of the deadline
#   BATCH=auto        per-GPU batch size (1,024 context tokens + canvas: ~70k tokens a GPU per step at 64);
#                     auto: 64 on cards of 100 GiB or more (H200), 32 below (an H100's 80 GB: 64 did not fit)
#   EXTRA_TRAIN_ARGS= more flags for both phases
#   EXTRA_TRAIN_ARGS_B= with INIT_FROM: a second diffusion run (diffb) beside the first, each on half the
#                     GPUs, with these flags added (a controlled comparison; `fetch` with PHASES=diffb)
#   INIT_FROM=        a checkpoint folder to continue (no AR phase); `INIT_SRC=engine/weights/dfim-base
#                     unpack` copies a carried one to $ROOT/init (the pipeline waits up to 10 min for it)
#   COMPILE=layers    torch.compile of the layers (none: eager); PROBE=1 measures both on spare GPUs
#                     during the data build and takes the faster (layers: 1.8x eager on an H200)
#   DRY_RUN=1         start builds the shards and prints the torchrun commands without running them
#   HOLD_OUT=         packages of this machine's Python left out of the data, as evaluation code the model
#                     never saw (default: the cross-file evaluation's packages, scripts/eval_cross_file.py)
#   PY_ROOTS=         .py folders instead of this machine's stdlib + site-packages (tests use it)
#   HEADER_ROOTS=     header folders (default: /usr/include, torch's and CUDA's include folders)
#   CARRIED=.corpus   where the unpack stage finds the carried shard; TOKENIZER_SRC: the vocabulary
set -euo pipefail
STAGE=${1:-status}
ROOT=${DFIM_ROOT:-/root}
CORPUS_DIR=${CORPUS_DIR:-$ROOT/corpus}
DATA=${DATA:-$ROOT/dfim-base-data}
RUN=${RUN:-$ROOT/run}
CODE=${CODE:-$ROOT/dfim-code}
CARRIED=${CARRIED:-.corpus}                                          # where a call carries its shard
TOKENIZER_SRC=${TOKENIZER_SRC:-engine/weights/dfim-base/tokenizer.json}  # copied to the run's code
say() { echo "[$(date -u +%H:%M:%S)] $*"; }
alive() { [ -f "$RUN/pipeline.pid" ] && kill -0 "$(cat "$RUN/pipeline.pid")" 2>/dev/null; }
logs() { ls -1tr "$RUN"/data.log "$RUN"/ar.log "$RUN"/diff.log "$RUN"/diffb.log "$RUN"/pipeline.log 2>/dev/null || true; }

stage_unpack() {
  mkdir -p "$CORPUS_DIR"
  shopt -s nullglob
  local carried=("$CARRIED"/train-*.jsonl.xz)
  [ ${#carried[@]} -gt 0 ] || say "no $CARRIED/train-*.jsonl.xz carried in this call"
  for shard in "${carried[@]}"; do
    local dest=$CORPUS_DIR/$(basename "$shard")
    if [ -f "$dest" ] && cmp -s "$shard" "$dest"; then
      say "$dest: there already"
    else
      xz -t "$shard"  # a truncated transfer fails here, not in the data build
      cp "$shard" "$dest.tmp" && mv "$dest.tmp" "$dest"
      say "$dest: copied ($(du -h "$dest" | cut -f1))"
    fi
  done
  if [ -n "${INIT_SRC:-}" ] && [ -f "$INIT_SRC/config.json" ]; then  # a checkpoint to continue (INIT_FROM)
    rm -rf "$ROOT/init.tmp" && cp -r "$INIT_SRC" "$ROOT/init.tmp" && rm -rf "$ROOT/init" && mv "$ROOT/init.tmp" "$ROOT/init"
    say "checkpoint to continue: $ROOT/init ($(du -sh "$ROOT/init" | cut -f1))"
  fi
  for extra in "$CARRIED"/summary.json "$CARRIED"/manifest.jsonl.gz; do
    [ -f "$extra" ] && cp "$extra" "$CORPUS_DIR/"
  done
  say "corpus shards here:"
  ls -la "$CORPUS_DIR"
}

stage_start() {
  if alive; then
    say "a run is alive already (pid $(cat "$RUN/pipeline.pid")); not starting another"
    for log in $(logs); do echo "== $log"; tail -n 5 "$log"; done
    return 0
  fi
  if [ -f "$RUN/DONE" ]; then say "the run has finished already ($RUN/DONE); fetch it"; return 0; fi
  shopt -s nullglob
  local shards=("$CORPUS_DIR"/train-*.jsonl.xz)
  [ ${#shards[@]} -gt 0 ] || { say "no corpus shard in $CORPUS_DIR: run the unpack stage first"; exit 1; }
  [ -f "$TOKENIZER_SRC" ] || { say "$TOKENIZER_SRC missing"; exit 1; }
  # A copy of the code of its own: a later call replaces this checkout while the run goes on.
  say "code: copying engine, server, dfim, scripts and the dfim-base tokenizer to $CODE"
  rm -rf "$CODE" && mkdir -p "$CODE/engine" "$RUN"
  tar -C . --exclude='engine/weights' --exclude='__pycache__' -cf - engine server dfim scripts | tar -C "$CODE" -xf -
  mkdir -p "$CODE/engine/weights/dfim-base" && cp "$TOKENIZER_SRC" "$CODE/engine/weights/dfim-base/tokenizer.json"
  local torch_include cuda_include batch=${BATCH:-auto}
  if [ "$batch" = auto ]; then
    local mib
    mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -n 1 || true)
    batch=$([ "${mib:-0}" -ge 100000 ] && echo 64 || echo 32)
    say "batch per GPU: $batch (${mib:-?} MiB a card)"
  fi
  torch_include=$(python3 -c "import torch, os; print(os.path.join(os.path.dirname(torch.__file__), 'include'))" 2>/dev/null || true)
  cuda_include=$(ls -d /usr/local/cuda/include 2>/dev/null || true)
  # A deadline fixed once: a restarted pipeline keeps the first one (phase 2 gets what is left).
  local deadline
  deadline=$(grep -s '^DEADLINE=' "$RUN/settings.env" | cut -d= -f2 || true)
  cat > "$RUN/settings.env" <<ENV
CODE=$CODE
RUN=$RUN
DATA=$DATA
CORPUS_DIR=$CORPUS_DIR
TOKENIZER=$CODE/engine/weights/dfim-base/tokenizer.json
TRAIN_MINUTES=${TRAIN_MINUTES:-21}
AR_SHARE=${AR_SHARE:-0.33}
BATCH='$batch'
LOADER_WORKERS=${LOADER_WORKERS:-12}
EXTRA_TRAIN_ARGS='${EXTRA_TRAIN_ARGS:-}'
EXTRA_TRAIN_ARGS_B='${EXTRA_TRAIN_ARGS_B:-}'
INIT_FROM=${INIT_FROM:-}
PROBE=${PROBE:-0}
COMPILE=${COMPILE:-layers}
DRY_RUN=${DRY_RUN:-0}
HOLD_OUT='${HOLD_OUT-pygls lsprotocol cattrs attrs pydantic pydantic_core hypothesis tqdm rich _pytest}'
PY_ROOTS='$(for r in ${PY_ROOTS:-}; do realpath "$r"; done | tr '\n' ' ')'
HEADER_ROOTS='${HEADER_ROOTS-/usr/include $torch_include $cuda_include}'
ENV
  [ -n "$deadline" ] && echo "DEADLINE=$deadline" >> "$RUN/settings.env"
  say "settings ($RUN/settings.env):"; cat "$RUN/settings.env"
  # The deadline counts from the end of the data build: the pipeline fixes it there.
  # -w: setsid stays as the pid we watch even when it has to fork.
  RUN=$RUN setsid -w bash "$CODE/scripts/train_base_pipeline.sh" > "$RUN/pipeline.log" 2>&1 < /dev/null &
  echo $! > "$RUN/pipeline.pid"
  say "pipeline started in the background (pid $!, log $RUN/pipeline.log)"
  # Show the data summary and the first training lines, within this call's time.
  local waited=0
  while alive && [ $waited -lt "${START_WAIT:-420}" ] && ! grep -qs "run:" "$RUN/pipeline.log"; do
    sleep 10; waited=$((waited + 10))
    [ $((waited % 60)) -eq 0 ] && say "data build: $(tail -n 1 "$RUN/data.log" 2>/dev/null)"
  done
  print_summary
  sleep "${FIRST_LINES_WAIT:-60}"
  for log in $(logs); do echo "== $log"; tail -n 15 "$log"; done
}

print_summary() {
  [ -f "$RUN/data_summary.json" ] || { say "no data summary yet"; return 0; }
  python3 - "$RUN/data_summary.json" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
print(f"files kept {s['files_kept']:,} of {s['files_seen']:,}; unique tokens {s['unique_tokens']:,} "
      f"(train {s['tokens']['train']:,}, val {s['tokens']['val']:,}); {s['chars_per_token']} chars/token")
for lang, v in s["languages"].items():
    print(f"  {lang:12s} {v['tokens']:>14,} tokens {v['share']:7.1%} {v['files']:>9,} files")
print("dropped:", s["dropped"])
PY
}

stage_wait() {
  local minutes=${1:-9} i
  for ((i = 0; i < minutes; i++)); do
    if ! alive; then break; fi
    sleep 60
    say "minute $((i + 1)) of $minutes"
    for log in $(logs | tail -n 2); do echo "== $log"; tail -n 4 "$log"; done
  done
  if alive; then say "still running"; else
    say "the run has ended ($([ -f "$RUN/DONE" ] && echo finished || echo 'stopped early: see the log'))"
    tail -n 20 "$RUN/pipeline.log" 2>/dev/null || true
    # The machine goes back 30 s after a call, and the export with it: bring it back in this call rather
    # than trust the next one to come in time.
    if [ -n "${OUT:-}" ]; then stage_fetch; fi
  fi
}

stage_fetch() {
  : "${OUT:?OUT must name the folder that comes back}"
  # At most 8 files and 64 MiB come back: the logs travel as one archive, the export as 15 MiB parts.
  local f phase logs=()
  for f in data.log ar.log diff.log diffb.log pipeline.log data_summary.json settings.env probe-none.json probe-layers.json; do
    [ -f "$RUN/$f" ] && logs+=("$f")
  done
  for phase in ar diff diffb; do
    cp "$RUN/$phase/train_log.jsonl" "$RUN/${phase}_train_log.jsonl" 2>/dev/null && logs+=("${phase}_train_log.jsonl")
  done
  [ ${#logs[@]} -gt 0 ] && tar -C "$RUN" -czf "$OUT/logs.tgz" "${logs[@]}"
  # The int8 export ships (36 MB); the bf16 one (FETCH_BF16=1) or the AR one (FETCH_AR=1) on request.
  local what=export-int8
  [ "${FETCH_BF16:-0}" = 1 ] && what=export
  # PHASES picks the runs whose export comes back (two exports are over one call's 64 MiB).
  for phase in ${PHASES:-diff ar}; do
    [ "$phase" = ar ] && [ "${FETCH_AR:-0}" != 1 ] && continue
    [ -f "$RUN/$phase/$what/config.json" ] || { [ -f "$RUN/$phase/export/config.json" ] && what=export; }
    [ -f "$RUN/$phase/$what/config.json" ] || continue
    tar -C "$RUN/$phase" -czf "/tmp/dfim-base-$phase.tgz" "$what"
    split -b 15m -d "/tmp/dfim-base-$phase.tgz" "$OUT/$phase-$what.tgz.part"
    say "$phase $what: $(du -h "/tmp/dfim-base-$phase.tgz" | cut -f1), $(ls "$OUT"/$phase-$what.tgz.part* | wc -l) parts"
  done
  if [ "${FETCH_MANIFEST:-0}" = 1 ] && [ -f "$DATA/manifest.jsonl" ]; then  # per-file provenance of the build
    gzip -c "$DATA/manifest.jsonl" > /tmp/data_manifest.jsonl.gz
    split -b 15m -d /tmp/data_manifest.jsonl.gz "$OUT/data_manifest.jsonl.gz.part"
  fi
  ls -la "$OUT"
}

stage_status() {
  say "corpus: $(ls "$CORPUS_DIR" 2>/dev/null | tr '\n' ' ')"
  say "data: $([ -f "$DATA/meta.json" ] && echo built || echo 'not built')"
  say "run: $(alive && echo "alive (pid $(cat "$RUN/pipeline.pid"))" || echo 'not running') $([ -f "$RUN/DONE" ] && echo DONE)"
  print_summary
  for log in $(logs); do echo "== $log"; tail -n 5 "$log"; done
  nvidia-smi --query-gpu=index,name,utilization.gpu,memory.used --format=csv,noheader 2>/dev/null || true
}

case "$STAGE" in
  unpack) stage_unpack ;;
  start) stage_start ;;
  wait) stage_wait "${2:-9}" ;;
  fetch) stage_fetch ;;
  status) stage_status ;;
  *) echo "usage: $0 unpack|start|wait MINUTES|fetch|status" >&2; exit 2 ;;
esac
