"""Repro 7: gathered K/V rows of a paged cache (page 16) in a Q K^T / P V loop.

A decode-like program of one query tile (64 rows, D 128, bf16) over the keys of one
sequence whose cache is split in pages of 16 rows (``K``, ``V`` [pages * 16, D]; the
block table ``Pages``, one sequence): 64-key tiles, an fp32 online softmax, P V into fp32
accumulators. Each form loads a key tile's K and V rows differently:

- ``tma``: four 16-row TMA loads a tile (one per page; the library's per-page path,
  benchmarks/notes/varlen-paged.md §39b), one MMA per page, the scores joined (``ct.cat``);
- ``advidx``: ``ct.load_advanced_indexing`` with a tile of row ids (page id * 16 + row);
- ``advidx-notma``: the same with ``allow_tma=False``;
- ``gather``: ``ct.gather`` of [64, D] rows (bounds checked);
- ``gather-nocheck``: the same, ``check_bounds=False``;
- ``gather-scalar``: ``check_bounds=False``, the row ids built from the tile's four page
  ids read as scalars, each key selecting its page's id (what the library runs,
  ``FwdFlags.PAGE_GATHER``);
- ``gather-prefetch``: ``gather-scalar`` software-pipelined by hand: tile j+1's K and V rows
  gathered at the top of iteration j and carried into the next one, as FlashAttention's
  ``PagedKVManager`` issues the next tile's cp.async before this tile's MMAs.

Compiled offline for sm_90 (cuTile's export API, no GPU), read with cuobjdump: loads
(UTMALDG: TMA; LDGSTS: cp.async; LDG: plain loads; STS: shared stores), HGMMA, registers at
launch (REG), local memory (STL / LDL). A form that cuTile refuses prints its error.

``loops`` are the program's innermost loops, each as its events in program order: ``G`` a
run of cp.async (LDGSTS), ``W`` a wait on them (LDGDEPBAR, LDGSTSBAR, DEPBAR), ``T`` an
mbarrier wait, ``A`` an arrive, ``C`` a copy into shared memory (STS.128), ``M`` a run of
MMAs (HGMMA), ``X`` a TMA load. Gathers that tileiras pipelines sit in a loop of their own
(``T G W T G W``, the MMAs in ``T M A T M A``); gathers it does not are waited on right
before the MMA that reads them, in the MMAs' loop (``G W T M``). ``--tile 128 --warps 8``
compiles 128-row query tiles on two consumer warp groups, as the library's chunked
prefill runs them (benchmarks/notes/varlen-paged.md §51b).

    CUDA_TILE_CACHE_DIR=/tmp/repro-cache python benchmarks/repro/paged_gather.py \
        [--cuobjdump /tmp/cuobj/nvidia/cu13/bin/cuobjdump] [--only gather-scalar] \
        [--tile 128 --warps 8]
"""

import argparse
import io
import re
import shutil

import cuda.tile as ct
import cuda.tile.compilation as tc
import numpy as np
from dkdv_accumulators import cuobjdump_text  # this directory's repro 1

FORMS = ("tma", "advidx", "advidx-notma", "gather", "gather-nocheck", "gather-scalar",
         "gather-prefetch")
PAGE, TM, TN, D = 16, 64, 64, 128
SPAN = TN // PAGE  # pages per key tile


def page_id(Pages, i):
    return ct.gather(Pages, i)


def rows_loaded(Pages, j, P: ct.Constant[int], TN: ct.Constant[int]):
    """Row ids of key tile ``j`` from a loaded tile of page ids (one per key)."""
    key = ct.arange(TN, dtype=np.int32)
    return ct.gather(Pages, j * (TN // P) + key // P) * P + key % P


def rows_scalar(Pages, j, P: ct.Constant[int], TN: ct.Constant[int]):
    """Row ids of key tile ``j``: its pages' ids as scalars, each key selecting its own."""
    key = ct.arange(TN, dtype=np.int32)
    first = j * (TN // P)
    pg = ct.full((TN,), 0, dtype=np.int32) + page_id(Pages, first)
    for i in range(1, TN // P):
        pg = ct.where(key >= i * P, page_id(Pages, first + i), pg)
    return pg * P + key % P


def tile_rows(T, Pages, j, FORM: ct.Constant[int], P: ct.Constant[int], TN: ct.Constant[int],
              D: ct.Constant[int]):
    """Key tile ``j``'s rows of ``T`` as [TN, D] (forms 1-5)."""
    col = ct.arange(D, dtype=np.int32)[None, :]
    if FORM == 1:
        return ct.load_advanced_indexing(T, (rows_loaded(Pages, j, P, TN), ct.Slice(0, D)),
                                         padding_mode=ct.PaddingMode.ZERO)
    if FORM == 2:
        return ct.load_advanced_indexing(T, (rows_loaded(Pages, j, P, TN), ct.Slice(0, D)),
                                         padding_mode=ct.PaddingMode.ZERO, allow_tma=False)
    if FORM == 3:
        return ct.gather(T, (rows_loaded(Pages, j, P, TN)[:, None], col))
    if FORM == 4:
        return ct.gather(T, (rows_loaded(Pages, j, P, TN)[:, None], col), check_bounds=False)
    return ct.gather(T, (rows_scalar(Pages, j, P, TN)[:, None], col), check_bounds=False)


def page_scores(q, K, Pages, i, P: ct.Constant[int], TM: ct.Constant[int],
                D: ct.Constant[int]):
    """Q K^T over one page: a [D, P] TMA load of K^T and its MMA."""
    kt = ct.load(K, index=(0, page_id(Pages, i)), shape=(D, P), order=(1, 0))
    return ct.mma(q, kt, ct.full((TM, P), 0.0, dtype=np.float32))


def scores(q, K, Pages, j, FORM: ct.Constant[int], P: ct.Constant[int], TM: ct.Constant[int],
           TN: ct.Constant[int], D: ct.Constant[int]):
    if FORM == 0:
        first = j * (TN // P)
        s01 = ct.cat((page_scores(q, K, Pages, first, P, TM, D),
                      page_scores(q, K, Pages, first + 1, P, TM, D)), 1)
        s23 = ct.cat((page_scores(q, K, Pages, first + 2, P, TM, D),
                      page_scores(q, K, Pages, first + 3, P, TM, D)), 1)
        return ct.cat((s01, s23), 1)
    kt = ct.transpose(tile_rows(K, Pages, j, FORM, P, TN, D))
    return ct.mma(q, kt, ct.full((TM, TN), 0.0, dtype=np.float32))


def values(p, V, Pages, j, acc, FORM: ct.Constant[int], P: ct.Constant[int],
           TM: ct.Constant[int], TN: ct.Constant[int], D: ct.Constant[int]):
    if FORM == 0:
        for i in range(TN // P):
            v = ct.load(V, index=(page_id(Pages, j * (TN // P) + i), 0), shape=(P, D))
            acc = ct.mma(ct.extract(p, index=(0, i), shape=(TM, P)), v, acc)
        return acc
    return ct.mma(p, tile_rows(V, Pages, j, FORM, P, TN, D), acc)


@ct.kernel
def paged_loop(Q, K, V, Out, Pages, n_tiles: int, c: float, FORM: ct.Constant[int],
               P: ct.Constant[int], TM: ct.Constant[int], TN: ct.Constant[int],
               D: ct.Constant[int]):
    h = ct.bid(0)  # Q, Out [H, TM, D]; K, V [pages * P, D]; Pages [max pages]
    q = ct.load(Q, index=(h, 0, 0), shape=(1, TM, D)).reshape((TM, D))
    m = ct.full((TM, 1), -np.inf, dtype=np.float32)
    l_ = ct.full((TM, 1), 0.0, dtype=np.float32)
    acc = ct.full((TM, D), 0.0, dtype=np.float32)
    if FORM == 6:
        # gather-prefetch: tile j+1's rows gathered before tile j's MMAs, carried over
        k_next = tile_rows(K, Pages, 0, 5, P, TN, D)
        v_next = tile_rows(V, Pages, 0, 5, P, TN, D)
        for j in range(n_tiles):
            k_tile, v_tile = k_next, v_next
            following = ct.minimum(j + 1, n_tiles - 1)
            k_next = tile_rows(K, Pages, following, 5, P, TN, D)
            v_next = tile_rows(V, Pages, following, 5, P, TN, D)
            s = ct.mma(q, ct.transpose(k_tile), ct.full((TM, TN), 0.0, dtype=np.float32))
            m_new = max(m, ct.max(s, axis=-1, keepdims=True) * c)
            p = ct.exp2(s * c - m_new, flush_to_zero=True)
            alpha = ct.exp2(m - m_new, flush_to_zero=True)
            l_ = l_ * alpha + ct.sum(p, axis=-1, keepdims=True)
            m = m_new
            acc = ct.mma(p.astype(Q.dtype), v_tile, acc * alpha)
    else:
        for j in range(n_tiles):
            s = scores(q, K, Pages, j, FORM, P, TM, TN, D)
            m_new = max(m, ct.max(s, axis=-1, keepdims=True) * c)
            p = ct.exp2(s * c - m_new, flush_to_zero=True)
            alpha = ct.exp2(m - m_new, flush_to_zero=True)
            l_ = l_ * alpha + ct.sum(p, axis=-1, keepdims=True)
            m = m_new
            acc = values(p.astype(Q.dtype), V, Pages, j, acc * alpha, FORM, P, TM, TN, D)
    ct.store(Out, index=(h, 0, 0), tile=(acc / l_).reshape((1, TM, D)).astype(Out.dtype))


def array(dtype, ndim, aligned=True):
    """A contiguous, 16-byte aligned array (what a torch tensor gives a launch); or, not
    ``aligned``, one only gathered from (the block table)."""
    if not aligned:
        return tc.ArrayConstraint(dtype, ndim, index_dtype=ct.int32, stride_lower_bound_incl=0,
                                  alias_groups=(), may_alias_internally=False)
    return tc.ArrayConstraint(
        dtype, ndim, index_dtype=ct.int32, stride_lower_bound_incl=0, alias_groups=(),
        may_alias_internally=False, stride_constant=[None] * (ndim - 1) + [1],
        stride_divisible_by=[8] * (ndim - 1) + [1], base_addr_divisible_by=16)


def cubin(form: int, tm: int = TM, warps: int = 4) -> bytes:
    bf3, bf2 = array(ct.bfloat16, 3), array(ct.bfloat16, 2)
    sig = tc.KernelSignature(
        [bf3, bf2, bf2, bf3, array(ct.int32, 1, aligned=False), tc.ScalarConstraint(ct.int32),
         tc.ScalarConstraint(ct.float32), form, PAGE, tm, TN, D],
        tc.CallingConvention.cutile_python_v1())
    buf = io.BytesIO()
    tc.export_kernel(paged_loop.replace_hints(num_worker_warps=warps, occupancy=1), [sig], buf,
                     gpu_code="sm_90", output_format="cubin")
    return buf.getvalue()


def read(blob: bytes, cuobjdump: str) -> dict:
    res = cuobjdump_text(blob, cuobjdump, "-res-usage")
    sass = cuobjdump_text(blob, cuobjdump, "-sass")
    ops = re.findall(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass)
    count = lambda pre: sum(op.startswith(pre) for op in ops)  # noqa: E731
    kinds = sorted({op for op in ops if op.startswith(("LDGSTS", "LDG", "STS"))})
    wide = " ".join(f"{k}x{sum(op == k for op in ops)}" for k in kinds)
    return dict(UTMALDG=count("UTMALDG"), LDGSTS=count("LDGSTS"),
                LDG=count("LDG.") + sum(op == "LDG" for op in ops), STS=count("STS"),
                HGMMA=count("HGMMA"), REG=int(re.search(r"REG:(\d+)", res).group(1)),
                STL=count("STL"), LDL=count("LDL"), instr=len(ops), kinds=wide,
                loops=inner_loops(sass))


EVENTS = (("LDGSTS.E", "G"), ("LDGDEPBAR", "W"), ("LDGSTSBAR", "W"), ("DEPBAR", "W"),
          ("SYNCS.PHASECHK", "T"), ("SYNCS.ARRIVE", "A"), ("STS.128", "C"), ("HGMMA", "M"),
          ("UTMALDG", "X"))


def events(instructions: list[str], most: int = 12) -> str:
    """The first ``most`` events of ``instructions``, runs of one kind folded."""
    out = []
    for ins in instructions:
        op = ins.split()[1] if ins.startswith("@") else ins.split()[0]
        e = next((e for pre, e in EVENTS if op.startswith(pre)), None)
        if e and (not out or out[-1] != e):
            out.append(e)
    return " ".join(out[:most])


def inner_loops(sass: str, shown: int = 3, most: int = 12) -> str:
    """The first ``shown`` innermost loops (a backward branch and its target; over 20
    instructions) as their first ``most`` events, ``|`` between loops."""
    lines = [(int(a, 16), ins) for a, ins in
             re.findall(r"/\*([0-9a-f]{4,})\*/\s+((?:@!?U?P\w+\s+)?[A-Z][^;]*);", sass)]
    loops = []
    for at, ins in lines:
        target = re.search(r"BRA\b.*?0x([0-9a-f]+)", ins)
        if target and int(target.group(1), 16) < at:
            body = [i for a, i in lines if int(target.group(1), 16) <= a <= at]
            if len(body) > 20:
                loops.append((int(target.group(1), 16), at, body))
    inner = [lp for lp in loops
             if not any(o is not lp and lp[0] <= o[0] and o[1] <= lp[1] for o in loops)]
    return " | ".join(events(body, most) for _, _, body in inner[:shown])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cuobjdump", default=shutil.which("cuobjdump")
                    or "/tmp/cuobj/nvidia/cu13/bin/cuobjdump")
    ap.add_argument("--only", default="", help="comma-separated forms (default: all)")
    ap.add_argument("--tile", type=int, default=TM, help="query rows a program (64)")
    ap.add_argument("--warps", type=int, default=4, help="worker warps (4)")
    args = ap.parse_args()
    only = set(filter(None, args.only.split(",")))
    print(f"cuda-tile {ct.__version__} | sm_90 | bf16 | page {PAGE}, {TN}-key tiles, "
          f"{args.tile} query rows, D {D} | {args.warps} worker warps, occupancy 1")
    print(f"{'form':<15} {'UTMALDG':>7} {'LDGSTS':>6} {'LDG':>4} {'STS':>4} {'HGMMA':>5} "
          f"{'REG':>4} {'STL':>4} {'LDL':>4} {'instr':>6}  loads and shared stores by kind; loops")
    for form, name in enumerate(FORMS):
        if only and name not in only:
            continue
        try:
            r = read(cubin(form, args.tile, args.warps), args.cuobjdump)
        except Exception as exc:  # cuTile's own refusal is the row's result
            print(f"{name:<15} refused: {str(exc).splitlines()[0]}", flush=True)
            continue
        print(f"{name:<15} {r['UTMALDG']:>7} {r['LDGSTS']:>6} {r['LDG']:>4} {r['STS']:>4} "
              f"{r['HGMMA']:>5} {r['REG']:>4} {r['STL']:>4} {r['LDL']:>4} {r['instr']:>6}  "
              f"{r['kinds']}; {r['loops']}", flush=True)


if __name__ == "__main__":
    main()
