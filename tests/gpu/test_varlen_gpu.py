"""Packed (varlen) and paged-cache attention against the float64 references on a GPU:
forward, LSE and dq/dk/dv, causal (bottom-right), windows, softcap, GQA, seqused_k,
score_mod / mask_mod with per-sequence indices, the ragged edge cases (empty and one-token
sequences, Sq > Skv, page sizes that do not divide the context, one page), outputs
poisoned first so an unwritten row shows, CUDA-graph capture and torch.compile."""

from __future__ import annotations

import functools
import math

import pytest
import torch

import tiledattention as ta
from tiledattention import variants
from tiledattention.tolerance import relative_error, rtol, rtol_bwd
from tiledattention.workload_reference import paged_reference, varlen_reference

BF16 = torch.bfloat16


def _cu(lens):
    return torch.tensor([0, *itertools_accumulate(lens)], dtype=torch.int32, device="cuda")


def itertools_accumulate(lens):
    out, s = [], 0
    for n in lens:
        s += n
        out.append(s)
    return out


def _packed(lens, heads, d, dtype):
    return torch.randn(sum(lens), heads, d, device="cuda").to(dtype)


def _poisoned(fn):
    """Run ``fn`` on an allocator whose fresh blocks hold NaN: a row the kernels do not
    write stays NaN."""
    torch.cuda.empty_cache()
    junk = torch.full((64 << 20,), float("nan"), device="cuda")
    del junk
    return fn()


def _past_used(lens_k, seqused):
    """[total_k] bool: the key rows past each sequence's ``seqused_k``."""
    past = torch.zeros(sum(lens_k), dtype=torch.bool, device="cuda")
    for start, n, u in zip(itertools_accumulate([0, *lens_k[:-1]]), lens_k, seqused):
        past[start + min(u, n):start + n] = True
    return past


def _check_varlen(lens_q, lens_k, *, hq=4, hk=4, d=64, dtype=BF16, causal=False,
                  window=(-1, -1), softcap=0.0, grad=True, seqused=None, nan_past_used=False,
                  **mods):
    """``nan_past_used``: the key and value rows past ``seqused`` hold NaN (a cache's
    unwritten slots); the references read them as zeros, which they never use."""
    q = _packed(lens_q, hq, d, dtype).requires_grad_(grad)
    k = _packed(lens_k, hk, d, dtype)
    v = _packed(lens_k, hk, d, dtype)
    if nan_past_used:
        k[_past_used(lens_k, seqused)] = float("nan")
        v[_past_used(lens_k, seqused)] = float("nan")
    k.requires_grad_(grad)
    v.requires_grad_(grad)
    cq, ck = _cu(lens_q), _cu(lens_k)
    used = None if seqused is None else torch.tensor(seqused, dtype=torch.int32, device="cuda")
    out, lse = _poisoned(lambda: ta.sdpa_varlen(
        q, k, v, cq, ck, max(lens_q, default=0), max(lens_k, default=0), seqused_k=used,
        causal=causal, window_size=window, softcap=softcap, return_lse=True, **mods))
    ref, ref_lse = varlen_reference(q.detach(), k.detach().nan_to_num(0),
                                    v.detach().nan_to_num(0), cq.cpu(), ck.cpu(),
                                    seqused_k=None if used is None else used.cpu(),
                                    causal=causal, window_size=window, softcap=softcap,
                                    **_refs(mods))
    assert not out.isnan().any(), "unwritten or NaN output rows"
    assert relative_error(out, ref) <= rtol(dtype)
    finite = torch.isfinite(ref_lse)
    assert torch.equal(torch.isfinite(lse), finite.to(lse.device))
    assert torch.allclose(lse[finite].double(), ref_lse[finite], atol=2e-2)
    if not grad or q.shape[0] == 0:
        return
    dout = torch.randn_like(out)
    _poisoned(lambda: out.backward(dout))  # a gradient row no program writes stays NaN
    qd, kd, vd = (t.detach().double().nan_to_num(0).requires_grad_() for t in (q, k, v))
    r, _ = varlen_reference(qd, kd, vd, cq.cpu(), ck.cpu(),
                            seqused_k=None if used is None else used.cpu(), causal=causal,
                            window_size=window, softcap=softcap, **_refs(mods))
    r.backward(dout.double())
    for name, got, want in (("dq", q.grad, qd.grad), ("dk", k.grad, kd.grad),
                            ("dv", v.grad, vd.grad)):
        assert not got.isnan().any(), f"{name} has NaN"
        if want.abs().max() > 0:
            err = relative_error(got, want)
            assert err <= rtol_bwd(dtype), f"{name} relative error {err:.3e}"


def _refs(mods):
    out = {}
    if "score_mod" in mods:
        out["score_ref"] = variants.reference_of(mods["score_mod"])
    if "mask_mod" in mods:
        out["keep_ref"] = variants.reference_of(mods["mask_mod"])
    return out


ROW_SWITCHES = ("PACKED_FWD_WHOLE", "PACKED_FWD_SCATTER_OUT", "PACKED_BWD_WHOLE",
                "PACKED_BWD_SCATTER_OUT")


@pytest.fixture(params=["sliced", "shipped", "whole-scattered"])
def packed_rows(request, monkeypatch):
    """How the packed kernels load and store their rows (benchmarks/notes/varlen-paged.md
    §42a, §51d-§51f): per-sequence slices; the switches as they ship; and every row
    through the whole arrays (loads whose rows and keys past a sequence hold the next
    sequence's data, masked in the compute; Out, dK, dV and dQ stored by masked
    scatters). The plan caches key on the switches."""
    from tiledattention.kernel import workload as W

    if request.param != "shipped":
        for switch in ROW_SWITCHES:
            monkeypatch.setattr(W, switch, request.param == "whole-scattered")
    return request.param


LENS = [([300, 1, 0, 129, 64, 700], [300, 1, 0, 129, 64, 700]),
        ([17, 513, 64], [100, 513, 1000])]


@pytest.mark.parametrize("lens", LENS, ids=["self", "cross"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_varlen_matches_float64_forward_and_backward(lens, causal, d, packed_rows):
    _check_varlen(*lens, causal=causal, d=d)


@pytest.mark.parametrize("d", [96, 256])
def test_varlen_head_dims_without_padding(d, packed_rows):
    _check_varlen([200, 77], [200, 77], causal=True, d=d, dtype=torch.float16)


def test_varlen_gqa_sums_the_group_in_dk_dv(packed_rows):
    _check_varlen([130, 5, 260], [130, 5, 260], hq=8, hk=2, causal=True)


def test_varlen_query_longer_than_keys_gives_zero_rows_under_causality(packed_rows):
    # Sq > Skv, bottom-right: the first Sq - Skv queries attend nothing (zeros, lse -inf).
    _check_varlen([50, 8], [20, 8], causal=True)


def test_varlen_sliding_window_and_softcap(packed_rows):
    _check_varlen([300, 70], [300, 70], causal=True, window=(64, 0), softcap=30.0)
    _check_varlen([300, 70], [300, 90], window=(32, 16))


def test_varlen_seqused_k_caps_each_sequences_keys():
    _check_varlen([40, 60], [100, 80], seqused=[37, 80], grad=False)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d", [64, 128])
def test_varlen_rows_past_seqused_k_holding_nan_reach_no_output_or_gradient(causal, d, packed_rows):
    """Keys past seqused_k may be a cache's unwritten slots: masked (P = 0), yet 0 * NaN
    is NaN in P V, dP = dO V^T and dS K. Output and dq/dk/dv stay finite and match
    float64; dk/dv of the unused rows are zero."""
    _check_varlen([40, 60, 33, 1], [100, 80, 130, 64], seqused=[37, 80, 65, 0], causal=causal,
                  d=d, nan_past_used=True)


@pytest.mark.parametrize("extra, h, d", [(37, 4, 64), (200, 3, 96)],
                         ids=["tail-in-one-tile", "tail-over-tiles-288-columns"])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_rows_no_sequence_covers_add_nothing_to_the_gradients(causal, packed_rows, extra,
                                                                     h, d):
    """cu_seqlens[-1] < total: the forward leaves out and lse of the rows past it unwritten
    (NaN on the poisoned allocator), so their delta is NaN too. The whole-array dK/dV
    program of the last sequence reads them (its last query tile runs past the sequence's
    end) and must add nothing (lse +inf, delta 0 there); dq/dk/dv match float64, zero on
    the uncovered rows, which the tile maps' launches zero in gradients allocated empty
    (NaN here): past one tile of rows, and over a row width no 64-column store divides."""
    lens = [70, 129]
    q, k, v = (torch.randn(sum(lens) + extra, h, d, device="cuda").to(BF16).requires_grad_()
               for _ in range(3))
    cu = _cu(lens)
    out = _poisoned(lambda: ta.sdpa_varlen(q, k, v, cu, cu, max(lens), max(lens),
                                           causal=causal))
    dout = torch.randn_like(out)
    _poisoned(lambda: out.backward(dout))
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    r, _ = varlen_reference(qd, kd, vd, cu.cpu(), cu.cpu(), causal=causal)
    r.backward(dout.double())
    for name, got, want in (("dq", q.grad, qd.grad), ("dk", k.grad, kd.grad),
                            ("dv", v.grad, vd.grad)):
        assert not got.isnan().any(), f"{name} has NaN"
        assert not got[sum(lens):].any(), f"{name} of uncovered rows not zero"
        assert relative_error(got, want) <= rtol_bwd(BF16), name


def test_varlen_mods_see_positions_within_the_sequence(packed_rows):
    def rel(score, b, h, q_idx, kv_idx):
        return score - 0.01 * (q_idx - kv_idx)

    def every_third(b, h, q_idx, kv_idx):
        return (kv_idx % 3) != (b % 3)

    rel.reference = lambda s, b, h, q, k: s - 0.01 * (q - k)
    every_third.reference = lambda b, h, q, k: (k % 3) != (b % 3)
    _check_varlen([90, 130, 7], [90, 130, 7], causal=True, score_mod=rel,
                  mask_mod=every_third)


def test_varlen_under_cuda_graph_capture_needs_no_sync():
    lens = [120, 33, 400]
    q, k, v = (_packed(lens, 4, 64, BF16) for _ in range(3))
    cq = _cu(lens)
    ta.sdpa_varlen(q, k, v, cq, cq, 400, 400, causal=True)  # plan and check outside
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = ta.sdpa_varlen(q, k, v, cq, cq, 400, 400, causal=True)
    q.copy_(torch.randn_like(q))
    g.replay()
    ref, _ = varlen_reference(q, k, v, cq.cpu(), cq.cpu(), causal=True)
    assert relative_error(out, ref) <= rtol(BF16)


def test_varlen_trains_under_torch_compile():
    lens = [64, 200]
    q, k, v = (_packed(lens, 4, 64, BF16).requires_grad_() for _ in range(3))
    cq = _cu(lens)

    @torch.compile(fullgraph=True)
    def step(q, k, v):
        return ta.sdpa_varlen(q, k, v, cq, cq, 200, 200, causal=True).float().square().sum()

    step(q, k, v).backward()
    qd, kd, vd = (t.detach().double().nan_to_num(0).requires_grad_() for t in (q, k, v))
    r, _ = varlen_reference(qd, kd, vd, cq.cpu(), cq.cpu(), causal=True)
    r.square().sum().backward()
    assert relative_error(q.grad, qd.grad) <= rtol_bwd(BF16)
    assert relative_error(v.grad, vd.grad) <= rtol_bwd(BF16)


def test_varlen_refuses_bad_offsets_with_one_typed_error():
    q = _packed([10, 10], 2, 64, BF16)
    bad = torch.tensor([0, 12, 8], dtype=torch.int32, device="cuda")
    with pytest.raises(ta.InputError, match="non-decreasing"):
        ta.sdpa_varlen(q, q, q, bad, bad, 12, 12)
    cu = _cu([10, 10])
    with pytest.raises(ta.InputError, match="longer than max_seqlen"):
        ta.sdpa_varlen(q, q, q, cu, cu, 5, 10)
    with pytest.raises(ta.DTypeError):
        ta.sdpa_varlen(q, q, q, cu.long(), cu, 10, 10)


# ----------------------------------------------------------------------------- paged
def _cache(lens, page, hk, d, dtype, spare=3):
    """A shuffled page cache holding sequences of ``lens`` tokens, and its block table."""
    pages_per = [max(math.ceil(n / page), 1) for n in lens]
    total = sum(pages_per) + spare
    order = torch.randperm(total, device="cuda").to(torch.int32)
    table = torch.zeros(len(lens), max(pages_per), dtype=torch.int32, device="cuda")
    at = 0
    for b, n in enumerate(pages_per):
        table[b, :n] = order[at:at + n]
        at += n
    kc = torch.randn(total, page, hk, d, device="cuda").to(dtype)
    vc = torch.randn_like(kc)
    return kc, vc, table


# 16: rows gathered into 128-key tiles (PAGE_GATHER); 32, 64: key tiles span 4, 2 pages
@pytest.mark.parametrize("page", [16, 32, 64, 256])
@pytest.mark.parametrize("sq", [1, 4])
def test_paged_decode_matches_float64(page, sq):
    lens = [1, 37, 1000, 4096, 250]
    kc, vc, table = _cache(lens, page, 2, 128, BF16)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(len(lens), sq, 8, 128, device="cuda").to(BF16)
    if sq > 1:
        seqlens = seqlens.clamp(min=sq)
    with torch.no_grad():
        out, lse = _poisoned(lambda: ta.sdpa_paged(q, kc, vc, table, seqlens, causal=True,
                                                   return_lse=True))
    ref, ref_lse = paged_reference(q, kc, vc, table, seqlens.cpu(), causal=True)
    assert not out.isnan().any()
    assert relative_error(out, ref) <= rtol(BF16)
    assert torch.allclose(lse.double(), ref_lse, atol=2e-2)


@pytest.mark.parametrize("page", [16, 64, 256])
def test_a_ragged_decodes_empty_key_splits_change_no_output_bit_when_skipped(page,
                                                                          monkeypatch):
    # §50a: the splits are sized by the longest context (5000 keys), so the short ones'
    # later splits hold no key. Skipped, they write no partial: the allocator is poisoned,
    # so an unwritten partial holds NaN, and the combine must weigh it 0.
    from tiledattention.kernel import workload as W
    from tiledattention.varlen import varlen_mods

    lens = [1, 37, 5000, 300, 16, 2100]
    kc, vc, table = _cache(lens, page, 2, 128, BF16)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    q = torch.randn(len(lens), 1, 8, 128, device="cuda").to(BF16)
    got = {}
    for skip in (False, True):
        monkeypatch.setattr(W, "PAGED_SKIP_EMPTY", skip)
        with torch.no_grad():
            got[skip] = _poisoned(lambda: ta.sdpa_paged(q, kc, vc, table, seqlens,
                                                        causal=True, return_lse=True))
    plan = W.paged_setup(q, kc, vc, table, seqlens, None, None, True, None, (-1, -1), 0.0,
                         varlen_mods(None, None, 0.0), True, None)
    assert plan.splits > 1
    assert not got[True][0].isnan().any()
    assert torch.equal(got[False][0], got[True][0])
    assert torch.equal(got[False][1], got[True][1])
    ref, _ = paged_reference(q, kc, vc, table, seqlens.cpu(), causal=True)
    assert relative_error(got[True][0], ref) <= rtol(BF16)


@pytest.mark.parametrize("page, d", [(16, 64), (32, 64), (64, 64), (16, 128), (32, 128)])
def test_paged_chunked_prefill_matches_float64(page, d):
    # ragged contexts: 300 and 1201 end inside a page, 64 on a page's edge
    ctx = [300, 64, 1201]
    new = [100, 64, 7]
    kc, vc, table = _cache(ctx, page, 2, d, BF16)
    seqlens = torch.tensor(ctx, dtype=torch.int32, device="cuda")
    cq = _cu(new)
    q = _packed(new, 4, d, BF16)
    with torch.no_grad():
        out = _poisoned(lambda: ta.sdpa_paged(q, kc, vc, table, seqlens, cu_seqlens_q=cq,
                                              max_seqlen_q=100, causal=True))
    ref, _ = paged_reference(q, kc, vc, table, seqlens.cpu(), cu_seqlens_q=cq.cpu(),
                             causal=True)
    assert not out.isnan().any()
    assert relative_error(out, ref) <= rtol(BF16)


@pytest.mark.parametrize("page", [16, 32, 64, 256])
@pytest.mark.parametrize("chunk", [1, 40])
def test_paged_free_slots_holding_nan_do_not_reach_the_output(page, chunk):
    """A cache from ``torch.empty`` (transformers' paged cache): the slots past each
    context hold whatever the allocator had, here NaN. Masked keys' P = 0 must not meet
    their V (0 * NaN): the output is finite and matches float64 over the written slots.
    Contexts end inside a page, on a page's edge within a key tile (96) and in a tile's
    first page, so a tile spanning pages has pages wholly past the end."""
    lens = [5, 70, 96, 300]
    kc, vc, table = _cache(lens, page, 2, 64, BF16)
    written = torch.zeros(kc.shape[:2], dtype=torch.bool, device="cuda")
    for b, n in enumerate(lens):
        for t in range(n):
            written[table[b, t // page], t % page] = True
    kc[~written] = float("nan")
    vc[~written] = float("nan")
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    new = [min(chunk, n) for n in lens]
    with torch.no_grad():
        if chunk == 1:
            q = torch.randn(len(lens), 1, 4, 64, device="cuda").to(BF16)
            out = ta.sdpa_paged(q, kc, vc, table, seqlens, causal=True)
            ref, _ = paged_reference(q, kc.nan_to_num(0), vc.nan_to_num(0), table,
                                     seqlens.cpu(), causal=True)
        else:
            cq = _cu(new)
            q = _packed(new, 4, 64, BF16)
            out = ta.sdpa_paged(q, kc, vc, table, seqlens, cu_seqlens_q=cq,
                                max_seqlen_q=max(new), causal=True)
            ref, _ = paged_reference(q, kc.nan_to_num(0), vc.nan_to_num(0), table,
                                     seqlens.cpu(), cu_seqlens_q=cq.cpu(), causal=True)
    assert not out.isnan().any()
    assert relative_error(out, ref) <= rtol(BF16)


@pytest.mark.parametrize("page", [16, 32])
@pytest.mark.parametrize("chunk", [1, 40])
def test_paged_small_pages_match_float64_gathered_and_by_per_page_tma(page, chunk):
    """With ``workload.PAGE_GATHER_BELOW`` at 64 (and ``GATHER_MAX_Q`` past the chunk) pages
    16 and 32 are gathered (the default gathers page 16 in decode only); with it at 0 the
    same call runs one TMA load per page (the A/B of benchmarks/varlen.py --ab-page-span):
    both match float64, over ragged contexts ending mid-page."""
    from tiledattention import mods
    from tiledattention.kernel import workload as W
    from tiledattention.kernel.spec import FWD_SEQS
    from tiledattention.kernel.workload_check import check_paged

    names = FWD_SEQS.names()[len(FWD_SEQS.tensors):]
    lens = [1, 37, 1000, 250]
    kc, vc, table = _cache(lens, page, 2, 128, BF16)
    seqlens = torch.tensor(lens, dtype=torch.int32, device="cuda")
    new = [min(chunk, n) for n in lens]
    cq = _cu(new) if chunk > 1 else None
    q = _packed(new, 8, 128, BF16) if chunk > 1 else torch.randn(
        len(lens), 1, 8, 128, device="cuda").to(BF16)
    max_q = max(new) if chunk > 1 else None
    w = check_paged(q, kc, vc, table, seqlens, cq, max_q, True, None, (-1, -1), 0.0)
    ref, _ = paged_reference(q, kc, vc, table, seqlens.cpu(), cu_seqlens_q=None if cq is None
                             else cq.cpu(), causal=True)
    for below in (64, 0):
        kept = W.PAGE_GATHER_BELOW, W.GATHER_MAX_Q
        W.PAGE_GATHER_BELOW, W.GATHER_MAX_Q = below, chunk
        try:
            plan = W.paged_plan(w, q.device, None, mods.NONE, False)
        finally:
            W.PAGE_GATHER_BELOW, W.GATHER_MAX_Q = kept
        tail = plan.launches[0][3]
        assert tail[names.index("PAGE_GATHER")] is (below > 0)  # each path ran
        with torch.no_grad():
            out = W.run_paged(plan, q, kc, vc, table, seqlens, cq)[0]
        assert not out.isnan().any()
        assert relative_error(out, ref) <= rtol(BF16), f"PAGE_GATHER_BELOW={below}"


def test_paged_one_page_and_a_context_the_page_does_not_divide():
    kc, vc, table = _cache([5, 17], 16, 1, 64, BF16, spare=0)
    seqlens = torch.tensor([5, 17], dtype=torch.int32, device="cuda")
    q = torch.randn(2, 1, 4, 64, device="cuda").to(BF16)
    with torch.no_grad():
        out = ta.sdpa_paged(q, kc, vc, table, seqlens)
    ref, _ = paged_reference(q, kc, vc, table, seqlens.cpu())
    assert relative_error(out, ref) <= rtol(BF16)


def test_paged_refuses_out_of_range_pages_before_reading_them():
    kc, vc, table = _cache([40], 16, 1, 64, BF16, spare=0)
    table[0, 1] = 99
    q = torch.randn(1, 1, 1, 64, device="cuda").to(BF16)
    with pytest.raises(ta.InputError, match="outside the cache"):
        ta.sdpa_paged(q, kc, vc, table, torch.tensor([40], dtype=torch.int32, device="cuda"))


@pytest.mark.parametrize("folded", [False, True], ids=["delta-launch", "delta-in-dq"])
@pytest.mark.parametrize("causal", [False, True])
def test_varlen_lse_gradient_enters_delta_on_both_delta_paths(causal, folded, packed_rows,
                                                               monkeypatch):
    """A gradient through the returned log-sum-exp (dlse) on both packed delta paths
    (benchmarks/notes/varlen-paged.md §43b): the delta launch over the packed rows, or
    the packed dQ computing its rows' delta = rowsum(dO * O) - dlse (dlse and O read at
    the sequence's rows, delta stored for its rows only). dq, dk, dv match float64."""
    from tiledattention.kernel import workload as W

    monkeypatch.setattr(W, "PACKED_DQ_DELTA", folded)
    lens, h, d = [300, 1, 0, 129, 64, 700], 4, 64
    q, k, v = (_packed(lens, h, d, BF16).requires_grad_() for _ in range(3))
    cu = _cu(lens)
    out, lse = _poisoned(lambda: ta.sdpa_varlen(q, k, v, cu, cu, max(lens), max(lens),
                                                causal=causal, return_lse=True))
    dout, dlse = torch.randn_like(out), torch.randn_like(lse)
    got = _poisoned(lambda: torch.autograd.grad((out, lse), (q, k, v), (dout, dlse)))
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    r, r_lse = varlen_reference(qd, kd, vd, cu.cpu(), cu.cpu(), causal=causal)
    want = torch.autograd.grad((r * dout.double()).sum() + (r_lse * dlse.double()).sum(),
                               (qd, kd, vd))
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert not g.isnan().any(), f"{name} has NaN"
        err = relative_error(g, w)
        assert err <= rtol_bwd(BF16), f"{name} relative error {err:.3e}"


@pytest.mark.parametrize("d", [64, 128])
def test_varlen_captured_biases_get_gradients_in_both_dkdv_orientations(d):
    """Per-head slopes, a per-key and a per-query bias read by a packed score_mod, each
    with its gradient against float64. D 128 runs the packed dK/dV with keys as the MMA
    rows (benchmarks/notes/varlen-paged.md §43c), where a per-query read is summed over
    the score tile's rows, not its columns (variants.md §45a: this failed to compile)."""
    from tiledattention.reference import delta_rounding_effect
    from tiledattention.tolerance import captured_grad_error

    lens, h = [90, 200, 7, 129], 4
    q, k, v = (_packed(lens, h, d, BF16).requires_grad_() for _ in range(3))
    cu, n = _cu(lens), max(lens)
    slopes = (0.1 * torch.rand(h, device="cuda")).requires_grad_()
    kb = (0.3 * torch.randn(n, device="cuda")).requires_grad_()
    qb = (0.3 * torch.randn(len(lens), n, device="cuda")).requires_grad_()
    s64, kb64, qb64 = (t.detach().double().requires_grad_() for t in (slopes, kb, qb))

    def mod(score, b, h, q_idx, kv_idx):
        return score + slopes[h] * (kv_idx - q_idx) + kb[kv_idx] + qb[b, q_idx]

    def ref(s, b, h, qi, ki):
        return s + s64[h] * (ki - qi) + kb64[ki] + qb64[b, qi]

    out = _poisoned(lambda: ta.sdpa_varlen(q, k, v, cu, cu, n, n, causal=True, score_mod=mod))
    dout = torch.randn_like(out)
    got = _poisoned(lambda: torch.autograd.grad(out, (q, k, v, slopes, kb, qb), dout))
    qd, kd, vd = (t.detach().double().requires_grad_() for t in (q, k, v))
    r, r_lse = varlen_reference(qd, kd, vd, cu.cpu(), cu.cpu(), causal=True, score_ref=ref)
    assert relative_error(out, r) <= rtol(BF16)
    leaves = (s64, kb64, qb64)
    want = torch.autograd.grad((r * dout.double()).sum(), (qd, kd, vd, *leaves),
                               retain_graph=True)
    # delta's rounded O is what a gradient that cancels to 0 (the per-query bias) shows
    shifts = delta_rounding_effect(out.transpose(0, 1), r.transpose(0, 1), r_lse,
                                   dout.transpose(0, 1), list(leaves))
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        assert not g.isnan().any(), f"{name} has NaN"
        assert relative_error(g, w) <= rtol_bwd(BF16), name
    for name, g, w, shift in zip(("slopes", "kb", "qb"), got[3:], want[3:], shifts):
        assert g is not None and torch.isfinite(g).all(), name
        assert captured_grad_error(g, w, shift) <= rtol_bwd(BF16), name


@pytest.mark.parametrize("lens, keys, offsets", [
    ([300, 1, 0, 129, 64, 700], [300, 1, 0, 129, 900, 700], True),
    ([300, 1, 0, 129, 64, 700], [5, 5, 0, 7000, 64, 1], False),
    ([64] * 40, list(range(40)), False)])
def test_the_tile_map_kernel_runs_the_heaviest_sequences_first_as_its_host_mirror(
        lens, keys, offsets):
    # §48a: the sequence-major map, from offsets (full attention: cu_seqlens_k) or values
    # (a paged cache's contexts), is the host's order; past the last tile, (-1, 0)
    from tiledattention.kernel import workload as W
    from tiledattention.kernel.visit import host_sequence_order

    tile = 64
    weights = _cu(keys) if offsets else torch.tensor(keys, dtype=torch.int32, device="cuda")
    tmap = W.tile_map(_cu(lens), sum(lens), tile, 64, weights=weights,
                      offsets=offsets).tolist()
    want = host_sequence_order(lens, tile, weights=keys)
    assert [tuple(e) for e in tmap[:len(want)]] == want
    assert all(e == [-1, 0] for e in tmap[len(want):])


@pytest.mark.parametrize("causal", [False, True])
def test_the_launch_order_changes_no_output_or_gradient_bit(causal, monkeypatch):
    # §48a: only which program starts when changes, not what any program computes; packed
    # forward+backward and paged chunked prefill, every order switch off and on
    from tiledattention.kernel import workload as W

    lens = [300, 1, 0, 129, 64, 700, 2000]
    q, k, v = (_packed(lens, 8, 128, BF16).requires_grad_() for _ in range(3))
    dout = _packed(lens, 8, 128, BF16)
    cu = _cu(lens)
    kc, vc, table = _cache([3000, 64, 1201], 64, 2, 128, BF16)
    seqlens = torch.tensor([3000, 64, 1201], dtype=torch.int32, device="cuda")
    new = [512, 64, 7]
    qp = _packed(new, 8, 128, BF16)
    got = {}
    for on in (False, True):
        for switch in ("PAGED_HEAVY_FIRST", "VARLEN_HEAD_BLOCKS", "VARLEN_BWD_HEAD_BLOCKS",
                       "VARLEN_HEAVY_MAP"):
            monkeypatch.setattr(W, switch, on)
        out = ta.sdpa_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=causal)
        grads = torch.autograd.grad(out, (q, k, v), dout)
        with torch.no_grad():
            prefill = ta.sdpa_paged(qp, kc, vc, table, seqlens, cu_seqlens_q=_cu(new),
                                    max_seqlen_q=512, causal=causal)
        got[on] = (out, *grads, prefill)
    for name, a, b in zip(("out", "dq", "dk", "dv", "prefill"), got[False], got[True]):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("block", [1, 2, 4, 8])
def test_every_block_of_heads_runs_the_same_bits(block, monkeypatch):
    # §48a: the per-call block (``varlen_head_block``) only reorders the programs; forced
    # to each size here (GQA 8/4: the dK/dV blocks hold 1..2 K/V heads)
    from tiledattention.kernel import workload as W

    lens = [300, 1, 0, 129, 64, 700, 2000]
    q = _packed(lens, 8, 64, BF16).requires_grad_()
    k, v = (_packed(lens, 4, 64, BF16).requires_grad_() for _ in range(2))
    dout = _packed(lens, 8, 64, BF16)
    cu = _cu(lens)

    def run():
        out = ta.sdpa_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=True)
        return (out, *torch.autograd.grad(out, (q, k, v), dout))

    monkeypatch.setattr(W, "VARLEN_HEAD_BLOCKS", False)
    monkeypatch.setattr(W, "VARLEN_BWD_HEAD_BLOCKS", False)
    want = run()
    monkeypatch.setattr(W, "VARLEN_HEAD_BLOCKS", True)
    monkeypatch.setattr(W, "VARLEN_BWD_HEAD_BLOCKS", True)
    monkeypatch.setattr(W, "varlen_head_block", lambda hq, hk, nbytes: block)
    for name, a, b in zip(("out", "dq", "dk", "dv"), want, run()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("causal", [False, True])
def test_whole_array_forward_loads_change_no_output_bit(causal, monkeypatch):
    # §51d-§51e: only where the rows come from changes (the next sequence's, or TMA zeros
    # past the array, instead of a per-sequence tensor map's zeros; scattered, how Out's
    # rows are stored), and those rows are masked
    # keys (P = 0 and, in the last tile, V read through its slice) or query rows never
    # stored. Packed forward with lse, seqused_k, a window and softcap, GQA; chunked
    # prefill at a gathered and a TMA page size. Rows past the packed sequences hold NaN.
    from tiledattention.kernel import workload as W

    lens, keys = [300, 1, 0, 129, 64, 700, 2000], [300, 1, 5, 200, 64, 700, 2100]
    q = torch.cat([_packed(lens, 8, 128, BF16), torch.full((50, 8, 128), math.nan,
                                                          device="cuda", dtype=BF16)])
    k, v = (torch.cat([_packed(keys, 2, 128, BF16), torch.full((70, 2, 128), math.nan,
                                                             device="cuda", dtype=BF16)])
            for _ in range(2))
    used = torch.tensor([299, 1, 0, 129, 10, 700, 2050], dtype=torch.int32, device="cuda")
    kc, vc, table = _cache([3000, 64, 1201], 16, 2, 128, BF16)
    kc64, vc64, table64 = _cache([3000, 64, 1201], 64, 2, 128, BF16)
    seqlens = torch.tensor([3000, 64, 1201], dtype=torch.int32, device="cuda")
    new = [512, 64, 7]
    qp = _packed(new, 8, 128, BF16)
    got = {}
    for arm in ("sliced", "whole", "scatter"):
        monkeypatch.setattr(W, "PACKED_FWD_WHOLE", arm != "sliced")
        monkeypatch.setattr(W, "PACKED_FWD_SCATTER_OUT", arm == "scatter")
        with torch.no_grad():
            got[arm] = (
                *ta.sdpa_varlen(q, k, v, _cu(lens), _cu(keys), max(lens), max(keys),
                                causal=causal, return_lse=True),
                ta.sdpa_varlen(q, k, v, _cu(lens), _cu(keys), max(lens), max(keys),
                               causal=causal, seqused_k=used),
                ta.sdpa_varlen(q, k, v, _cu(lens), _cu(keys), max(lens), max(keys),
                               causal=causal, window_size=(128, 0), softcap=30.0),
                ta.sdpa_paged(qp, kc, vc, table, seqlens, cu_seqlens_q=_cu(new),
                              max_seqlen_q=512, causal=causal),
                ta.sdpa_paged(qp, kc64, vc64, table64, seqlens, cu_seqlens_q=_cu(new),
                              max_seqlen_q=512, causal=causal))
    rows = sum(lens)
    for arm in ("whole", "scatter"):
        for name, a, b in zip(("out", "lse", "seqused", "window-softcap", "prefill16",
                               "prefill64"), got["sliced"], got[arm]):
            if name in ("out", "seqused", "window-softcap"):
                a, b = a[:rows], b[:rows]
            elif name == "lse":
                a, b = a[:, :rows], b[:, :rows]
            assert not b.isnan().any(), (arm, name)
            assert torch.equal(a, b), (arm, name)


@pytest.mark.parametrize("causal", [False, True])
def test_scattered_gradient_stores_change_no_gradient_bit(causal, monkeypatch):
    # §51f: dK, dV and dQ stored by masked scatters into the whole arrays instead of
    # through per-sequence slices: the same values in the same rows, every covered row
    # written (gradients allocated empty, poisoned here), rows no sequence covers still
    # zeroed by the tile map's launch. GQA, D 64 and 128, empty and one-token sequences.
    from tiledattention.kernel import workload as W

    lens, extra = [300, 1, 0, 129, 64, 700, 2000], 37
    got = {}
    for d in (64, 128):
        q = torch.randn(sum(lens) + extra, 8, d, device="cuda").to(BF16).requires_grad_()
        k, v = (torch.randn(sum(lens) + extra, 2, d, device="cuda").to(BF16).requires_grad_()
                for _ in range(2))
        cu = _cu(lens)
        out = ta.sdpa_varlen(q, k, v, cu, cu, max(lens), max(lens), causal=causal)
        dout = torch.randn_like(out)
        for scatter in (False, True):
            monkeypatch.setattr(W, "PACKED_BWD_SCATTER_OUT", scatter)
            got[d, scatter] = _poisoned(functools.partial(
                torch.autograd.grad, out, (q, k, v), dout, retain_graph=True))
        for name, a, b in zip(("dq", "dk", "dv"), got[d, False], got[d, True]):
            assert not b.isnan().any(), (d, name)
            assert torch.equal(a, b), (d, name)
