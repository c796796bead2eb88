"""Variant numerics without a GPU: the kernels that FlexAttention's masking idiom (a
score_mod returning -inf), relative biases at untiled lengths and integer index arithmetic
run through compile with tileiras, forward and backward (tests/gpu/test_variant_numerics_gpu.py
checks their values on the GPU); the float64 reference defines fully masked rows."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tiledattention.reference import naive_attention

NEG_INF = -math.inf


def test_the_reference_gives_fully_masked_rows_zeros_and_lse_minus_inf():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))

    def score_ref(s, b, h, q_idx, kv_idx):  # rows 0..2 see no key at all
        return s.masked_fill((q_idx < 3) & (kv_idx >= 0), NEG_INF)

    out, lse = naive_attention(q, k, v, score_ref=score_ref)
    assert torch.equal(out[:, :, :3], torch.zeros_like(out[:, :, :3]))
    assert torch.isneginf(lse[:, :, :3]).all() and torch.isfinite(lse[:, :, 3:]).all()
    assert torch.isfinite(out).all()


def test_the_references_autograd_gives_fully_masked_rows_finite_zero_gradients():
    # A dead row's dO above 4 used to make autograd's d out / d (P V) = dO / tiny inf,
    # and dV = P^T (that) 0 * inf = NaN: nan_to_num then zeroed whole columns of the
    # reference dV (the GPU tests' "6-10 % dV error" on dead rows).
    from tiledattention.reference import attention_backward

    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 16, dtype=torch.float64, requires_grad=True)
               for n in (40, 24, 24))
    keep = torch.arange(40)[:, None] < 30  # rows 30.. see no key
    dout = torch.randn(2, 2, 40, 16, dtype=torch.float64)
    dout[:, :, 35] = 8.0
    out, lse = naive_attention(q, k, v, keep_ref=lambda b, h, qi, ki: keep & (ki >= 0))
    (out * dout).sum().backward()
    want = attention_backward(q, k, v, dout, attn_mask=keep.expand(40, 24))
    for got, w in zip((q.grad, k.grad, v.grad), want):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, w)
    assert (q.grad[:, :, 30:] == 0).all()


def test_torch_softmax_of_a_row_holding_plus_inf_is_nan():
    # The semantics the kernels keep for a score_mod returning +inf (documented in body).
    assert torch.isnan(torch.softmax(torch.tensor([math.inf, 1.0]), -1)).all()


# ----------------------------------------------------------------------------- compiles
ct = pytest.importorskip("cuda.tile", reason="cuTile not installed")

from tiledattention import mods as M  # noqa: E402
from tiledattention.kernel.compile import export_bwd_cubins, export_cubin  # noqa: E402
from tiledattention.kernel.toolchain import tileiras_path  # noqa: E402
from tiledattention.kernel.variant import BwdVariant, Flags, Variant  # noqa: E402
from tiledattention.mods import derivative  # noqa: E402
from tiledattention.schedules.backward import default_bwd_schedule  # noqa: E402
from tiledattention.schedules.schedule import Schedule, default_schedule  # noqa: E402

_needs_tileiras = pytest.mark.skipif(tileiras_path() is None, reason="tileiras not found")

_DOC = torch.zeros(333, dtype=torch.int32)
_POS = torch.arange(333, dtype=torch.int64)
_VALID = torch.ones(2, 333, dtype=torch.bool)


def inverse_causal(score, b, h, q_idx, kv_idx):
    return ct.where(q_idx <= kv_idx, score, NEG_INF)


def document_inf(score, b, h, q_idx, kv_idx):
    return ct.where(_DOC[q_idx] == _DOC[kv_idx], score, NEG_INF)


def sequence_mask(score, b, h, q_idx, kv_idx):
    return ct.where(_VALID[b, kv_idx], score, NEG_INF)


def relative_bias(score, b, h, q_idx, kv_idx):
    return score + (q_idx - kv_idx)


def integer_terms(score, b, h, q_idx, kv_idx):
    # int / int is true division (float), // floors, an int64 tensor read mixes with fp32
    return score + (q_idx - kv_idx) / 64 + (q_idx // 64 - kv_idx // 64) + _POS[kv_idx] * 0.001


_SCALE64 = torch.ones(4, dtype=torch.float64)


def float64_gate(score, b, h, q_idx, kv_idx):  # float64 arithmetic: the score is f64
    return score * _SCALE64[h] + (q_idx - kv_idx) * 0.5


def _aux(mods):
    dt = {torch.float32: ct.float32, torch.int32: ct.int32, torch.int64: ct.int64,
          torch.float64: ct.float64,
          torch.bool: ct.bool_, torch.float16: ct.float16}
    return tuple((dt[t.dtype], t.dim()) for t in mods.tensors())


def _compile_both(score, d=64, causal=False, split_k=False, even=False):
    mods = M.mods_for(score, None)
    assert mods.grad_error is None, mods.grad_error
    aux = _aux(mods)
    flags = Flags("float16", d, causal, mods=mods.key, has_score_mod=True)
    fwd = export_cubin(Variant("float16", d, causal, Schedule(64, 64, 2) if split_k else
                               default_schedule(d, causal), even_n=even, return_lse=True,
                               split_k=split_k, flags=flags), "sm_90", mods=mods, aux=aux)
    assert fwd.cubin[:4] == b"\x7fELF"
    if split_k:
        return
    bwd = export_bwd_cubins(BwdVariant("float16", d, causal, default_bwd_schedule(d, causal),
                                       even_n=even, flags=flags), "sm_90", mods=mods, aux=aux)
    assert all(c[:4] == b"\x7fELF" for c in bwd.values())


@pytest.mark.compile
@_needs_tileiras
@pytest.mark.parametrize("score", [inverse_causal, relative_bias, integer_terms,
                                   float64_gate],
                         ids=lambda f: f.__name__)
def test_minus_inf_relative_and_integer_score_mods_compile_forward_and_backward(score):
    _compile_both(score)


@pytest.mark.compile
@_needs_tileiras
@pytest.mark.parametrize("score", [document_inf, sequence_mask], ids=lambda f: f.__name__)
def test_captured_int_and_bool_masks_through_the_score_compile(score):
    _compile_both(score, d=128, causal=True)


@pytest.mark.compile
@_needs_tileiras
def test_a_split_k_forward_with_a_minus_inf_score_mod_compiles():
    _compile_both(inverse_causal, split_k=True)


# ----------------------------------------------------------------------------- captured grads
_BIAS = torch.zeros(4, 333, 333, requires_grad=True)
_SLOPES = torch.rand(4, requires_grad=True)
_GATE = torch.ones(4, requires_grad=True)
_KB = torch.zeros(333, requires_grad=True)
_QB = torch.zeros(2, 333, requires_grad=True)
_HEAD = torch.zeros(4, dtype=torch.float16, requires_grad=True)


def learnable(score, b, h, q_idx, kv_idx):
    return score * _GATE[h] + _SLOPES[h] * (kv_idx - q_idx) + _KB[kv_idx] + _QB[b, q_idx]


def head_bias(score, b, h, q_idx, kv_idx):  # FlexAttention's test_head_bias_req_grad
    return score + _HEAD[h]


def query_bias(score, b, h, q_idx, kv_idx):
    return score + _QB[b, q_idx]


def full_bias(score, b, h, q_idx, kv_idx):
    """A docstring and an assignment: still one expression to differentiate."""
    x = score + _BIAS[h, q_idx, kv_idx]
    return ct.tanh(x / 30.0) * 30.0


def _slots(mods) -> dict[str, int]:
    return {name: i for i, (name, _) in enumerate(mods.score_mod.cells)}


def test_each_read_is_summed_over_the_axes_its_index_does_not_use():
    mods = M.mods_for(learnable, None)
    src = M.with_captured_grads(mods, (True,) * 4).captured_grad.key[1]
    slot = _slots(mods)
    lines = {n: next(ln for ln in src.splitlines() if f"atomic_add(_ta_grad{i}," in ln)
             for n, i in slot.items()}
    assert "(h,)" in lines["_GATE"] and "axis" not in lines["_GATE"]  # one scalar a tile
    assert "_ta_ds * score" in lines["_GATE"]
    assert "(kv_idx - q_idx)" in lines["_SLOPES"] and "axis" not in lines["_SLOPES"]
    # per key: summed over the queries' axis, per query over the keys': each axis read from
    # the other index's tile ([M, 1] / [1, N] with queries as the rows, [1, M] / [N, 1]
    # with keys as the rows: KEY_ROWS)
    assert "(kv_idx,)" in lines["_KB"] and "axis=0 if q_idx.shape[0] > 1 else 1" in lines["_KB"]
    assert "(b, q_idx)" in lines["_QB"] and "axis=0 if kv_idx.shape[0] > 1 else 1" in lines["_QB"]
    assert all("RELAXED" in ln for ln in lines.values())


def test_a_constant_derivative_is_summed_over_the_whole_tile_or_each_row():
    # d/d T[idx] = 1: ds itself, one fp32 scalar per tile for bias[h] (an fp16 tensor:
    # its fp32 accumulator gets the sum), one per row (a [TILE_M, 1] tile matching the
    # [TILE_M, 1] q_idx) for qb[b, q_idx]; atomic_add's default bounds check drops the
    # padded rows past Sq.
    src = M.with_captured_grads(M.mods_for(head_bias, None), (True,)).captured_grad.key[1]
    line = next(ln for ln in src.splitlines() if "atomic_add" in ln)
    assert "atomic_add(_ta_grad0, (h,), _ta_ct.sum(_ta_ct.astype(_ta_ds * 1.0, " \
        "_ta_ct.float32)), memory_order" in line
    assert "check_bounds" not in src
    src = M.with_captured_grads(M.mods_for(query_bias, None), (True,)).captured_grad.key[1]
    line = next(ln for ln in src.splitlines() if "atomic_add" in ln)
    assert "(b, q_idx), _ta_ct.sum(_ta_ct.astype(_ta_ds * 1.0, _ta_ct.float32), " \
        "axis=0 if kv_idx.shape[0] > 1 else 1, keepdims=True)" in line


def test_only_the_tensors_that_need_a_gradient_are_accumulated():
    mods = M.mods_for(learnable, None)
    slot = _slots(mods)
    needs = tuple(name == "_KB" for name in sorted(slot, key=slot.get))
    src = M.with_captured_grads(mods, needs).captured_grad.key[1]
    assert src.count("atomic_add") == 1 and f"atomic_add(_ta_grad{slot['_KB']}," in src
    assert M.with_captured_grads(mods, (False,) * 4) is mods


def test_a_full_bias_under_tanh_in_a_multi_statement_body_is_differentiated_elementwise():
    src = M.with_captured_grads(M.mods_for(full_bias, None), (True,)).captured_grad.key[1]
    assert "(h, q_idx, kv_idx)" in src and "sum" not in src and "tanh" in src


def test_the_symbolic_derivative_covers_the_torch_ops_a_mod_uses():
    import ast

    cases = {"ct.where(score > 0, score, 0.1 * score)": "ct.where(score > 0, 1.0, 0.1)",
             "ct.maximum(score, 0.0)": "ct.where(score >= 0.0, 1.0, 0.0)",
             "ct.log(score)": "1.0 / score", "score / (2.0 + score)": None,
             "score ** 2": "2.0 * score ** 1", "ct.sin(score)": "ct.cos(score)"}
    for src, want in cases.items():
        d = derivative._d(ast.parse(src, mode="eval").body, "score")
        assert d is not None, src
        if want is not None:
            assert ast.unparse(d) == want, (src, ast.unparse(d))


def test_the_rules_only_the_translated_ops_need_and_their_keyword_refusal():
    """``_d_more``: tan, rsqrt and pow by a constant exponent (the rest of its old table was
    unreachable behind ``_d_call``); a keyword on them is refused, on sin it is kept."""
    import ast

    cases = {"ct.tan(score)": "1.0 + ct.tan(score) * ct.tan(score)",
             "ct.rsqrt(score)": "-0.5 * ct.rsqrt(score) / score",
             "ct.pow(score, 3.0)": "3.0 * _ta_ct.pow(score, 3.0 - 1.0)",
             "ct.tan(score, flush_to_zero=True)": None, "ct.pow(2.0, score)": None,
             "ct.sin(score, flush_to_zero=True)": "ct.cos(score)"}
    for src, want in cases.items():
        d = derivative._d(ast.parse(src, mode="eval").body, "score")
        assert (None if d is None else ast.unparse(d)) == want, src


def test_a_captured_tensor_read_where_the_derivative_cannot_follow_is_refused_typed():
    def opaque(score, b, h, q_idx, kv_idx):
        return score + ct.floor(_KB[kv_idx])

    with pytest.raises(M.VariantError, match="_KB.*requires grad"):
        M.with_captured_grads(M.mods_for(opaque, None), (True,))


@pytest.mark.compile
@_needs_tileiras
@pytest.mark.parametrize("key_rows", [False, True], ids=["query-rows", "key-rows"])
@pytest.mark.parametrize("score", [learnable, full_bias, head_bias, query_bias],
                         ids=lambda f: f.__name__)
def test_the_captured_gradient_backward_compiles(score, key_rows):
    # both dK/dV orientations: with keys as the MMA rows (the variants' and the packed
    # backward's schedule at D 128) a per-query read is summed over the tile's rows
    mods = M.mods_for(score, None)
    bwd_mods = M.with_captured_grads(mods, (True,) * len(mods.tensors()))
    aux = tuple((*a, True) for a in _aux(mods))
    flags = Flags("bfloat16", 128, True, mods=bwd_mods.key, has_score_mod=True)
    schedule = dataclasses.replace(default_bwd_schedule(128, True), key_rows=key_rows)
    bwd = export_bwd_cubins(BwdVariant("bfloat16", 128, True, schedule,
                                       flags=flags), "sm_90", mods=bwd_mods, aux=aux)
    assert all(c[:4] == b"\x7fELF" for c in bwd.values())
    assert b"attention_bwd_dkdv" in bwd["attention_bwd_dkdv_variant"]


# ----------------------------------------------------------------------------- autograd wiring
class _FakeKernels:
    """The eager path's plan, launch and backward replaced by stand-ins on the CPU: what
    is checked is the autograd wiring around them (which tensors get which gradient)."""

    def __init__(self, monkeypatch):
        from types import SimpleNamespace

        from tiledattention import api

        self.launched, self.captured = 0, None
        monkeypatch.setattr(api, "plan_for", lambda *a, **k: SimpleNamespace(
            variant=SimpleNamespace(causal=False), scale=1.0))
        monkeypatch.setattr(api, "launch", self.launch)
        monkeypatch.setattr(api, "bwd_plan_for", lambda *a, **k: None)
        monkeypatch.setattr(api, "run_backward", self.run_backward)

    def launch(self, plan, q, k, v, attn_mask, fresh_lse=True, aux=()):
        self.launched += 1
        return q * 1.0, torch.zeros(q.shape[:3])

    def run_backward(self, plan, q, k, v, out, lse, dout, dlse, *args, aux=(), captured=(),
                     **kw):
        self.captured = captured
        for i, g in enumerate(captured):
            if g is not None:
                g.fill_(float(i + 1))
        return dout, torch.zeros_like(k), torch.zeros_like(v)


def test_captured_tensors_that_require_grad_get_theirs_in_their_dtype(monkeypatch):
    import tiledattention as ta

    fake = _FakeKernels(monkeypatch)
    slopes = torch.rand(4, dtype=torch.bfloat16, requires_grad=True)
    fixed = torch.rand(4)  # no grad wanted: no buffer, no atomics
    gate = torch.ones(4, requires_grad=True)

    def mod(score, b, h, q_idx, kv_idx):
        return score * gate[h] + slopes[h] * (kv_idx - q_idx) + fixed[h]

    q = torch.randn(1, 4, 8, 64)  # q, k, v need no gradient: the captured ones make it
    ta.sdpa(q, q, q, score_mod=mod).sum().backward()
    slot = _slots(M.mods_for(mod, None))
    assert fake.captured[slot["fixed"]] is None
    for t, name in ((slopes, "slopes"), (gate, "gate")):
        assert t.grad is not None and t.grad.dtype == t.dtype, name
        assert torch.equal(t.grad, torch.full_like(t, slot[name] + 1.0)), name


def test_a_captured_tensor_only_a_mask_mod_reads_gets_none_as_in_torch(monkeypatch):
    import tiledattention as ta

    fake = _FakeKernels(monkeypatch)
    lengths = torch.tensor([5.0], requires_grad=True)
    q = torch.randn(1, 2, 8, 64, requires_grad=True)
    ta.sdpa(q, q, q, mask_mod=lambda b, h, q_idx, kv_idx: kv_idx < lengths[b]).sum().backward()
    assert lengths.grad is None and q.grad is not None and fake.captured == ()


def test_an_underivable_captured_read_is_refused_before_anything_runs(monkeypatch):
    import tiledattention as ta

    fake = _FakeKernels(monkeypatch)
    kb = torch.zeros(8, requires_grad=True)

    def floored(score, b, h, q_idx, kv_idx):
        return score + ct.floor(kb[kv_idx])

    with pytest.raises(M.VariantError, match="'kb' requires grad"):
        ta.sdpa(torch.randn(1, 1, 8, 64), torch.randn(1, 1, 8, 64), torch.randn(1, 1, 8, 64),
                score_mod=floored)
    assert fake.launched == 0
    with torch.no_grad():  # no gradient wanted: it runs
        ta.sdpa(torch.randn(1, 1, 8, 64), torch.randn(1, 1, 8, 64), torch.randn(1, 1, 8, 64),
                score_mod=floored)
    assert fake.launched == 1


class _TorchTile:
    """torch in place of cuTile for running a generated captured-gradient function on the
    CPU: gather is indexing, atomic_add is index_put_ with accumulation."""

    float32 = torch.float64
    MemoryOrder = type("MemoryOrder", (), {"RELAXED": "relaxed"})
    where, tanh, exp = staticmethod(torch.where), staticmethod(torch.tanh), staticmethod(
        torch.exp)

    @staticmethod
    def _index(idx):
        idx = idx if isinstance(idx, tuple) else (idx,)
        return tuple(torch.as_tensor(i) for i in idx)

    def gather(self, array, idx):
        return array[self._index(idx)]

    def atomic_add(self, array, idx, value, memory_order=None):
        idx = torch.broadcast_tensors(*self._index(idx), torch.as_tensor(value))
        array.index_put_(idx[:-1], idx[-1].to(array.dtype), accumulate=True)

    @staticmethod
    def sum(x, axis=None, keepdims=False):
        return x.sum() if axis is None else x.sum(axis, keepdim=keepdims)

    @staticmethod
    def astype(x, dtype):
        return torch.as_tensor(x).to(dtype)


def squared_bias(score, b, h, q_idx, kv_idx):  # one tensor read twice, one read nested
    return score + _KB[kv_idx] * (_KB[kv_idx] + score)


_REFERENCES = {  # each mod in torch, its captured tensors from ``t``
    learnable: lambda s, b, h, q, kv, t: (s * t["_GATE"][h] + t["_SLOPES"][h] * (kv - q)
                                          + t["_KB"][kv] + t["_QB"][b, q]),
    full_bias: lambda s, b, h, q, kv, t: torch.tanh((s + t["_BIAS"][h, q, kv]) / 30.0) * 30.0,
    head_bias: lambda s, b, h, q, kv, t: s + t["_HEAD"][h],
    query_bias: lambda s, b, h, q, kv, t: s + t["_QB"][b, q],
    squared_bias: lambda s, b, h, q, kv, t: s + t["_KB"][kv] * (t["_KB"][kv] + s),
}


@pytest.mark.parametrize("fn", list(_REFERENCES), ids=lambda f: f.__name__)
def test_the_generated_captured_gradient_equals_torch_autograd_on_a_tile(fn):
    """The generated function run over one [5, 7] tile (torch standing in for cuTile)
    against torch autograd of the same mod: every read, reduction and index."""
    mods = M.mods_for(fn, None)
    slot = _slots(mods)
    names = sorted(slot, key=slot.get)
    bwd = M.with_captured_grads(mods, (True,) * len(names))
    shim = _TorchTile()
    scope = {**bwd.captured_grad.fn.__globals__, "_ta_ct": shim, "ct": shim}
    exec(compile(bwd.captured_grad.key[1], "<test>", "exec"), scope)  # noqa: S102
    torch.manual_seed(1)
    values = {n: (globals()[n].detach() + 0.3 * torch.randn_like(globals()[n])).double()
              for n in names}
    score, ds = torch.randn(5, 7, dtype=torch.float64), torch.randn(5, 7, dtype=torch.float64)
    b, h, q_idx, kv_idx = 1, 2, torch.arange(5)[:, None] + 3, torch.arange(7)[None, :] + 11
    grads = {n: torch.zeros_like(values[n]) for n in names}
    pad = [None] * (4 - len(names))
    scope["score_capgrad"](score, b, h, q_idx, kv_idx, *(values[n] for n in names), *pad,
                           *(grads[n] for n in names), *pad, ds)
    leaves = {n: values[n].clone().requires_grad_() for n in names}
    ref = _REFERENCES[fn](score, b, h, q_idx, kv_idx, leaves)
    want = torch.autograd.grad((ref * ds).sum(), [leaves[n] for n in names])
    for n, w in zip(names, want):
        assert grads[n].abs().sum() > 0, n
        assert torch.allclose(grads[n], w, atol=1e-10), n


@pytest.mark.compile
@_needs_tileiras
def test_captured_gradients_compile_with_a_block_sparse_mask_mod_and_atomic_dq():
    from tiledattention.schedules.backward import BwdSchedule

    def doc_mask(b, h, q_idx, kv_idx):
        return _DOC[q_idx] == _DOC[kv_idx]

    mods = M.mods_for(full_bias, doc_mask)
    n_score = len(mods.score_mod.cells)
    bwd_mods = M.with_captured_grads(mods, (True,) * n_score + (False,))
    aux = tuple((*a, i < n_score) for i, a in enumerate(_aux(mods)))
    flags = Flags("float16", 64, False, mods=bwd_mods.key, has_score_mod=True,
                  has_mask_mod=True, block_axes=(False, False))
    bwd = export_bwd_cubins(BwdVariant("float16", 64, False, BwdSchedule(dq="atomic"),
                                       flags=flags), "sm_90", mods=bwd_mods, aux=aux)
    assert all(c[:4] == b"\x7fELF" for c in bwd.values())


def test_the_ops_variant_registry_is_bounded_by_value_and_never_reuses_a_key():
    import gc

    from tiledattention import api
    from tiledattention.kernel.blockmask import BlockMask

    mods = M.mods_for(inverse_causal, None)
    keys, ids = [], []
    for i in range(api.MAX_VARIANTS + 300):  # a new block mask per step, each dropped
        block = BlockMask(None, None, None, 64 + i, 64, torch.device("cpu"))
        keys.append(api._variant_key(mods, block))
        ids.append(id(block))
        del block
        gc.collect(0)
    assert len(api._variants) <= api.MAX_VARIANTS
    assert len(set(ids)) < len(ids)  # freed masks' ids came back (evicted ones are freed)
    assert len(set(keys)) == len(keys)  # their keys did not
    assert api._entry(keys[-1])[0] is mods and api._entry("")[1] is None
    same = BlockMask(None, None, None, 64 + len(keys) - 1, 64, torch.device("cpu"))
    assert api._variant_key(mods, same) == keys[-1]  # equal by value: one entry
    with pytest.raises(api.InputError, match="no longer registered"):
        api._entry(keys[0])


def test_a_row_shift_bias_has_zero_exact_gradient_and_a_flash_backward_only_deltas_rounding():
    """What the GPU tests judge captured gradients by (``captured_grad_error``): softmax
    ignores a per-head or per-query bias, so its float64 gradient is ~1e-15; a flash
    backward in fp32 whose delta takes O rounded to fp16 (as the kernels' does) is off by
    exactly ``delta_rounding_effect``, and a tile it dropped is not excused."""
    from tiledattention.reference import delta_rounding_effect
    from tiledattention.tolerance import captured_grad_error, relative_error

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 128, 32).half() for _ in range(3))
    dout = torch.randn(1, 2, 128, 32).half()
    bias = torch.randn(2)
    b64 = bias.double().requires_grad_()
    ref, lse = naive_attention(q, k, v, score_ref=lambda s, b, h, qi, ki: s + b64[h])
    (ref * dout.double()).sum().backward(retain_graph=True)
    s = q.float() @ k.float().transpose(-1, -2) / math.sqrt(32) + bias[None, :, None, None]
    p = torch.softmax(s, -1)
    out = (p @ v.float()).half()
    ds = p * (dout.float() @ v.float().transpose(-1, -2)
              - (dout.float() * out.float()).sum(-1, keepdim=True))
    got = ds.sum((0, 2, 3))
    shift = delta_rounding_effect(out, ref, lse, dout, [b64])[0]
    assert b64.grad.abs().max() < 1e-12 and relative_error(got, b64.grad) > 1e6
    assert torch.allclose(got.double() - b64.grad, shift, rtol=1e-2, atol=1e-6)
    assert captured_grad_error(got, b64.grad, shift) == 0.0
    dropped = ds.clone()
    dropped[:, :, 64:, :64] = 0  # one [64, 64] tile never added
    assert captured_grad_error(dropped.sum((0, 2, 3)), b64.grad, shift) > 1e6
