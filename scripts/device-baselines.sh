#!/usr/bin/env bash
# Installs the FA4 kit of scripts/pack-baseline-wheels.sh on a GPU machine without a package
# index, one carried load per device call:
#
#   bash scripts/device-baselines.sh [LOAD_DIR...]     # default: every $FA4KIT/load* here
#
# Each call copies the loads it finds into $STAGE (default /tmp/fa4kit: a warm machine keeps
# /tmp between calls). Once every wheel and part that MD5SUMS and PARTS name is staged, the
# parts are checked and joined, every wheel is checked against its md5, and all are installed
# with pip --no-index --no-deps --target $FA4_SITE (default /tmp/fa4site), once. pip --target
# skips the DSL's .pth file (it puts nvidia_cutlass_dsl/dsl_packages, where `cutlass` lives,
# on sys.path), so the entries to put on PYTHONPATH are written to $FA4_SITE/.pythonpath and
# printed as the last line; scripts/device-study.sh adds them itself.
#
# Exit: 0 installed (or already), 3 loads still missing (carry the next one), 1 a bad md5 or
# a failed install, 2 no kit here and none staged.
set -euo pipefail
cd "$(dirname "$0")/.."
FA4KIT=${FA4KIT:-.fa4kit}
STAGE=${STAGE:-/tmp/fa4kit}
FA4_SITE=${FA4_SITE:-/tmp/fa4site}
say() { echo "device-baselines: $*" >&2; }
pythonpath="$FA4_SITE:$FA4_SITE/nvidia_cutlass_dsl/dsl_packages"

loads=("$@")
if [ ${#loads[@]} -eq 0 ]; then
  for d in "$FA4KIT"/load*; do [ -d "$d" ] && loads+=("$d"); done
fi
mkdir -p "$STAGE"
for d in "${loads[@]}"; do
  [ -f "$d/MD5SUMS" ] || { say "$d is not a kit load (no MD5SUMS)"; exit 2; }
  cp "$d"/* "$STAGE"/
  say "staged $d ($(ls "$d" | wc -l) files)"
done
if [ ! -f "$STAGE/MD5SUMS" ]; then
  [ -f "$FA4_SITE/.pythonpath" ] && { cat "$FA4_SITE/.pythonpath"; exit 0; }
  say "no kit: carry $FA4KIT/load1 (bash scripts/pack-baseline-wheels.sh makes it)"; exit 2
fi
if [ -f "$FA4_SITE/.pythonpath" ] && cmp -s "$STAGE/MD5SUMS" "$FA4_SITE/.kit"; then
  cat "$FA4_SITE/.pythonpath"; exit 0  # this kit is installed already
fi

# Everything staged? Parts and whole wheels, each named once in PARTS / MD5SUMS.
missing=()
while read -r _ name; do
  [ -f "$STAGE/$name" ] || missing+=("$name")
done < "$STAGE/PARTS"
while read -r _ name; do
  [ -f "$STAGE/$name" ] || grep -q " $name.part" "$STAGE/PARTS" || missing+=("$name")
done < "$STAGE/MD5SUMS"
if [ ${#missing[@]} -gt 0 ]; then
  say "${#missing[@]} file(s) not staged yet (${missing[*]}): carry the next load"
  exit 3
fi
(cd "$STAGE" && md5sum --quiet -c PARTS) >&2 || { say "a part's md5 differs"; exit 1; }
for name in $(awk '{print $2}' "$STAGE/MD5SUMS"); do
  if [ ! -f "$STAGE/$name" ]; then
    mapfile -t parts < <(awk -v n="$name" 'index($2, n ".part") == 1 {print $2}' \
                         "$STAGE/PARTS" | sort)
    (cd "$STAGE" && cat "${parts[@]}") > "$STAGE/$name"
    say "joined ${#parts[@]} parts into $name"
  fi
done
(cd "$STAGE" && md5sum --quiet -c MD5SUMS) >&2 || { say "a wheel's md5 differs"; exit 1; }
rm -rf "$FA4_SITE"
wheels=()
while read -r _ name; do wheels+=("$STAGE/$name"); done < "$STAGE/MD5SUMS"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$FA4_SITE" \
  "${wheels[@]}" >&2 || { say "pip install failed"; exit 1; }
cp "$STAGE/MD5SUMS" "$FA4_SITE/.kit"
echo "$pythonpath" > "$FA4_SITE/.pythonpath"
say "installed ${#wheels[@]} wheels into $FA4_SITE; PYTHONPATH gets $pythonpath"
echo "$pythonpath"
