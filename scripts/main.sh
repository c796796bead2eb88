#!/usr/bin/env bash
# The main job: set up, then check the kernel on this machine. With a CUDA GPU it
# checks correctness against float64 and speed against PyTorch SDPA; without one it
# says so and runs the CPU checks (reference algorithm, validation, a real compile).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p results
.venv/bin/tiledattn check --json results/check.json "$@"
