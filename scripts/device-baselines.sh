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
# FA4_SITE is replaced only when this script made it: absent, empty, or holding nothing but
# what its marker .fa4site names (written before the install's files are moved in); a user's
# directory is refused. The names in MD5SUMS and PARTS are plain file names (no '/', no '..'):
# nothing is written outside $STAGE and $FA4_SITE.
#
# Exit: 0 installed (or already), 3 loads still missing (carry the next one), 1 a bad md5 or
# a failed install, 2 no kit here and none staged, a listing naming a path, or an FA4_SITE
# holding files this script did not make.
set -euo pipefail
cd "$(dirname "$0")/.."
FA4KIT=${FA4KIT:-.fa4kit}
STAGE=${STAGE:-/tmp/fa4kit}
FA4_SITE=${FA4_SITE:-/tmp/fa4site}
say() { echo "device-baselines: $*" >&2; }
pythonpath="$FA4_SITE:$FA4_SITE/nvidia_cutlass_dsl/dsl_packages"
marker=.fa4site  # the names this script put in FA4_SITE, its own two files included

# A name from a listing (MD5SUMS, PARTS, the marker) is used as a path inside one directory:
# only a plain file name is, never '..', an absolute path or anything with a '/'.
plain_names() {  # FILE: exit 2 on the first line whose name is not a plain file name
  local file=$1 name
  while read -r _ name; do
    case "$name" in
      ''|.|..|*/*|-*|*[[:space:]]*)
        say "$file names '$name', not a plain file name; refused, nothing written"; exit 2 ;;
    esac
  done < "$file"
}
# FA4_SITE is ours when absent, empty, or holding only what its marker names.
site_is_ours() {
  [ -e "$FA4_SITE" ] || [ -L "$FA4_SITE" ] || return 0
  [ -d "$FA4_SITE" ] && [ ! -L "$FA4_SITE" ] || return 1
  [ -n "$(ls -A "$FA4_SITE")" ] || return 0
  [ -f "$FA4_SITE/$marker" ] && [ ! -L "$FA4_SITE/$marker" ] || return 1
  (plain_names <(sed 's/^/- /' "$FA4_SITE/$marker")) >/dev/null 2>&1 || return 1
  local f
  for f in "$FA4_SITE"/* "$FA4_SITE"/.[!.]* "$FA4_SITE"/..?*; do
    [ -e "$f" ] || [ -L "$f" ] || continue
    grep -qxF -- "${f##*/}" "$FA4_SITE/$marker" || return 1
  done
}

loads=("$@")
if [ ${#loads[@]} -eq 0 ]; then
  for d in "$FA4KIT"/load*; do [ -d "$d" ] && loads+=("$d"); done
fi
for d in "${loads[@]}"; do  # every load checked before anything is staged
  [ -f "$d/MD5SUMS" ] || { say "$d is not a kit load (no MD5SUMS)"; exit 2; }
  plain_names "$d/MD5SUMS"
  [ ! -f "$d/PARTS" ] || plain_names "$d/PARTS"
done
mkdir -p "$STAGE"
for d in "${loads[@]}"; do
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

plain_names "$STAGE/MD5SUMS"  # a stage an earlier version of this script filled
[ -f "$STAGE/PARTS" ] || { say "$STAGE has MD5SUMS but no PARTS: not a kit load"; exit 2; }
plain_names "$STAGE/PARTS"
if ! site_is_ours; then
  say "FA4_SITE $FA4_SITE holds files this script did not install; nothing removed:" \
      "name a new FA4_SITE"
  exit 2
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
wheels=()
while read -r _ name; do wheels+=("$STAGE/$name"); done < "$STAGE/MD5SUMS"
# Installed beside FA4_SITE first, so that an interrupted install leaves nothing in FA4_SITE
# that its marker does not name (the next call replaces it instead of refusing it).
mkdir -p "$(dirname "$FA4_SITE")"
new=$(mktemp -d "${FA4_SITE%/}.new-XXXXXX")
trap 'rm -rf -- "$new"' EXIT
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$new" \
  "${wheels[@]}" >&2 || { say "pip install failed"; exit 1; }
cp "$STAGE/MD5SUMS" "$new/.kit"
echo "$pythonpath" > "$new/.pythonpath"
if [ -f "$FA4_SITE/$marker" ]; then  # the last install's names (checked above), nothing else
  while read -r name; do rm -rf -- "${FA4_SITE:?}/$name"; done < "$FA4_SITE/$marker"
  rm -f -- "$FA4_SITE/$marker"
fi
mkdir -p "$FA4_SITE"
{ ls -A "$new"; echo "$marker"; } > "$FA4_SITE/$marker"
for f in "$new"/* "$new"/.[!.]* "$new"/..?*; do
  [ -e "$f" ] || [ -L "$f" ] || continue
  mv -- "$f" "$FA4_SITE/"
done
say "installed ${#wheels[@]} wheels into $FA4_SITE; PYTHONPATH gets $pythonpath"
echo "$pythonpath"
