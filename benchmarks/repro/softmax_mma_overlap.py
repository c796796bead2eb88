"""Repro 2: does tileiras overlap softmax (MUFU.EX2) with warp-group MMAs (HGMMA)?

Minimal attention loops, bf16, num_worker_warps=8 (two consumer warp groups), compiled
offline for sm_90 and read from cuobjdump's SASS:
  fwd: a 128-row query tile over 128-key tiles, S = Q K^T, online softmax, O += P V
       (FA3's forward tiling, each warp group 64 rows); once as written, once with S of
       the next key tile issued before this tile's softmax in the source (PIPELINED);
  bwd: a 128-key dK/dV tile over 64-row query tiles: S, dP, P = exp2(S*c - lse), dS,
       dV += P^T dO, dK += dS^T Q (FA3's D = 128 causal backward tile);
  dq:  a 128-row dQ tile over 64-key tiles: S, dP, dS, dQ += dS K.
Printed per loop body (D = 128): one thread's event order (HGMMA, WARPGROUP.ARRIVE/DEPBAR,
EX2 runs, BAR.*, mbarrier waits), the EX2s issued while an HGMMA of the same warp group is
in flight, and the named barriers (FA3's ping-pong: BAR.SYNC on its own id, BAR.ARV on the
other warp group's, around each group's GEMMs). Then the ceiling table: fwd, dK/dV and dQ at
D 64 and 128, one row per tileiras (cuTile's, plus each --tileiras, e.g. a `pip install
--target` of another release), the rows with --apply-controls ACF added for a tileiras
that lists that option.

    CUDA_TILE_CACHE_DIR=/tmp/repro-cache python softmax_mma_overlap.py [--cuobjdump PATH] \
        [--listing] [--tileiras /tmp/tileiras135/nvidia/cu13/bin/tileiras] [--apply-controls F]
"""

import argparse
import io
import itertools
import os
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


def kt_tile(K, h, j, D):
    return ct.load(K, index=(h, 0, j), shape=(1, D, 128), order=(0, 2, 1)).reshape((D, 128))


def softmax_pv(s, m, lsum, acc, V, h, j, dtype, D):
    """Online softmax of the scaled scores s, then O += P V (one forward step after S)."""
    m_new = ct.maximum(m, ct.max(s, axis=1, keepdims=True))
    alpha = ct.exp2(m - m_new, flush_to_zero=True)
    p = ct.exp2(s - m_new, flush_to_zero=True)
    lsum = lsum * alpha + ct.sum(p, axis=1, keepdims=True)
    v = ct.load(V, index=(h, j, 0), shape=(1, 128, D)).reshape((128, D))
    return m_new, lsum, ct.mma(p.astype(dtype), v, acc * alpha)


@ct.kernel
def fwd(Q, K, V, Out, c: float, PIPELINED: ct.Constant[bool], D: ct.Constant[int]):
    """PIPELINED: S of the next key tile is issued before this tile's softmax in the source
    (FA3's intra-warpgroup overlap, written by hand); else S, softmax, P V in order."""
    m_i, h = ct.bid(0), ct.bid(1)  # arrays [H, S, D]
    q = ct.load(Q, index=(h, m_i, 0), shape=(1, 128, D)).reshape((128, D))
    m, zero = ct.full((128, 1), -np.inf, dtype=F32), ct.full((128, 128), 0.0, dtype=F32)
    lsum, acc = ct.full((128, 1), 0.0, dtype=F32), ct.full((128, D), 0.0, dtype=F32)
    n = K.shape[1] // 128
    if PIPELINED:
        s = ct.mma(q, kt_tile(K, h, 0, D), zero) * c
        for j in range(n - 1):
            s_next = ct.mma(q, kt_tile(K, h, j + 1, D), zero)
            m, lsum, acc = softmax_pv(s, m, lsum, acc, V, h, j, Q.dtype, D)
            s = s_next * c
        m, lsum, acc = softmax_pv(s, m, lsum, acc, V, h, n - 1, Q.dtype, D)
    else:
        for j in range(n):
            s = ct.mma(q, kt_tile(K, h, j, D), zero) * c
            m, lsum, acc = softmax_pv(s, m, lsum, acc, V, h, j, Q.dtype, D)
    ct.store(Out, index=(h, m_i, 0), tile=(acc / lsum).reshape((1, 128, D)).astype(Out.dtype))


@ct.kernel
def bwd(Q, K, V, dO, Lse, Delta, dK, dV, c: float, D: ct.Constant[int]):
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


@ct.kernel
def dq(Q, K, V, dO, Lse, Delta, dQ, c: float, D: ct.Constant[int]):
    """dQ of a 128-row query tile (64 rows per consumer warp group) over 64-key tiles."""
    m_i, h = ct.bid(0), ct.bid(1)
    q = ct.load(Q, index=(h, m_i, 0), shape=(1, 128, D)).reshape((128, D))
    do = ct.load(dO, index=(h, m_i, 0), shape=(1, 128, D)).reshape((128, D))
    lse = ct.load(Lse, index=(h, m_i), shape=(1, 128)).reshape((128, 1))
    delta = ct.load(Delta, index=(h, m_i), shape=(1, 128)).reshape((128, 1))
    acc = ct.full((128, D), 0.0, dtype=F32)
    for j in range(K.shape[1] // 64):
        kt = ct.load(K, index=(h, 0, j), shape=(1, D, 64), order=(0, 2, 1)).reshape((D, 64))
        vt = ct.load(V, index=(h, 0, j), shape=(1, D, 64), order=(0, 2, 1)).reshape((D, 64))
        s = ct.mma(q, kt, ct.full((128, 64), 0.0, dtype=F32))
        dp = ct.mma(do, vt, ct.full((128, 64), 0.0, dtype=F32))
        ds = ct.exp2(s * c - lse, flush_to_zero=True) * (dp - delta)
        acc = ct.mma(ds.astype(Q.dtype), ct.transpose(kt), acc)
    ct.store(dQ, index=(h, m_i, 0), tile=(acc * c).reshape((1, 128, D)).astype(dQ.dtype))


def bytecode(kernel, kinds: str, constants: list) -> bytes:
    """Tile IR bytecode of the kernel at w8, occupancy 1, for sm_90; "b": a bf16 [H, S, D]
    array, "f": an fp32 [H, S] one (contiguous, 16-byte aligned: TMA-eligible)."""
    arr = lambda t, nd: tc.ArrayConstraint(  # noqa: E731
        t, nd, index_dtype=ct.int32, stride_lower_bound_incl=0, alias_groups=(),
        may_alias_internally=False, stride_constant=[None] * (nd - 1) + [1],
        stride_divisible_by=[8] * (nd - 1) + [1], base_addr_divisible_by=16)
    params = [arr(ct.bfloat16, 3) if k == "b" else arr(ct.float32, 2) for k in kinds]
    sig = tc.KernelSignature(params + [tc.ScalarConstraint(ct.float32)] + constants,
                             tc.CallingConvention.cutile_python_v1())
    buf = io.BytesIO()
    tc.export_kernel(kernel.replace_hints(num_worker_warps=8, occupancy=1), [sig], buf,
                     gpu_code="sm_90", output_format="tileir_bytecode")
    return buf.getvalue()


def default_tileiras() -> str:
    from cuda.tile._compile import _find_compiler_bin  # the binary cuTile itself runs

    return _find_compiler_bin().path


def tileiras_release(tileiras: str) -> str:
    out = subprocess.run([tileiras, "--version"], capture_output=True, text=True).stdout
    return (re.findall(r"V(\d+\.\d+\.\d+)", out) or ["?"])[0]


def cubin(tileiras: str, code: bytes, controls: str | None = None) -> bytes:
    """Compile with cuTile's own flags (-O3 --lineinfo). PATH (ptxas) and CUDA_HOME point at
    that tileiras's own toolkit, so a pip --target install of another release runs as is."""
    bindir = os.path.dirname(os.path.realpath(tileiras))
    env = dict(os.environ, PATH=bindir + os.pathsep + os.environ.get("PATH", ""),
               CUDA_HOME=os.path.dirname(bindir))
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, "k.bytecode"), os.path.join(tmp, "k.cubin")
        with open(src, "wb") as f:
            f.write(code)
        extra = [f"--apply-controls={controls}"] if controls else []
        run = subprocess.run([tileiras, src, "-o", out, "--gpu-name", "sm_90", "-O3",
                              "--lineinfo", *extra], env=env, capture_output=True, text=True)
        if run.returncode:
            raise RuntimeError(f"tileiras exit {run.returncode}: "
                               f"{(run.stderr or run.stdout).strip().splitlines()[:1]}")
        with open(out, "rb") as f:
            return f.read()


def cuobjdump(blob: bytes, tool: str, flag: str = "-sass") -> str:
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(blob)
        f.flush()
        return subprocess.run([tool, flag, f.name], capture_output=True, text=True,
                              check=True).stdout


def ceiling_row(blob: bytes, tool: str) -> str:
    """What decides the two consumer warp groups' overlap: registers and their split, the
    MMAs and the waits on them, the exponentials, spills, and every BAR by id and thread
    count (FA3's ping-pong needs a BAR.SYNC on the own id and a BAR.ARV on the other
    group's, two ids > 0; id 0 is __syncthreads)."""
    sass = cuobjdump(blob, tool)
    reg = re.search(r"REG:(\d+)", cuobjdump(blob, tool, "-res-usage")).group(1)
    ins = [(int(a, 16), p, op, r) for a, p, op, r in INSTR.findall(sass)]
    body = loop_body(ins)
    lo, hi = body[0][0], body[-1][0]
    ovl = f"{events(body)[1]}/{count(body, 'MUFU.EX2')}"  # EX2s under an own HGMMA, loop
    nreg = "/".join(str(int(v, 16)) for _, v in sorted(set(re.findall(
        r"USETMAXREG\.(\w+)\S*\s+(?:U?P\d+,\s*)?(0x[0-9a-f]+)", sass)))) or "none"
    bars = {}  # "KIND id/threads" -> [count, of them in the steady loop]
    for addr, _, op, rest in ins:
        if op.startswith("BAR."):
            args = [a.strip() for a in rest.split(",")]
            key = f"{op.split('.')[1]} " + "/".join(
                str(int(a, 16)) if a.startswith("0x") else a for a in args)
            n = bars.setdefault(key, [0, 0])
            n[0], n[1] = n[0] + 1, n[1] + (lo <= addr <= hi)
    return (f"{reg:>4} {nreg:>7} {count(ins, 'HGMMA'):>5} {count(ins, 'WARPGROUP.DEPBAR'):>6} "
            f"{count(ins, 'MUFU.EX2'):>4} {ovl:>7} "
            f"{count(ins, 'STL'):>4} {count(ins, 'UTMASTG'):>7}  "
            + ", ".join(f"{k} x{n} ({m} in loop)" for k, (n, m) in sorted(bars.items())))


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


# (label, kernel, argument kinds, constants): the loop reads at D = 128 above, and the
# ceiling table's rows: the backward's two programs at D 64 and 128 and the forward beside them
LOOPS = (("fwd", fwd, "bbbb", [False, 128]),
         ("fwd, S(j+1) before softmax(j) in the source", fwd, "bbbb", [True, 128]),
         ("bwd (dK/dV)", bwd, "bbbbffbb", [128]))
TABLE = [(f"{name} D={d}", kernel, kinds, const + [d]) for d in (64, 128)
         for name, kernel, kinds, const in (("fwd", fwd, "bbbb", [False]),
                                            ("bwd dK/dV 64x128", bwd, "bbbbffbb", []),
                                            ("bwd dQ 128x64", dq, "bbbbffb", []))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump")
                    or "/tmp/cuobj/nvidia/cu13/bin/cuobjdump")
    ap.add_argument("--listing", action="store_true", help="print the loop body's SASS")
    ap.add_argument("--tileiras", action="append", default=[], metavar="PATH",
                    help="also compile the table with this tileiras (repeatable)")
    ap.add_argument("--apply-controls", metavar="ACF",
                    help="add rows compiled with tileiras --apply-controls=ACF (13.5+)")
    args = ap.parse_args()
    own = default_tileiras()
    print("cuda-tile", ct.__version__, "| sm_90 | bf16 | num_worker_warps=8 | tileiras",
          tileiras_release(own))
    for name, kernel, kinds, const in LOOPS:
        ins = [(int(a, 16), p, op, r) for a, p, op, r in
               INSTR.findall(cuobjdump(cubin(own, bytecode(kernel, kinds, const)),
                                       args.cuobjdump))]
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

    # The ceiling table: whole kernels, one row per program and compiler (BAR: kind id/threads)
    compilers = [(tileiras_release(t), t, None) for t in [own, *args.tileiras]]
    if args.apply_controls:
        compilers += [(f"{rel}+ACF", t, args.apply_controls) for rel, t, _ in compilers
                      if "apply-controls" in subprocess.run([t, "--help"], capture_output=True,
                                                            text=True).stdout]
    print(f"\n{'program':<22} {'tileiras':<12} {'REG':>4} {'maxnreg':>7} {'HGMMA':>5} "
          f"{'DEPBAR':>6} {'EX2':>4} {'EX2 ovl':>7} {'STL':>4} {'UTMASTG':>7}  "
          "BAR kind id/threads x count")
    for label, kernel, kinds, const in TABLE:
        code = bytecode(kernel, kinds, const)
        for rel, tileiras, controls in compilers:
            try:
                row = ceiling_row(cubin(tileiras, code, controls), args.cuobjdump)
            except RuntimeError as exc:  # a refused controls file is the row's result
                row = str(exc)
            print(f"{label:<22} {rel:<12} {row}", flush=True)


if __name__ == "__main__":
    main()
