#!/usr/bin/env bash
# CI's check of the pinned environment on a distribution's own Python (/usr/bin/python3, e.g.
# Debian 12's, whose python3-pyparsing 3.0.9 once broke rdflib in a venv that inherited it):
# scripts/setup.sh makes a throwaway venv of it with the locked workflow and dev tools,
# .venv's torch lent when both Pythons are one version (else torch from the CPU index),
# and the environment and RO-Crate validator tests run in it. About a minute with pip's
# cache warm.
set -euo pipefail
cd "$(dirname "$0")/.."
DIST=${DIST_PYTHON:-/usr/bin/python3}
[ -x "$DIST" ] || { echo "check-dist-python: no $DIST; skipped" >&2; exit 0; }
if ! "$DIST" -c "import venv, ensurepip" 2>/dev/null; then
  echo "check-dist-python: $DIST cannot make a venv (python3-venv missing); skipped" >&2
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
ver() { "$1" -c "import sys; print(sys.version_info[:2])"; }
lender=${TORCH_FROM:-.venv/bin/python}  # the interpreter whose torch is lent
if [ -x "$lender" ] && [ "$(ver "$lender")" = "$(ver "$DIST")" ] \
   && "$lender" -c "import torch" 2>/dev/null; then
  export TORCH_FROM=$lender
else
  unset TORCH_FROM
  export TORCH_INDEX=https://download.pytorch.org/whl/cpu
fi
VENV="$work/venv" PYTHON="$DIST" SETUP_EXTRAS=dev,workflow bash scripts/setup.sh
"$work/venv/bin/python" -m pytest -q -p no:xdist -p no:cacheprovider tests/test_env.py \
  tests/test_study.py -k "env or crate or locks or venv"
