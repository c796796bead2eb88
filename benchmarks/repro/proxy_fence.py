"""Repro 4: a TMA store, then a device-scope atomic: no proxy fence between them.

FlashDecoding's "last split combines" pattern (benchmarks/notes/decode.md §36b): each program stores
its partial tile, then adds 1 to a counter (``ct.atomic_add``, ACQ_REL, device scope); the
program that reads N-1 loads every partial and merges them. On sm_90 a tile store may
lower to TMA (``UTMASTG``: the async proxy); the PTX memory model orders async-proxy
writes before a generic-proxy release only through ``fence.proxy.async`` (SASS
``FENCE.VIEW.ASYNC``). This kernel is that pattern and nothing else, compiled offline for
sm_90 in three forms: the store as cuTile chooses (TMA), the store with
``memory_order=RELEASE`` (device scope), and ``allow_tma=False``. Per form it prints
which store and load instructions tileiras emitted and whether a proxy fence, a MEMBAR and
the atomic are in the SASS (``--order``: where, by address). Compiled with cuda-tile
1.7.0 / tileiras 13.4.92 (README): in the TMA form the store warp issues ``UTMASTG``,
waits for it (``DEPBAR``) and signals an mbarrier; the consumer warp then runs
``MEMBAR.ALL.GPU; ATOMG`` with no ``FENCE.VIEW.ASYNC.G`` (the global proxy fence) before it
— the one there is comes after the atomic, before the last program's TMA loads. The
pattern is then correct by PTX's rules only with plain (generic-proxy) stores, which cost
the fused decode kernel 13-30 % (benchmarks/notes/decode.md §36b).

    CUDA_TILE_CACHE_DIR=/tmp/repro-cache python proxy_fence.py \
        [--cuobjdump /tmp/cuobj/nvidia/cu13/bin/cuobjdump]
"""

import argparse
import io
import re
import shutil

import cuda.tile as ct
import cuda.tile.compilation as tc
import numpy as np
from dkdv_accumulators import array, cuobjdump_text  # this directory's repro 1

TM, D, SPLITS = 64, 128, 16
FORMS = {0: "store as cuTile chooses", 1: "store memory_order=RELEASE, DEVICE",
         2: "store and loads allow_tma=False"}


@ct.kernel
def last_combines(Part, Count, Out, FORM: ct.Constant[int]):
    s, h = ct.bid(0), ct.bid(1)  # Part [H * SPLITS, TM, D] fp32, Count [H] int32
    tile = ct.full((1, TM, D), 1.0, dtype=np.float32) * (s + 1)
    if FORM == 0:
        ct.store(Part, index=(h * SPLITS + s, 0, 0), tile=tile)
    elif FORM == 1:
        ct.store(Part, index=(h * SPLITS + s, 0, 0), tile=tile,
                 memory_order=ct.MemoryOrder.RELEASE, memory_scope=ct.MemoryScope.DEVICE)
    else:
        ct.store(Part, index=(h * SPLITS + s, 0, 0), tile=tile, allow_tma=False)
    old = ct.atomic_add(Count, (h,), 1, memory_order=ct.MemoryOrder.ACQ_REL,
                        memory_scope=ct.MemoryScope.DEVICE)
    if old == SPLITS - 1:
        acc = ct.full((1, TM, D), 0.0, dtype=np.float32)
        for t in range(SPLITS):
            acc = acc + ct.load(Part, index=(h * SPLITS + t, 0, 0), shape=(1, TM, D),
                                allow_tma=False if FORM == 2 else None)
        ct.store(Out, index=(h, 0, 0), tile=acc)


def cubin(form: int) -> bytes:
    sig = tc.KernelSignature([array(ct.float32, 3), array(ct.int32, 1), array(ct.float32, 3),
                              form], tc.CallingConvention.cutile_python_v1())
    buf = io.BytesIO()
    tc.export_kernel(last_combines, [sig], buf, gpu_code="sm_90", output_format="cubin")
    return buf.getvalue()


def read(blob: bytes, cuobjdump: str) -> tuple[dict, list]:
    sass = cuobjdump_text(blob, cuobjdump, "-sass")
    found = re.findall(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
    ops = [op for _, op in found]
    count = lambda pre: sum(op.startswith(pre) for op in ops)  # noqa: E731
    counts = {name: count(name) for name in (
        "UTMASTG", "STG", "UTMALDG", "LDG", "FENCE.VIEW.ASYNC.G", "FENCE.VIEW.ASYNC.S",
        "MEMBAR.ALL.GPU", "ATOMG")}
    # The order that matters, by address: the global proxy fences (.G; .S fences order
    # shared memory for TMA reads of it), the device fence and the atomic, the TMA traffic.
    keep = ("UTMASTG", "DEPBAR", "FENCE.VIEW.ASYNC.G", "MEMBAR.ALL.GPU", "ATOMG", "UTMALDG")
    order = [f"{a}:{op}" for a, op in found if op.startswith(keep)]
    return counts, order


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump")
                    or "/tmp/cuobj/nvidia/cu13/bin/cuobjdump")
    ap.add_argument("--order", action="store_true",
                    help="also list, by address, the TMA, fence and atomic instructions")
    args = ap.parse_args()
    print("cuda-tile", ct.__version__, f"| sm_90 | partial [{TM}, {D}] fp32, {SPLITS} splits")
    for form, label in FORMS.items():
        try:
            r, order = read(cubin(form), args.cuobjdump)
        except Exception as exc:  # cuTile's own refusal is the row's result
            print(f"{label:34s} refused: {str(exc).splitlines()[0]}")
            continue
        print(f"{label:34s} " + "  ".join(f"{k} {v}" for k, v in r.items()))
        if args.order:
            print("    " + " ".join(order))


if __name__ == "__main__":
    main()
