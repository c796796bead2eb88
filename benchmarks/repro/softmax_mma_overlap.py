"""Repro 2: does tileiras overlap softmax (MUFU.EX2) with warp-group MMAs (HGMMA)?

Minimal attention loops at D = 128, bf16, num_worker_warps=8 (two consumer warp groups),
compiled offline for sm_90 and read from cuobjdump's SASS:
  fwd: a 128-row query tile over 128-key tiles, S = Q K^T, online softmax, O += P V
       (FA3's forward tiling, each warp group 64 rows); once as written, once with S of
       the next key tile issued before this tile's softmax in the source (PIPELINED);
  bwd: a 128-key dK/dV tile over 64-row query tiles: S, dP, P = exp2(S*c - lse), dS,
       dV += P^T dO, dK += dS^T Q (FA3's D = 128 causal backward tile).
Printed per loop body: one thread's event order (HGMMA, WARPGROUP.ARRIVE/DEPBAR, EX2 runs,
BAR.*, mbarrier waits), the EX2s issued while an HGMMA of the same warp group is in
flight, and the named barriers (FA3's ping-pong: BAR.SYNC on its own id, BAR.ARV on the
other warp group's, around each group's GEMMs).

    CUDA_TILE_CACHE_DIR=/tmp/repro-cache python softmax_mma_overlap.py \
        [--cuobjdump PATH] [--listing]
"""

import argparse
import io
import itertools
import re
import shutil
import subprocess
import tempfile

import cuda.tile as ct
import cuda.tile.compilation as tc
import numpy as np

D, F32 = 128, np.float32
EVENTS = {"MUFU.EX2": "EX2", "WARPGROUP.ARRIVE": "WG.ARRIVE", "SYNCS.PHASECHK": "MBAR.WAIT"}
KEYS = ("HGMMA", "MUFU.EX2", "WARPGROUP.ARRIVE", "WARPGROUP.DEPBAR", "BAR.SYNC", "BAR.ARV")
INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+((?:@!?U?P\w+\s+)?)([A-Z][A-Z0-9_.]*)([^;]*);")


def kt_tile(K, h, j):
    return ct.load(K, index=(h, 0, j), shape=(1, D, 128), order=(0, 2, 1)).reshape((D, 128))


def softmax_pv(s, m, lsum, acc, V, h, j, dtype):
    """Online softmax of the scaled scores s, then O += P V (one forward step after S)."""
    m_new = ct.maximum(m, ct.max(s, axis=1, keepdims=True))
    alpha = ct.exp2(m - m_new, flush_to_zero=True)
    p = ct.exp2(s - m_new, flush_to_zero=True)
    lsum = lsum * alpha + ct.sum(p, axis=1, keepdims=True)
    v = ct.load(V, index=(h, j, 0), shape=(1, 128, D)).reshape((128, D))
    return m_new, lsum, ct.mma(p.astype(dtype), v, acc * alpha)


@ct.kernel
def fwd(Q, K, V, Out, c: float, PIPELINED: ct.Constant[bool]):
    """PIPELINED: S of the next key tile is issued before this tile's softmax in the source
    (FA3's intra-warpgroup overlap, written by hand); else S, softmax, P V in order."""
    m_i, h = ct.bid(0), ct.bid(1)  # arrays [H, S, D]
    q = ct.load(Q, index=(h, m_i, 0), shape=(1, 128, D)).reshape((128, D))
    m, zero = ct.full((128, 1), -np.inf, dtype=F32), ct.full((128, 128), 0.0, dtype=F32)
    lsum, acc = ct.full((128, 1), 0.0, dtype=F32), ct.full((128, D), 0.0, dtype=F32)
    n = K.shape[1] // 128
    if PIPELINED:
        s = ct.mma(q, kt_tile(K, h, 0), zero) * c
        for j in range(n - 1):
            s_next = ct.mma(q, kt_tile(K, h, j + 1), zero)
            m, lsum, acc = softmax_pv(s, m, lsum, acc, V, h, j, Q.dtype)
            s = s_next * c
        m, lsum, acc = softmax_pv(s, m, lsum, acc, V, h, n - 1, Q.dtype)
    else:
        for j in range(n):
            s = ct.mma(q, kt_tile(K, h, j), zero) * c
            m, lsum, acc = softmax_pv(s, m, lsum, acc, V, h, j, Q.dtype)
    ct.store(Out, index=(h, m_i, 0), tile=(acc / lsum).reshape((1, 128, D)).astype(Out.dtype))


@ct.kernel
def bwd(Q, K, V, dO, Lse, Delta, dK, dV, c: float):
    n, h = ct.bid(0), ct.bid(1)  # Lse, Delta [H, S]
    kt = ct.load(K, index=(h, 0, n), shape=(1, D, 128), order=(0, 2, 1)).reshape((D, 128))
    vt = ct.load(V, index=(h, 0, n), shape=(1, D, 128), order=(0, 2, 1)).reshape((D, 128))
    dk = ct.full((128, D), 0.0, dtype=F32)
    dv = ct.full((128, D), 0.0, dtype=F32)
    for i in range(Q.shape[1] // 64):
        q = ct.load(Q, index=(h, i, 0), shape=(1, 64, D)).reshape((64, D))
        do = ct.load(dO, index=(h, i, 0), shape=(1, 64, D)).reshape((64, D))
        s = ct.mma(q, kt, ct.full((64, 128), 0.0, dtype=F32))
        dp = ct.mma(do, vt, ct.full((64, 128), 0.0, dtype=F32))
        lse = ct.load(Lse, index=(h, i), shape=(1, 64)).reshape((64, 1))
        p = ct.exp2(s * c - lse, flush_to_zero=True)
        ds = p * (dp - ct.load(Delta, index=(h, i), shape=(1, 64)).reshape((64, 1)))
        dv = ct.mma(ct.transpose(p.astype(Q.dtype)), do, dv)
        dk = ct.mma(ct.transpose(ds.astype(Q.dtype)), q, dk)
    ct.store(dK, index=(h, n, 0), tile=dk.reshape((1, 128, D)).astype(dK.dtype))
    ct.store(dV, index=(h, n, 0), tile=dv.reshape((1, 128, D)).astype(dV.dtype))


def sass(kernel, kinds: str, constants: list, cuobjdump: str) -> str:
    arr = lambda t, nd: tc.ArrayConstraint(  # noqa: E731
        t, nd, index_dtype=ct.int32, stride_lower_bound_incl=0, alias_groups=(),
        may_alias_internally=False, stride_constant=[None] * (nd - 1) + [1],
        stride_divisible_by=[8] * (nd - 1) + [1], base_addr_divisible_by=16)
    params = [arr(ct.bfloat16, 3) if k == "b" else arr(ct.float32, 2) for k in kinds]
    sig = tc.KernelSignature(params + [tc.ScalarConstraint(ct.float32)] + constants,
                             tc.CallingConvention.cutile_python_v1())
    buf = io.BytesIO()
    tc.export_kernel(kernel.replace_hints(num_worker_warps=8, occupancy=1), [sig], buf,
                     gpu_code="sm_90", output_format="cubin")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(buf.getvalue())
        f.flush()
        return subprocess.run([cuobjdump, "-sass", f.name], capture_output=True, text=True,
                              check=True).stdout


def count(ins, prefix: str) -> int:
    return sum(x[2].startswith(prefix) for x in ins)


def loop_body(ins):
    """The innermost loop (a backward branch's range) with HGMMA and EX2 in it (the retry
    branches of mbarrier waits, placed after the kernel's end, span longer ranges)."""
    loops = []
    for k, (addr, _, op, rest) in enumerate(ins):
        tgt = re.search(r"0x([0-9a-f]+)", rest) if op.startswith("BRA") else None
        if tgt and int(tgt.group(1), 16) < addr:
            body = [x for x in ins[:k + 1] if x[0] >= int(tgt.group(1), 16)]
            if count(body, "MUFU.EX2") and count(body, "HGMMA"):
                loops.append(body)
    return min(loops, key=len)


def events(body):
    """One thread's event order, and the EX2s issued while an HGMMA of the thread's warp
    group is in flight (issued: from its group's first HGMMA until a DEPBAR drains it)."""
    seq, pending, is_open, overlapped = [], 0, False, 0
    for rep in range(2):  # twice: a group left pending at the loop's end carries over
        for _, pred, op, rest in body:
            ev = EVENTS.get(".".join(op.split(".")[:2]))
            if op.startswith("HGMMA"):
                ev, is_open = "HGMMA", "gsb0" not in rest  # gsb0: its group's last
                pending += not is_open
            elif op.startswith("WARPGROUP.DEPBAR"):  # wait until <= N groups outstanding
                n = int(re.search(r"0x([0-9a-f]+)", rest).group(1), 16)
                ev, pending = f"DEPBAR.LE {n}", min(pending, n)
            elif op == "MUFU.EX2":
                overlapped += rep == 1 and (pending > 0 or is_open)
            elif op.startswith("BAR"):
                ev = f"{pred}{op}{rest}".strip()
            if ev is None:
                continue
            seq += [ev] * (rep == 1)
    runs = [(ev, len(list(g))) for ev, g in itertools.groupby(seq)]
    return [f"{ev}x{n}" if n > 1 else ev for ev, n in runs], overlapped


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump")
                    or "/tmp/cuobj/nvidia/cu13/bin/cuobjdump")
    ap.add_argument("--listing", action="store_true", help="print the loop body's SASS")
    args = ap.parse_args()
    print("cuda-tile", ct.__version__, "| sm_90 | bf16 | D=128 | num_worker_warps=8")
    for name, kernel, kinds, const in (("fwd", fwd, "bbbb", [False]),
                                       ("fwd, S(j+1) before softmax(j) in the source", fwd,
                                        "bbbb", [True]), ("bwd (dK/dV)", bwd, "bbbbffbb", [])):
        ins = [(int(a, 16), p, op, r) for a, p, op, r in
               INSTR.findall(sass(kernel, kinds, const, args.cuobjdump))]
        body = loop_body(ins)
        seq, overlapped = events(body)
        print(f"\n{name}: loop 0x{body[0][0]:x}-0x{body[-1][0]:x}, {len(body)} instr/thread; "
              + ", ".join(f"{k} {count(body, k)}" for k in KEYS)
              + f"; whole kernel HGMMA {count(ins, 'HGMMA')}, MUFU.EX2 {count(ins, 'MUFU.EX2')}"
              + f", STL {count(ins, 'STL')}, LDL {count(ins, 'LDL')}")
        print(f"  EX2 issued while an HGMMA of the own warp group is in flight: {overlapped} of "
              f"{count(body, 'MUFU.EX2')}")
        bars = sorted({f"{x[2]} {x[3].strip()}" for x in body if x[2].startswith("BAR")})
        print(f"  barriers in the loop: {bars or 'none'}")
        print("  order: " + " | ".join(seq))
        if args.listing:
            print("\n".join(f"    /*{a:04x}*/ {p}{op}{r};" for a, p, op, r in body))


if __name__ == "__main__":
    main()
