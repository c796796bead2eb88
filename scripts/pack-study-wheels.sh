#!/usr/bin/env bash
# The wheels a GPU machine without a package index needs to run the study through
# `snakemake --profile profiles/local` (scripts/device-study.sh installs them): Snakemake and
# what it imports on that path, jsonschema (the config check), submitit (the local launcher)
# and rocrate (bundle verify). Everything else the study uses -- torch, numpy, pandas, pyarrow,
# matplotlib, pyyaml, jinja2, requests, psutil, wrapt, tabulate, click, python-dateutil,
# cloudpickle, transformers -- is in the GPU image already (its package list is read before
# anything is added here), and the cuTile toolchain travels as .toolchain.
#
#   bash scripts/pack-study-wheels.sh [DEST] [PYTHON_VERSION]     # default: .whl 3.12
#
# FlashAttention-4 and the CuTe DSL (the fa4, sdpa_fa4, flex_flash baselines; 92 MB of CUDA 13
# libs) are a kit of their own, in loads of one device call each:
# scripts/pack-baseline-wheels.sh, installed there by scripts/device-baselines.sh.
#
# Left out, each checked by running the CPU study without it: pulp (the ILP scheduler; the
# profile's `scheduler: greedy` never imports it), docutils (only `--report`), gitpython, and
# sqlmodel/SQLAlchemy/pydantic, through which Snakemake >= 9.17 keeps its metadata in SQLite
# (~5 MB of wheels). The kit pins Snakemake 9.9.0: before that store, and the newest 9.x
# whose greedy scheduler keeps to `--resources gpu=N` (from 9.10 it can start a job past a
# resource limit, snakemake issue 3913: two GPU steps at once on one GPU slot, seen here with
# 9.16.3). The other pins are containers/requirements.lock's. ~2.9 MB in all.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.whl}
py=${2:-3.12}
pins=(
  snakemake==9.9.0
  snakemake-interface-common==1.23.0 snakemake-interface-executor-plugins==9.4.0
  snakemake-interface-storage-plugins==4.4.1 snakemake-interface-report-plugins==1.3.0
  snakemake-interface-logger-plugins==1.2.4
  configargparse==1.9.0 argparse-dataclass==2.0.0 immutables==0.21 humanfriendly==10.0
  throttler==1.2.3 tenacity==9.2.1 reretry==0.11.8 appdirs==1.4.4 dpath==2.2.0 yte==1.9.4
  conda-inject==1.3.2 smart-open==7.7.1
  # snakemake.script (the plan rules' `script:`) imports nbformat
  nbformat==5.11.1 fastjsonschema==2.22.3 traitlets==5.16.1 jupyter-core==5.9.1
  platformdirs==4.14.7
  jsonschema==4.26.0 referencing==0.37.0 rpds-py==2026.9.1 jsonschema-specifications==2025.9.1
  submitit==1.5.4
  rocrate==0.16.0 arcp==0.2.1
)
# connection-pool 0.0.3 (snakemake 9.9 needs >= 0.0.3) is published as a source archive
# only: built here into a pure-Python wheel.
built=(connection-pool==0.0.3)
# DEST holds only what this script made: its manifest (.pack-study-wheels) names every file
# of the last pack, and only those are replaced. Anything else there (a user's wheels, an
# archive) is never removed: the pack is refused instead, naming it.
manifest=.pack-study-wheels
if [ -e "$dest" ] && [ ! -d "$dest" ]; then
  echo "pack-study-wheels: $dest exists and is not a directory; name another DEST" >&2
  exit 2
fi
mkdir -p "$dest"
ours=("$manifest")
[ -f "$dest/$manifest" ] && mapfile -t -O 1 ours < "$dest/$manifest"
# A kit of this script from before its manifest (until Nov 26 2026) holds the .gitignore it
# wrote ('*') and the wheels of the pins it had (today's, or 9.16.3's below, written with
# one '=' so that they read as no pin of today's): those wheels, regular files, are its
# own and replaced; anything else still refuses the pack.
old_pins=("${pins[@]}" "${built[@]}" snakemake=9.16.3
          snakemake-interface-logger-plugins=2.1.0 snakemake-interface-scheduler-plugins=2.0.2)
old_kit=0
if [ ! -e "$dest/$manifest" ] && [ -f "$dest/.gitignore" ] && [ ! -L "$dest/.gitignore" ] \
    && [ "$(cat "$dest/.gitignore")" = '*' ]; then
  for f in "$dest"/*.whl; do
    [ -f "$f" ] && [ ! -L "$f" ] || continue
    name=${f##*/}; rest=${name#*-}
    dist=${name%%-*}; dist=${dist,,}; dist=${dist//[-.]/_}
    for p in "${old_pins[@]}"; do
      n=${p%%=*}; n=${n,,}; n=${n//[-.]/_}
      if [ "$dist" = "$n" ] && [ "${rest%%-*}" = "${p##*=}" ]; then
        ours+=("$name"); old_kit=1; break
      fi
    done
  done
fi
foreign=()
for f in "$dest"/* "$dest"/.[!.]* "$dest"/..?*; do
  [ -e "$f" ] || [ -L "$f" ] || continue
  name=${f##*/}
  [ "$name" = .gitignore ] && [ "$(cat "$f" 2>/dev/null)" = '*' ] && continue
  mine=0
  for o in "${ours[@]}"; do [ "$name" = "$o" ] && [ -f "$f" ] && [ ! -L "$f" ] && mine=1; done
  [ "$mine" = 1 ] || foreign+=("$name")
done
if [ ${#foreign[@]} -gt 0 ]; then
  echo "pack-study-wheels: $dest holds ${#foreign[@]} file(s) this script did not make" \
       "(${foreign[*]:0:3}${foreign[3]:+ ...}); nothing removed: move them or name another DEST" >&2
  exit 2
fi
if [ "$old_kit" = 1 ]; then
  echo "pack-study-wheels: $dest is a kit of this script from before its manifest; its" \
       "$(( ${#ours[@]} - 1 )) wheel(s) are replaced" >&2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux_2_5_x86_64 \
         manylinux1_x86_64 any; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" \
  --implementation cp "${platforms[@]}" -d "$work" "${pins[@]}"
python3 -m pip wheel -q --no-deps --no-binary=:all: -w "$work" "${built[@]}"
count=$(find "$work" -maxdepth 1 -name '*.whl' | wc -l)
expected=$(( ${#pins[@]} + ${#built[@]} ))
if [ "$count" -ne "$expected" ]; then
  echo "pack-study-wheels: $count wheels packed, expected $expected; $dest left as it was" >&2
  exit 1
fi
# The last pack's files go (each named in the manifest, checked above), then the new ones.
for o in "${ours[@]:1}"; do rm -f -- "$dest/$o"; done
# The kit ignores itself (git never tracks it; the device tool's `carry` brings it along).
printf '*\n' > "$dest/.gitignore"
(cd "$work" && ls -1 -- *.whl) > "$work/$manifest.new"
mv -f -- "$work"/*.whl "$dest"/
mv -f -- "$work/$manifest.new" "$dest/$manifest"
echo "$dest: $count wheels, $(du -cb "$dest"/*.whl | tail -1 | cut -f1) bytes, Python $py"
