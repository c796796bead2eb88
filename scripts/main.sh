#!/usr/bin/env bash
# The main job: set up, check the kernel on this machine, then run the study locally with
# Snakemake (profiles/local). With a CUDA GPU: the full study (config/config.yaml, the
# paper's 80 points, every baseline). Without one: the smoke study (config/smoke.yaml),
# where the GPU methods are reported `unavailable` and eager/math attention run on the CPU.
# It ends with a verified Zenodo-ready bundle and the HTML report in the study's results
# directory. Extra arguments go to snakemake (e.g. -n for a dry run).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
mkdir -p results
tiledattn check --json results/check.json
if python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  config=config/config.yaml
else
  config=config/smoke.yaml
fi
snakemake --profile profiles/local --configfile "$config" "$@"
case " $* " in *" -n "*|*" --dry-run "*) exit 0 ;; esac
# The HTML report (figures and tables with captions) next to the verified bundle.
results=$(python -c "import yaml,sys; print(yaml.safe_load(open(sys.argv[1]))['results_dir'])" "$config")
snakemake --profile profiles/local --configfile "$config" --report "$results/report.html"
cat "$results/bundle.verified"
