"""Repro 6: the forward at head dim 512 (and MLA decode's D_qk 576 / D_v 512) on sm_90.

Issue 48 item 3: a 64-row x 512 fp32 output accumulator is 128 KB, 256 registers a
thread over one consumer warp group (4 worker warps), 128 over two (8). Unlike repros 1-5
this one compiles the repo's own forward program (``tiledattention.kernel.attention.
attention_fwd``: Q K^T streamed per head-dim chunk, online softmax, P V into chunked fp32
accumulators) with its ``ct.Constant`` flags set by hand, past the host's head-dim check
(``headdim.MAX_HEAD_DIM`` = 256): the kernel body needs no change, since 512 = 256 + 256
and 576 = 512 + 64 (or 256 + 256 + 64) fit its three power-of-two chunks. Option (b),
D_v split across programs (each recomputes P and accumulates one D_v slice), is the same
kernel at D_v 256 with V and the output passed as column views; it costs one Q K^T per
slice. Compiled offline (no GPU) with cuTile's export API and read with cuobjdump:
registers at launch, stack, local-memory instructions (STL/LDL), warp-group MMAs
(HGMMA), mma.sync (HMMA), TMA loads, shared memory, and tileiras's per-warp-group
register split (USETMAXREG). A refused candidate prints cuTile's own error.

    CUDA_TILE_CACHE_DIR=/tmp/repro-cache PYTHONPATH=. python benchmarks/repro/d512_forward.py \
        [--cuobjdump PATH] [--only LABEL_SUBSTRING] [--causal]

The library runs the rows marked "what the library runs" (``default_schedule`` past 256:
64x64, 8 worker warps); ``schedules.space.rejection`` refuses the ones that spill.
"""

import argparse
import os
import re
import shutil
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(__file__))

from dkdv_accumulators import cuobjdump_text  # noqa: E402

from tiledattention.kernel.compile import _arrays, _export, signature  # noqa: E402
from tiledattention.kernel.plan import fwd_hints  # noqa: E402
from tiledattention.kernel.spec import score_specs  # noqa: E402
from tiledattention.kernel.variant import Variant  # noqa: E402
from tiledattention.schedules.schedule import Schedule  # noqa: E402

# (label, Q/K chunk widths, V/output chunk widths, query rows, keys per step, worker warps
# (None: the compiler's choice, 4)). The D_v 256 rows are option (b): one D_v slice per
# program. 32 query rows are option (c): below one warp-group MMA's 64 rows.
CANDIDATES = [
    ("512 64x64 w4", (256, 256), (256, 256), 64, 64, None),
    ("512 64x64 w8", (256, 256), (256, 256), 64, 64, 8),
    ("512 64x32 w8", (256, 256), (256, 256), 64, 32, 8),
    ("512 64x64 w8 1chunk", (512,), (512,), 64, 64, 8),  # what the library runs
    ("512 64x128 w8", (512,), (512,), 64, 128, 8),
    ("512 32x64 w4 (c)", (256, 256), (256, 256), 32, 64, None),
    ("512 128x64 w8", (256, 256), (256, 256), 128, 64, 8),
    ("512/v256 64x64 w4 (b)", (256, 256), (256,), 64, 64, None),
    ("512/v256 64x128 w4 (b)", (256, 256), (256,), 64, 128, None),
    ("512/v256 64x64 w8 (b)", (256, 256), (256,), 64, 64, 8),
    ("576/512 64x64 w8", (512, 64), (256, 256), 64, 64, 8),
    ("576/512 64x64 w8 lib", (512, 64), (512,), 64, 64, 8),  # what the library runs
    ("576/512 64x32 w8", (256, 256, 64), (256, 256), 64, 32, 8),
    ("576/v256 64x64 w4 (b)", (512, 64), (256,), 64, 64, None),
    ("256 64x128 w4 (shipped)", (256,), (256,), 64, 128, None),
]


def constants(qk, v, tm, tn, warps, causal):
    """The plain forward's constants: a D 256 variant's, with the chunks replaced."""
    s = Schedule(tm, tn, occupancy=1, worker_warps=warps)
    c = Variant("bfloat16", 256, causal, s, even_n=True, return_lse=True).constants()
    pad = lambda w: tuple(w) + (w[-1],) * (3 - len(w))  # noqa: E731 - unused slots repeat
    c.update(NCHUNK=len(qk), **dict(zip(("W0", "W1", "W2"), pad(qk))))
    c.update(VNCHUNK=len(v), **dict(zip(("VW0", "VW1", "VW2"), pad(v))))
    return s, c


def cubin(qk, v, tm, tn, warps, causal) -> bytes:
    s, consts = constants(qk, v, tm, tn, warps, causal)
    spec = score_specs(True)[0]
    return _export(spec, spec.kernel(None, **fwd_hints(s)),
                   signature(spec, _arrays("bfloat16", None), consts), "sm_90", "d512 repro")


def read(blob: bytes, cuobjdump: str) -> dict:
    res = cuobjdump_text(blob, cuobjdump, "-res-usage")
    sass = cuobjdump_text(blob, cuobjdump, "-sass")
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
    count = lambda pre: sum(op.startswith(pre) for op in ops)  # noqa: E731
    field = lambda k: int(re.search(rf"{k}:(\d+)", res).group(1))  # noqa: E731
    return dict(REG=field("REG"), STACK=field("STACK"), SHARED=field("SHARED"),
                STL=count("STL"), LDL=count("LDL"), HGMMA=count("HGMMA"), HMMA=count("HMMA"),
                TMA=count("UTMALDG"), WAIT=count("WARPGROUP.DEPBAR"),
                nreg=sorted(set(re.findall(
                    r"USETMAXREG\.(\w+)\S*\s+(?:U?P\d+,\s*)?(0x[0-9a-f]+)", sass))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump")
                    or "/tmp/cuobj/x/nvidia/cu13/bin/cuobjdump")
    ap.add_argument("--only", help="only the candidates whose label contains this")
    ap.add_argument("--causal", action="store_true", help="the causal program (default: not)")
    args = ap.parse_args()
    import cuda.tile as ct

    print(f"cuda-tile {ct.__version__} | sm_90 | bf16 | occupancy 1 | "
          f"{'causal' if args.causal else 'non-causal'} | acc: fp32 output registers per "
          "worker thread")
    print(f"{'candidate':<24} {'qk chunks':<13} {'v chunks':<9} {'acc':>4} {'REG':>4} "
          f"{'STACK':>6} {'STL':>4} {'LDL':>4} {'SHARED':>7} {'HGMMA':>5} {'WAIT':>4} "
          f"{'HMMA':>4} {'TMA':>3} {'sec':>4}  setmaxnreg")
    for label, qk, v, tm, tn, w in CANDIDATES:
        if args.only and args.only not in label:
            continue
        acc = tm * sum(v) // (32 * (w or 4))
        head = f"{label:<24} {'+'.join(map(str, qk)):<13} {'+'.join(map(str, v)):<9} {acc:>4}"
        start = time.perf_counter()
        try:
            r = read(cubin(qk, v, tm, tn, w, args.causal), args.cuobjdump)
        except Exception as exc:  # cuTile's own refusal is the row's result
            msg = str(exc).replace("compiling attention_fwd of d512 repro for sm_90 failed: ", "")
            print(f"{head}  refused: {msg.splitlines()[0][:160]}", flush=True)
            continue
        nreg = " ".join(f"{k}={int(x, 16)}" for k, x in r["nreg"]) or "none"
        print(f"{head} {r['REG']:>4} {r['STACK']:>6} {r['STL']:>4} {r['LDL']:>4} "
              f"{r['SHARED']:>7} {r['HGMMA']:>5} {r['WAIT']:>4} {r['HMMA']:>4} {r['TMA']:>3} "
              f"{time.perf_counter() - start:>4.0f}  {nreg}", flush=True)


if __name__ == "__main__":
    main()
