#!/usr/bin/env bash
# FlashAttention-4, NVIDIA's CuTe DSL and the cuDNN frontend (the study's fa4, sdpa_fa4,
# flex_flash and cudnn_fe baselines)
# for a GPU machine without a package index, in loads small enough for one device call each
# (it carries at most 64 MiB, the working tree included; the cuTile toolchain alone is ~60 MB,
# so the loads travel in calls of their own, before the study's):
#
#   bash scripts/pack-baseline-wheels.sh [DEST] [PYTHON_VERSION]     # default: .fa4kit 3.12
#
# The wheels are the baselines extra's pins (pyproject.toml) for CPython PYTHON_VERSION on
# manylinux x86_64, less SKIP (default: the CUDA 12 DSL libs, for a machine whose torch is a
# cu13 build, and einops, cuda-bindings, cuda-pathfinder and protobuf, which the device
# machine's image has). A wheel over PART bytes (the 92 MB
# nvidia-cutlass-dsl-libs-cu13) is split into NAME.partNN; wheels and parts are then binned
# into DEST/load1, DEST/load2, ... of at most LOAD bytes, and every load holds MD5SUMS (each
# whole wheel) and PARTS (each part), so scripts/device-baselines.sh on the machine knows
# when it has them all, joins the parts and checks every wheel before installing.
#
# Environment: FROM=DIR takes the wheels from DIR (pip --no-index --find-links DIR) instead of
# the index; PINS replaces the pin list; PART (default 48000000), LOAD (default 56000000).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-.fa4kit}
py=${2:-3.12}
PART=${PART:-48000000}
LOAD=${LOAD:-56000000}
SKIP=${SKIP:-nvidia-cutlass-dsl-libs-cu12 einops cuda-bindings cuda-pathfinder protobuf}
for n in "$PART" "$LOAD"; do
  case "$n" in ''|*[!0-9]*) echo "pack-baseline-wheels: PART/LOAD must be bytes, got $n" >&2
                            exit 2 ;; esac
done
if [ "$PART" -gt "$LOAD" ]; then  # checked before anything in DEST is removed
  echo "pack-baseline-wheels: PART $PART exceeds LOAD $LOAD" >&2
  exit 2
fi
if [ -z "${PINS:-}" ]; then
  PINS=$(python3 - "$SKIP" <<'EOF'
import re, sys, tomllib
skip = set(sys.argv[1].split())
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]
print(" ".join(p for p in deps["baselines"] if re.split(r"[=\[]", p)[0] not in skip))
EOF
)
fi
read -ra pins <<< "$PINS"
# DEST is replaced only when it is a kit this script made (its marker, .fa4kit-pack, names
# the loads of the last pack; a kit holds only those, .gitignore and the marker) or empty:
# anything else there is never removed, the pack is refused instead.
marker=.fa4kit-pack
if [ -e "$dest" ] && [ ! -d "$dest" ]; then
  echo "pack-baseline-wheels: $dest exists and is not a directory; name another DEST" >&2
  exit 2
fi
# A kit of this script from before its marker (until Nov 26 2026) has no marker, the
# .gitignore it wrote ('*') and loads holding only MD5SUMS, PARTS and the files they name:
# those loads are its own and replaced; anything else still refuses the pack.
old_load() {
  local d=$1 f
  [ -d "$d" ] && [ ! -L "$d" ] && [ -f "$d/MD5SUMS" ] && [ -f "$d/PARTS" ] || return 1
  for f in "$d"/* "$d"/.[!.]* "$d"/..?*; do
    [ -e "$f" ] || [ -L "$f" ] || continue
    [ -f "$f" ] && [ ! -L "$f" ] || return 1
    case "${f##*/}" in MD5SUMS|PARTS) continue ;; esac
    cat "$d/MD5SUMS" "$d/PARTS" | awk -v n="${f##*/}" '$2 == n {found = 1} END {exit !found}' \
      || return 1
  done
}
old_kit=0
if [ ! -e "$dest/$marker" ] && [ -f "$dest/.gitignore" ] && [ ! -L "$dest/.gitignore" ] \
    && [ "$(cat "$dest/.gitignore")" = '*' ]; then
  old_kit=1
fi
# The marker's lines are used as paths to remove: each must be a name this script writes
# (loadN, inside DEST), never '../x', an absolute path or a path with a '/'.
if [ -f "$dest/$marker" ]; then
  n=0
  while IFS= read -r line || [ -n "$line" ]; do
    n=$((n + 1))
    [[ "$line" =~ ^load[0-9]+$ ]] && continue
    echo "pack-baseline-wheels: line $n of $dest/$marker names '$line', not a load this" \
         "script writes; nothing removed: move $dest aside or name another DEST" >&2
    exit 2
  done < "$dest/$marker"
fi
old_loads=()
if [ -d "$dest" ] && [ -n "$(ls -A "$dest")" ]; then
  foreign=()
  for f in "$dest"/* "$dest"/.[!.]*; do
    [ -e "$f" ] || [ -L "$f" ] || continue
    name=${f##*/}
    case "$name" in
      .gitignore|"$marker") [ -f "$dest/$marker" ] && continue
                            [ "$name" = .gitignore ] && [ "$old_kit" = 1 ] && continue ;;
      load[0-9]*) [ -f "$dest/$marker" ] && grep -qx -- "$name" "$dest/$marker" && continue
                  if [ "$old_kit" = 1 ] && old_load "$f"; then old_loads+=("$name"); continue; fi ;;
    esac
    foreign+=("$name")
  done
  if [ ${#foreign[@]} -gt 0 ]; then
    echo "pack-baseline-wheels: $dest holds ${#foreign[@]} file(s) this script did not make" \
         "(${foreign[*]:0:3}${foreign[3]:+ ...}); nothing removed: move them or name" \
         "another DEST" >&2
    exit 2
  fi
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
src=()
[ -n "${FROM:-}" ] && src=(--no-index --find-links "$FROM")
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
         manylinux2014_x86_64 any; do
  platforms+=(--platform "$p")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" \
  --implementation cp "${platforms[@]}" "${src[@]}" -d "$work/wheels" "${pins[@]}"
count=$(ls "$work"/wheels/*.whl | wc -l)
if [ "$count" -ne "${#pins[@]}" ]; then
  echo "pack-baseline-wheels: $count wheels for ${#pins[@]} pins" >&2
  exit 1
fi
if [ -f "$dest/$marker" ]; then  # the last pack's loads (checked above), nothing else
  while IFS= read -r load || [ -n "$load" ]; do rm -rf -- "${dest:?}/$load"; done \
    < "$dest/$marker"
fi
if [ ${#old_loads[@]} -gt 0 ]; then  # an old kit's loads (checked above), nothing else
  echo "pack-baseline-wheels: $dest is a kit of this script from before its marker; its" \
       "${#old_loads[@]} load(s) are replaced" >&2
  for load in "${old_loads[@]}"; do rm -rf -- "${dest:?}/$load"; done
fi
mkdir -p "$dest"
printf '*\n' > "$dest/.gitignore"  # the kit is carried (device tool), never tracked
python3 - "$work/wheels" "$dest" "$PART" "$LOAD" <<'EOF'
import hashlib, os, shutil, sys

wheels, dest, part, load = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
md5 = lambda path: hashlib.md5(open(path, "rb").read()).hexdigest()


def pack():
    pieces, sums, parts = [], [], []  # pieces: (size, path, name in the kit)
    for name in sorted(os.listdir(wheels)):
        path = os.path.join(wheels, name)
        sums.append(f"{md5(path)}  {name}")
        size = os.path.getsize(path)
        if size <= part:
            pieces.append((size, path, name))
            continue
        with open(path, "rb") as f:
            for i in range(-(-size // part)):
                piece = os.path.join(wheels, f"{name}.part{i:02d}")
                with open(piece, "wb") as out:
                    out.write(f.read(part))
                parts.append(f"{md5(piece)}  {name}.part{i:02d}")
                pieces.append((os.path.getsize(piece), piece, f"{name}.part{i:02d}"))
    bins = []  # first fit, largest first
    for size, path, name in sorted(pieces, reverse=True):
        for b in bins:
            if b[0] + size <= load:
                b[0] += size
                b[1].append((path, name))
                break
        else:
            bins.append([size, [(path, name)]])
    # The marker names the loads before they are written: a pack stopped half-way (a full
    # disk) leaves only loads the next pack knows for its own and replaces.
    with open(os.path.join(dest, ".fa4kit-pack"), "w") as f:  # what the next pack may replace
        f.write("".join(f"load{i}\n" for i in range(1, len(bins) + 1)))
    for i, (size, items) in enumerate(bins, 1):
        d = os.path.join(dest, f"load{i}")
        os.makedirs(d)
        for path, name in items:
            shutil.copyfile(path, os.path.join(d, name))
        for listing, lines in (("MD5SUMS", sums), ("PARTS", parts)):
            with open(os.path.join(d, listing), "w") as f:
                f.write("".join(line + "\n" for line in lines))
        print(f"{d}: {len(items)} file(s), {size} bytes")
    print(f"{dest}: {len(sums)} wheels ({len(parts)} parts) in {len(bins)} load(s); carry each "
          f"in its own device call, then run scripts/device-baselines.sh")


try:
    pack()
except OSError as e:  # a full disk, a read-only DEST: one line, and the next pack replaces it
    sys.exit(f"pack-baseline-wheels: writing the kit failed: {e.strerror or e} "
             f"({e.filename}); run the pack again once there is room")
EOF
