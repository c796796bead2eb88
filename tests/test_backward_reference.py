"""The backward's formulas against autograd of the naive definition, in float64 on the CPU.

``attention_backward`` states what the cuTile backward kernels compute (delta, P from the
LSE, dS, dQ/dK/dV, GQA group sums, fully masked rows); these checks pin it to the
definition, and ``torch.autograd.gradcheck`` pins the definition's own gradients.
"""

from __future__ import annotations

import pytest
import torch

from tiledattention.reference import attention_backward, naive_attention

CASES = {
    "plain": dict(),
    "causal": dict(causal=True),
    "causal_sq_lt_skv": dict(causal=True, sk=11),
    "causal_sq_gt_skv": dict(causal=True, sq=11, sk=5),
    "gqa": dict(hq=4, hk=2),
    "mqa_causal": dict(hq=3, hk=1, causal=True),
    "scale": dict(scale=0.3),
    "additive_mask": dict(mask="additive"),
    "bool_mask": dict(mask="bool"),
    "key_padding_mask": dict(mask="key_padding"),
}


def make(hq=2, hk=2, sq=7, sk=7, d=8, mask=None, causal=False, scale=None, seed=0):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    q, k, v = rnd(2, hq, sq, d), rnd(2, hk, sk, d), rnd(2, hk, sk, d)
    m = None
    if mask == "additive":
        m = rnd(1, hq, sq, sk)
    elif mask == "bool":
        m = torch.rand(2, 1, sq, sk, generator=g) > 0.3
        m[..., 0] = True  # no fully masked row: autograd of the naive formula is finite
    elif mask == "key_padding":
        m = torch.ones(2, 1, 1, sk, dtype=torch.bool)
        m[1, ..., sk // 2:] = False
    return (q, k, v), dict(causal=causal, scale=scale, attn_mask=m)


@pytest.mark.parametrize("case", CASES)
def test_naive_attention_passes_gradcheck(case):
    small = {**CASES[case], "sq": min(CASES[case].get("sq", 4), 4),
             "sk": min(CASES[case].get("sk", 4), 5)}
    (q, k, v), kw = make(**small)
    inputs = tuple(t.requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(lambda a, b, c: naive_attention(a, b, c, **kw)[0], inputs)


@pytest.mark.parametrize("case", CASES)
def test_backward_formulas_equal_autograd_of_the_definition(case):
    (q, k, v), kw = make(**CASES[case])
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    out, lse = naive_attention(q, k, v, **kw)
    dout = torch.randn_like(out)
    dlse = torch.randn_like(lse)
    (out * dout).sum().add((lse * dlse).sum()).backward()
    got = attention_backward(q.detach(), k.detach(), v.detach(), dout, dlse=dlse, **kw)
    for name, g, want in zip("qkv", got, (q.grad, k.grad, v.grad)):
        torch.testing.assert_close(g, want, msg=f"d{name}")


def test_fully_masked_rows_get_zero_grads_and_add_nothing():
    (q, k, v), kw = make(sq=6, sk=6)
    mask = torch.ones(2, 1, 6, 6, dtype=torch.bool)
    mask[:, :, 2] = False  # query row 2 attends nothing
    dout = torch.randn(2, 2, 6, 8, dtype=torch.float64)
    dq, dk, dv = attention_backward(q, k, v, dout, attn_mask=mask)
    assert all(torch.isfinite(t).all() for t in (dq, dk, dv))
    assert (dq[:, :, 2] == 0).all()
    keep = [0, 1, 3, 4, 5]  # the same problem without the dead row
    qq, kk, vv = (t.clone().requires_grad_() for t in (q[:, :, keep], k, v))
    out, _ = naive_attention(qq, kk, vv)
    (out * dout[:, :, keep]).sum().backward()
    torch.testing.assert_close(dq[:, :, keep], qq.grad)
    torch.testing.assert_close(dk, kk.grad)
    torch.testing.assert_close(dv, vv.grad)
