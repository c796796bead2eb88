#!/usr/bin/env bash
# One device call's worth of GPU work, logs under $OUT (the device tool brings them back).
#   bash benchmarks/gpu_batch.sh tests      # the GPU tests (variants, sdpa, backward, decode, HF)
#   bash benchmarks/gpu_batch.sh ab-fwd     # A/B against .ab/<rev>/tiledattention, forward grid
#   bash benchmarks/gpu_batch.sh ab-bwd     # the same, forward+backward
#   bash benchmarks/gpu_batch.sh ab-host    # host cost and call latency against $AB and torch
#   NAME=x bash benchmarks/gpu_batch.sh ab --grid decode --passes fwd   # any ab_revision
#                                           # A/B, compiled first by $JOBS parallel shards
#   bash benchmarks/gpu_batch.sh variants   # sparsity targets and FlexAttention comparison
#   bash benchmarks/gpu_batch.sh tune-bwd   # backward tune (quick space) into $OUT/h100.json
#   bash benchmarks/gpu_batch.sh launch     # host cost of each step of a training call
#   bash benchmarks/gpu_batch.sh host       # host cost table + profiler attribution
#   LEADS="occupancy prefill-w4" bash benchmarks/gpu_batch.sh leads
#                                           # the switch A/Bs open-leads.md names, in its
#                                           # order (default: those still open; FA4
#                                           # from /tmp/fa4site when the kit is there)
#   bash benchmarks/gpu_batch.sh sweep-shapes [--sweep both --shapes 192,128 512,512
#       --fa4-site /tmp/fa4site]            # head-shape schedule sweep: $JOBS compile
#                                           # shards (<= 200 s), then one timed process
# Start each device command with `. .toolchain/activate.sh &&`.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD:${PYTHONPATH:-}
nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader | tee -a "$OUT/device.txt"
python -c "import torch, cuda.tile as ct; print('torch', torch.__version__, 'cudnn',
torch.backends.cudnn.version(), 'cuda.tile', ct.__version__)" | tee -a "$OUT/device.txt"
AB=${AB:-.ab/455dac2/tiledattention}
case "${1:?what to run}" in
  tests)
    shift
    python -m pytest -q -n "${WORKERS:-8}" -p no:cacheprovider "${@:-tests/gpu}" 2>&1 \
      | tee "$OUT/gpu-tests.log" | tail -40
    # The tests that time kernels against a reference skip under workers sharing the GPU.
    python -m pytest -q -p no:cacheprovider -m alone "${@:-tests/gpu}" 2>&1 \
      | tee "$OUT/gpu-tests-alone.log" | tail -10 ;;
  ab-fwd)
    python benchmarks/ab_revision.py --other "$AB" --grid "${GRID:-paper}" --passes fwd \
      2>&1 | tee "$OUT/ab-fwd.log" ;;
  ab-bwd)
    python benchmarks/ab_revision.py --other "$AB" --grid "${GRID:-quick}" --passes fwd+bwd \
      2>&1 | tee "$OUT/ab-bwd.log" ;;
  ab)
    shift
    for i in $(seq 0 $((${JOBS:-12} - 1))); do
      python benchmarks/ab_revision.py --other "$AB" "$@" --compile-only \
        --shard "$i/${JOBS:-12}" > "/tmp/ab-${NAME:-run}-compile-$i.log" 2>&1 &
    done
    wait
    python benchmarks/ab_revision.py --other "$AB" "$@" 2>&1 | tee "$OUT/ab-${NAME:-run}.log" \
      | tail -4 ;;
  ab-host)
    python benchmarks/ab_host.py --other "$AB" --rounds "${ROUNDS:-8}" 2>&1 \
      | tee "$OUT/ab-host.log" ;;
  variants)
    python benchmarks/variants.py --sparsity --flex 2>&1 | tee "$OUT/variants.log" ;;
  tune-bwd)
    python benchmarks/tune_backward.py --table tiledattention/schedules/tables/h100.json.gz \
      --out "$OUT/h100.json.gz" --state "$OUT/tune-bwd-state.jsonl" \
      --head-dims ${DIMS:-64 128} --seqs ${SEQS:-1024 4096} --dtypes float16 bfloat16 \
      2>&1 | tee "$OUT/tune-bwd.log" | tail -60 ;;
  launch)
    python benchmarks/launch_cost.py 2>&1 | tee "$OUT/launch-cost.log" ;;
  host)
    python benchmarks/host_cost.py --tables paths 2>&1 | tee "$OUT/host-cost.log"
    python benchmarks/host_profile.py 2>&1 | tee "$OUT/host-profile.log" | grep "===\|GPU kernels" ;;
  sweep-shapes)
    shift
    # No --sweep given: both passes at issue 48's shapes (a later --shapes wins).
    case " $* " in *" --sweep "*) ;; *) set -- --sweep both --shapes 192,128 512,512 "$@" ;; esac
    # Parallel shards fill $CUDA_TILE_CACHE_DIR (70 runs by default, 0.5-3 s each cold on
    # one core: benchmarks/notes/head-shapes.md §42b); a shard past 200 s is cut off and
    # the timed run compiles what it left. FA4's JIT runs in the timed process only.
    for i in $(seq 0 $((${JOBS:-14} - 1))); do
      timeout 200 python benchmarks/head_shapes.py "$@" --compile-only \
        --shard "$i/${JOBS:-14}" > "$OUT/sweep-compile-$i.log" 2>&1 &
    done
    wait
    tail -qn1 "$OUT"/sweep-compile-*.log | sort | uniq -c
    grep -h "error" "$OUT"/sweep-compile-*.log | head -5
    timeout "${SWEEP_TIMEOUT:-300}" python benchmarks/head_shapes.py "$@" \
      --json "$OUT/sweep-shapes.json" 2>&1 | tee "$OUT/sweep-shapes.log" \
      | grep -v "UserWarning\|exe_args" ;;
  leads)
    # benchmarks/notes/open-leads.md §55e: each a packed_order_ab.py run on the workloads
    # stage's points (both arms checked against float64 and bit for bit), its log and rows
    # under $OUT; a run past AB_TIMEOUT is cut off, and the next one starts.
    fa4=$(cat "${FA4_SITE:-/tmp/fa4site}/.pythonpath" 2>/dev/null || true)
    export PYTHONPATH=$PYTHONPATH${fa4:+:$fa4}
    ab() {
      local name=$1; shift
      [ -n "$fa4" ] || set -- "$@" --no-fa4  # no kit installed on this machine: ours only
      echo "== $name: $*"
      timeout "${AB_TIMEOUT:-500}" python benchmarks/packed_order_ab.py "$@" \
        --out "$OUT/ab-$name.json" 2>&1 | tee "$OUT/ab-$name.log" | tail -"${TAIL:-30}"
    }
    for lead in ${LEADS:-fwd-scatter bwd-scatter gather-64 occupancy}; do
      case $lead in
        occupancy) ab "$lead" --switch PAGED_DECODE_OCCUPANCY --values 0 2 --kinds decode \
                     --set PAGED_DECODE_OCCUPANCY_FROM=0 \
                     --passes fwd ;;
        prefill-w4) ab "$lead" --switch GATHERED_PREFILL_SCHEDULE \
                      --values "''" "'64x128_o1_c1_lk2_lv4_w4'" --set GATHER_MAX_Q=1024 \
                      --kinds prefill --pages 16 --passes fwd ;;
        fwd-whole) ab "$lead" --switch PACKED_FWD_WHOLE --kinds varlen prefill ;;
        fwd-scatter) ab "$lead" --switch PACKED_FWD_SCATTER_OUT --set PACKED_FWD_WHOLE=True \
                       --kinds varlen prefill ;;
        bwd-scatter) ab "$lead" --switch PACKED_BWD_SCATTER_OUT --kinds varlen \
                       --passes fwd+bwd ;;
        gather-64) ab "$lead" --switch GATHER_TILE --values 64 128 --kinds decode --pages 16 \
                     --passes fwd ;;
        *) echo "gpu_batch.sh: unknown lead $lead" >&2; exit 2 ;;
      esac
    done ;;
  *) echo "gpu_batch.sh: unknown step $1" >&2; exit 2 ;;
esac
