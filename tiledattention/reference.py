"""Float64 references in plain PyTorch (any device, CPU included).

``naive_attention`` is the definition. ``tiled_attention`` re-traces the kernel's
algorithm step by step (query/key tiles, tiles skipped above the causal diagonal,
masking only from ``mask_start``, online softmax in log2 units, head-dim chunks,
zero rows for fully masked queries), so tests on any machine pin what the kernel does.
"""

from __future__ import annotations

import math

import torch

from .headdim import plan_head_dim

LOG2E = 1.0 / math.log(2.0)


def _expand_kv(k, v, heads_q):
    group = heads_q // k.shape[1]
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


def additive_mask(mask, dtype=torch.float64):
    """Bool (True = attend) or additive mask as an additive float mask."""
    if mask is None:
        return None
    if mask.dtype == torch.bool:
        return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(
            ~mask, float("-inf"))
    return mask.to(dtype)


def causal_keep(seq_q, seq_kv, device=None):
    """torch's is_causal: query i attends keys j <= i (top-left aligned)."""
    i = torch.arange(seq_q, device=device)[:, None]
    j = torch.arange(seq_kv, device=device)[None, :]
    return j <= i


def _indices(s):
    """Broadcast index tensors (b, h, q_idx, kv_idx) over a [B, H, Sq, Skv] score tensor."""
    b, h, sq, sk = s.shape
    dev = s.device
    return (torch.arange(b, device=dev)[:, None, None, None],
            torch.arange(h, device=dev)[None, :, None, None],
            torch.arange(sq, device=dev)[None, None, :, None],
            torch.arange(sk, device=dev)[None, None, None, :])


def _scores(q, k, causal, scale, attn_mask, score_ref=None, keep_ref=None):
    """(score_ref(q k^T * scale) + mask, -inf above the causal diagonal and where
    ``keep_ref`` is False; the scale used). ``score_ref(s, b, h, q_idx, kv_idx)`` and
    ``keep_ref(b, h, q_idx, kv_idx)``: a variant's modification in torch (``variants``)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    s = q @ k.transpose(-1, -2) * scale
    if score_ref is not None:
        s = score_ref(s, *_indices(s))
    if keep_ref is not None:
        s = s.masked_fill(~keep_ref(*_indices(s)), float("-inf"))
    bias = additive_mask(attn_mask)
    if bias is not None:
        s = s + bias
    if causal:
        s = s.masked_fill(~causal_keep(s.shape[-2], s.shape[-1], s.device), float("-inf"))
    return s, scale


def naive_attention(q, k, v, *, causal=False, scale=None, attn_mask=None, score_ref=None,
                    keep_ref=None):
    """softmax(q k^T * scale + mask) v in float64; fully masked rows give 0, lse -inf.

    Autograd through it gives fully masked rows P = 0 and finite zero gradients: their row
    sum is divided out as 1 (a divisor clamped to the smallest double made d out / d (P V)
    = dO / tiny, inf for |dO| > 4, and P^T of it 0 * inf = NaN in dV)."""
    q, k, v = q.double(), k.double(), v.double()
    k, v = _expand_kv(k, v, q.shape[1])
    s, _ = _scores(q, k, causal, scale, attn_mask, score_ref, keep_ref)
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None].masked_fill(lse[..., None] == float("-inf"), 0.0))
    out = p @ v
    total = p.sum(-1, keepdim=True)
    out = out / total.masked_fill(total == 0.0, 1.0)
    return out, lse


def quantized(x):
    """``x`` in e4m3 with its per-tensor float32 descale (one element; real = stored x
    descale): amax / 448 maps x's largest magnitude to e4m3's largest, so every element
    keeps e4m3's relative precision (2^-4) unless it is below its normal range. An all-zero
    ``x`` gets descale 1."""
    amax = x.detach().abs().amax().float()
    descale = torch.where(amax > 0, amax / torch.finfo(torch.float8_e4m3fn).max,
                          torch.ones_like(amax)).reshape(1)
    return (x.float() / descale).to(torch.float8_e4m3fn), descale


def dequantized(t, descale, heads: int):
    """``t`` (e4m3) in float64 times its descale ([], [1] or per (batch, K/V head) [B,
    Hkv], None: 1.0), the descale repeated over the ``heads // Hkv`` heads of a group."""
    t = t.double()
    if descale is None:
        return t
    d = descale.double()
    if d.dim() == 2:
        d = d.repeat_interleave(heads // d.shape[1], dim=1)[:, :, None, None]
    else:
        d = d.reshape(())
    return t * d


def fp8_attention(q, k, v, *, q_descale=None, k_descale=None, v_descale=None, causal=False,
                  scale=None):
    """The FP8 forward's float64 reference: ``naive_attention`` of the dequantized inputs
    (q's descales are per K/V head, as FA3's: repeated over the group's query heads)."""
    hk = k.shape[1]
    return naive_attention(dequantized(q, q_descale, q.shape[1]), dequantized(k, k_descale, hk),
                           dequantized(v, v_descale, hk), causal=causal, scale=scale)


def delta_rounding_effect(out, ref, ref_lse, dout, leaves):
    """The change of the float64 gradients of ``leaves`` (captured tensors' copies read by
    ``score_ref``) when delta = rowsum(dO * O) takes the kernel's ``out``, rounded to its
    dtype, instead of the exact ``ref``: every flash backward's delta does, and it is what
    is left of a gradient whose exact value cancels to 0 (a per-head or per-query bias:
    softmax ignores a shift of a whole row). d lse / d score = P, so dS moves by
    -P * (delta' - delta): the gradient of -sum((delta' - delta) * lse). Needs the graph of
    ``ref_lse`` (``naive_attention`` with ``score_ref``), kept by ``retain_graph=True``."""
    dout = dout.double()
    shift = (dout * (out.detach().double() - ref.detach())).sum(-1)
    lse = ref_lse.masked_fill(~torch.isfinite(ref_lse), 0.0)
    grads = torch.autograd.grad(-(shift * lse).sum(), leaves, allow_unused=True,
                                retain_graph=True)
    return [torch.zeros_like(t) if g is None else torch.nan_to_num(g)
            for g, t in zip(grads, leaves)]


def attention_backward(q, k, v, dout, *, causal=False, scale=None, attn_mask=None,
                       dlse=None):
    """(dq, dk, dv) of ``naive_attention`` by the backward kernels' formulas, in float64.

    delta = rowsum(dO * O) - dlse; P = exp(S - lse); dS = P * (dP - delta) with dP = dO V^T;
    dQ = scale * dS K, dK = scale * dS^T Q and dV = P^T dO, summed over each GQA group.
    Fully masked rows (lse = -inf) have P = 0: zero dQ, nothing added to dK and dV (where
    autograd through the naive formula gives NaN).
    """
    q, k, v, dout = q.double(), k.double(), v.double(), dout.double()
    group = q.shape[1] // k.shape[1]
    ke, ve = _expand_kv(k, v, q.shape[1])
    s, scale = _scores(q, ke, causal, scale, attn_mask)
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    p = torch.exp(s - lse.masked_fill(lse == float("-inf"), float("inf")))
    out = p @ ve
    delta = (dout * out).sum(-1, keepdim=True)
    if dlse is not None:
        delta = delta - dlse.double()[..., None]
    ds = p * (dout @ ve.transpose(-1, -2) - delta)
    dq = ds @ ke * scale
    dk = (ds.transpose(-1, -2) @ q * scale)
    dv = p.transpose(-1, -2) @ dout
    b, hk, sk, d = k.shape
    return (dq, dk.reshape(b, hk, group, sk, d).sum(2),
            dv.reshape(b, hk, group, sk, v.shape[-1]).sum(2))


def tiled_attention(q, k, v, *, causal=False, scale=None, attn_mask=None, tile_m=64,
                    tile_n=64):
    """The kernel's algorithm, tile by tile, in float64. Returns (out, lse). V's head dim
    may differ from Q/K's: Q K^T runs over Q/K's chunks, P V and the output over V's."""
    q, k, v = q.double(), k.double(), v.double()
    b, hq, sq, d = q.shape
    k, v = _expand_kv(k, v, hq)
    sk = k.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    qk_scale_log2 = scale * LOG2E
    bias = additive_mask(attn_mask)
    if bias is not None:
        bias = bias.expand(b, hq, sq, sk)
    from .kernel.visit import host_key_range  # the kernels' visit range (loads cuTile)

    widths = plan_head_dim(d).widths
    vwidths = plan_head_dim(v.shape[-1]).widths
    even_n = sk % tile_n == 0

    def chunk(x, c, rows, n_rows, widths=widths):
        # A zero-padded [n_rows, W_c] tile: rows past the sequence and columns past D
        # are explicit zeros, as the kernel's padding_mode=ZERO loads.
        start = sum(widths[:c])
        t = x.new_zeros(b, hq, n_rows, widths[c])
        r = x[:, :, rows, start:start + widths[c]]
        t[:, :, : r.shape[2], : r.shape[3]] = r
        return t

    out = q.new_zeros(b, hq, sq, v.shape[-1])
    lse = q.new_empty(b, hq, sq)
    for mt in range(math.ceil(sq / tile_m)):
        q_start = mt * tile_m
        rows = slice(q_start, min(q_start + tile_m, sq))
        qc = [chunk(q, c, rows, tile_m) for c in range(len(widths))]
        m_i = q.new_full((b, hq, tile_m, 1), float("-inf"))
        l_i = q.new_zeros(b, hq, tile_m, 1)
        acc = [q.new_zeros(b, hq, tile_m, w) for w in vwidths]
        n_tiles, mask_start = host_key_range(q_start, sk, tile_m, tile_n, causal, even_n)
        offs_m = torch.arange(q_start, q_start + tile_m, device=q.device)[:, None]
        for j in range(n_tiles):
            keys = slice(j * tile_n, min((j + 1) * tile_n, sk))
            qk = sum(qc[c] @ chunk(k, c, keys, tile_n).transpose(-1, -2)
                     for c in range(len(widths)))
            if bias is not None:
                t = q.new_zeros(b, hq, tile_m, tile_n)
                r = bias[:, :, rows, keys]
                t[:, :, : r.shape[2], : r.shape[3]] = r
                qk = qk + t / scale
            if (causal or not even_n) and j >= mask_start:
                offs_n = torch.arange(j * tile_n, (j + 1) * tile_n, device=q.device)[None, :]
                keep = torch.ones(tile_m, tile_n, dtype=torch.bool, device=q.device)
                if not even_n:
                    keep &= offs_n < sk
                if causal:
                    keep &= offs_m >= offs_n
                qk = qk.masked_fill(~keep, float("-inf"))
            m_ij = torch.maximum(m_i, qk.amax(-1, keepdim=True) * qk_scale_log2)
            m_sub = m_ij.masked_fill(m_ij == float("-inf"), 0.0)
            p = torch.exp2(qk * qk_scale_log2 - m_sub)
            alpha = torch.exp2(m_i - m_sub)
            l_i = l_i * alpha + p.sum(-1, keepdim=True)
            acc = [a * alpha + p @ chunk(v, c, keys, tile_n, vwidths)
                   for c, a in enumerate(acc)]
            m_i = m_ij
        l_div = l_i.masked_fill(l_i == 0, 1.0)
        n = rows.stop - rows.start
        tile_out = torch.cat([a / l_div for a in acc], dim=-1)[..., :v.shape[-1]]
        out[:, :, rows] = tile_out[:, :, :n]
        lse[:, :, rows] = ((m_i + torch.log2(l_i)) * math.log(2.0))[:, :, :n, 0]
    return out, lse
