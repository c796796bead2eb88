#!/usr/bin/env bash
# A slim SIF to carry to a GPU machine that has no registry and takes files only through a
# small channel (64 MiB): tiledattn-trip.sif, built from containers/tiledattn.def's
# runscript, apps, labels and environment, on Ubuntu 24.04's Python 3.12 instead of NGC's.
#
#   containers/trip.sh OUT_DIR      (after containers/ci.sh build: it uses that Apptainer)
#
# It holds the project and cuda-tile, not torch/numpy and not the cuTile compiler: those are
# what the NGC base and the gpu extra add (gigabytes), and they are bound in from the GPU
# machine at run time (its torch venv, as NGC's torch would be; the carried .toolchain):
#   apptainer run --nv -B /opt/torch/.venv --env PYTHONPATH=/opt/torch/.venv/lib/python3.12/site-packages \
#     --env CUDA_HOME=/tmp/cutile-toolchain/nvidia/cu13 tiledattn-trip.sif check
# Ubuntu 24.04 because its python3.12 is the ABI of such a machine's torch wheels.
# debootstrap of Ubuntu from Debian 12 has no Ubuntu keyring: the Release signature is not
# checked (package hashes are checked against that Release).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=$(realpath -m "${1:?usage: containers/trip.sh OUT_DIR}")
CACHE=${TILEDATTN_CI_CACHE:-/var/cache/tiledattn-ci}
UBUNTU=${UBUNTU_MIRROR:-http://archive.ubuntu.com/ubuntu}
set -a; . containers/versions.env; set +a
mkdir -p "$OUT"
export TILEDATTN_CI_BINDS="$OUT${TILEDATTN_CI_BINDS:+:$TILEDATTN_CI_BINDS}"  # for containers/ci-apptainer

rootfs=$CACHE/rootfs-noble-py
if [ ! -d "$rootfs" ]; then
  rm -rf "$rootfs.tmp"
  debootstrap --no-check-gpg --variant=minbase --include=python3.12-minimal,libpython3.12-stdlib \
    noble "$rootfs.tmp" "$UBUNTU" /usr/share/debootstrap/scripts/gutsy > "$CACHE/noble.log" 2>&1
  mv "$rootfs.tmp" "$rootfs"
fi

prep=$(mktemp -d)
trap 'rm -rf "$prep"' EXIT
tar -C "$rootfs" --exclude=./var/cache/apt --exclude=./var/lib/apt/lists --exclude=./usr/share/doc \
  --exclude=./usr/share/man --exclude=./usr/share/locale --exclude=./usr/share/info \
  --exclude=./usr/lib/python3.12/test --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' \
  -cf - . | tar -C "$prep" -xf -
site=$prep/usr/local/lib/python3.12/dist-packages
wheels=$CACHE/wheels-cp312
mkdir -p "$site" "$wheels"
python3 -m pip download --quiet --no-deps --only-binary :all: --python-version 3.12 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 -d "$wheels" \
  "cuda-tile==$CUDA_TILE_VERSION" pyyaml==6.0.3 typing-extensions==4.16.0
rm -f "$wheels"/tiledattention-*.whl
python3 -m pip wheel --quiet --no-deps -w "$wheels" "$ROOT"
# For the image's Python 3.12, not the one running pip.
python3 -m pip install --quiet --no-deps --no-compile --only-binary :all: --python-version 3.12 \
  --implementation cp --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform any --target "$site" "$wheels"/*.whl
rm -rf "$site/bin"
printf '#!/usr/bin/python3.12\nimport sys\nfrom tiledattention.cli import main\nsys.exit(main())\n' \
  > "$prep/usr/local/bin/tiledattn"
chmod 755 "$prep/usr/local/bin/tiledattn"
ln -sf python3.12 "$prep/usr/bin/python3"; ln -sf python3.12 "$prep/usr/bin/python"

# The def's sections that do not install anything, on this root instead of NGC's.
python3 - "$prep" > "$OUT/tiledattn-trip.def" <<'EOF'
import re, sys
text = open("containers/tiledattn.def").read()
sections = re.split(r"(?m)^(?=%)", text)
head, body = sections[0], sections[1:]
keep = [s for s in body if s.split(None, 1)[0] not in ("%files", "%post", "%test")]
print(f"Bootstrap: scratch\n\n%setup\n    cp -a {sys.argv[1]}/. \"$APPTAINER_ROOTFS\"/\n")
print("".join(keep))
EOF
revision=$(git rev-parse HEAD 2>/dev/null || echo unknown)
git diff --quiet HEAD -- 2>/dev/null || revision="$revision-dirty"
"${APPTAINER:-containers/ci-apptainer}" build --force --fakeroot --build-arg "SOURCE_REVISION=$revision" \
  --build-arg "BASE_IMAGE=ubuntu:24.04-python3.12-no-torch" \
  "$OUT/tiledattn-trip.sif" "$OUT/tiledattn-trip.def"
# Apptainer itself for a machine that lacks it: the sid package's files, unsquashfs, and
# the libraries they link (installed there only where missing): containers/trip-run.sh.
sid=$CACHE/rootfs-sid-apptainer
files=$(chroot "$sid" dpkg -L apptainer | grep -v -e '^/usr/share' -e '^/\.$' | while read -r f; do
  [ -f "$sid$f" ] && echo ".$f"; done)
libs=$(chroot "$sid" sh -c 'ldd /usr/bin/apptainer /usr/lib/x86_64-linux-gnu/apptainer/bin/starter /usr/bin/unsquashfs' \
  | awk '/=> \//{print $3}' | sort -u | grep -v -e libc.so -e libm.so -e ld-linux)
mkdir -p "$prep.libs/opt/apptainer-libs"
for l in $libs; do cp -L "$sid$l" "$prep.libs/opt/apptainer-libs/"; done
# shellcheck disable=SC2086
tar -C "$sid" -cf "$OUT/apptainer-bundle.tar" $files ./usr/bin/unsquashfs
tar -C "$prep.libs" -rf "$OUT/apptainer-bundle.tar" ./opt/apptainer-libs
rm -rf "$prep.libs"
xz -T2 -9 -f "$OUT/apptainer-bundle.tar"
echo "apptainer bundle $(stat -c %s "$OUT/apptainer-bundle.tar.xz") bytes"
echo "image $OUT/tiledattn-trip.sif sha256:$(sha256sum "$OUT/tiledattn-trip.sif" | cut -d' ' -f1)" \
  "$(stat -c %s "$OUT/tiledattn-trip.sif") bytes"
