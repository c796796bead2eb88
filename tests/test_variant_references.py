"""The built-in variants' torch references on the CPU, which the GPU matrix
(tests/gpu/test_variants_matrix.py) judges the kernels by: brute-force definitions,
decode against a KV cache (``q_offset``) as the prefill's last rows, the window's
off-by-one as transformers counts it, and one compile for any offset."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("cuda.tile", reason="cuTile not installed: pip install 'cuda-tile[tileiras]'")

from tiledattention import mods as M  # noqa: E402
from tiledattention import variants  # noqa: E402
from tiledattention.reference import naive_attention  # noqa: E402

B, H, S = 2, 4, 24


def _idx(sq, sk):
    return (torch.arange(B)[:, None, None, None], torch.arange(H)[None, :, None, None],
            torch.arange(sq)[None, None, :, None], torch.arange(sk)[None, None, None, :])


def _brute(rule):
    """[B, H, S, S] from a scalar rule over Python ints."""
    return torch.tensor([[[[rule(b, h, i, j) for j in range(S)] for i in range(S)]
                          for h in range(H)] for b in range(B)])


IDS = torch.tensor([[0] * 5 + [1] * 12 + [2] * 7, [0] * 20 + [1] * 4], dtype=torch.int32)
PREFIX = torch.tensor([3, 10], dtype=torch.int32)
SLOPES = variants.alibi_slopes(H, device="cpu")

# name: (factory taking q_offset=..., brute-force rule, is it a score_mod)
BUILTINS = {
    "window": (lambda **o: variants.sliding_window(5, **o), lambda b, h, i, j: i - 5 < j <= i,
               False),
    "window_ahead": (lambda **o: variants.sliding_window(4, 2, **o),
                     lambda b, h, i, j: i - 4 < j <= i + 2, False),
    "document": (lambda **o: variants.document(IDS, **o),
                 lambda b, h, i, j: bool(IDS[b, i] == IDS[b, j]), False),
    "prefix_lm": (lambda **o: variants.prefix_lm(PREFIX, **o),
                  lambda b, h, i, j: j <= i or j < int(PREFIX[b]), False),
    "alibi": (lambda **o: variants.alibi(SLOPES, **o),
              lambda b, h, i, j: float(SLOPES[h].double()) * (j - i), True),
}


def _apply(mod, is_score, sq, sk):
    ref = variants.reference_of(mod)
    if is_score:
        return ref(torch.zeros(B, H, sq, sk, dtype=torch.float64), *_idx(sq, sk))
    return ref(*_idx(sq, sk)).expand(B, H, sq, sk)


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_the_reference_is_the_variants_definition(name):
    make, rule, is_score = BUILTINS[name]
    got = _apply(make(), is_score, S, S)
    want = _brute(rule)
    assert torch.allclose(got.double(), want.double()), name


@pytest.mark.parametrize("sq", [1, 3])
@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_decode_against_a_kv_cache_is_the_prefills_last_rows(name, sq):
    # transformers' bottom-right alignment: Sq new queries sit at positions S - Sq .. S - 1.
    make, _, is_score = BUILTINS[name]
    full = _apply(make(), is_score, S, S)
    offset = torch.full((B,), S - sq, dtype=torch.int32)
    decode = _apply(make(q_offset=offset), is_score, sq, S)
    assert torch.equal(decode, full[:, :, S - sq:])


def test_the_offset_of_each_row_is_its_own():
    offset = torch.tensor([S - 1, 10], dtype=torch.int32)
    keep = _apply(variants.sliding_window(5, q_offset=offset), False, 1, S)
    assert keep[0, 0, 0].nonzero().flatten().tolist() == list(range(S - 5, S))
    assert keep[1, 0, 0].nonzero().flatten().tolist() == list(range(6, 11))


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_a_variant_with_an_offset_compiles_once_for_every_offset(name):
    make, _, is_score = BUILTINS[name]
    a, b = (make(q_offset=torch.full((B,), n, dtype=torch.int32)) for n in (7, 300))
    key = (lambda m: M.mods_for(m, None).key) if is_score else (
        lambda m: M.mods_for(None, m).key)
    assert key(a) == key(b) and key(a) != key(make())


def test_the_window_counts_keys_as_transformers_does():
    masking = pytest.importorskip("transformers.masking_utils",
                                  reason="transformers not installed")
    for w in (1, 4, 9):
        hf = masking.sliding_window_causal_mask_function(w)
        i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
        want = hf(0, 0, i, j)
        got = variants.sliding_window(w)(0, 0, i, j) & (j <= i)
        assert torch.equal(got, want) and int(want[-1].sum()) == w  # w keys, itself included


def test_a_window_reference_is_what_naive_attention_applies():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, S, 8, generator=g, dtype=torch.float64) for _ in range(3))
    keep = torch.ones(S, S, dtype=torch.bool).tril() & ~torch.ones(S, S, dtype=torch.bool
                                                                   ).tril(-5)
    want, _ = naive_attention(q, k, v, attn_mask=keep)
    got, _ = naive_attention(q, k, v, causal=True,
                             keep_ref=variants.sliding_window(5))
    assert torch.allclose(got, want)


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_a_builtin_is_one_torch_function_its_own_reference(name):
    mod = BUILTINS[name][0]()
    assert variants.reference_of(mod) is mod and not hasattr(mod, "reference")


def test_softcap_keeps_hand_written_tile_code_with_a_torch_reference():
    cap = variants.softcap(30.0)
    assert variants.reference_of(cap) is cap.fn.reference
    assert "RoundingMode.APPROX" in M.mods_for(cap, None).score_mod.key[1]


def test_combining_a_hand_written_mask_combines_the_torch_forms():
    def ct_style(b, h, q_idx, kv_idx):
        return kv_idx >= 2

    ct_style.reference = lambda b, h, q, k: k >= 2
    both = variants.and_masks(variants.sliding_window(5), ct_style)
    i, j = torch.arange(S)[:, None], torch.arange(S)[None, :]
    want = (i - 5 < j) & (j <= i) & (j >= 2)
    assert torch.equal(variants.reference_of(both)(0, 0, i, j), want)
    pure = variants.and_masks(variants.sliding_window(5), variants.prefix_lm(PREFIX))
    assert variants.reference_of(pure) is pure
