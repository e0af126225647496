#!/usr/bin/env bash
# Install dfim into ./.venv (CPU PyTorch). `./install.sh --test` adds the test tools.
# Offline-friendly: a CPU torch wheel found on this machine is used before any download.
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
PIP=(.venv/bin/python -m pip install -q --disable-pip-version-check)

if ! .venv/bin/python -c "import torch" 2>/dev/null; then
  wheel=$(ls /opt/wheels/torch-2.13.0+cpu-*.whl 2>/dev/null | head -n 1 || true)
  if [ -n "$wheel" ]; then
    "${PIP[@]}" "$wheel"
  elif ! "${PIP[@]}" torch --index-url https://download.pytorch.org/whl/cpu 2>/dev/null; then
    "${PIP[@]}" torch  # PyPI's default build (larger, includes CUDA)
  fi
fi

if [ "${1:-}" = "--test" ]; then
  "${PIP[@]}" -e ".[test]"
else
  "${PIP[@]}" -e .
fi
