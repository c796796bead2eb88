#!/usr/bin/env bash
# CI's container stage: build containers/Dockerfile with podman and containers/tiledattn.def
# with Apptainer on a CPU machine with no registry, then run both images
# (tests/containers/) and the smoke study through SLURM inside the SIF
# (tests/cluster/test_slurm_image.py).
#
#   containers/ci.sh            provision, build, test (CI: Debian 12, root)
#   containers/ci.sh build      provision and build only; prints the images.env to source
#
# The NGC base cannot be pulled here, so a CPU stand-in is made locally: a debootstrap'd
# Debian 12 with Python, plus the CPU torch wheel. Apptainer is not packaged for Debian 12:
# it runs from a debootstrap'd Debian sid root inside podman (containers/ci-apptainer),
# and the def's `Bootstrap: docker` pulls the stand-in from Debian's docker-registry on
# 127.0.0.1. Rootfs trees, images, registry blobs and the Apptainer cache are kept under
# $TILEDATTN_CI_CACHE (default /var/cache/tiledattn-ci) and podman's store, so a warm run
# rebuilds only what the source changed. Timings (seconds) and sizes go to
# $OUT/timings.tsv; see containers/README.md for the measured numbers.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
CACHE=${TILEDATTN_CI_CACHE:-/var/cache/tiledattn-ci}
OUT=${TILEDATTN_CI_OUT:-$ROOT/build/containers-ci}
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
TORCH=${TILEDATTN_CI_TORCH:-2.13.0}          # the CPU torch of the stand-in base
WHEELS=${TILEDATTN_CI_WHEELS:-/opt/wheels}   # where a torch-$TORCH+cpu wheel may already be
REGISTRY=127.0.0.1:${TILEDATTN_CI_REGISTRY_PORT:-5000}
# Bump a suffix when its recipe below changes: the cached image is then rebuilt.
PY_BASE=localhost/tiledattn-ci/debian-py:bookworm-1
CPU_BASE=localhost/tiledattn-ci/cpu-base:torch-${TORCH}-1
APPTAINER_IMAGE=localhost/tiledattn-ci/apptainer:sid-1
TAG=localhost/tiledattn:ci
SIF=$OUT/tiledattn.sif
mkdir -p "$CACHE" "$OUT/logs"
: > "$OUT/timings.tsv"

say() { echo "containers/ci: $*" >&2; }
timed() {  # timed NAME command...: run it, its output to $OUT/logs/NAME.log, time it
  local name=$1 t0 rc=0
  shift
  t0=$(date +%s)
  say "$name ..."
  "$@" > "$OUT/logs/$name.log" 2>&1 || rc=$?
  printf '%s\t%s\n' "$name" "$(( $(date +%s) - t0 ))" >> "$OUT/timings.tsv"
  if [ "$rc" != 0 ]; then
    tail -80 "$OUT/logs/$name.log" >&2
    say "$name failed (exit $rc); its log: $OUT/logs/$name.log"
    exit "$rc"
  fi
}
size() { printf 'size:%s\t%s\n' "$1" "$2" >> "$OUT/timings.tsv"; }

tools() {
  local need=()
  for cmd in podman:podman buildah:buildah runc:runc debootstrap:debootstrap \
             newuidmap:uidmap docker-registry:docker-registry; do
    command -v "${cmd%%:*}" >/dev/null || need+=("${cmd#*:}")
  done
  [ ${#need[@]} = 0 ] && return 0
  [ "$(id -u)" = 0 ] || { say "needs root to install ${need[*]}"; return 2; }
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends "${need[@]}" >/dev/null
}

engine_config() {
  # runc (Debian's crun 1.8 refuses the hybrid cgroup host), cgroupfs (no systemd), and
  # explicit rlimits: without CAP_SYS_RESOURCE podman's defaults (raising nofile) get EPERM.
  local hard
  hard=$(ulimit -Hn)
  printf '[containers]\ndefault_ulimits=["nofile=%s:%s","nproc=32768:32768"]\n[engine]\nruntime="runc"\ncgroup_manager="cgroupfs"\nevents_logger="file"\n' \
    "$hard" "$hard" > "$CACHE/containers.conf"
  export CONTAINERS_CONF=$CACHE/containers.conf
}

rootfs() {  # rootfs NAME SUITE PACKAGES: a cached debootstrap tree under $CACHE
  local dir=$CACHE/rootfs-$1
  [ -d "$dir" ] && return 0
  rm -rf "$dir.tmp"
  debootstrap --variant=minbase --include="$3" "$2" "$dir.tmp" "$MIRROR" > "$CACHE/$1.log" 2>&1 \
    || { tail -5 "$CACHE/$1.log" >&2; return 1; }
  mv "$dir.tmp" "$dir"
}

import_rootfs() {  # import_rootfs DIR TAG: the tree as a one-layer image (without /dev)
  tar -C "$1" --numeric-owner --exclude='./dev/*' --exclude='./proc/*' --exclude='./sys/*' -c . \
    | podman import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$2" >/dev/null
}

py_base() {
  podman image exists "$PY_BASE" && return 0
  rootfs bookworm-py bookworm python3,python3-venv,python3-pip,ca-certificates
  # pip in the builds goes through this machine's egress proxy: trust what the host trusts.
  cp /usr/local/share/ca-certificates/*.crt "$CACHE/rootfs-bookworm-py/usr/local/share/ca-certificates/" 2>/dev/null || true
  chroot "$CACHE/rootfs-bookworm-py" update-ca-certificates >/dev/null
  import_rootfs "$CACHE/rootfs-bookworm-py" "$PY_BASE"
}

torch_wheel() {  # a directory holding the CPU torch wheel for Debian 12's Python 3.11
  local found
  # CI's machines carry it in /opt/wheels; elsewhere PyPI's (CUDA) build, whose nvidia-*
  # dependencies then come with it (gigabytes: the stand-in only needs it to import).
  found=$(ls "$WHEELS"/torch-"$TORCH"+cpu-cp311-*.whl 2>/dev/null | head -1 || true)
  if [ -z "$found" ]; then
    mkdir -p "$CACHE/wheels"
    found=$(ls "$CACHE"/wheels/torch-"$TORCH"*-cp311-*.whl 2>/dev/null | head -1 || true)
    [ -n "$found" ] || python3 -m pip download --quiet --no-deps --only-binary :all: \
      --python-version 3.11 --platform manylinux_2_28_x86_64 -d "$CACHE/wheels" "torch==$TORCH"
    found=$(ls "$CACHE"/wheels/torch-"$TORCH"*-cp311-*.whl | head -1)
  fi
  dirname "$found"
}

cpu_base() {  # the NGC stand-in: a venv on PATH with CPU torch and numpy, like NGC's python
  podman image exists "$CPU_BASE" && return 0
  local ctx wheels
  wheels=$(torch_wheel)
  ctx=$(mktemp -d)
  printf 'FROM %s\nRUN python3 -m venv /opt/venv\nENV PATH=/opt/venv/bin:$PATH VIRTUAL_ENV=/opt/venv\nRUN pip install --no-cache-dir /wheels/torch-%s*-cp311-*.whl numpy\n' \
    "$PY_BASE" "$TORCH" > "$ctx/Containerfile"
  podman build --pull=never -v "$wheels:/wheels:ro" -t "$CPU_BASE" "$ctx" >/dev/null
  rm -rf "$ctx"
}

docker_image() {
  BASE_IMAGE=$CPU_BASE VERIFY_FLAGS='' TAG=$TAG containers/build podman
}

apptainer_image() {  # Apptainer 1.4 (Debian sid: it needs glibc 2.38) in an image
  podman image exists "$APPTAINER_IMAGE" && return 0
  rootfs sid-apptainer sid apptainer,squashfs-tools,ca-certificates
  local ctx
  ctx=$(mktemp -d)
  import_rootfs "$CACHE/rootfs-sid-apptainer" "$APPTAINER_IMAGE-rootfs"
  # --fakeroot builds need subordinate ids; root's default capability set includes
  # CAP_SYS_RESOURCE, which this machine withholds: grant every other one instead.
  cat > "$ctx/Containerfile" <<EOF
FROM $APPTAINER_IMAGE-rootfs
RUN echo root:100000:65536 >> /etc/subuid && echo root:100000:65536 >> /etc/subgid \\
 && sed -i 's/^root default capabilities = full/root default capabilities = file/' /etc/apptainer/apptainer.conf \\
 && apptainer capability add --user root \$(apptainer capability avail | sed -n 's/^\(CAP_[A-Z_]*\).*/\1/p' | grep -vx CAP_SYS_RESOURCE | paste -sd, -)
EOF
  podman build --pull=never -t "$APPTAINER_IMAGE" "$ctx" >/dev/null
  rm -rf "$ctx"
}

registry() {  # Debian's docker-registry on loopback, for the def's `Bootstrap: docker`
  if curl -fsS "http://$REGISTRY/v2/" >/dev/null 2>&1; then return 0; fi
  mkdir -p "$CACHE/registry"
  printf 'version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: %s\n' \
    "$CACHE/registry" "$REGISTRY" > "$CACHE/registry.yml"
  docker-registry serve "$CACHE/registry.yml" > "$CACHE/registry.log" 2>&1 &
  REGISTRY_PID=$!
  trap 'kill "$REGISTRY_PID" 2>/dev/null || true' EXIT
  for _ in $(seq 50); do curl -fsS "http://$REGISTRY/v2/" >/dev/null 2>&1 && return 0; sleep 0.2; done
  say "docker-registry did not start: $(tail -3 "$CACHE/registry.log")"; return 1
}

push_base() {
  podman push --quiet --tls-verify=false "$CPU_BASE" "docker://$REGISTRY/tiledattn-cpu-base:torch-$TORCH"
}

sif() {
  # APPTAINER_NOHTTPS: the loopback registry speaks plain HTTP. The Apptainer cache keeps
  # the base's layers between runs.
  mkdir -p "$CACHE/apptainer-cache"
  APPTAINER=$ROOT/containers/ci-apptainer APPTAINER_NOHTTPS=1 APPTAINER_CACHEDIR=$CACHE/apptainer-cache \
    BASE_IMAGE=$REGISTRY/tiledattn-cpu-base:torch-$TORCH VERIFY_FLAGS='' SIF=$SIF \
    containers/build sif-def
}

build() {
  timed tools tools
  engine_config
  timed base-debian-python py_base
  timed base-cpu-torch cpu_base
  timed docker-build docker_image
  timed apptainer-tool apptainer_image
  timed registry registry
  timed registry-push push_base
  timed sif-build sif
  size docker-image-bytes "$(podman image inspect --format '{{.Size}}' "$TAG")"
  size cpu-base-bytes "$(podman image inspect --format '{{.Size}}' "$CPU_BASE")"
  size sif-bytes "$(stat -c %s "$SIF")"
  cat > "$OUT/images.env" <<EOF
export CONTAINERS_CONF=$CONTAINERS_CONF
export TILEDATTN_CI_IMAGE=$TAG
export TILEDATTN_CI_IMAGE_ID=$(podman image inspect --format '{{.Id}}' "$TAG")
export TILEDATTN_CI_IMAGE_DIGEST=$(podman image inspect --format '{{.Digest}}' "$TAG")
export TILEDATTN_CI_SIF=$SIF
export TILEDATTN_CI_SIF_SHA256=sha256:$(sha256sum "$SIF" | cut -d' ' -f1)
export TILEDATTN_CI_APPTAINER=$ROOT/containers/ci-apptainer
export TILEDATTN_CI_TIMINGS=$OUT/timings.tsv
EOF
  say "images: $OUT/images.env"
}

build
[ "${1:-}" = build ] && exit 0
# shellcheck disable=SC1091
. "$OUT/images.env"
export TILEDATTN_CI_IMAGES_REQUIRED=1  # from here on a test that cannot run fails
timed image-tests python -m pytest -q -p no:cacheprovider -rs tests/containers
timed slurm-image-test timeout -k 30 1500 python -m pytest -q -p no:cacheprovider -rs \
  tests/cluster/test_slurm_image.py
for t in image-tests slurm-image-test; do say "$t: $(tail -1 "$OUT/logs/$t.log")"; done
say "timings (s) and sizes (bytes):"; column -t "$OUT/timings.tsv" >&2 || cat "$OUT/timings.tsv" >&2
