#!/usr/bin/env bash
# Create .venv and install tiledattention with the cuTile compiler and dev tools, every
# dependency at the version containers/requirements.lock and requirements-dev.lock pin.
# The venv sees none of the system's packages (a distribution's own, e.g. Debian's
# python3-pyparsing 3.0.9, would stand in for the locked ones) except its PyTorch: a GPU
# node's torch (and its CUDA libraries) is lent to it by scripts/borrow-torch.py; without
# one, torch 2.13.0 is installed.
#   PYTHON (default python3, found on PATH before the venv is activated): the interpreter
#   the venv is made from, and whose torch is lent (never the venv's own: borrow-torch.py)
#   VENV (default .venv); TORCH_FROM (default $PYTHON): the interpreter whose torch to lend
#   SETUP_EXTRAS (default gpu,dev,workflow,hf): the extras installed
#   TORCH_INDEX: where torch comes from when none is lent (e.g. PyTorch's CPU wheels,
#   https://download.pytorch.org/whl/cpu, on a machine without a GPU)
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
# The interpreters, resolved on PATH before the venv is activated: after it, a bare python3
# is the venv's own, whose torch is no system's (README: a node's PyTorch is reused).
PY=$(command -v "${PYTHON:-python3}") \
  || { echo "setup.sh: no interpreter ${PYTHON:-python3} on PATH" >&2; exit 2; }
lender=${TORCH_FROM:-$PY}
TORCH_FROM=$(command -v "$lender") \
  || { echo "setup.sh: no interpreter $lender on PATH" >&2; exit 2; }
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
# A venv this script made before inherited every system package: now only the torch lent.
sed -i 's/^include-system-site-packages = true/include-system-site-packages = false/' \
  "$VENV/pyvenv.cfg"
. "$VENV/bin/activate"
site=$(python -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
if "$TORCH_FROM" -c "import torch" 2>/dev/null; then  # borrow-torch.py: never the venv's own
  "$TORCH_FROM" scripts/borrow-torch.py "$site"
fi
python scripts/constraints.py > "$VENV/constraints.txt"  # the two locks, merged
locks=(-c "$VENV/constraints.txt")
python -m pip install -q --upgrade pip
python -c "import torch" 2>/dev/null || python -m pip install -q "${locks[@]}" \
  ${TORCH_INDEX:+--index-url "$TORCH_INDEX"} "torch==2.13.0"
python -m pip install -q "${locks[@]}" -e ".[${SETUP_EXTRAS:-gpu,dev,workflow,hf}]"
