"""The GPU half of the FlexAttention conformance suite (``tests/flex_conformance.py``):
every case of PyTorch's FlexAttention tests, as written, through ``sdpa`` at the shape
that test uses — forward and every gradient (q, k, v and captured tensors that require
grad) against float64 autograd of the naive formula (``reference.naive_attention``),
judged by the one tolerance table. A case that must be refused must raise a typed error
before anything runs. The last test prints one summary line:

    flex conformance: N ran (fwd+bwd) / F forward-only (gradient refused, typed) /
    M refused (typed) / 0 silently wrong / R refused typed but expected to run /
    0 failed untyped

Run with ``-s`` to see it. Masks go through ``block_mask`` as FlexAttention's do.
``FLEX_SHARD=i/n`` runs every n-th case from the i-th (each case compiles its own
kernels: the whole suite may outlast one 10-minute command), with its own summary line.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import flex_conformance as F  # noqa: E402

import tiledattention as ta  # noqa: E402
from tiledattention.reference import delta_rounding_effect, naive_attention  # noqa: E402
from tiledattention.tolerance import (  # noqa: E402
    captured_grad_error,
    relative_error,
    rtol,
    rtol_bwd,
)

DTYPE = torch.float16
RESULTS: dict[str, str] = {}


def _shard(cases: list) -> list:
    spec = os.environ.get("FLEX_SHARD", "0/1")
    i, n = (int(x) for x in spec.split("/"))
    return cases[i::n]


CASES = _shard(F.CASES)


class SilentlyWrong(AssertionError):
    pass


def _inputs(c: F.Case, grads: bool, seed: int = 0):
    b, hq, hk, sq, sk, d = c.shape
    torch.manual_seed(seed)
    q = torch.randn(b, hq, sq, d, device="cuda").to(DTYPE).requires_grad_(grads)
    k, v = (torch.randn(b, hk, sk, d, device="cuda").to(DTYPE).requires_grad_(grads)
            for _ in range(2))
    return q, k, v


def _call(c: F.Case, made: F.Made, q, k, v):
    b, hq, hk, sq, sk, _ = c.shape
    kw = dict(enable_gqa=hq != hk)
    if c.kind == "score":
        kw["score_mod"] = made.fn
    else:
        kw["block_mask"] = ta.block_mask(made.fn, b, None, sq, sk)
    return ta.sdpa(q, k, v, **kw)


def _call_varlen(c: F.Case, made: F.Made, q, k, v):
    """The case's B sequences packed ([total, H, D], cu_seqlens) through ``sdpa_varlen``:
    its mods see the sequence as ``b`` and positions within it, so the output is the
    dense call's and the same float64 reference judges it."""
    b, hq, hk, sq, sk, d = c.shape

    def packed(t, n):
        return t.transpose(1, 2).reshape(b * n, t.shape[1], d)

    def offsets(n):
        return torch.arange(0, (b + 1) * n, n, dtype=torch.int32, device="cuda")

    kw = {"score_mod" if c.kind == "score" else "mask_mod": made.fn}
    out = ta.sdpa_varlen(packed(q, sq), packed(k, sk), packed(v, sk), offsets(sq),
                         offsets(sk), sq, sk, **kw)
    return out.reshape(b, sq, hq, d).transpose(1, 2)


def _reference(c: F.Case, made: F.Made, q, k, v):
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    refs = {}
    for name, t, slot in made.learnable:
        slot["ref"] = refs[name] = t.detach().double().requires_grad_()
    kw = {"score_ref" if c.kind == "score" else "keep_ref": made.reference}
    out, lse = naive_attention(q64, k64, v64, **kw)
    return out, lse, (q64, k64, v64), refs


def _check(name: str, got, want, tol: float, rounding=None):
    if got is None:
        raise SilentlyWrong(f"{name}: no gradient (None)")
    if not torch.isfinite(got).all():
        raise SilentlyWrong(f"{name}: non-finite values")
    err = relative_error(got, torch.nan_to_num(want)) if rounding is None else \
        captured_grad_error(got, torch.nan_to_num(want), rounding)
    if not err <= tol:
        raise SilentlyWrong(f"{name}: relative error {err:.2e} > {tol:.0e}")


def _run(c: F.Case, call=_call) -> str:
    made = c.make("cuda")
    if c.expect == "refuse":
        q, k, v = _inputs(c, grads=False)
        with pytest.raises(ta.TiledAttentionError):
            call(c, made, q, k, v)
        return "refused"
    grads = c.expect == "run"
    q, k, v = _inputs(c, grads=grads)
    out = call(c, made, q, k, v)
    ref, ref_lse, leaves, refs = _reference(c, made, q, k, v)
    _check("out", out, ref, rtol(DTYPE))
    if not grads:
        qg, kg, vg = _inputs(c, grads=True)
        with pytest.raises(ta.BackwardNotSupportedError):
            call(c, made, qg, kg, vg)
        return "forward"
    dout = torch.randn_like(out)
    out.backward(dout)
    (ref * dout.double()).sum().backward(retain_graph=bool(made.learnable))
    for name, t, r in zip(("dq", "dk", "dv"), (q, k, v), leaves):
        _check(name, t.grad, r.grad, rtol_bwd(DTYPE))
    names = [name for name, _, _ in made.learnable]
    rounding = delta_rounding_effect(out, ref, ref_lse, dout, [refs[n] for n in names]) \
        if names else []
    for (name, t, _), shift in zip(made.learnable, rounding):
        # test_head_bias_req_grad: the exact gradient of a per-head bias is 0 (softmax
        # ignores a row shift); judged beyond what delta's rounded O explains, as
        # FlexAttention's test judges it against a low-precision reference's error.
        _check(f"d{name}", t.grad, refs[name].grad, rtol_bwd(DTYPE), shift)
    return "ran"


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.name)
def test_flexattention_case_runs_as_written_or_is_refused_typed(c):
    try:
        RESULTS[c.name] = _run(c)
    except SilentlyWrong as exc:
        RESULTS[c.name] = "silently wrong"
        pytest.fail(f"{c.name} ({c.source}) silently wrong: {exc}")
    except ta.TiledAttentionError:  # typed, but the case should have run
        RESULTS[c.name] = "refused unexpectedly"
        raise
    except Exception:
        RESULTS[c.name] = "failed"
        raise
    finally:
        torch.cuda.empty_cache()


@pytest.mark.parametrize("c", CASES, ids=lambda c: c.name)
def test_flexattention_case_through_sdpa_varlen_matches_the_dense_reference(c):
    """The same case with its batch packed (issue 46: the mods see per-sequence indices):
    forward and every gradient, or the same typed refusal."""
    try:
        _run(c, _call_varlen)
    except SilentlyWrong as exc:
        pytest.fail(f"{c.name} ({c.source}) through sdpa_varlen silently wrong: {exc}")
    finally:
        torch.cuda.empty_cache()


def test_changed_closure_constant_reaches_the_kernels():
    """test_recompile_changed_score_mod: ``qk + 1`` then ``qk * 1``; softmax cannot tell
    them apart, the log-sum-exp can (it moves by exactly 1)."""
    c = F.by_name()["changed_branch"]
    made = c.make("cuda")
    q, k, v = _inputs(c, grads=False)
    _, lse_add = ta.sdpa(q, k, v, score_mod=made.fn, return_lse=True)
    made.fn.flip()  # ADD = False
    _, lse_mul = ta.sdpa(q, k, v, score_mod=made.fn, return_lse=True)
    _, want = naive_attention(q, k, v)
    assert torch.allclose(lse_mul.double(), want, atol=1e-2)
    assert torch.allclose(lse_add.double(), want + 1, atol=1e-2)


def test_zz_summary_line():
    counts = {k: sum(v == k for v in RESULTS.values()) for k in (
        "ran", "forward", "refused", "silently wrong", "refused unexpectedly", "failed")}
    print(f"\nflex conformance: {counts['ran']} ran (fwd+bwd) / {counts['forward']} "
          f"forward-only (gradient refused, typed) / {counts['refused']} refused (typed) / "
          f"{counts['silently wrong']} silently wrong / {counts['refused unexpectedly']} "
          f"refused typed but expected to run / {counts['failed']} failed untyped "
          f"(of {len(F.CASES)} cases, {len(RESULTS)} run, FLEX_SHARD="
          f"{os.environ.get('FLEX_SHARD', '0/1')})")
    assert counts["silently wrong"] == 0
