#!/usr/bin/env bash
# The test suite: lint, CPU tests, compile-only tests (every kernel variant for sm_90,
# sm_100 and sm_120 through tileiras, no GPU needed), and the GPU tests, which skip
# with the reason where no CUDA GPU is visible.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
ruff check .
python -m pytest -n "${PYTEST_WORKERS:-2}" --dist loadgroup "$@"
