#!/usr/bin/env bash
# The main job: set up, check the kernel on this machine, then run a small benchmark.
# With a CUDA GPU the check compares against float64 and times against PyTorch SDPA, and
# the benchmark runs config/bench-h100-small.yaml; without one the check says so and runs
# the CPU checks, and the benchmark runs config/bench-smoke.yaml (eager and math attention
# on the CPU; the GPU methods are reported `unavailable`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
mkdir -p results
.venv/bin/tiledattn check --json results/check.json
if .venv/bin/python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  config=config/bench-h100-small.yaml
else
  config=config/bench-smoke.yaml
fi
.venv/bin/tiledattn bench --config "$config" --out results/bench "$@"
