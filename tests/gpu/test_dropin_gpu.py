"""The drop-in mode on a GPU: unmodified models that call PyTorch's SDPA (a Hugging Face
Llama with attn_implementation="sdpa", a timm-style ViT block calling
F.scaled_dot_product_attention, torchvision-style nn.MultiheadAttention) run the kernel
inside ``ta.sdpa_mode()``; outputs and gradients are compared with the same models outside
the mode (PyTorch's SDPA), eager, in a training step and under torch.compile. Every test
asserts the routing counts, so a silent fallback to PyTorch fails it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import tiledattention as ta
from tiledattention.tolerance import relative_error, rtol, rtol_bwd

DTYPE = torch.bfloat16


def _err(a, b) -> float:
    return relative_error(a.float(), b.double())


class ViTBlock(torch.nn.Module):
    """timm's ViT block as timm writes it (fused_attn: F.scaled_dot_product_attention)."""

    def __init__(self, dim=768, heads=12):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(dim, 4 * dim), torch.nn.GELU(),
                                       torch.nn.Linear(4 * dim, dim))

    def forward(self, x):
        b, n, c = x.shape
        qkv = self.qkv(self.norm1(x)).reshape(b, n, 3, self.heads, c // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
        a = F.scaled_dot_product_attention(q, k, v)
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, c))
        return x + self.mlp(self.norm2(x))


def _vit(seed=0):
    torch.manual_seed(seed)
    return ViTBlock().to("cuda", DTYPE)


def _tokens(b=4, n=197, dim=768):  # ViT-B/16 at 224 px: 196 patches + the class token
    return torch.randn(b, n, dim, device="cuda", dtype=DTYPE)


def _grads(module):
    return [p.grad for p in module.parameters()]


@torch.inference_mode()
def test_an_unmodified_hf_llama_runs_the_kernel_inside_the_mode():
    pytest.importorskip("transformers", reason="transformers not installed")
    from tiledattention.integrations.transformers import tiny_llama

    model = tiny_llama("sdpa", dtype=DTYPE)
    ids = torch.randint(0, 1024, (2, 300), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, :40] = 0  # left padding: transformers passes a bool mask
    want = model(ids).logits
    want_padded = model(ids, attention_mask=mask).logits
    with ta.sdpa_mode() as mode:
        got = model(ids).logits
        got_padded = model(ids, attention_mask=mask).logits
    layers = model.config.num_hidden_layers
    assert mode.routed == 2 * layers and not mode.fallbacks, mode
    assert _err(got, want) <= 2 * rtol(DTYPE)
    keep = mask.bool()
    assert _err(got_padded[keep], want_padded[keep]) <= 2 * rtol(DTYPE)


@torch.inference_mode()
def test_a_vit_block_runs_the_kernel_inside_the_mode():
    block, x = _vit(), _tokens()
    want = block(x)
    with ta.sdpa_mode() as mode:
        got = block(x)
    assert mode.routed == 1 and not mode.fallbacks, mode
    assert _err(got, want) <= 2 * rtol(DTYPE)


def test_a_multihead_attention_training_step_runs_the_kernel_inside_the_mode():
    """torchvision's ViT encoder block calls nn.MultiheadAttention(need_weights=False)."""
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(768, 12, batch_first=True).to("cuda", DTYPE)
    x = _tokens()

    def step():
        mha.zero_grad()
        out, _ = mha(x, x, x, need_weights=False)
        out.float().square().mean().backward()
        return out, _grads(mha)

    want, want_grads = step()
    with ta.sdpa_mode() as mode:
        got, got_grads = step()
    assert mode.routed == 1 and not mode.fallbacks, mode
    assert _err(got, want) <= 2 * rtol(DTYPE)
    for g, w in zip(got_grads, want_grads):
        assert _err(g, w) <= 2 * rtol_bwd(DTYPE)


def test_a_training_step_matches_pytorchs_gradients_and_update():
    block, x = _vit(), _tokens()
    ref = _vit()

    def step(module):
        opt = torch.optim.SGD(module.parameters(), lr=0.1)
        loss = module(x).float().square().mean()
        loss.backward()
        grads = [g.clone() for g in _grads(module)]
        opt.step()
        return loss.item(), grads

    want_loss, want_grads = step(ref)
    with ta.sdpa_mode() as mode:
        loss, grads = step(block)
    assert mode.routed == 1 and not mode.fallbacks, mode
    assert loss == pytest.approx(want_loss, rel=2 * rtol(DTYPE))
    for g, w in zip(grads, want_grads):
        assert _err(g, w) <= 2 * rtol_bwd(DTYPE)
    for p, r in zip(block.parameters(), ref.parameters()):
        assert _err(p, r) <= 2 * rtol(DTYPE)


@pytest.mark.parametrize("mode_name", ["default", "reduce-overhead"])
def test_a_compiled_vit_block_runs_the_kernel_fullgraph_forward_and_backward(mode_name):
    block, x = _vit(), _tokens()
    torch._dynamo.reset()
    compiled = torch.compile(block, fullgraph=True, mode=mode_name)
    with torch.no_grad():
        want = block(x)
    with ta.sdpa_mode() as mode:
        with torch.no_grad():
            outs = [compiled(x).clone() for _ in range(3)]
        block.zero_grad()
        compiled(x).float().square().mean().backward()
        grads = [g.clone() for g in _grads(block)]
    assert mode.routed >= 2 and not mode.fallbacks, mode  # one per compilation: no-grad, grad
    assert all(_err(o, want) <= 2 * rtol(DTYPE) for o in outs)
    block.zero_grad()
    block(x).float().square().mean().backward()
    for g, w in zip(grads, _grads(block)):
        assert _err(g, w) <= 2 * rtol_bwd(DTYPE)


@torch.inference_mode()
def test_a_compiled_hf_llama_runs_the_kernel_inside_the_mode():
    pytest.importorskip("transformers", reason="transformers not installed")
    from tiledattention.integrations.transformers import tiny_llama

    model = tiny_llama("sdpa", dtype=DTYPE)
    ids = torch.randint(0, 1024, (1, 512), device="cuda")
    want = model(ids).logits
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    with ta.sdpa_mode() as mode:
        got = compiled(ids).logits
    assert mode.routed == model.config.num_hidden_layers and not mode.fallbacks, mode
    assert _err(got, want) <= 2 * rtol(DTYPE)


def test_what_the_kernel_does_not_do_on_the_gpu_goes_to_pytorch_counted():
    q, k, v = (torch.randn(1, 4, 64, 64, device="cuda") for _ in range(3))
    with ta.sdpa_mode() as mode:
        fp32 = F.scaled_dot_product_attention(q, k, v)
        torch.manual_seed(1)
        dropped = F.scaled_dot_product_attention(q.to(DTYPE), k.to(DTYPE), v.to(DTYPE),
                                                 dropout_p=0.3)
        odd = F.scaled_dot_product_attention(*(t[..., :20].to(DTYPE) for t in (q, k, v)))
        # A value head dim unlike the query's is the kernel's (D_qk != D_v) where both are
        # head dims it takes; a V of 20 is refused by sdpa's checks and goes to PyTorch.
        narrow = F.scaled_dot_product_attention(q.to(DTYPE), k.to(DTYPE),
                                                v[..., :32].to(DTYPE))
        odd_v = F.scaled_dot_product_attention(q.to(DTYPE), k.to(DTYPE),
                                               v[..., :20].to(DTYPE))
    assert _err(narrow, F.scaled_dot_product_attention(
        q.to(DTYPE), k.to(DTYPE), v[..., :32].to(DTYPE))) <= 2 * rtol(DTYPE)
    assert torch.equal(odd_v, F.scaled_dot_product_attention(q.to(DTYPE), k.to(DTYPE),
                                                             v[..., :20].to(DTYPE)))
    torch.manual_seed(1)
    assert torch.equal(dropped, F.scaled_dot_product_attention(
        q.to(DTYPE), k.to(DTYPE), v.to(DTYPE), dropout_p=0.3))
    assert torch.equal(fp32, F.scaled_dot_product_attention(q, k, v))
    assert odd.shape[-1] == 20
    assert mode.fallbacks == {"dtype float32": 1, "dropout": 1, "head dim 20": 1,
                              "rejected: UnsupportedHeadDimError": 1}
    assert mode.routed == 1
