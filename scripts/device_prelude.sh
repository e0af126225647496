# Sourced by the scripts/train_*_on_device.sh scripts at the start of every call on the GPU machine:
# environment, token shards (built from that machine's Python stdlib + site-packages on the first call,
# skipped later), and TRAIN_MINUTES, what is left of this call's MINUTES_TOTAL for training after the
# data step and RESERVE_MINUTES (saving, export, copying back).
source scripts/device_env.sh   # PYTHONPATH mirror of the installed layout, NCCL settings
START=$(date +%s)
DATA=${DATA:-/root/dfim-data}
MINUTES_TOTAL=${MINUTES_TOTAL:-9}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true

# CORPUS=path/to/corpus.tar.xz (carried; made by scripts/fetch_corpus.py): extra code from PyPI,
# unpacked once and added to this machine's own roots.
EXTRA=()
if [ -n "${CORPUS:-}" ]; then
  [ -f /root/corpus/corpus.json ] || tar -C /root -xJf "$CORPUS"
  EXTRA=(--extra-roots /root/corpus)
fi
python3 -m dfim.commands.data --out "$DATA" --tokenizer engine/weights/dfim-small/tokenizer.json \
  --workers "$(nproc)" --skip-if-built "${EXTRA[@]}"

ELAPSED=$(( $(date +%s) - START ))
TRAIN_MINUTES=$(python3 -c "print(max(1.0, $MINUTES_TOTAL - $ELAPSED / 60 - ${RESERVE_MINUTES:-0.8}))")
echo "data ready after ${ELAPSED}s; training for ${TRAIN_MINUTES} min"
