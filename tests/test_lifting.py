"""Lifting a user's score_mod / mask_mod (issue 36 items 3-4, issue 38's API bullets): one
identity (globals and helpers by value), the source checked against the code that runs,
every refusal a VariantError at lift time naming the user's file and line, torch ops and
multi-statement bodies translated, and the variant registry bounded."""

from __future__ import annotations

import functools
import importlib
import math
import sys
import textwrap
import time

import pytest
import torch

pytest.importorskip("cuda.tile", reason="cuTile not installed: pip install 'cuda-tile[tileiras]'")

import cuda.tile as ct  # noqa: E402

import tiledattention as ta  # noqa: E402
from tiledattention import api, variants  # noqa: E402
from tiledattention import mods as M  # noqa: E402

HERE = __file__
W = 128


def window_mask(b, h, q_idx, kv_idx):
    return q_idx - kv_idx < W


def _src(mods, part="mask_mod") -> str:
    return getattr(mods, part).key[1]


def _line_of(fn, offset=1) -> str:
    return f"{HERE}:{fn.__code__.co_firstlineno + offset}"


def test_a_changed_global_is_a_new_variant():
    global W
    first = M.mods_for(None, window_mask)
    try:
        W = 4096
        second = M.mods_for(None, window_mask)
    finally:
        W = 128
    assert "128" in _src(first) and "4096" in _src(second) and first.key != second.key
    assert M.mods_for(None, window_mask).key == first.key  # back to 128: the first one


def test_a_global_read_by_a_helper_is_part_of_the_identity_too():
    global W

    def mask(b, h, q_idx, kv_idx):
        return window_mask(b, h, q_idx, kv_idx) & (kv_idx <= q_idx)

    first = M.mods_for(None, mask)
    try:
        W = 7
        assert "7" in _src(M.mods_for(None, mask)) and "128" in _src(first)
    finally:
        W = 128


def test_a_functools_wraps_decorator_is_refused_not_dropped():
    def double(f):
        @functools.wraps(f)
        def wrapper(score, b, h, q_idx, kv_idx):
            return 2 * f(score, b, h, q_idx, kv_idx)
        return wrapper

    @double
    def plain(score, b, h, q_idx, kv_idx):
        return score

    with pytest.raises(ta.VariantError, match=r"test_lifting\.py:\d+: .*decorator.*undecorated"):
        M.mods_for(plain, None)


def test_a_decorator_that_returns_the_function_itself_is_lifted():
    def register(f):
        return f

    @register
    def plain(score, b, h, q_idx, kv_idx):
        return score * 2

    assert "score * 2" in _src(M.mods_for(plain, None), "score_mod")


def test_a_lambda_on_a_continuation_line_is_lifted():
    mods = M.mods_for(None,
                      lambda b, h, q_idx, kv_idx: q_idx >= kv_idx)
    assert "q_idx >= kv_idx" in _src(mods)
    pair = variants.and_masks(lambda b, h, q, k: q >= k, lambda b, h, q, k: q - k < 64)
    assert "(q_idx >= kv_idx) & (q_idx - kv_idx < 64)" in _src(M.mods_for(None, pair))


def test_an_empty_closure_cell_is_refused_naming_the_variable():
    def make():
        def mask(b, h, q_idx, kv_idx):
            return q_idx < limit
        return mask
        limit = 3  # noqa: F841 - never reached: the cell stays empty

    fn = make()
    with pytest.raises(ta.VariantError, match=r"test_lifting\.py:\d+: .*`limit`.*empty closure"):
        M.mods_for(None, fn)


def test_a_cyclic_captured_list_is_refused():
    table = [1, 2]
    table.append(table)

    def mask(b, h, q_idx, kv_idx):
        return q_idx < table[0]

    with pytest.raises(ta.VariantError, match=r"`table` contains itself"):
        M.mods_for(None, mask)


def test_a_tensor_reached_through_an_attribute_is_refused_at_the_users_line():
    class Cfg:
        slopes = torch.rand(8)

    cfg = Cfg()

    def alibi(score, b, h, q_idx, kv_idx):
        return score + cfg.slopes[h] * (kv_idx - q_idx)

    with pytest.raises(ta.VariantError) as err:
        M.mods_for(alibi, None)
    assert _line_of(alibi) in str(err.value) and "slopes = cfg.slopes" in str(err.value)


def test_a_tensor_in_a_dict_is_refused():
    params = {"bias": torch.rand(8)}

    def mod(score, b, h, q_idx, kv_idx):
        return score + params["bias"][h]

    with pytest.raises(ta.VariantError, match=r"dict `params` with a tile|tensor"):
        M.mods_for(mod, None)


def test_an_untranslated_torch_op_is_refused_with_what_is_supported():
    def mod(score, b, h, q_idx, kv_idx):
        return torch.erf(score)

    with pytest.raises(ta.VariantError) as err:
        M.mods_for(mod, None)
    assert _line_of(mod) in str(err.value) and "torch.erf" in str(err.value)
    assert "where" in str(err.value)


def test_torch_ops_are_translated_to_ct():
    def mod(score, b, h, q_idx, kv_idx):
        s = torch.where(q_idx >= kv_idx, score, float("-inf"))
        s = torch.clamp(s, min=-50.0, max=50.0) + torch.sigmoid(score) * 0
        return s + abs(q_idx - kv_idx).to(torch.float32) * math.pi * 0

    src = _src(M.mods_for(mod, None), "score_mod")
    for piece in ("_ta_ct.where", "_ta_ct.maximum", "_ta_ct.minimum", "_ta_ct.tanh",
                  "_ta_ct.abs", "_ta_ct.astype", "_ta_ct.float32", "1e309"):
        assert piece in src, (piece, src)
    assert "torch" not in src and "math" not in src


def test_chained_indexing_is_one_gather_and_partial_indexing_is_refused():
    bias = torch.rand(2, 64)

    def mod(score, b, h, q_idx, kv_idx):
        return score + bias[b][q_idx]

    assert "_ta_ct.gather(_ta_aux0, (b, q_idx))" in _src(M.mods_for(mod, None), "score_mod")
    means = torch.rand(64, 3)

    def partial(score, b, h, q_idx, kv_idx):
        return score + means[q_idx]

    with pytest.raises(ta.VariantError, match=r"indexes 1 of the 2 axes of the captured tensor"):
        M.mods_for(partial, None)


def test_a_0d_captured_tensor_is_read_as_a_number():
    scale = torch.ones((), dtype=torch.int32)

    def mod(qk, b, h, q, kv):
        return qk + scale

    mods = M.mods_for(mod, None)
    assert "_ta_ct.gather(_ta_aux0, (0,))" in _src(mods, "score_mod")
    assert mods.tensors()[0].shape == (1,)


def test_a_multi_statement_body_gets_its_derivative():
    tok = torch.rand(64)

    def mod(score, b, h, q_idx, kv_idx):
        """A docstring, assignments, a helper and a constant branch."""
        score = score + tok[q_idx]
        capped = softcap(score)
        if W > 100:
            return capped
        return score

    def softcap(x):
        return 20.0 * torch.tanh(x / 20.0)

    mods = M.mods_for(mod, None)
    assert mods.grad_error is None
    assert "_ta_ct.tanh" in mods.score_grad.key[1]


def test_a_branch_on_a_tile_becomes_where():
    def mod(score, b, h, q_idx, kv_idx):
        if q_idx >= kv_idx:
            return score
        return score - 1.0

    assert "_ta_ct.where(q_idx >= kv_idx, score, score - 1.0)" in _src(
        M.mods_for(mod, None), "score_mod")


def test_a_source_file_edited_after_import_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "user_mods_edited.py"
    path.write_text("def mod(score, b, h, q_idx, kv_idx):\n    return score * 2\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("user_mods_edited")
    try:
        time.sleep(0.01)
        path.write_text("def mod(score, b, h, q_idx, kv_idx):\n    return score * 3\n")
        import linecache

        linecache.checkcache(str(path))  # what inspect.getsource would do: re-read the file
        with pytest.raises(ta.VariantError, match=r"user_mods_edited\.py:1: .*no longer "
                                                  r"matches the code that runs"):
            M.mods_for(module.mod, None)
    finally:
        sys.modules.pop("user_mods_edited", None)


def test_a_function_without_source_is_refused_typed():
    scope: dict = {}
    exec(textwrap.dedent("""
        def mod(score, b, h, q_idx, kv_idx):
            return score
    """), scope)  # noqa: S102
    with pytest.raises(ta.VariantError, match="source is not available"):
        M.mods_for(scope["mod"], None)


def test_and_or_masks_are_public_and_lift_into_one_mask():
    causal = variants.sliding_window(10**9)
    both = ta.and_masks(causal, lambda b, h, q_idx, kv_idx: q_idx - kv_idx <= 512)
    either = ta.or_masks(lambda b, h, q, k: q >= k, lambda b, h, q, k: q < k)
    assert " & " in _src(M.mods_for(None, both)) and " | " in _src(M.mods_for(None, either))
    with pytest.raises(ta.VariantError, match="at least one"):
        ta.and_masks()


def _reset_registry():
    api._variants.clear()
    api._names.clear()


def test_the_registry_is_keyed_by_value_and_bounded():
    _reset_registry()
    ids = torch.zeros(1, 64, dtype=torch.int32)
    keys = {api._traced_variant(None, None, ta.block_mask(  # what a traced call does
        variants.sliding_window(8), None, None, 64, 64, device="cpu"), False)[0]
        for _ in range(500)}
    assert len(api._variants) == 1 and len(keys) == 1  # one entry for 500 equal masks
    first = next(iter(keys))
    for _ in range(api.MAX_VARIANTS + 10):
        api._traced_variant(None, None, ta.block_mask(
            variants.document(ids), None, None, 64, 64, device="cpu"), False)
    assert len(api._variants) == api.MAX_VARIANTS
    with pytest.raises(ta.InputError, match="no longer registered"):
        api._entry(first)
    _reset_registry()


def test_block_masks_of_captured_tensors_never_share_an_identity():
    ids = torch.zeros(1, 64, dtype=torch.int32)
    a, b = (ta.block_mask(variants.document(ids), None, None, 64, 64, device="cpu")
            for _ in range(2))
    c, d = (ta.block_mask(variants.sliding_window(8), None, None, 64, 64, device="cpu")
            for _ in range(2))
    assert a.key != b.key and c.key == d.key


def test_ct_code_as_written_still_lifts():
    def mod(score, b, h, q_idx, kv_idx):
        return 30.0 * ct.tanh(score / 30.0, rounding_mode=ct.RoundingMode.APPROX)

    assert "_ta_ct.RoundingMode.APPROX" in _src(M.mods_for(mod, None), "score_mod")


def _shim(name):
    def call(*args):
        return getattr(torch, name)(*(torch.as_tensor(a, dtype=torch.float64)
                                      if not isinstance(a, torch.Tensor) else a for a in args))
    return staticmethod(call)


_SHIM = type("Shim", (), {n: _shim(n) for n in (
    "where", "tanh", "exp", "exp2", "sin", "cos", "tan", "log", "log2", "sqrt", "rsqrt",
    "abs", "minimum", "maximum", "pow")})


def _grad_of(lifted, score, q, k):
    """The lifted derivative's generated source run with torch in place of cuTile."""
    scope = {"_ta_ct": _SHIM}
    exec(compile(lifted.key[1], "<test>", "exec"), scope)  # noqa: S102
    fn = next(v for n, v in scope.items() if n.startswith("score_grad"))
    return fn(score, 0, 0, q, k, None, None, None, None)


def _mods_trig(score, b, h, q_idx, kv_idx):
    return torch.sin(torch.cos(score)) + torch.tan(score * 0.1)


def _mods_smooth(score, b, h, q_idx, kv_idx):
    a = torch.sqrt(score * score + 1.0) + torch.log(score * score + 2.0)
    return a / (1.0 + torch.abs(score)) + torch.clamp(score, min=-1.0, max=2.0)


def _mods_gated(score, b, h, q_idx, kv_idx):
    y = torch.nn.functional.silu(score)
    return torch.where(score <= 1.5, torch.maximum(y, score * 0.5), float("-inf"))


@pytest.mark.parametrize("fn", [_mods_trig, _mods_smooth, _mods_gated])
def test_derivatives_of_translated_torch_ops_match_autograd(fn):
    mods = M.mods_for(fn, None)
    assert mods.grad_error is None, mods.grad_error
    s = torch.linspace(-4, 4, 97, dtype=torch.float64, requires_grad=True)
    q, k = torch.arange(97)[:, None] % 7, torch.arange(97)[:, None] % 5
    out = fn(s, 0, 0, q, k)
    want = torch.autograd.grad(out[torch.isfinite(out)].sum(), s)[0]
    got = _grad_of(mods.score_grad, s.detach(), q, k)
    got = torch.broadcast_to(torch.as_tensor(got, dtype=torch.float64), s.shape)
    keep = torch.isfinite(out.detach()).reshape(-1)
    assert torch.allclose(got.reshape(-1)[keep], want.reshape(-1)[keep], atol=1e-9)


def test_unhashable_captures_and_defaults_still_key_the_cache():
    table = [[1, 2], [3]]

    def helper(x, pad=[0]):  # noqa: B006 - a user's mutable default
        return x + pad[0]

    def mask(b, h, q_idx, kv_idx):
        return helper(q_idx) - kv_idx < table[0][1]

    assert "q_idx + 0 - kv_idx < 2" in _src(M.mods_for(None, mask))
    table[0][1] = 5
    assert "< 5" in _src(M.mods_for(None, mask))


def test_a_tensor_returned_by_a_helper_is_indexed():
    bias = torch.rand(8)

    def get_bias():
        return bias

    def mod(score, b, h, q_idx, kv_idx):
        return score + get_bias()[h]

    assert "_ta_ct.gather(_ta_aux0, (h,))" in _src(M.mods_for(mod, None), "score_mod")


def test_a_block_mask_refuses_a_mask_mod_whose_global_changed_since_it_was_made():
    global W
    bm = ta.block_mask(window_mask, None, None, 64, 64, device="cpu")
    assert api._variant(None, None, bm, False)[1] is bm
    try:
        W = 7
        with pytest.raises(ta.InputError, match="make the block mask again"):
            api._variant(None, None, bm, False)
    finally:
        W = 128
    assert api._variant(None, None, bm, False)[1] is bm


def _recurse(x):
    return _recurse(x)


def _recursive_mod(score, b, h, q_idx, kv_idx):
    return _recurse(score)


def test_python_forms_translate_or_are_refused_typed():
    def chained(b, h, q_idx, kv_idx):
        return 0 <= q_idx - kv_idx < 64 and not (kv_idx > q_idx)

    def consts(score, b, h, q_idx, kv_idx):
        return torch.where(q_idx >= kv_idx, score, torch.tensor(float("-inf"))) + \
            torch.zeros_like(score)

    def loop(score, b, h, q_idx, kv_idx):
        for i in range(2):
            score = score + i
        return score

    assert "(0 <= q_idx - kv_idx) & (q_idx - kv_idx < 64) & ~(kv_idx > q_idx)" in _src(
        M.mods_for(None, chained))
    assert "-1e309) + 0.0" in _src(M.mods_for(consts, None), "score_mod")
    with pytest.raises(ta.VariantError, match=r"test_lifting\.py:\d+: .*`For` statement"):
        M.mods_for(loop, None)
    with pytest.raises(ta.VariantError, match=r"nest deeper than 16 \(recursion"):
        M.mods_for(_recursive_mod, None)


@pytest.mark.parametrize("magic", ["", "%time x = 1\n"])
def test_a_function_from_a_notebook_cell_is_lifted(magic):
    """IPython compiles a cell under a pseudo file name and puts its text in linecache;
    a cell may hold lines that are not Python (magics): the definition block alone is
    parsed then."""
    import linecache

    name = f"<ipython-input-{len(magic)}-test>"
    cell = magic + "def cell_mod(score, b, h, q_idx, kv_idx):\n    return score * 3\n"
    linecache.cache[name] = (len(cell), None, cell.splitlines(True), name)
    code_text = cell.replace("%time x = 1", "x = 1")  # what IPython would run
    scope: dict = {}
    exec(compile(code_text, name, "exec"), scope)  # noqa: S102
    assert "score * 3" in _src(M.mods_for(scope["cell_mod"], None), "score_mod")


def user_softcap(score, b, h, q_idx, kv_idx):  # as FlexAttention users write it
    return 30.0 * torch.tanh(score / 30.0)


def thirds(score, b, h, q_idx, kv_idx):  # a quotient compared, and two in the arithmetic
    return torch.where(q_idx / 3 >= kv_idx, score / 7, score * (kv_idx - q_idx) / 2)


def _run_generated(source: str, name: str, *args):
    """A generated function run by torch on the CPU (torch's float32 in place of cuTile's:
    the same IEEE float32 arithmetic for +, *, / and the comparisons)."""
    import types

    scope = {"_ta_ct": types.SimpleNamespace(tanh=torch.tanh, where=torch.where)}
    exec(compile(source, "<generated>", "exec"), scope)  # noqa: S102 - generated in the test
    return scope[name](*args, None, None, None, None)


@pytest.mark.parametrize("fn", [user_softcap, thirds], ids=lambda f: f.__name__)
def test_a_score_divided_by_a_number_is_multiplied_by_its_reciprocal_within_an_ulp(fn):
    # variants.md §52d: a float division compiles IEEE-rounded (a range check, a refinement
    # and a slow-path call per element); the score's quotients become products, the mask's
    # comparisons keep theirs and decide bit for bit as the torch function does
    mods = M.mods_for(fn, None)
    source, grad = _src(mods, "score_mod"), _src(mods, "score_grad")
    for text in (source, grad):
        assert "/ 30.0" not in text and "/ 7" not in text and "/ 2" not in text, text
    assert ("q_idx / 3 >= kv_idx" in source) is (fn is thirds)
    torch.manual_seed(0)
    score = torch.randn(64, 64) * 40
    q_idx, kv_idx = torch.arange(64)[:, None], torch.arange(64)[None, :]
    got = _run_generated(source, f"score_mod_{fn.__name__}", score, 0, 0, q_idx, kv_idx)
    want = fn(score, 0, 0, q_idx, kv_idx)
    # each product within an fp32 ulp of its quotient, so the score within a few: 30 tanh
    # (s / 30) carries the argument's ulp, up to 4 of the capped value's at |s| 120
    assert torch.allclose(got, want, rtol=2.0 ** -20, atol=0), ((got - want) / want).abs().max()
    assert not torch.equal(got, want)  # the products do round differently
    s64 = score.double().requires_grad_()
    d_want, = torch.autograd.grad(fn(s64, 0, 0, q_idx, kv_idx).sum(), s64)
    d_got = _run_generated(grad, f"score_grad_{fn.__name__}", score.double(), 0, 0, q_idx,
                           kv_idx)
    assert torch.allclose(torch.as_tensor(d_got, dtype=torch.float64).expand(64, 64), d_want,
                          rtol=1e-7, atol=0)


def shared_quotient(score, b, h, q_idx, kv_idx):  # one quotient compared and scaled
    t = score / 3 / 7
    return torch.where(t > 1.0, t, score)


def floored(score, b, h, q_idx, kv_idx):  # a quotient floored and one cast: both decide
    return score + torch.floor((q_idx - kv_idx) / 3) + ((q_idx + kv_idx) / 5).int()


def by_thirds(b, h, q_idx, kv_idx):
    return q_idx / 3 >= kv_idx


def test_a_quotient_that_decides_stays_a_division():
    # compared (also where the same quotient is scaled beside it), floored, cast, a mask's
    assert _src(M.mods_for(shared_quotient, None), "score_mod").endswith(
        "return _ta_ct.where(score / 3 / 7 > 1.0, score * 0.3333333333333333 * "
        "0.14285714285714285, score)\n")
    floor_src = _src(M.mods_for(floored, None), "score_mod")
    assert "_ta_ct.floor((q_idx - kv_idx) / 3)" in floor_src
    assert "_ta_ct.astype((q_idx + kv_idx) / 5, _ta_ct.int32)" in floor_src
    assert "q_idx / 3 >= kv_idx" in _src(M.mods_for(None, by_thirds))
