#!/usr/bin/env bash
# One config on several GPU counts of one node, then the scaling table and figure:
#
#   bash scripts/device-scaling.sh CONFIG N [N...]        # e.g. config/scaling.yaml 1 2
#
# Each count runs as scripts/device-study.sh with GPUS=N (the first N GPUs, `--resources
# gpu=N`) into results/<config name>-g<N>, within BUDGET seconds each (default 270); then
# `tiledattn scaling` over the runs that finished. $OUT gets scaling.md, scaling.csv,
# scaling.png and one archive of every run's results directory (the device tool brings
# back at most 8 files).
set -uo pipefail
cd "$(dirname "$0")/.."
config=${1:?usage: scripts/device-scaling.sh CONFIG N [N...]}
shift
[ "$#" -ge 1 ] || { echo "device-scaling: name one or more GPU counts" >&2; exit 2; }
for n in "$@"; do
  case "$n" in ''|*[!0-9]*|0) echo "device-scaling: GPU counts are positive integers, got $n" >&2
                              exit 2 ;; esac
done
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
name=$(basename "$config" .yaml)
work=$(mktemp -d)
studies=()
for n in "$@"; do
  results=results/$name-g$n
  GPUS=$n RESULTS=$results OUT=$work/g$n bash scripts/device-study.sh "$config" \
    "${BUDGET:-270}" --config "results_dir=$results"
  studies+=("$results")
done
PATH="${SITE:-/tmp/site}/bin:$PATH" PYTHONPATH="${SITE:-/tmp/site}:$PWD" \
  tiledattn scaling "${studies[@]}" --out "$OUT"
rc=$?
tar -czf "$OUT/$name-runs.tar.gz" --exclude='*/bundle.zip' "${studies[@]}" -C "$work" .
ls -la "$OUT" >&2
exit "$rc"
