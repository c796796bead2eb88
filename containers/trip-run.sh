#!/usr/bin/env bash
# On a GPU machine without Apptainer (root, no network): install the carried Apptainer
# (Debian sid's 1.4, built for glibc >= 2.38) and run the carried tiledattn-trip.sif
# (containers/trip.sh) with the GPU, torch from the machine's venv bound in.
#
#   trip-run.sh setup DIR       DIR holds apptainer-bundle.tar.xz and tiledattn-trip.sif
#   trip-run.sh run DIR         with the cuTile toolchain unpacked in /tmp/cutile-toolchain
#                               (. .toolchain/activate.sh): check, then a small bench
# TORCH_VENV (default /opt/torch/.venv) is the machine's torch.
set -uo pipefail
mode=${1:?usage: trip-run.sh setup|run DIR}
dir=$(cd "${2:?usage: trip-run.sh setup|run DIR}" && pwd)
venv=${TORCH_VENV:-/opt/torch/.venv}
site=$venv/lib/python3.12/site-packages
sif=$dir/tiledattn-trip.sif

step() { echo; echo "### $*"; }

# Where this machine's libcuda lives: --nv finds driver libraries through ldconfig; a
# driver outside its cache is bound and put on LD_LIBRARY_PATH explicitly.
driver_dir() {
  "$venv/bin/python" -c 'import torch; torch.cuda.init(); import re
print(next(re.search(r"(/\S+)/libcuda\.so", l).group(1) for l in open("/proc/self/maps") if "libcuda.so" in l))'
}

nv_args() {
  local d
  d=$(driver_dir) || return 1
  echo "--nv -B $venv -B $d:/.host-driver --env PYTHONPATH=$site --env LD_LIBRARY_PATH=/.host-driver"
}

# Apptainer mounts a SIF with the kernel's squashfs on a loop device; a machine without
# loop devices gets it extracted instead (--unsquash, the carried unsquashfs).
if command -v apptainer >/dev/null && [ -f "$sif" ] && ! apptainer exec "$sif" true 2>/dev/null; then
  echo "note: mounting the SIF failed; running it with --unsquash"
  export APPTAINER_UNSQUASH=1
fi

case "$mode" in
  setup)
    step "install Apptainer from the carried Debian sid files"
    # Python's lzma: such a machine need not have xz.
    "$venv/bin/python" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall("/")' \
      "$dir/apptainer-bundle.tar.xz" || exit 1
    # Libraries Apptainer and unsquashfs need, only where the machine lacks them.
    for lib in /opt/apptainer-libs/*; do
      [ -e "/usr/lib/x86_64-linux-gnu/$(basename "$lib")" ] || cp -a "$lib" /usr/lib/x86_64-linux-gnu/
    done
    ldconfig
    mkdir -p /var/lib/apptainer/mnt/session  # the package's empty directory
    # Root's default capability set includes CAP_SYS_RESOURCE, which this machine withholds.
    sed -i 's/^root default capabilities = full/root default capabilities = file/' /etc/apptainer/apptainer.conf
    apptainer --version
    ls -l "$sif"; sha256sum "$sif"
    step "driver: $(driver_dir); ldconfig: $(ldconfig -p | grep -c libcuda) libcuda entries; loop devices: $(ls /dev/loop-control /dev/loop0 2>&1 | tr '\n' ' ')"
    step "apptainer inspect"
    apptainer inspect --labels "$sif"
    step "apptainer run tiledattn-trip.sif --version"
    apptainer run "$sif" --version
    step "the image's python with the machine's torch, --nv"
    # shellcheck disable=SC2046
    apptainer exec $(nv_args) "$sif" python3 -c 'import sys, torch, cuda.tile, tiledattention
print(sys.executable, sys.version.split()[0], "torch", torch.__version__, torch.cuda.is_available(), torch.cuda.get_device_name(0))
print("tiledattention from", tiledattention.__file__)'
    ;;
  run)
    tc=/tmp/cutile-toolchain/nvidia/cu13
    [ -x "$tc/bin/tileiras" ] || { echo "no toolchain in /tmp/cutile-toolchain"; exit 2; }
    command -v apptainer >/dev/null || { echo "apptainer is not installed here (a fresh machine: run setup first)"; exit 2; }
    args="$(nv_args) -B /tmp/cutile-toolchain --env CUDA_HOME=$tc --env PATH=$tc/bin:/usr/local/bin:/usr/bin:/bin"
    out=$dir/results; mkdir -p "$out"
    step "apptainer run --nv tiledattn-trip.sif check"
    # shellcheck disable=SC2086
    apptainer run $args "$sif" check; echo "exit $?"
    step "apptainer run --nv tiledattn-trip.sif bench (8 shapes, 4 methods)"
    cat > "$out/bench.yaml" <<'EOF'
grid:
  seqs: [1024, 4096]
  head_dims: [64, 128]
  dtypes: [bfloat16]
  causal: [false, true]
  shape_policy: explicit
  batch: 4
  heads: 16
methods: [tiledattention, torch_sdpa, flash, cudnn]
timing:
  warmup: 5
  reps: 20
  rounds: 3
seed: 0
EOF
    # shellcheck disable=SC2086
    apptainer run $args -B "$out:/data" "$sif" bench --config /data/bench.yaml --out /data/bench
    echo "exit $?"
    ls -l "$out/bench"
    ;;
esac
