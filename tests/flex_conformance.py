"""FlexAttention's own score_mod / mask_mod cases, as a migrating user brings them.

Each case is a function in the form PyTorch's FlexAttention test suite
(``test/inductor/test_flex_attention.py`` in pytorch/pytorch) writes it — torch ops and
all; nothing changed for tiledattention — re-typed here with the captured tensors built
on the given device, its float64 torch reference over broadcast index tensors (b
[B,1,1,1], h [1,H,1,1], q [1,1,Sq,1], kv [1,1,1,Skv]), the shape that test uses
([B, Hq, Hkv, Sq, Skv, D]; D 4 there becomes 8 here, the smallest head dim we run), and
what must happen: ``run`` (forward and every gradient: q, k, v and captured tensors that
require grad), ``forward`` (forward runs; the gradient is refused with a typed error before
anything runs, no derivative being derivable) or ``refuse`` (a typed VariantError when
lifted, naming the user's line).

Cases (name: source test in test_flex_attention.py):

- identity, times_two, squared, causal, inverse_causal, rel_bias, rel_causal, alibi_bias:
  the module's ``test_score_mods`` (``test_builtin_score_mods``)
- head_offset: ``_head_offset`` (``test_captured_score_mod_aot_eager_gradcheck``)
- trig, trig2: ``_trig``, ``_trig2`` (``test_aot_eager_gradcheck``)
- causal_mask, inverse_causal_mask: ``_causal_mask``, ``_inverse_causal_mask``
  (``test_builtin_score_mods_dynamic``)
- doc_mask_causal: ``test_doc_mask_sparse``
- index_multiple, index_weird1, index_weird2: ``test_index_multiple`` / ``_weird1`` / ``_weird2``
- skip_odd_keys: ``test_skip_odd_keys``
- function_composition: ``test_function_composition``
- all_bias: ``test_captured_buffers_all_dims``
- seq_masking: ``test_seq_masking``
- bias_seq_only, bias_seq_batch, bias_head_seq_batch: ``test_load_from_bias_seq_only`` /
  ``_seq_batch`` / ``_head_seq_batch``
- rel_bias_table: ``test_load_rel_bias``
- causal_bidirectional: ``test_dependent_causal_bidirectional``
- natten_2d: ``test_natten_2d``
- floor_div: ``test_subgraph_respect_decompostion``
- silu: ``test_silu_on_score``
- padded_dense_causal: ``test_padded_dense_causal``
- captured_scale: ``test_captured_scale``
- changed_branch: ``test_recompile_changed_score_mod``
- realized_input: ``test_inputs_are_realized``
- njt_causal: ``test_njt_causal``
- and_masks_window: ``test_mask_mod_combiners``
- causal_slidewindow: ``test_multiple_mask_calls``
- non_divisible_seq: ``test_block_mask_non_divisible``
- fully_masked_rows: ``test_fully_masked_out_rows``
- document_edge_case: ``test_document_masking_edge_case``
- sliding_window_causal, global_causal: ``test_lse_masked_output``
- view_buffer_rel_pos: ``test_load_from_view_buffer``
- modular_indexing: ``test_modular_indexing``
- head_bias_learnable: ``test_head_bias_req_grad``
- rel_pos_1d, rel_pos_2d, rel_pos_2d_chained, rel_pos_2d_transposed, rel_pos_3d_transposed:
  ``test_comparison_vs_sdpa_with_learnable_bias``
- euclidean_dist (refuse: a row read from a 2-d tensor and reduced): ``test_reduction_unrolled``
- captured_reduction (refuse: ``.sum`` of a captured tensor): ``test_captured_reduction``
- autograd_function (refuse: ``torch.autograd.Function.apply``):
  ``test_autograd_function_in_score_mod``
- new_zeros_index (refuse: a tensor method on an index): ``test_new_empty_mask_mod``
- partial_mask (refuse: ``functools.partial``): ``test_dynamic_shapes_bug_dynamic_batch``

And the torch (eager) forms of FlashAttention-4's score_mods (Dao-AILab/flash-attention
``tests/cute/score_mod_definitions.py``): fa4_rel_bias, fa4_rel_bias_x2, fa4_alibi,
fa4_sliding_window, fa4_block_diagonal, fa4_causal_v2, fa4_dual_buffer
(``test_score_mod.py``), fa4_packed_kv_bias (``test_score_mod_varlen.py``, as a padded
batch: kv_idx clamped to each row's length, as there).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

B, H, S, D = 4, 8, 2048, 64
NEG_INF = float("-inf")


@dataclass(frozen=True)
class Made:
    fn: object  # the score_mod / mask_mod as the peer writes it
    reference: Callable  # float64 torch over broadcast indices
    # captured tensors that require grad: (name, tensor, slot); the reference reads
    # slot["ref"], which a test may point at a float64 copy
    learnable: tuple[tuple[str, Tensor, dict], ...] = ()


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    kind: str  # "score" or "mask"
    make: Callable[[str], Made]
    shape: tuple[int, int, int, int, int, int] = (B, H, H, S, S, D)  # B, Hq, Hkv, Sq, Skv, D
    expect: str = "run"  # "run", "forward" or "refuse"


CASES: list[Case] = []


def case(kind: str, source: str, shape=None, expect: str = "run", name: str | None = None):
    def register(make):
        where = source if source.startswith("FA4") else f"test_flex_attention.py::{source}"
        CASES.append(Case(name or make.__name__, where, kind, make,
                          shape or (B, H, H, S, S, D), expect))
        return make
    return register


def _where(c, a, b):
    return torch.where(c, a, torch.as_tensor(b, dtype=torch.float64))


# ----------------------------------------------------------------- module-level functions
def _identity(score, b, h, q_idx, kv_idx):
    return score


def _times_two(score, b, h, m, n):
    """Joint graph needed for correctness"""
    return score * 2


def _squared(score, b, h, m, n):
    """Joint graph needed for correctness"""
    return score * score


def _causal(score: Tensor, batch: Tensor, head: Tensor, token_q: Tensor,
            token_kv: Tensor) -> Tensor:
    return torch.where(token_q >= token_kv, score, float("-inf"))


def _inverse_causal(score, b, h, m, n):
    return torch.where(m <= n, score, float("-inf"))


def _rel_bias(score: Tensor, batch: Tensor, head: Tensor, token_q: Tensor,
              token_kv: Tensor) -> Tensor:
    return score + (token_q - token_kv)


def _rel_causal(score: Tensor, batch: Tensor, head: Tensor, token_q: Tensor,
                token_kv: Tensor) -> Tensor:
    return torch.where(token_q >= token_kv, score + (token_q - token_kv), float("-inf"))


def _generate_alibi_bias(num_heads: int):
    def _alibi_bias(score: Tensor, batch: Tensor, head: Tensor, token_q: Tensor,
                    token_kv: Tensor) -> Tensor:
        scale = torch.exp2(-((head + 1) * 8.0 / num_heads))
        return score + (token_kv - token_q) * scale

    return _alibi_bias


def _trig(score, b, h, m, n):
    """Joint graph needed for correctness"""
    return torch.sin(torch.cos(score)) + torch.tan(b)


def _trig2(score, b, h, m, n):
    """Branching joint graph"""
    cos_score = torch.cos(score)
    sin_score = torch.sin(score)
    z = cos_score * sin_score + torch.tan(b)
    return z


def _causal_mask(batch: Tensor, head: Tensor, token_q: Tensor, token_kv: Tensor) -> Tensor:
    return token_q >= token_kv


def _inverse_causal_mask(batch: Tensor, head: Tensor, token_q: Tensor,
                         token_kv: Tensor) -> Tensor:
    return token_q <= token_kv


def _simple(name, fn, ref, kind="score", expect="run", source="test_builtin_score_mods"):
    case(kind, source, expect=expect, name=name)(lambda device: Made(fn, ref))


_simple("identity", _identity, lambda s, b, h, q, k: s)
_simple("times_two", _times_two, lambda s, b, h, q, k: s * 2)
_simple("squared", _squared, lambda s, b, h, q, k: s * s)
_simple("causal", _causal, lambda s, b, h, q, k: _where(q >= k, s, NEG_INF))
_simple("inverse_causal", _inverse_causal, lambda s, b, h, q, k: _where(q <= k, s, NEG_INF))
_simple("rel_bias", _rel_bias, lambda s, b, h, q, k: s + (q - k))
_simple("rel_causal", _rel_causal, lambda s, b, h, q, k: _where(q >= k, s + (q - k), NEG_INF))
_simple("alibi_bias", _generate_alibi_bias(8),
        lambda s, b, h, q, k: s + (k - q) * torch.exp2(-((h + 1) * 8.0 / 8)))
_simple("trig", _trig, lambda s, b, h, q, k: torch.sin(torch.cos(s)) + torch.tan(b.double()),
        source="test_aot_eager_gradcheck")
_simple("trig2", _trig2,
        lambda s, b, h, q, k: torch.cos(s) * torch.sin(s) + torch.tan(b.double()),
        source="test_aot_eager_gradcheck")
_simple("causal_mask", _causal_mask, lambda b, h, q, k: q >= k, kind="mask",
        source="test_builtin_score_mods_dynamic")
_simple("inverse_causal_mask", _inverse_causal_mask, lambda b, h, q, k: q <= k, kind="mask",
        source="test_builtin_score_mods_dynamic")


# ----------------------------------------------------------------- functions of one test
@case("score", "test_captured_score_mod_aot_eager_gradcheck")
def head_offset(device):
    head_offset = torch.rand(H, device=device)

    def score_mod(score, b, h, m, n):
        return score * head_offset[h]

    return Made(score_mod, lambda s, b, h, q, k: s * head_offset.double()[h])


@case("score", "test_doc_mask_sparse")
def doc_mask_causal(device):
    document_id = torch.zeros(S, dtype=torch.int, device=device)
    for i in range(0, S, 256):
        document_id[i: i + 256] = i // 256

    def document_masking_causal(score, b, h, q_idx, kv_idx):
        causal_mask = q_idx >= kv_idx
        document_mask = document_id[q_idx] == document_id[kv_idx]
        return torch.where(causal_mask & document_mask, score, -float("inf"))

    d = document_id.long()
    return Made(document_masking_causal,
                lambda s, b, h, q, k: _where((q >= k) & (d[q] == d[k]), s, NEG_INF))


@case("score", "test_index_multiple")
def index_multiple(device):
    bias = torch.randn(B, S, device=device)

    def index_multiple(score, b, h, q_idx, kv_idx):
        return score + bias[b][q_idx]

    return Made(index_multiple, lambda s, b, h, q, k: s + bias.double()[b, q])


@case("score", "test_index_weird1")
def index_weird1(device):
    bias = torch.randn(4, B, H, S, device=device)

    def index_weird1(score, b, h, q_idx, kv_idx):
        return score + bias[0][b, h][q_idx]

    return Made(index_weird1, lambda s, b, h, q, k: s + bias.double()[0, b, h, q])


@case("score", "test_index_weird2")
def index_weird2(device):
    bias = torch.randn(B, H, 4, S, device=device)
    which_bias = torch.tensor(0, device=device)

    def index_weird2(score, b, h, q_idx, kv_idx):
        return score + bias[b][h][which_bias, q_idx]

    return Made(index_weird2, lambda s, b, h, q, k: s + bias.double()[b, h, 0, q])


@case("score", "test_skip_odd_keys")
def skip_odd_keys(device):
    def score_mod(score, b, h, q, kv):
        return torch.where(kv % 2 == 0, score, float("-inf"))

    return Made(score_mod, lambda s, b, h, q, k: _where(k % 2 == 0, s, NEG_INF))


@case("score", "test_function_composition")
def function_composition(device):
    def score_mod_1(score, b, h, m, n):
        return score + (m - n)

    def score_mod_2(score, b, h, m, n):
        return torch.where(m <= n, score, float("-inf"))

    def composed_score_mod(score, b, h, m, n):
        return score_mod_2(score_mod_1(score, b, h, m, n), b, h, m, n)

    return Made(composed_score_mod, lambda s, b, h, q, k: _where(q <= k, s + (q - k), NEG_INF))


@case("score", "test_captured_buffers_all_dims")
def all_bias(device):
    head_scale = torch.randn(H, device=device)
    batch_scale = torch.randn(B, device=device)
    tok_scale = torch.randn(S, device=device)

    def all_bias(score, batch, head, token_q, token_kv):
        score = score + tok_scale[token_q]
        score = score + batch_scale[batch]
        score = score + head_scale[head]
        return score

    return Made(all_bias, lambda s, b, h, q, k: s + tok_scale.double()[q]
                + batch_scale.double()[b] + head_scale.double()[h])


@case("score", "test_seq_masking")
def seq_masking(device):
    seq_idx = torch.zeros(S, device=device, dtype=torch.bool)
    seq_idx[S // 2:] = 1

    def seq_mask_mod(score, b, h, q, kv):
        return torch.where(seq_idx[q] == seq_idx[kv], score, float("-inf"))

    return Made(seq_mask_mod, lambda s, b, h, q, k: _where(seq_idx[q] == seq_idx[k], s, NEG_INF))


@case("score", "test_load_from_bias_seq_only")
def bias_seq_only(device):
    bias = torch.randn(S, S, device=device, dtype=torch.float16)

    def bias_mod(score, b, h, q, kv):
        return score + bias[q, kv]

    return Made(bias_mod, lambda s, b, h, q, k: s + bias.double()[q, k])


@case("score", "test_load_from_bias_seq_batch")
def bias_seq_batch(device):
    bias = torch.randn(B, S, S, device=device, dtype=torch.float16)

    def bias_mod(score, b, h, q, kv):
        return score + bias[b, q, kv]

    return Made(bias_mod, lambda s, b, h, q, k: s + bias.double()[b, q, k])


@case("score", "test_load_from_bias_head_seq_batch")
def bias_head_seq_batch(device):
    bias = torch.randn(B, H, S, S, device=device, dtype=torch.float16)

    def bias_mod(score, b, h, q, kv):
        return score + bias[b, h, q, kv]

    return Made(bias_mod, lambda s, b, h, q, k: s + bias.double()[b, h, q, k])


@case("score", "test_load_rel_bias")
def rel_bias_table(device):
    rel_bias = torch.randn(2 * S, device=device, dtype=torch.float16)

    def bias_mod(score, b, h, q, kv):
        return score + rel_bias[(q - kv) + S]

    return Made(bias_mod, lambda s, b, h, q, k: s + rel_bias.double()[(q - k) + S])


@case("score", "test_dependent_causal_bidirectional")
def causal_bidirectional(device):
    num_bidirectional = torch.randint(0, S, (B,), device=device, dtype=torch.int32)

    def bias_mod(score, b, h, q, kv):
        causal_attention = q >= kv
        cur_num_bidirectional = num_bidirectional[b]
        bidirectional_attention_on_video = (q <= cur_num_bidirectional) & (
            kv <= cur_num_bidirectional
        )
        return torch.where(
            bidirectional_attention_on_video | causal_attention,
            score,
            -float("inf"),
        )

    n = num_bidirectional.long()
    return Made(bias_mod, lambda s, b, h, q, k: _where(
        ((q <= n[b]) & (k <= n[b])) | (q >= k), s, NEG_INF))


@case("score", "test_natten_2d", shape=(B, 32, 32, S, S, D))
def natten_2d(device):
    H = 32
    W = S // H
    WINDOW = 3

    def get_x_y(idx):
        # This should be a floor divide, but we don't support that properly
        return idx / W, idx % W

    def natten_mask(score, b, h, q, kv):
        q_x, q_y = get_x_y(q)
        kv_x, kv_y = get_x_y(kv)
        return torch.where(
            ((q_x - kv_x).abs() <= WINDOW) | ((q_y - kv_y).abs() <= WINDOW),
            score,
            float("-inf"),
        )

    def ref(s, b, h, q, k):
        return _where(((q / W - k / W).abs() <= WINDOW) | ((q % W - k % W).abs() <= WINDOW),
                      s, NEG_INF)

    return Made(natten_mask, ref)


@case("score", "test_subgraph_respect_decompostion", shape=(2, 2, 2, 128, 128, 8))
def floor_div(device):
    def score_mod_func(score, b, h, q, kv):
        return score - q // (1 + kv)

    return Made(score_mod_func, lambda s, b, h, q, k: s - q // (1 + k))


@case("score", "test_silu_on_score")
def silu(device):
    def silu_score(score, b, h, q, kv):
        return torch.nn.functional.silu(score)

    return Made(silu_score, lambda s, b, h, q, k: torch.nn.functional.silu(s))


@case("score", "test_padded_dense_causal")
def padded_dense_causal(device):
    seq_len = torch.arange(B, device=device, dtype=torch.int32) + 1

    def create_padded_dense_wrapper(orig_score_mod):
        def njt_score_mod(qk, b, h, q, kv):
            return torch.where(
                qk <= seq_len[b], orig_score_mod(qk, b, h, q, kv), -float("inf")
            )

        return njt_score_mod

    n = seq_len.double()
    return Made(create_padded_dense_wrapper(_causal), lambda s, b, h, q, k: _where(
        s <= n[b], _where(q >= k, s, NEG_INF), NEG_INF))


@case("score", "test_captured_scale")
def captured_scale(device):
    scale = torch.ones((), device=device, dtype=torch.int32)

    def score_mod_scale(qk, b, h, q, kv):
        return qk + scale

    return Made(score_mod_scale, lambda s, b, h, q, k: s + 1)


@case("score", "test_recompile_changed_score_mod")
def changed_branch(device):
    scale = torch.ones((), device=device, dtype=torch.int32)
    ADD = True

    def score_mod_scale(qk, b, h, q, kv):
        if ADD:
            return qk + scale
        else:
            return qk * scale

    def flip():  # the test sets ADD = False and runs again: the second run must see it
        nonlocal ADD
        ADD = False

    score_mod_scale.flip = flip
    return Made(score_mod_scale, lambda s, b, h, q, k: s + 1)


@case("score", "test_inputs_are_realized", shape=(1, 8, 8, 1024, 1024, 64))
def realized_input(device):
    x = torch.randn(1024, device=device)
    x = x * 2

    def func(qk, b, h, q, kv):
        return qk + x[q]

    return Made(func, lambda s, b, h, q, k: s + x.double()[q])


@case("score", "test_njt_causal")
def njt_causal(device):
    offsets = torch.tensor([0, 1024, 1024 + 512, S], device=device, dtype=torch.int32)
    seq_idx = torch.zeros(S, device=device, dtype=torch.int32)
    for idx in range(len(offsets) - 1):
        seq_idx[offsets[idx]: offsets[idx + 1]] = idx

    def create_njt_wrapper(orig_score_mod, offsets, seq_idx):
        def njt_score_mod(qk, b, h, q, kv):
            q_nested = q - offsets[seq_idx[q]]
            kv_nested = kv - offsets[seq_idx[kv]]
            return orig_score_mod(qk, b, h, q_nested, kv_nested)

        return njt_score_mod

    o, i = offsets.long(), seq_idx.long()
    return Made(create_njt_wrapper(_causal, offsets, seq_idx), lambda s, b, h, q, k: _where(
        q - o[i[q]] >= k - o[i[k]], s, NEG_INF))


@case("mask", "test_mask_mod_combiners", shape=(B, H, H, S, S, D))
def and_masks_window(device):
    from tiledattention import and_masks

    def causal_mask(b, h, q, kv):
        return q >= kv

    def sliding_window(b, h, q, kv):
        return (q - kv) <= 512

    return Made(and_masks(causal_mask, sliding_window),
                lambda b, h, q, k: (q >= k) & ((q - k) <= 512))


@case("mask", "test_multiple_mask_calls", shape=(1, 4, 4, 512, 512, 64))
def causal_slidewindow(device):
    window_size = 32

    def causal_mask_slidewindow_mod(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx <= kv_idx + window_size)

    return Made(causal_mask_slidewindow_mod, lambda b, h, q, k: (q >= k) & (q <= k + 32))


@case("mask", "test_block_mask_non_divisible", shape=(B, H, H, 1023, 1023, D))
def non_divisible_seq(device):
    seq = torch.arange(1023, device=device) // 128

    def mod(b, h, q, kv):
        return seq[q] == seq[kv]

    return Made(mod, lambda b, h, q, k: seq[q] == seq[k])


@case("mask", "test_fully_masked_out_rows")
def fully_masked_rows(device):
    M = S // 2

    def mask_mod(b, h, q, kv):
        return q < M

    return Made(mask_mod, lambda b, h, q, k: (q < M) & (k >= 0))


@case("mask", "test_document_masking_edge_case", shape=(2, 1, 1, 128, 128, 8))
def document_edge_case(device):
    document_masks = torch.full((2, 128), 0, dtype=torch.int32, device=device)
    document_masks[:, 64:] = 1

    def mask_mod(b, h, q, kv):
        same_doc = document_masks[b, q] == document_masks[b, kv]
        return same_doc

    d = document_masks.long()
    return Made(mask_mod, lambda b, h, q, k: d[b, q] == d[b, k])


@case("mask", "test_lse_masked_output", shape=(2, 2, 2, 196, 196, 64))
def sliding_window_causal(device):
    SLIDING_WINDOW = 64

    def sliding_window_causal(b, h, q_idx, kv_idx):
        causal_mask = q_idx >= kv_idx
        window_mask = q_idx - kv_idx <= SLIDING_WINDOW
        return causal_mask & window_mask

    return Made(sliding_window_causal, lambda b, h, q, k: (q >= k) & (q - k <= 64))


@case("mask", "test_lse_masked_output", shape=(2, 2, 2, 196, 196, 64))
def global_causal(device):
    SLIDING_WINDOW = 64

    def global_causal(b, h, q_idx, kv_idx):
        causal_mask = q_idx >= kv_idx
        window_mask = q_idx - kv_idx > SLIDING_WINDOW
        return causal_mask & window_mask

    return Made(global_causal, lambda b, h, q, k: (q >= k) & (q - k > 64))


@case("score", "test_load_from_view_buffer", shape=(B, H, H, H * 8, H * 8, D))
def view_buffer_rel_pos(device):
    W = 8
    rel_h = torch.randn(B, H, H * W, H, device=device, dtype=torch.float16)

    def score_mod(score, batch, head, q_idx, k_idx):
        h_idx = k_idx // W
        return score + rel_h[batch, head, q_idx, h_idx]

    return Made(score_mod, lambda s, b, h, q, k: s + rel_h.double()[b, h, q, k // W])


@case("score", "test_modular_indexing", shape=(100, 12, 12, 128, 128, 64))
def modular_indexing(device):
    bias = (2 * torch.randn(100, 128, 128, 12, device=device)).view(100, 12, 128, 128)
    bias = bias.contiguous()

    def score_mod(score, batch, head, q_idx, k_idx):
        attn_bias = bias[batch, head, q_idx, k_idx]
        return score + attn_bias

    return Made(score_mod, lambda s, b, h, q, k: s + bias.double()[b, h, q, k])


# ----------------------------------------------------------------- learnable biases
def _learnable(name, shape, index, ref_index, source, dims):
    def make(device):
        bias_flex = torch.randn(*shape, device=device, dtype=torch.float16).requires_grad_(True)
        slot = {"ref": bias_flex}  # the reference reads slot["ref"]: a float64 copy in tests
        return Made(index(bias_flex),
                    lambda s, b, h, q, k: s + ref_index(slot["ref"], b, h, q, k),
                    (("bias_flex", bias_flex, slot),))
    case("score", source, shape=dims, name=name)(make)


def _head_bias(bias_flex):
    def head_bias(score, b, h, q_idx, kv_idx):
        return score + bias_flex[h]
    return head_bias


def _rel_pos_1d(bias_flex):
    def rel_pos_1d(score, b, h, q_idx, kv_idx):
        return score + bias_flex[q_idx + kv_idx]
    return rel_pos_1d


def _rel_pos_2d(bias_flex):
    def rel_pos_2d(score, b, h, q_idx, kv_idx):
        return score + bias_flex[q_idx, kv_idx]
    return rel_pos_2d


def _rel_pos_2d_chained(bias_flex):
    def rel_pos_2d(score, b, h, q_idx, kv_idx):
        return score + bias_flex[q_idx][kv_idx]
    return rel_pos_2d


def _rel_pos_2d_transposed(bias_flex):
    def rel_pos_2d_transposed(score, b, h, q_idx, kv_idx):
        return score + bias_flex[kv_idx, q_idx]
    return rel_pos_2d_transposed


def _rel_pos_3d_transposed(bias_flex):
    def rel_pos_3d_transposed(score, b, h, q_idx, kv_idx):
        return score + bias_flex[h, kv_idx, q_idx]
    return rel_pos_3d_transposed


_learnable("head_bias_learnable", (4,), _head_bias, lambda t, b, h, q, k: t.double()[h],
           "test_head_bias_req_grad", (1, 4, 4, 256, 256, 64))
_learnable("rel_pos_1d", (512,), _rel_pos_1d, lambda t, b, h, q, k: t.double()[q + k],
           "test_comparison_vs_sdpa_with_learnable_bias", (1, 1, 1, 256, 256, 64))
_learnable("rel_pos_2d", (256, 256), _rel_pos_2d, lambda t, b, h, q, k: t.double()[q, k],
           "test_comparison_vs_sdpa_with_learnable_bias", (1, 1, 1, 256, 256, 64))
_learnable("rel_pos_2d_chained", (256, 256), _rel_pos_2d_chained,
           lambda t, b, h, q, k: t.double()[q, k],
           "test_comparison_vs_sdpa_with_learnable_bias", (1, 1, 1, 256, 256, 64))
_learnable("rel_pos_2d_transposed", (256, 256), _rel_pos_2d_transposed,
           lambda t, b, h, q, k: t.double()[k, q],
           "test_comparison_vs_sdpa_with_learnable_bias", (1, 1, 1, 256, 256, 64))
_learnable("rel_pos_3d_transposed", (8, 256, 256), _rel_pos_3d_transposed,
           lambda t, b, h, q, k: t.double()[h, k, q],
           "test_comparison_vs_sdpa_with_learnable_bias", (4, 8, 8, 256, 256, 64))


# ----------------------------------------------------------------- FlashAttention-4
# The torch forms of FA4's score_mods (``tests/cute/score_mod_definitions.py``, the eager
# side of ``tests/cute/test_score_mod.py`` / ``test_score_mod_varlen.py``), at one shape.
FA4 = (2, 4, 4, 1024, 1024, 128)


def _fa4(name, fn, ref):
    case("score", "FA4 tests/cute/test_score_mod.py", shape=FA4, name=name,
         )(lambda device: Made(fn, ref))


def rel_bias_eager(score, b, h, q_idx, kv_idx):
    return score + torch.abs(q_idx - kv_idx)


def rel_bias_x2_eager(score, b, h, q_idx, kv_idx):
    return score + 2 * torch.abs(q_idx - kv_idx)


def alibi_eager(score, b, h, q_idx, kv_idx):
    slope = 2 ** (-8 * (h + 1) / 8)
    return score - slope * torch.abs(q_idx - kv_idx)


def sliding_window_eager(score, b, h, q_idx, kv_idx):
    return torch.where(torch.abs(q_idx - kv_idx) <= 256, score, float("-inf"))


def block_diagonal_eager(score, b, h, q_idx, kv_idx):
    return torch.where(q_idx // 64 == kv_idx // 64, score, float("-inf"))


def causal_v2_eager(score, b, h, q_idx, kv_idx):
    return torch.where(q_idx - kv_idx >= 0, score, float("-inf"))


_fa4("fa4_rel_bias", rel_bias_eager, lambda s, b, h, q, k: s + (q - k).abs())
_fa4("fa4_rel_bias_x2", rel_bias_x2_eager, lambda s, b, h, q, k: s + 2 * (q - k).abs())
_fa4("fa4_alibi", alibi_eager,
     lambda s, b, h, q, k: s - 2.0 ** (-8 * (h + 1) / 8) * (q - k).abs())
_fa4("fa4_sliding_window", sliding_window_eager,
     lambda s, b, h, q, k: _where((q - k).abs() <= 256, s, NEG_INF))
_fa4("fa4_block_diagonal", block_diagonal_eager,
     lambda s, b, h, q, k: _where(q // 64 == k // 64, s, NEG_INF))
_fa4("fa4_causal_v2", causal_v2_eager, lambda s, b, h, q, k: _where(q - k >= 0, s, NEG_INF))


@case("score", "FA4 tests/cute/test_score_mod.py", shape=FA4)
def fa4_dual_buffer(device):
    head_bias = torch.randn(4, device=device)
    pos_bias = torch.randn(1024, device=device)

    def dual_buffer_factory(head_bias, pos_bias):
        def mod(score, b, h, q_idx, kv_idx):
            return score + head_bias[h] + pos_bias[q_idx]

        return mod

    return Made(dual_buffer_factory(head_bias, pos_bias),
                lambda s, b, h, q, k: s + head_bias.double()[h] + pos_bias.double()[q])


@case("score", "FA4 tests/cute/test_score_mod_varlen.py", shape=FA4)
def fa4_packed_kv_bias(device):
    cu_seqlens_k = torch.tensor([0, 700, 1724], device=device, dtype=torch.int32)
    bias_tensor = torch.randn(1724, device=device)

    def packed_kv_bias_factory(bias_tensor, cu_seqlens_k):
        def mod(score, b, h, q_idx, kv_idx):
            # Calculate valid length for this sequence
            start = cu_seqlens_k[b]
            seq_len = cu_seqlens_k[b+1] - start

            # Clamp kv_idx.
            safe_kv_idx = torch.clamp(kv_idx, max=seq_len - 1)

            return score + bias_tensor[start + safe_kv_idx]
        return mod

    cu = cu_seqlens_k.long()

    def ref(s, b, h, q, k):
        start = cu[b]
        return s + bias_tensor.double()[start + torch.minimum(k, cu[b + 1] - start - 1)]

    return Made(packed_kv_bias_factory(bias_tensor, cu_seqlens_k), ref)


# ----------------------------------------------------------------- refused, typed
@case("score", "test_reduction_unrolled", expect="refuse")
def euclidean_dist(device):
    means = torch.randn(S, 3, device=device)
    length_scales = torch.logspace(0.001, 0.1, H, device=device)

    def euclidean_dist_pos_embed(score, b, h, q_idx, k_idx):
        q_pos = means[q_idx]
        k_pos = means[k_idx]
        dist = (q_pos - k_pos).pow(2).sum(-1).sqrt()
        scale = length_scales[h]
        inv_dist = torch.exp(-dist / scale)
        return inv_dist * score

    return Made(euclidean_dist_pos_embed, None)


@case("score", "test_captured_reduction", expect="refuse")
def captured_reduction(device):
    scale = torch.randn((B, 8), device=device)

    def score_mod_scale(qk, b, h, q, kv):
        return qk + scale[b].sum(dim=-1)

    return Made(score_mod_scale, None)


@case("score", "test_autograd_function_in_score_mod", expect="refuse")
def autograd_function(device):
    class ApplyMask(torch.autograd.Function):
        @staticmethod
        def forward(a, mask):
            return torch.where(mask, a, -float("inf"))

        @staticmethod
        def backward(ctx, i):
            return i, None

    def score_mod(score, b, h, q, kv):
        return ApplyMask.apply(score, q <= kv)

    return Made(score_mod, None)


@case("score", "test_new_empty_mask_mod", expect="refuse")
def new_zeros_index(device):
    attn_mask = torch.ones(4, 1, 128, 128, dtype=torch.bool, device=device).tril()

    def score_mod(score, b, h, q_idx, kv_idx):
        h_ = h.new_zeros(h.shape)
        return score + attn_mask[b, h_, q_idx, kv_idx]

    return Made(score_mod, None)


@case("mask", "test_dynamic_shapes_bug_dynamic_batch", expect="refuse")
def partial_mask(device):
    input_lengths = torch.tensor([100, 90], device=device)

    def _flex_attention_mask(b, h, q_idx, kv_idx, input_lengths):
        padding_condition = (q_idx < input_lengths[b]) & (kv_idx < input_lengths[b])
        return padding_condition

    return Made(functools.partial(_flex_attention_mask, input_lengths=input_lengths), None)


def by_name() -> dict[str, Case]:
    return {c.name: c for c in CASES}
