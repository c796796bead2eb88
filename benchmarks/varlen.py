"""Packed (varlen) training batches and paged decode, side by side in one process (GPU).

Varlen: a batch of documents whose lengths follow a lognormal (median 512 tokens, sigma
1.0, capped at 8192; seeded) packed to ``--tokens`` in total; methods: ``ta.sdpa_varlen``;
FlashAttention-4's ``flash_attn_varlen_func`` (``--fa4-site`` on PYTHONPATH, else
unavailable); FlexAttention with a document block mask over the packed stream (TRITON, and
FLASH where FA4 imports); ``ta.sdpa`` with our own document block mask; torch SDPA on the
padded [B, H, max_len, D] batch with a key-padding mask (what a user without varlen runs; the
padding copy is not timed). Paged decode: ``ta.sdpa_paged`` against our dense decode on the
same contexts padded to the longest, FA4 with ``page_table``. Every method's output is
checked against the float64 reference first; kernel time by ``timing.time_cuda`` (L2
flushed); ratios are to ``ta`` in the same run. Prints one table per workload; ``--json``
writes the rows.

    python benchmarks/varlen.py [--tokens 16384 65536] [--head-dims 64 128] [--fa4-site /tmp/site]

``--ab-packed-bwd`` (with ``--backward``): ``ta`` twice more, its packed backward with the
per-sequence sliced loads (``ta_sliced``) and through the whole arrays (``ta_whole``,
``workload.PACKED_BWD_WHOLE``: benchmarks/notes/varlen-paged.md §42a), beside FA4 and our
block-mask packing only (Flex and the padded SDPA left out: the A/B's time is short).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tiledattention as ta  # noqa: E402
from tiledattention.timing import L2Flusher, summarize, time_cuda  # noqa: E402
from tiledattention.tolerance import relative_error  # noqa: E402
from tiledattention.workload_reference import paged_reference, varlen_reference  # noqa: E402

BF16 = torch.bfloat16


def doc_lengths(tokens: int, seed: int, median=512, sigma=1.0, cap=8192) -> list[int]:
    """Lognormal document lengths filling ``tokens`` exactly (the last one cut)."""
    g = torch.Generator().manual_seed(seed)
    lens = []
    while sum(lens) < tokens:
        n = int(math.exp(math.log(median) + sigma * torch.randn(1, generator=g).item()))
        lens.append(max(1, min(n, cap, tokens - sum(lens))))
    return lens


def fa4(site, name="flash_attn_varlen_func"):
    """FA4's ``flash_attn.cute.<name>``, else the reason it is unavailable."""
    if site:  # scripts/device-baselines.sh's --target install (its .pth not applied)
        sys.path[:0] = [site, f"{site}/nvidia_cutlass_dsl/dsl_packages"]
    try:
        import flash_attn.cute as cute

        return getattr(cute, name)
    except Exception as exc:  # noqa: BLE001 - reported as unavailable
        return f"unavailable: {type(exc).__name__}: {exc}"[:120]


# --ab-packed-bwd: ta with workload.PACKED_BWD_WHOLE off / on for its forward+backward
PACKED_BWD = {"ta_sliced": False, "ta_whole": True}


@contextlib.contextmanager
def packed_bwd(name):
    """The packed backward's switch set for method ``name`` while it runs (a plan is built,
    and cached under the switch, when its backward first runs), restored after."""
    if name not in PACKED_BWD:
        yield
        return
    from tiledattention.kernel import workload as W

    kept, W.PACKED_BWD_WHOLE = W.PACKED_BWD_WHOLE, PACKED_BWD[name]
    try:
        yield
    finally:
        W.PACKED_BWD_WHOLE = kept


def varlen_methods(q, k, v, lens, causal, fa, ab=False):
    """The methods of one varlen point; ``ab`` (--ab-packed-bwd): ta's two packed
    backwards, FA4 and the block-mask packing only."""
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")
    mx = max(lens)
    total = sum(lens)
    out = {"ta": lambda: ta.sdpa_varlen(q, k, v, cu, cu, mx, mx, causal=causal)}
    if ab:
        out.update(dict.fromkeys(PACKED_BWD, out["ta"]))
    if callable(fa):
        out["fa4"] = lambda: fa(q, k, v, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=mx,
                                max_seqlen_k=mx, causal=causal)[0]
    seg = ta.variants.segments_from_lengths(lens)  # [1, total]
    doc = ta.variants.document(seg)
    mask = ta.and_masks(doc, lambda b, h, q_idx, kv_idx: kv_idx <= q_idx) if causal else doc
    bm = ta.block_mask(mask, None, None, total, total)
    # [1, H, total, D] views made leaves of their own (a view made under no_grad has no
    # path back to q): the backward's gradients are then those of the methods' inputs
    qd, kd, vd = (t.detach().transpose(0, 1)[None].requires_grad_(t.requires_grad)
                  for t in (q, k, v))
    out["ta_blockmask"] = lambda: ta.sdpa(qd, kd, vd, block_mask=bm)[0].transpose(0, 1)
    if ab:
        return out, cu
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        ids = seg[0]

        def doc_mask(b, h, qi, ki):
            same = ids[qi] == ids[ki]
            return same & (ki <= qi) if causal else same

        fbm = create_block_mask(doc_mask, None, None, total, total, device="cuda")
        flex = torch.compile(flex_attention)
        out["flex_triton"] = lambda: flex(qd, kd, vd, block_mask=fbm)[0].transpose(0, 1)
        if callable(fa):
            out["flex_flash"] = lambda: flex(qd, kd, vd, block_mask=fbm,
                                             kernel_options={"BACKEND": "FLASH"})[0].transpose(
                                                 0, 1)
    except Exception as exc:  # noqa: BLE001
        out["flex_triton"] = f"unavailable: {exc}"[:120]
    b = len(lens)
    pq = torch.zeros(b, q.shape[1], mx, q.shape[2], device="cuda", dtype=q.dtype)
    pk, pv = torch.zeros_like(pq), torch.zeros_like(pq)
    keep = torch.zeros(b, 1, 1, mx, dtype=torch.bool, device="cuda")
    for i, (s, n) in enumerate(zip(cu.tolist(), lens)):
        pq[i, :, :n] = q[s:s + n].transpose(0, 1)
        pk[i, :, :n] = k[s:s + n].transpose(0, 1)
        pv[i, :, :n] = v[s:s + n].transpose(0, 1)
        keep[i, ..., :n] = True
    if causal:
        keep = keep & torch.ones(mx, mx, dtype=torch.bool, device="cuda").tril()
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def padded():
        o = sdpa(pq, pk, pv, attn_mask=keep)
        return torch.cat([o[i, :, :n].transpose(0, 1) for i, n in enumerate(lens)])
    out["sdpa_padded"] = (lambda: sdpa(pq, pk, pv, attn_mask=keep), padded)
    return out, cu


def run_varlen(args, fa):
    rows = []
    for tokens in args.tokens:
        for d in args.head_dims:
            for causal in (False, True):
                lens = doc_lengths(tokens, seed=tokens + d)
                h = 2048 // d
                q, k, v = (torch.randn(tokens, h, d, device="cuda", dtype=BF16)
                           .requires_grad_(args.backward) for _ in range(3))
                with torch.no_grad():
                    methods, cu = varlen_methods(q, k, v, lens, causal, fa,
                                                 args.ab_packed_bwd)
                    ref, _ = varlen_reference(q, k, v, cu.cpu(), cu.cpu(), causal=causal)
                flush = L2Flusher()
                # useful FLOPs: 4 * H * D * sum(pairs attended)
                pairs = sum(n * n if not causal else n * (n + 1) // 2 for n in lens)
                flops = 4 * h * d * pairs
                for name, fn in methods.items():
                    row = dict(workload="varlen", pass_="fwd", tokens=tokens, docs=len(lens),
                               max_len=max(lens), d=d, causal=causal, method=name)
                    if isinstance(fn, str):
                        rows.append(dict(row, status=fn))
                        continue
                    timed, check = fn if isinstance(fn, tuple) else (fn, fn)
                    try:
                        with torch.no_grad():
                            err = relative_error(check(), ref)
                            if not err <= 2e-2:
                                rows.append(dict(row, status=f"wrong: rel err {err:.2e}"))
                                continue
                            ms = summarize(time_cuda(timed, flush=flush)).median_ms
                        rows.append(dict(row, status="ok", ms=ms, tflops=flops / ms / 1e9,
                                         err=err))
                    except Exception as exc:  # noqa: BLE001 - one method's failure is a row
                        rows.append(dict(row, status=f"error: {type(exc).__name__}: "
                                                     f"{exc}"[:160]))
                    if args.backward and name in ("ta", "fa4", "sdpa_padded", "flex_flash",
                                                  "ta_blockmask", *PACKED_BWD) and \
                            rows[-1]["status"] == "ok":
                        rows.append(backward_row(row, name, methods, flops, flush, q, k, v))
                if args.ab_packed_bwd and args.backward:
                    rows.append(dict(row, pass_="fwd+bwd", method="whole_vs_sliced",
                                     status=grads_agree(methods["ta"], q, k, v)))
                # each point as it ends (a run cut short keeps what it timed)
                table([r for r in rows if (r["tokens"], r["d"], r["causal"]) == (
                    tokens, d, causal)], ("tokens", "d", "causal", "pass_"))
    return rows


def grads_agree(fn, q, k, v) -> str:
    """dq, dk, dv of ``fn`` with the whole-array packed backward against the sliced one
    (the same dout): the largest relative error of the three, as a row's status."""
    grads = {}
    dout = None
    for name in PACKED_BWD:
        with packed_bwd(name), torch.enable_grad():
            o = fn()
            dout = torch.randn_like(o) if dout is None else dout
            grads[name] = torch.autograd.grad(o, (q, k, v), dout)
    err = max(relative_error(a, b) for a, b in zip(grads["ta_whole"], grads["ta_sliced"]))
    return f"{'ok' if err <= 1e-2 else 'DIFFER'}: dq/dk/dv max rel err {err:.2e}"


def profile_backward(args, fa):
    """Per-kernel CUDA time of one forward+backward step of ``ta``, ``ta_blockmask`` and
    ``fa4`` at the first --tokens / --head-dims point, non-causal then causal
    (torch.profiler, 10 steps; the gradients returned, as ``backward_row`` times them):
    where the packed backward's time goes, kernel by kernel."""
    tokens, d = args.tokens[0], args.head_dims[0]
    lens = doc_lengths(tokens, seed=tokens + d)
    h = 2048 // d
    q, k, v = (torch.randn(tokens, h, d, device="cuda", dtype=BF16).requires_grad_()
               for _ in range(3))
    dout = torch.randn(tokens, h, d, device="cuda", dtype=BF16)
    for causal in (False, True):
        methods, _ = varlen_methods(q, k, v, lens, causal, fa)
        for name in ("ta", "ta_blockmask", "fa4"):
            if callable(methods.get(name)):
                _profile_step(methods[name], dout,
                              f"{name}: tokens {tokens} D {d} causal {causal}, "
                              f"{len(lens)} documents")


def _profile_step(fn, dout, title):
    from torch.profiler import ProfilerActivity, profile

    leaves = graph_leaves(fn())

    def step():
        o = fn()
        return torch.autograd.grad(o, leaves, dout.view_as(o))
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
    print(f"--- {title}, CUDA time per step (us)")
    for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:12]:
        print(f"{e.device_time_total / 10:10.1f} {e.count / 10:5.1f}x {e.key[:90]}")


def graph_leaves(o) -> list:
    """The leaf tensors ``o``'s graph reaches: a method's own q, k, v (some methods take
    transposed or padded copies made once, outside the timed step)."""
    seen, leaves, stack = set(), [], [o.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if hasattr(node, "variable"):  # AccumulateGrad
            leaves.append(node.variable)
        stack.extend(nxt for nxt, _ in node.next_functions)
    return leaves


def backward_row(row, name, methods, flops, flush, q, k, v):
    """forward+backward of a method whose output depends on the leaves q, k, v."""
    fn = methods[name]
    if isinstance(fn, tuple):
        return dict(row, pass_="fwd+bwd", status="not timed: the padded copy is not a leaf")
    grad = leaves = None

    def step():
        # gradients returned, not accumulated into .grad: in a model q, k, v are not
        # leaves, and an accumulating add (strided for a transposed method) is no kernel's
        nonlocal grad, leaves
        with packed_bwd(name):
            o = fn()
            grad = torch.ones_like(o) if grad is None else grad
            leaves = leaves or graph_leaves(o)
            torch.autograd.grad(o, leaves, grad)
    try:
        with torch.enable_grad():
            ms = summarize(time_cuda(step, flush=flush, reps=20)).median_ms
        return dict(row, pass_="fwd+bwd", status="ok", ms=ms, tflops=3.5 * flops / ms / 1e9)
    except Exception as exc:  # noqa: BLE001
        return dict(row, pass_="fwd+bwd", status=f"error: {type(exc).__name__}: {exc}"[:160])
    finally:
        for t in (q, k, v):
            t.grad = None


def run_paged(args, fa_site_ok):
    flash = None
    if fa_site_ok:
        from flash_attn.cute import flash_attn_varlen_func as flash
    rows = []
    for chunk in args.chunks:
        for b in args.batches:
            for page in args.pages:
                point = paged_point(b, page, flash, chunk, args.ab_page_span)
                table(point, ("workload", "b", "page"))  # each point as it ends
                rows += point
    return rows


def other_path(q, kc, vc, table, seqlens, cq, max_q, page):
    """(name, call) of the paged path ``ta.sdpa_paged`` does not take at this point, built
    as a call builds its plan, or None where it has one path: ``ta_pertma`` (every page its
    own TMA load, key tiles spanning up to four pages: benchmarks/notes/varlen-paged.md
    §39b) where ``ta`` gathers, ``ta_gather`` (§40f's gathered rows) where a page small
    enough to gather takes the TMA loads for its many new tokens (§42c)."""
    from tiledattention import mods as _mods
    from tiledattention.kernel import workload as W
    from tiledattention.kernel.workload_check import check_paged

    if page >= W.PAGE_GATHER_BELOW:
        return None
    seq_q = 1 if cq is None else max_q
    w = check_paged(q, kc, vc, table, seqlens, cq, max_q, True, None, (-1, -1), 0.0)
    gathers = seq_q <= W.GATHER_MAX_Q
    kept = W.PAGE_GATHER_BELOW, W.GATHER_MAX_Q
    W.PAGE_GATHER_BELOW, W.GATHER_MAX_Q = (0, kept[1]) if gathers else (kept[0], seq_q)
    try:
        plan = W.paged_plan(w, q.device, None, _mods.NONE, False)
    finally:
        W.PAGE_GATHER_BELOW, W.GATHER_MAX_Q = kept
    return ("ta_pertma" if gathers else "ta_gather",
            lambda: W.run_paged(plan, q, kc, vc, table, seqlens, cq)[0])


def paged_point(b, page, flash, chunk=1, ab=False):
    """One paged point: B sequences, lognormal contexts (median 4096), GQA 32/8; decode
    (``chunk`` 1: one new token each) or chunked prefill (``chunk`` new tokens each, packed
    by cu_seqlens_q, fewer where the context is shorter)."""
    g = torch.Generator().manual_seed(b * 1000 + page)
    ctx = [int(min(32768, max(64, math.exp(math.log(4096) + 0.8 * torch.randn(
        1, generator=g).item())))) for _ in range(b)]
    hq, hk, d = 32, 8, 128
    npages = [math.ceil(n / page) for n in ctx]
    total = sum(npages)
    perm = torch.randperm(total, device="cuda").to(torch.int32)
    table = torch.zeros(b, max(npages), dtype=torch.int32, device="cuda")
    at = 0
    for i, n in enumerate(npages):
        table[i, :n] = perm[at:at + n]
        at += n
    kc = torch.randn(total, page, hk, d, device="cuda", dtype=BF16)
    vc = torch.randn_like(kc)
    seqlens = torch.tensor(ctx, dtype=torch.int32, device="cuda")
    if chunk > 1:
        return prefill_point(b, page, flash, chunk, ab, ctx, kc, vc, table, seqlens)
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=BF16)
    ref, _ = paged_reference(q, kc, vc, table, seqlens.cpu(), causal=True)
    methods = {"ta": lambda: ta.sdpa_paged(q, kc, vc, table, seqlens, causal=True)}
    other = other_path(q, kc, vc, table, seqlens, None, None, page) if ab else None
    if other:
        methods[other[0]] = other[1]
    mx = max(ctx)
    dk = torch.zeros(b, hk, mx, d, device="cuda", dtype=BF16)
    dv = torch.zeros_like(dk)
    keep = torch.zeros(b, 1, 1, mx, dtype=torch.bool, device="cuda")
    for i, n in enumerate(ctx):
        pages = table[i, :npages[i]].long()
        dk[i, :, :n] = kc[pages].reshape(-1, hk, d)[:n].transpose(0, 1)
        dv[i, :, :n] = vc[pages].reshape(-1, hk, d)[:n].transpose(0, 1)
        keep[i, ..., :n] = True
    qd = q.transpose(1, 2)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    methods["ta_dense_padded"] = lambda: ta.sdpa(qd, dk, dv, attn_mask=keep,
                                                 enable_gqa=True).transpose(1, 2)
    methods["sdpa_dense_padded"] = lambda: sdpa(qd, dk, dv, attn_mask=keep,
                                                enable_gqa=True).transpose(1, 2)
    if flash is not None:
        methods["fa4"] = lambda: flash(q, kc, vc, seqused_k=seqlens, page_table=table,
                                       causal=True)[0]
    nbytes = sum(ctx) * hk * d * 2 * 2 + q.numel() * 2 * 2
    return timed_rows(methods, ref, dict(workload="paged_decode", b=b, page=page,
                                         mean_ctx=sum(ctx) / b), nbytes)


def prefill_point(b, page, flash, chunk, ab, ctx, kc, vc, table, seqlens):
    """Chunked prefill: the last min(chunk, context) tokens of each context are new."""
    hq, d = 32, kc.shape[-1]
    new = [min(chunk, n) for n in ctx]
    cq = torch.tensor([0, *torch.tensor(new).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")
    q = torch.randn(sum(new), hq, d, device="cuda", dtype=BF16)
    ref, _ = paged_reference(q, kc, vc, table, seqlens.cpu(), cu_seqlens_q=cq.cpu(),
                             causal=True)
    mq = max(new)
    methods = {"ta": lambda: ta.sdpa_paged(q, kc, vc, table, seqlens, cu_seqlens_q=cq,
                                           max_seqlen_q=mq, causal=True)}
    other = other_path(q, kc, vc, table, seqlens, cq, mq, page) if ab else None
    if other:
        methods[other[0]] = other[1]
    if flash is not None:
        methods["fa4"] = lambda: flash(q, kc, vc, cu_seqlens_q=cq, max_seqlen_q=mq,
                                       seqused_k=seqlens, page_table=table, causal=True)[0]
    pairs = sum(n * c - n * (n - 1) // 2 for n, c in zip(new, ctx))
    return timed_rows(methods, ref, dict(workload="paged_prefill", b=b, page=page,
                                         mean_ctx=sum(ctx) / b, chunk=chunk),
                      None, flops=4 * hq * d * pairs)


def timed_rows(methods, ref, base, nbytes, flops=None):
    """Each method's row: checked against ``ref`` first, then timed (L2 flushed)."""
    rows = []
    flush = L2Flusher()
    for name, fn in methods.items():
        row = dict(base, method=name)
        try:
            err = relative_error(fn(), ref)
            if not err <= 2e-2:
                rows.append(dict(row, status=f"wrong: rel err {err:.2e}"))
                continue
            ms = summarize(time_cuda(fn, flush=flush)).median_ms
            rate = dict(gbps=nbytes / ms / 1e6) if nbytes else dict(tflops=flops / ms / 1e9)
            rows.append(dict(row, status="ok", ms=ms, **rate))
        except Exception as exc:  # noqa: BLE001
            rows.append(dict(row, status=f"error: {type(exc).__name__}: {exc}"[:160]))
    return rows


def table(rows, keys):
    groups = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k in keys), []).append(r)
    for key, rs in groups.items():
        base = next((r["ms"] for r in rs if r["method"] == "ta" and r.get("ms")), None)
        cells = []
        for r in rs:
            if r.get("ms"):
                ratio = f" ({r['ms'] / base:.2f}x ta)" if base else ""
                cells.append(f"{r['method']} {r['ms']:.3f} ms{ratio}")
            else:
                cells.append(f"{r['method']} {r['status'][:60]}")
        print(dict(zip(keys, key)), " | ".join(cells), flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[16384, 65536])
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 64])
    p.add_argument("--pages", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--chunks", type=int, nargs="+", default=[1],
                   help="paged: new tokens per sequence (1: decode; more: chunked prefill)")
    p.add_argument("--ab-page-span", action="store_true",
                   help="paged: also time the small-page path ta does not take: "
                        "ta_pertma (per-page TMA) where ta gathers (decode), ta_gather "
                        "where it does not (chunked prefill)")
    p.add_argument("--ab-packed-bwd", action="store_true",
                   help="varlen, with --backward: also time ta's packed backward with "
                        "PACKED_BWD_WHOLE off (ta_sliced) and on (ta_whole), beside FA4 and "
                        "the block-mask packing only")
    p.add_argument("--fa4-site", default=None)
    p.add_argument("--backward", action="store_true")
    p.add_argument("--skip", choices=["varlen", "paged"], default=None)
    p.add_argument("--profile-backward", action="store_true",
                   help="print per-kernel CUDA time of a packed forward+backward step, then "
                        "exit")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    fa = fa4(args.fa4_site)
    print("fa4:", "importable" if callable(fa) else fa)
    if args.profile_backward:
        profile_backward(args, fa)
        return 0
    rows = []
    if args.skip != "varlen":
        rows += run_varlen(args, fa)
    if args.skip != "paged":
        rows += run_paged(args, callable(fa))
    if args.json:
        Path(args.json).write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
