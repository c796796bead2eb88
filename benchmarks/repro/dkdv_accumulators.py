"""Repro 1: two fp32 [64, D] accumulators (dK, dV of a 64-key tile) across a query loop.

The dK/dV step of a FlashAttention backward, nothing else: per query tile, S = Q K^T,
dP = dO V^T, P = exp2(S*c - lse) (causal: masked), dS = P (dP - delta),
dV += P^T dO, dK += dS^T Q; fp32 accumulators, bf16 operands. At D = 256 and 64 keys
the two accumulators are 2 * 64 * 256 * 4 B = 128 KB: 256 registers a thread over 4
worker warps, 128 over 8 ("acc"). Compiled offline for sm_90 (no GPU needed) with
cuTile's export API, read with cuobjdump: registers (REG, at launch), stack, local-memory
instructions (STL/LDL), warp-group MMAs (HGMMA) and the waits on them (WAIT:
WARPGROUP.DEPBAR), mma.sync (HMMA), TMA loads, and the
per-warp-group register split tileiras chose (USETMAXREG: producer DEALLOC, consumers
TRY_ALLOC). A row "refused" prints cuTile's own error.

    CUDA_TILE_CACHE_DIR=/tmp/repro-cache python dkdv_accumulators.py \
        [--cuobjdump /tmp/cuobj/nvidia/cu13/bin/cuobjdump] [--head-dim 256]
cuobjdump: pip download nvidia-cuda-cuobjdump==13.4.92 --no-deps -d /tmp/cuobj; unzip there.
"""

import argparse
import io
import re
import shutil
import subprocess
import tempfile

import cuda.tile as ct
import cuda.tile.compilation as tc
import numpy as np

# (D, query rows per step, keys per program, num_worker_warps (None: the compiler's
# choice), causal mask: an index into MASKS, 1: a runtime loop over a GQA group around the
# query loop). 64 x 80 at D = 256 is FlashAttention-3's sm90
# tile (kBlockM 64, kBlockN 80, two MMA warp groups: hopper/flash_bwd_launch_template.h,
# run_mha_bwd_hdim256); 80 x 128 its D = 128 non-causal tile, 64 x 128 its causal one.
CONFIGS = [(256, 64, 64, None, 0, 0), (256, 64, 64, 4, 0, 0), (256, 64, 64, 8, 0, 0),
           (256, 64, 64, 8, 1, 0), (256, 64, 64, 8, 2, 0), (256, 64, 64, 8, 0, 1),
           (256, 64, 64, 8, 1, 1), (256, 128, 64, 8, 0, 0), (256, 64, 80, 8, 0, 0),
           (128, 64, 128, 4, 0, 0), (128, 64, 128, 8, 0, 0), (128, 64, 128, 8, 1, 0),
           (128, 64, 128, 8, 2, 0), (128, 128, 128, 8, 0, 0), (128, 80, 128, 8, 0, 0)]
MASKS = ("no", "all", "diag")  # causal mask: none, on every tile, on the diagonal tiles


@ct.kernel
def dkdv(Q, K, V, dO, Lse, Delta, dK, dV, c: float, G: int, D: ct.Constant[int],
         TM: ct.Constant[int], TN: ct.Constant[int], CAUSAL: ct.Constant[int],
         LOOP: ct.Constant[int]):
    n, hk = ct.bid(0), ct.bid(1)  # arrays [H, S, D]; Lse, Delta [H, S]; K, V [H / G, S, D]
    # LOOP 1: the query heads of a GQA group in a loop with a runtime trip count G around
    # the query loop (the repo's dK/dV program); LOOP 0: one head, no such loop
    for g in range(G if LOOP else 1):
        h = hk * G + g
        kt = ct.load(K, index=(hk, 0, n), shape=(1, D, TN), order=(0, 2, 1)).reshape((D, TN))
        vt = ct.load(V, index=(hk, 0, n), shape=(1, D, TN), order=(0, 2, 1)).reshape((D, TN))
        dk = ct.full((TN, D), 0.0, dtype=np.float32)
        dv = ct.full((TN, D), 0.0, dtype=np.float32)
        for i in range(n * TN // TM if CAUSAL else 0, Q.shape[1] // TM):
            q = ct.load(Q, index=(h, i, 0), shape=(1, TM, D)).reshape((TM, D))
            do = ct.load(dO, index=(h, i, 0), shape=(1, TM, D)).reshape((TM, D))
            s = ct.mma(q, kt, ct.full((TM, TN), 0.0, dtype=np.float32))
            dp = ct.mma(do, vt, ct.full((TM, TN), 0.0, dtype=np.float32))
            lse = ct.load(Lse, index=(h, i), shape=(1, TM)).reshape((TM, 1))
            delta = ct.load(Delta, index=(h, i), shape=(1, TM)).reshape((TM, 1))
            # CAUSAL 1: the mask on every tile (one loop body; the repo's MASK_ALL), 2: on the
            # tiles that cross the diagonal only
            if CAUSAL == 1 or (CAUSAL == 2 and i * TM < (n + 1) * TN):
                keep = (i * TM + ct.arange(TM, dtype=np.int32))[:, None] >= \
                    (n * TN + ct.arange(TN, dtype=np.int32))[None, :]
                s = ct.where(keep, s, -np.inf)
            p = ct.exp2(s * c - lse, flush_to_zero=True)
            ds = p * (dp - delta)
            dv = ct.mma(ct.transpose(p.astype(Q.dtype)), do, dv)
            dk = ct.mma(ct.transpose(ds.astype(Q.dtype)), q, dk)
        ct.store(dK, index=(h, n, 0), tile=dk.reshape((1, TN, D)).astype(dK.dtype))
        ct.store(dV, index=(h, n, 0), tile=dv.reshape((1, TN, D)).astype(dV.dtype))


def array(dtype, ndim):
    """A contiguous, 16-byte aligned array argument (what a torch tensor gives a launch)."""
    return tc.ArrayConstraint(
        dtype, ndim, index_dtype=ct.int32, stride_lower_bound_incl=0, alias_groups=(),
        may_alias_internally=False, stride_constant=[None] * (ndim - 1) + [1],
        stride_divisible_by=[8] * (ndim - 1) + [1], base_addr_divisible_by=16)


def cubin(head_dim: int, tm: int, tn: int, warps, causal: int, loop: int) -> bytes:
    bf, f32 = array(ct.bfloat16, 3), array(ct.float32, 2)
    scalar = tc.ScalarConstraint(ct.float32)
    sig = tc.KernelSignature([bf, bf, bf, bf, f32, f32, bf, bf, scalar,
                              tc.ScalarConstraint(ct.int32), head_dim, tm, tn, causal, loop],
                             tc.CallingConvention.cutile_python_v1())
    buf = io.BytesIO()
    tc.export_kernel(dkdv.replace_hints(num_worker_warps=warps, occupancy=1), [sig], buf,
                     gpu_code="sm_90", output_format="cubin")
    return buf.getvalue()


def cuobjdump_text(blob: bytes, cuobjdump: str, flag: str) -> str:
    """What ``cuobjdump FLAG`` prints for a cubin (``-sass``, ``-res-usage``)."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(blob)
        f.flush()
        return subprocess.run([cuobjdump, flag, f.name], capture_output=True, text=True,
                              check=True).stdout


def read(blob: bytes, cuobjdump: str) -> dict:
    res = cuobjdump_text(blob, cuobjdump, "-res-usage")
    sass = cuobjdump_text(blob, cuobjdump, "-sass")
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
    count = lambda pre: sum(op.startswith(pre) for op in ops)  # noqa: E731
    return dict(REG=int(re.search(r"REG:(\d+)", res).group(1)),
                STACK=int(re.search(r"STACK:(\d+)", res).group(1)),
                STL=count("STL"), LDL=count("LDL"), HGMMA=count("HGMMA"), HMMA=count("HMMA"),
                UTMALDG=count("UTMALDG"), WGWAIT=count("WARPGROUP.DEPBAR"),
                MUFU_EX2=count("MUFU.EX2"),
                setmaxnreg=sorted(set(re.findall(
                    r"USETMAXREG\.(\w+)\S*\s+(?:U?P\d+,\s*)?(0x[0-9a-f]+)", sass))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump")
                    or "/tmp/cuobj/nvidia/cu13/bin/cuobjdump")
    ap.add_argument("--head-dim", type=int, help="only the rows of this D")
    args = ap.parse_args()
    print("cuda-tile", ct.__version__, "| sm_90 | bf16 | occupancy 1 | acc: fp32 dK + dV "
          "registers per worker thread (4 warps if the compiler's choice)")
    print(f"{'D':>4} {'rows':>4} {'keys':>4} {'warps':>5} {'causal':>6} {'loop':>4} {'acc':>4} "
          f"{'REG':>4} {'STACK':>6} {'STL':>4} {'LDL':>4} {'HGMMA':>5} {'WAIT':>4} {'HMMA':>4} "
          f"{'TMA':>3} {'EX2':>4}  "
          "setmaxnreg")
    for d, tm, tn, w, causal, loop in CONFIGS:
        if args.head_dim not in (None, d):
            continue
        acc = 2 * tn * d // (32 * (w or 4))
        head = (f"{d:>4} {tm:>4} {tn:>4} {str(w):>5} {MASKS[causal]:>6} "
                f"{'yes' if loop else 'no':>4} {acc:>4}")
        try:
            r = read(cubin(d, tm, tn, w, causal, loop), args.cuobjdump)
        except Exception as exc:  # cuTile's own refusal is the row's result
            print(f"{head}  refused: {str(exc).splitlines()[0]}", flush=True)
            continue
        nreg = " ".join(f"{k}={int(v, 16)}" for k, v in r["setmaxnreg"]) or "none"
        print(f"{head} {r['REG']:>4} {r['STACK']:>6} {r['STL']:>4} {r['LDL']:>4} "
              f"{r['HGMMA']:>5} {r['WGWAIT']:>4} {r['HMMA']:>4} {r['UTMALDG']:>3} "
              f"{r['MUFU_EX2']:>4}  {nreg}",
              flush=True)

if __name__ == "__main__":
    main()
