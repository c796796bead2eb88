#!/usr/bin/env bash
# The study on a GPU machine that has PyTorch but no package index and no Snakemake (the
# device tool's machines), resumable within a per-command time limit:
#
#   bash scripts/device-study.sh CONFIG [BUDGET_S] [SNAKEMAKE ARGS...]
#   bash scripts/device-study.sh --reproduce BUNDLE [BUDGET_S] [SNAKEMAKE ARGS...]
#
# With --reproduce, the study is the one BUNDLE records: `tiledattn reproduce BUNDLE --out
# $WORKDIR` lays out its workflow and exact config (default /tmp/reproduction; the same
# command again continues there), steps 2-3 run in $WORKDIR, and once Snakemake finishes
# `tiledattn reproduce` ends the re-run as it does anywhere: the new bundle verified,
# compared against BUNDLE (exit 1 on a regression), rebuilt with compare/ and verified again.
#
# 1. installs the wheel kit (.whl, from scripts/pack-study-wheels.sh) into $SITE and puts a
#    `tiledattn` command there that runs this checkout (skipped when already installed);
# 2. activates the carried cuTile toolchain ($TOOLCHAIN/activate.sh, default .toolchain) when
#    there is one, and on a GPU compiles the planned points' kernels in parallel first (tiledattn precompile,
#    once per machine and set of plans);
# 3. runs `snakemake --profile profiles/local --configfile CONFIG` on $GPUS GPUs (default:
#    every visible one; the first $GPUS are made visible, `--resources gpu=$GPUS`), stopped
#    with SIGTERM after BUDGET_S seconds (default 530: with the
#    30 s grace after the signal and the packing, the call ends inside 10 minutes): the workflow passes the signal to the
#    GPU steps, which cancel their jobs; rows already measured stay, so the same command
#    again continues where this one stopped (a shard resumes from its finished rows);
# 4. packs the study's results directory (rows, tables, figures, logs, bundle) and the
#    bundle zip into $OUT (the device tool brings $OUT back).
#
# Environment: GPUS, KIT (default .whl), FA4KIT (default .fa4kit; scripts/device-baselines.sh
# says how its loads travel), OUT (default /tmp/out; a directory holding files this script
# did not write gets them in a fresh subdirectory), SITE (default /tmp/site), RESULTS (the study's
# results directory when a --config overrides results_dir), TILEDATTENTION_SOURCE_REVISION
# (the commit, recorded in every manifest: the copied tree may have no .git).
# Exit: 0 finished, 3 stopped at the budget (run it again), else the failure's code.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
usage="usage: scripts/device-study.sh CONFIG|--reproduce BUNDLE [BUDGET_S] [SNAKEMAKE ARGS...]"
bundle=
if [ "${1:-}" = --reproduce ]; then
  bundle=${2:?$usage}; shift
  [ -d "$bundle" ] || [ -f "$bundle" ] || { echo "device-study: no bundle $bundle" >&2; exit 2; }
  bundle=$(cd "$(dirname "$bundle")" && pwd)/$(basename "$bundle")
  config=config/study-config.yaml  # tiledattn reproduce puts the bundle's there
else
  config=${1:?$usage}
  [ -f "$config" ] || { echo "device-study: no config $config" >&2; exit 2; }
fi
budget=${2:-530}
shift $(( $# >= 2 ? 2 : 1 ))
case "$budget" in ''|*[!0-9]*) echo "device-study: BUDGET_S must be seconds, got $budget" >&2
                               exit 2 ;; esac
OUT=${OUT:-/tmp/out}
SITE=${SITE:-/tmp/site}
# GPUS as a count: 0, 00 or 1x are refused here, before anything is installed or run.
case "${GPUS:-1}" in *[!0-9]*|0*) echo "device-study: GPUS must be a positive whole number" \
                                       "of GPUs, got '$GPUS'" >&2; exit 2 ;; esac
# OUT is ours only when new, empty or marked by an earlier run of this script; otherwise
# (a user's directory) everything goes into a fresh subdirectory of it: packing splits and
# removes large files, and must never touch one it did not make.
if [ -e "$OUT" ] && [ ! -d "$OUT" ]; then
  echo "device-study: OUT $OUT exists and is not a directory; name a directory" >&2; exit 2
fi
mkdir -p "$OUT" 2>/dev/null && OUT=$(cd "$OUT" && pwd) \
  || { echo "device-study: cannot make OUT $OUT" >&2; exit 2; }  # absolute: --reproduce cds
if [ ! -f "$OUT/.device-study" ] && [ -n "$(ls -A "$OUT")" ]; then
  OUT=$(mktemp -d "$OUT/device-study-$(date +%Y%m%d-%H%M%S)-XXXX")
  echo "device-study: OUT holds files of its own; writing into $OUT" >&2
fi
touch "$OUT/.device-study"
# SITE is removed and reinstalled when the kit changes: only one this script installed (its
# .kit list) or one holding nothing but the bin/ it writes, never a user's directory.
KIT=${KIT:-.whl}
if [ -e "$SITE" ] && { [ ! -d "$SITE" ] || { [ -d "$KIT" ] && [ ! -f "$SITE/.kit" ] \
     && [ -n "$(ls -A "$SITE" | grep -vx bin)$(ls -A "$SITE/bin" 2>/dev/null \
                                             | grep -vx tiledattn)" ]; }; }; then
  echo "device-study: SITE $SITE holds files this script did not install; name a new SITE" >&2
  exit 2
fi
t0=$(date +%s)
say() { echo "device-study [$(( $(date +%s) - t0 ))s]: $*" >&2; }

# 1. The wheel kit, once per machine (a warm machine keeps /tmp).
KIT=${KIT:-.whl}
if [ -d "$KIT" ] && ! cmp -s <(ls "$KIT") "$SITE/.kit" 2>/dev/null; then
  rm -rf "$SITE"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" \
    "$KIT"/*.whl || { echo "device-study: installing $KIT failed" >&2; exit 1; }
  ls "$KIT" > "$SITE/.kit"
  say "installed $(ls "$KIT"/*.whl | wc -l) wheels from $KIT into $SITE"
fi
# 1b. FlashAttention-4 and the CuTe DSL (the fa4, sdpa_fa4 and flex_flash baselines): a
# carried kit load ($FA4KIT/load*, scripts/pack-baseline-wheels.sh) is installed by
# scripts/device-baselines.sh, which must then find the whole kit (earlier calls staged the
# other loads); without one, an earlier call's install on this warm machine is used. With
# neither, those rows say `unavailable` and why.
FA4KIT=${FA4KIT:-.fa4kit}
export FA4KIT
fa4path=
if compgen -G "$FA4KIT/load*" >/dev/null; then
  fa4path=$(bash scripts/device-baselines.sh) || {
    echo "device-study: the FA4 kit is not installed (above): carry its other loads first" >&2
    exit 2; }
elif [ -f "${FA4_SITE:-/tmp/fa4site}/.pythonpath" ]; then
  fa4path=$(cat "${FA4_SITE:-/tmp/fa4site}/.pythonpath")
fi
[ -n "$fa4path" ] && say "FA4 from ${fa4path%%:*}"
mkdir -p "$SITE/bin"
# The __main__ guard: tiledattn precompile's worker processes (spawn) import this script.
printf '#!/usr/bin/env python3\nimport sys\nfrom tiledattention.cli import main\nif __name__ == "__main__":\n    sys.exit(main())\n' \
  > "$SITE/bin/tiledattn"
chmod +x "$SITE/bin/tiledattn"
export PATH="$SITE/bin:$PATH" \
  PYTHONPATH="$SITE:$repo${fa4path:+:$fa4path}${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 CUDA_TILE_CACHE_DIR=${CUDA_TILE_CACHE_DIR:-/tmp/cutile-cache}
# Multi-GPU kinds: NVLink multicast stays off (the device README says why).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

# 2. The cuTile toolchain.
TOOLCHAIN=${TOOLCHAIN:-.toolchain}
if [ -f "$TOOLCHAIN/activate.sh" ]; then
  . "$TOOLCHAIN/activate.sh" >&2 || { echo "device-study: $TOOLCHAIN failed" >&2; exit 1; }
fi
command -v snakemake >/dev/null || { echo "device-study: no snakemake (carry .whl)" >&2
                                     exit 2; }
if [ -z "${TILEDATTENTION_SOURCE_REVISION:-}" ]; then
  rev=$(git rev-parse HEAD 2>/dev/null) && export TILEDATTENTION_SOURCE_REVISION=$rev \
    || say "no TILEDATTENTION_SOURCE_REVISION and no .git: manifests record no revision"
fi
if [ -n "$bundle" ]; then  # the bundle's workflow and config, laid out (or continued)
  WORKDIR=${WORKDIR:-/tmp/reproduction}
  tiledattn reproduce "$bundle" --out "$WORKDIR" --snakemake-args=-n >"$OUT/reproduce-plan.log" \
    2>&1 || { tail -3 "$OUT/reproduce-plan.log" >&2; exit 2; }
  cd "$WORKDIR"
fi

# 3. The study, on the first $GPUS GPUs.
visible=$(python3 -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
GPUS=${GPUS:-$(( visible > 0 ? visible : 1 ))}
if [ "$visible" -gt 0 ] && [ "$GPUS" -gt "$visible" ]; then
  echo "device-study: GPUS=$GPUS but this machine shows $visible GPU(s)" >&2; exit 2
fi
if [ "$visible" -gt 0 ] && [ -z "${CUDA_VISIBLE_DEVICES:-}" ]; then
  CUDA_VISIBLE_DEVICES=$(seq -s, 0 $(( GPUS - 1 )))
  export CUDA_VISIBLE_DEVICES
fi
results=${RESULTS:-$(python3 -c "import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))\
['results_dir'])" "$config")}
say "$GPUS GPU(s) (CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}), budget ${budget}s," \
    "results in $results, snakemake $(snakemake --version)"
smk=(snakemake --profile profiles/local --configfile "$config" --resources "gpu=$GPUS"
     --cores $(( GPUS + 1 )))
# As tiledattn reproduce runs it: a re-run continued from its carried results directory
# (a fresh machine, no .snakemake records) reruns only missing or older outputs.
[ -n "$bundle" ] && smk+=(--rerun-triggers mtime)
smk+=("$@")
"${smk[@]}" --unlock >/dev/null 2>&1  # a run stopped at its budget leaves the lock behind
# The kernels of every planned point, compiled into cuTile's disk cache by all CPU cores
# before the GPU steps run (once per machine and set of plans; PRECOMPILE=0 skips it).
if [ "$visible" -gt 0 ] && [ "${PRECOMPILE:-1}" = 1 ]; then
  "${smk[@]}" --until plan plan_shapes >"$OUT/plan.log" 2>&1 \
    || say "planning failed (plan.log); the study reports why"
  # plan_ladder names no wildcard, so --until would plan it even for a study without one.
  if python3 -c "import sys, yaml; c = yaml.safe_load(open(sys.argv[1])); \
sys.exit(0 if (c.get('ladder') or {}).get('enabled') else 1)" \
       "$results/plan/study-config.yaml" 2>/dev/null; then
    "${smk[@]}" --until plan_ladder >>"$OUT/plan.log" 2>&1
  fi
  plans=()
  for f in "$results"/plan/bench.yaml "$results"/plan/ladder.yaml "$results"/plan/shapes-g*.yaml; do
    [ -f "$f" ] && plans+=("$f")
  done
  stamp="$CUDA_TILE_CACHE_DIR/.precompiled-$(cat "${plans[@]}" /dev/null | sha256sum | cut -c1-16)"
  if [ "${#plans[@]}" -eq 0 ] || [ -f "$stamp" ]; then
    :  # nothing planned, or these plans' kernels are in the cache already
  # At most a third of the budget: what is not compiled by then compiles in the study.
  elif timeout --kill-after=10 $(( budget / 3 )) tiledattn precompile --config "${plans[@]}" \
       2>&1 | tee "$OUT/precompile.log" >&2; then  # pipefail: precompile's own status
    mkdir -p "$CUDA_TILE_CACHE_DIR" && touch "$stamp"
  else
    say "precompile did not finish; the study compiles as it goes"
  fi
fi
left=$(( budget - ($(date +%s) - t0) ))
[ "$left" -gt 30 ] || { echo "device-study: no time left for the study" >&2; exit 3; }
timeout --signal=TERM --kill-after=30 "$left" "${smk[@]}" 2>&1 | tee "$OUT/snakemake.log" >&2
rc=${PIPESTATUS[0]}
if [ "$rc" = 0 ] && [ -n "$bundle" ]; then  # Snakemake has nothing left: verify, compare
  tiledattn reproduce "$bundle" --out "$WORKDIR" 2>&1 | tee "$OUT/reproduce.log" >&2
  rc=${PIPESTATUS[0]}
  [ "$rc" = 0 ] || { say "tiledattn reproduce exited $rc (reproduce.log: a regression, or" \
                         "a step failed)"; rc=1; reproduced=no; }
fi
case $rc in
  0) say "study finished: $(cat "$results/bundle.verified" 2>/dev/null)" ;;
  124|137) say "stopped at the budget; the same command continues the study"; rc=3 ;;
  *) [ -n "${reproduced:-}" ] || say "snakemake exited $rc (see snakemake.log)" ;;
esac

# 4. What comes back: the results directory (the zip beside it, separately) and the logs.
if [ -d "$results" ]; then
  name=$(basename "$results")
  logs=(); [ -d .snakemake/log ] && logs=(-C "$PWD" .snakemake/log)
  tar -czf "$OUT/$name-results.tar.gz" --exclude="$name/bundle.zip" \
    -C "$(cd "$(dirname "$results")" && pwd)" "$name" "${logs[@]}"
  [ -f "$results/bundle.zip" ] && cp "$results/bundle.zip" "$OUT/$name-bundle.zip"
  # The device tool brings back files of at most 16 MiB: larger ones go in 15 MiB parts
  # (cat NAME.part* > NAME to join them). Only the two files written just above.
  for f in "$OUT/$name-results.tar.gz" "$OUT/$name-bundle.zip"; do
    if [ -f "$f" ] && [ ! -L "$f" ] && [ "$(stat -c %s "$f")" -gt $(( 16 << 20 )) ]; then
      rm -f "$f".part[0-9][0-9]  # an earlier run's parts of this file
      split -b 15M -d "$f" "$f.part" && rm "$f"
    fi
  done
  ls -la "$OUT" >&2
fi
exit "$rc"
