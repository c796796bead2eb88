#!/usr/bin/env bash
# Create .venv and install tiledattention with the cuTile compiler and dev tools.
# Reuses a system PyTorch (GPU nodes ship one); otherwise installs torch 2.13.0.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv --system-site-packages .venv
fi
. .venv/bin/activate
python -m pip install -q --upgrade pip
python -c "import torch" 2>/dev/null || python -m pip install -q "torch==2.13.0"
python -m pip install -q -e ".[gpu,dev,workflow,hf]"
