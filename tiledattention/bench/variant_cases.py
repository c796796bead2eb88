"""The variants the ``variants`` stage measures, behind one registry: per variant, what each
method runs for it.

A variant is built for one point's (B, H, S) on one device into ``Parts``: the keyword
arguments of ``tiledattention.sdpa`` (the built-in variant through the public API), the
same modification as torch ``score_mod`` / ``mask_mod`` functions (FlexAttention's
signature; eager attention and SDPA's materialised mask evaluate them over broadcast index
tensors), and the float64 reference's arguments. Both torch forms are the built-in's one
torch definition (``variants.reference_of``), causality folded in where the built-in
leaves it to ``is_causal``.
Adding a variant to the stage is one ``Variant`` entry in ``VARIANTS`` (docs/API.md, "Writing
your own variant"). Nothing here imports torch until a variant is built, so the config
and the command line read the names for free.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from .grid import Point

WINDOW = 1024  # sliding window: Mistral's and Gemma's local layers use 4096 and 1024..4096
SOFTCAP = 30.0  # Gemma 2's attention logit cap
DOCUMENTS = 4  # packed documents of equal length per row


@dataclass
class Parts:
    """One variant built for one (B, H, S) and device."""

    ours: dict  # tiledattention.sdpa keyword arguments (is_causal, score_mod, block_mask)
    reference: dict  # reference.naive_attention keyword arguments (causal, score_ref, ...)
    # the built-in's torch form (``variants.reference_of``): score_mod(score, b, h, q_idx,
    # kv_idx) and mask_mod(b, h, q_idx, kv_idx), causality folded in
    score: Callable | None = None
    mask: Callable | None = None
    # The mask depends on the batch / head index (else None: FlexAttention's block mask and
    # SDPA's materialised mask broadcast over it).
    mask_batch: int | None = None
    mask_heads: int | None = None
    bias_heads: int | None = None  # the score modification depends on h (SDPA's bias shape)
    sdpa: str | None = None  # how SDPA takes it: "bias" (additive float), "bool"; None: no
    no_sdpa: str = ""  # mask expresses it, and this says why
    # FlashAttention-4's form: flash_attn.cute.flash_attn_func keyword arguments (native
    # causal / window_size / softcap), or None and ``no_fa4`` says why.
    fa4: dict | None = None
    no_fa4: str = ""
    cache: dict = field(default_factory=dict)  # masks made once per point (not timed)


@dataclass(frozen=True)
class Variant:
    name: str
    description: str
    causal: bool  # the point's causal flag: the FLOP model halves causal points
    build: Callable  # (batch, heads, seq, device) -> Parts


@dataclass(frozen=True)
class VariantPoint(Point):
    """A benchmark point of the variants stage: a grid point and the variant measured."""

    variant: str = "causal"

    def key(self) -> str:
        return f"{self.variant}-{super().key()}"


# FA4 drops causal= and visits every tile once a mask_mod is given (only a block-sparse
# tensor set, which FlexAttention's FLASH backend builds from the block mask, skips tiles):
# a mask_mod-only FA4 row would time a handicapped FA4, so these variants' FA4 is flex_flash.
_NO_FA4 = ("FA4 takes this variant only as a CuTe DSL {} with block-sparse tensors (without "
           "them it visits every tile); FlexAttention's FLASH backend builds both and runs it "
           "on FA4's kernels: method flex_flash")


def _causal(b, h, q, k):
    return q >= k


def _causal_and(keep: Callable) -> Callable:
    """A built-in mask_mod's torch form with causality folded in."""
    return lambda b, h, q, k: (q >= k) & keep(b, h, q, k)


def _build_causal(batch, heads, seq, device):
    return Parts({"is_causal": True}, {"causal": True}, mask=_causal, sdpa="bool",
                 fa4={"causal": True})


def _build_window(batch, heads, seq, device):
    import tiledattention as ta
    from tiledattention import variants

    window = variants.sliding_window(WINDOW)
    return Parts({"is_causal": True, "block_mask": ta.block_mask(window, None, None, seq, seq,
                                                                 device)},
                 {"causal": True, "keep_ref": window},
                 mask=window, sdpa="bool",  # right=0: causal already
                 # FA4 keeps keys q - left .. q + right: WINDOW keys including the diagonal
                 fa4={"causal": True, "window_size": (WINDOW - 1, 0)})


def _build_softcap(batch, heads, seq, device):
    from tiledattention import variants

    cap = variants.softcap(SOFTCAP)
    ref = variants.reference_of(cap)  # softcap's kernel code is hand-written ct
    return Parts({"is_causal": True, "score_mod": cap},
                 {"causal": True, "score_ref": ref},
                 score=ref, mask=_causal,
                 no_sdpa="SDPA takes no score modification: softcapping is not a mask",
                 # FA4 caps the scaled scores, as the score_mod above (s = q.k * scale)
                 fa4={"causal": True, "softcap": SOFTCAP})


def _build_alibi(batch, heads, seq, device):
    from tiledattention import variants

    slopes = variants.alibi_slopes(heads, device)
    alibi = variants.alibi(slopes)
    mods = _fa4_alibi_mods()
    return Parts({"is_causal": True, "score_mod": alibi},
                 {"causal": True, "score_ref": alibi},
                 score=alibi, mask=_causal,
                 bias_heads=heads, sdpa="bias",
                 # FA4: the same bias as a CuTe DSL score_mod, the slopes as its aux tensor
                 fa4=mods and {"causal": True, "score_mod": mods[0], "score_mod_bwd": mods[1],
                               "aux_tensors": [slopes]},
                 no_fa4="" if mods else "the CuTe DSL (cutlass) cannot be imported")


@functools.lru_cache(maxsize=1)
def _fa4_alibi_mods():
    """ALiBi as FA4's CuTe DSL (score_mod, score_mod_bwd): s + slope[h] * (kv - q) on the
    scaled scores, the slopes read from aux_tensors[0]; its gradient in s is 1. None where
    the DSL is not importable (FA4's own check says so first). Register fragments are
    ``cute.make_rmem_tensor``, as FA4's own kernels make them: nvidia-cutlass-dsl 4.8 has
    no ``cute.make_fragment``."""
    try:
        import cutlass
        import cutlass.cute as cute
    except Exception:
        return None

    @cute.jit
    def score_mod(tSrS_ssa, b_idx, h_idx, q_idx, kv_idx, seqlen_info, aux_tensors):
        slopes = aux_tensors[0]
        h = cute.make_rmem_tensor(1, cutlass.Int32)
        h.store(h_idx)
        slope = cute.make_rmem_tensor(1, slopes.element_type)
        slope[0] = slopes[h[0]]
        dist = (kv_idx - q_idx).to(cutlass.Float32)
        return tSrS_ssa + slope.load().to(cutlass.Float32) * dist

    @cute.jit
    def score_mod_bwd(grad_out_ssa, score_ssa, b_idx, h_idx, q_idx, kv_idx, seqlen_info,
                      aux_tensors):
        return grad_out_ssa

    return score_mod, score_mod_bwd


def _build_documents(batch, heads, seq, device):
    import tiledattention as ta
    from tiledattention import variants

    # Every row packs the same documents, so the masks do not depend on b (None below);
    # the ids still cover every row, as the kernels index them with the real b.
    lengths = [seq // DOCUMENTS] * (DOCUMENTS - 1)
    ids = variants.segments_from_lengths(lengths + [seq - sum(lengths)], device)
    ids = ids.expand(batch, seq).contiguous()
    doc = variants.document(ids)
    return Parts({"is_causal": True, "block_mask": ta.block_mask(doc, None, None, seq, seq,
                                                                 device)},
                 {"causal": True, "keep_ref": doc},
                 mask=_causal_and(doc), sdpa="bool", no_fa4=_NO_FA4.format("mask_mod"))


def _build_prefix_lm(batch, heads, seq, device):
    import torch

    import tiledattention as ta
    from tiledattention import variants

    lens = torch.full((batch,), seq // 4, dtype=torch.int32, device=device)
    prefix = variants.prefix_lm(lens)
    return Parts({"block_mask": ta.block_mask(prefix, None, None, seq, seq, device)},
                 {"causal": False, "keep_ref": prefix},
                 mask=prefix, sdpa="bool",
                 no_fa4=_NO_FA4.format("mask_mod"))


# Registry order is the order of the table's rows and the figure's lines. (Attention sinks
# join as one entry once tiledattention.variants has them: their SDPA/Flex equivalents are
# a build function's business, the stage needs nothing else.)
VARIANTS: dict[str, Variant] = {v.name: v for v in (
    Variant("causal", "causal attention (the base every variant below is measured on)", True,
            _build_causal),
    Variant("window", f"causal sliding window of {WINDOW} keys (Mistral, Gemma)", True,
            _build_window),
    Variant("softcap", f"causal, logits soft-capped at {SOFTCAP:g} (Gemma 2)", True,
            _build_softcap),
    Variant("alibi", "causal ALiBi, per-head slopes (BLOOM, MPT)", True, _build_alibi),
    Variant("documents", f"causal, {DOCUMENTS} packed documents per row", True,
            _build_documents),
    Variant("prefix_lm", "prefix-LM, the first S/4 tokens bidirectional (T5, UL2)", False,
            _build_prefix_lm),
)}
VARIANT_NAMES = tuple(VARIANTS)


def variant_of(point) -> str | None:
    """The variant a point measures (None: a plain grid point)."""
    return getattr(point, "variant", None)


@functools.lru_cache(maxsize=1)  # one point at a time: its masks go with the next point
def _parts(name: str, batch: int, heads: int, seq: int, device: str) -> Parts:
    import torch

    return VARIANTS[name].build(batch, heads, seq, torch.device(device))


def parts_for(point, device) -> Parts:
    """The variant of a variants-stage point, built once for its shape and device."""
    import torch

    if point.seq_q != point.seq_kv:
        raise ValueError("variants are measured as self-attention (Sq = Skv)")
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:  # one cache entry per GPU, not two
        device = torch.device("cuda", torch.cuda.current_device())
    return _parts(point.variant, point.batch, point.heads, point.seq_q, str(device))


def reference_kwargs(point, device) -> dict:
    """naive_attention's keyword arguments for a point: its mask, and a variant's
    modification for a variants-stage point."""
    if variant_of(point) is None:
        return {"causal": point.causal}
    return parts_for(point, device).reference


def indices(batch: int, heads: int, seq: int, device):
    """Broadcast index tensors (b [B,1,1,1], h [1,H,1,1], q [1,1,S,1], kv [1,1,1,S])."""
    import torch

    def ar(n, dim):
        shape = [1, 1, 1, 1]
        shape[dim] = n
        return torch.arange(n, device=device).view(shape)

    return ar(batch, 0), ar(heads, 1), ar(seq, 2), ar(seq, 3)


def modified_scores(s, parts: Parts):
    """Eager attention's scores [B, H, S, S] (fp32) with the variant applied."""
    idx = indices(s.shape[0], s.shape[1], s.shape[2], s.device)
    if parts.score is not None:
        s = parts.score(s, *idx)
    if parts.mask is not None:
        s = s.masked_fill(~parts.mask(*idx), float("-inf"))
    return s


def sdpa_mask(parts: Parts, point, dtype, device):
    """The variant as an explicit SDPA mask, materialised once per point: bool (True:
    attend) or an additive bias of q's dtype with -inf where masked; [1 or B, 1 or H, S, S]
    as the mask depends on b and h."""
    import torch

    key = ("sdpa", dtype)
    if key not in parts.cache:
        for other in [k for k in parts.cache if k[0] == "sdpa"]:
            del parts.cache[other]  # one dtype at a time: a mask may take gigabytes
        b = parts.mask_batch or 1
        h = max(parts.mask_heads or 1, parts.bias_heads or 1 if parts.sdpa == "bias" else 1)
        idx = indices(b, h, point.seq_q, device)
        keep = parts.mask(*idx).expand(b, h, point.seq_q, point.seq_kv) \
            if parts.mask is not None else None
        if parts.sdpa == "bool":
            mask = keep.contiguous()
        else:  # in place where it can: the fp32 bias of a long S is gigabytes
            zero = torch.zeros((), dtype=torch.float32, device=device)
            bias = parts.score(zero, *idx).float() if parts.score is not None else zero
            bias = bias.expand(b, h, point.seq_q, point.seq_kv).contiguous()
            if keep is not None:
                bias.masked_fill_(~keep, float("-inf"))
            mask = bias.to(dtype)
            del bias
        parts.cache[key] = mask
    return parts.cache[key]


def flex_block_mask(parts: Parts, point, device):
    """FlexAttention's block mask of the variant (made once per point, not timed)."""
    if ("flex",) not in parts.cache:
        from torch.nn.attention.flex_attention import create_block_mask

        parts.cache[("flex",)] = None if parts.mask is None else create_block_mask(
            parts.mask, parts.mask_batch, parts.mask_heads, point.seq_q, point.seq_kv,
            device=device)
    return parts.cache[("flex",)]
