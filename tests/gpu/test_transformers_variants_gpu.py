"""transformers models whose attention carries variants, on a GPU: tiny randomly
initialised (no downloads) Gemma-2-style (softcap + alternating sliding-window and full
layers), Mistral-style (sliding window) and gpt-oss-style (sinks + alternating window)
models with our attention against transformers' eager path: logits of a prefill longer
than the window, of a left-padded batch, greedy generation with a KV cache, and (gpt-oss)
the sinks' gradient."""

from __future__ import annotations

import copy

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers not installed: "
                                   "pip install 'tiledattention[hf]'")

from tiledattention.integrations.transformers import register  # noqa: E402
from tiledattention.tolerance import relative_error, rtol, rtol_bwd  # noqa: E402

DTYPE = torch.bfloat16
WINDOW, PROMPT, NEW = 128, 300, 16


def _config(kind):
    small = dict(vocab_size=512, hidden_size=512, intermediate_size=1024, num_hidden_layers=4,
                 num_attention_heads=8, num_key_value_heads=2, head_dim=128,
                 sliding_window=WINDOW, max_position_embeddings=1024)
    if kind == "gemma2":  # initializer_range 0.1: scores of a few units, so softcap bites
        return transformers.Gemma2Config(**small, query_pre_attn_scalar=128,
                                         attn_logit_softcapping=5.0, initializer_range=0.1
                                         ), "Gemma2ForCausalLM"
    if kind == "mistral":
        return transformers.MistralConfig(**small), "MistralForCausalLM"
    if not hasattr(transformers, "GptOssConfig"):
        pytest.skip(f"transformers {transformers.__version__} has no GptOss")
    # Every expert active: routing stays continuous, so bf16 rounding flips no expert.
    return transformers.GptOssConfig(**small, num_local_experts=2, num_experts_per_tok=2
                                     ), "GptOssForCausalLM"


def _pair(kind, train=False):
    cfg, cls = _config(kind)
    torch.manual_seed(0)
    ours = getattr(transformers, cls)(cfg)
    for layer in ours.model.layers if kind == "gpt_oss" else ():
        # sinks of the size of log(#keys), so they take a real share of each softmax
        torch.nn.init.normal_(layer.self_attn.sinks, 4.0, 1.0)
    ours = ours.to("cuda", DTYPE)
    ref = getattr(transformers, cls)(copy.deepcopy(cfg)).to("cuda", DTYPE)
    ref.load_state_dict(ours.state_dict())
    ours.set_attn_implementation(register())
    ref.set_attn_implementation("eager")
    return (ours.train(), ref.train()) if train else (ours.eval(), ref.eval())


KINDS = ["gemma2", "mistral", "gpt_oss"]


@pytest.fixture(scope="module", params=KINDS)
def models(request):
    return request.param, *_pair(request.param)


def _close(a, b, what):
    err = relative_error(a.float(), b.double())
    assert err <= 2 * rtol(DTYPE), f"{what}: logits differ by {err:.3e}"


@torch.inference_mode()
def test_prefill_longer_than_the_window_matches_eager(models):
    kind, ours, ref = models
    ids = torch.randint(0, 512, (2, PROMPT), device="cuda")
    _close(ours(ids).logits, ref(ids).logits, kind)


@torch.inference_mode()
def test_left_padded_batch_matches_eager(models):
    kind, ours, ref = models
    ids = torch.randint(0, 512, (3, PROMPT), device="cuda")
    mask = torch.ones_like(ids)
    mask[0, :100] = 0
    mask[2, :3] = 0
    keep = mask.bool()  # padded positions: compare the real tokens
    _close(ours(ids, attention_mask=mask).logits[keep],
           ref(ids, attention_mask=mask).logits[keep], kind)


@torch.inference_mode()
def test_greedy_generation_with_a_kv_cache_matches_eager(models):
    """Every decode step's logits (the cache past the window, a left-padded row) match
    eager's while the two share a prefix, and the tokens are eager's except where eager's
    own top-2 margin is inside the measured logit difference (bf16 near-ties)."""
    kind, ours, ref = models
    ids = torch.randint(0, 512, (2, PROMPT), device="cuda")
    mask = torch.ones_like(ids)
    mask[1, :37] = 0
    kw = dict(attention_mask=mask, max_new_tokens=NEW, do_sample=False, use_cache=True,
              pad_token_id=0, output_logits=True, return_dict_in_generate=True)
    a, b = ours.generate(ids, **kw), ref.generate(ids, **kw)
    steps = 0
    for row in range(2):
        got, want = a.sequences[row, PROMPT:], b.sequences[row, PROMPT:]
        for t in range(NEW):
            la, lb = a.logits[t][row].float(), b.logits[t][row].float()
            _close(la, lb, f"{kind} row {row} step {t}")
            steps += 1
            if got[t] != want[t]:
                margin = (lb[want[t]] - lb[got[t]]).item()
                bound = 2 * (la - lb).abs().max().item()
                assert margin <= bound, (f"{kind} row {row} step {t}: token {got[t].item()} "
                                         f"vs eager's {want[t].item()}, margin {margin:.3f}")
                break  # the prefixes differ from here on
    assert steps >= 2


def test_gpt_oss_sinks_get_eagers_gradient():
    ours, ref = _pair("gpt_oss", train=True)
    ids = torch.randint(0, 512, (2, 256), device="cuda")
    for model in (ours, ref):
        model(ids, labels=ids).loss.backward()
    for layer_ours, layer_ref in zip(ours.model.layers, ref.model.layers):
        g, r = layer_ours.self_attn.sinks.grad, layer_ref.self_attn.sinks.grad
        assert g is not None and torch.isfinite(g).all()
        err = relative_error(g.float(), r.double())
        assert err <= 2 * rtol_bwd(DTYPE), f"sinks' gradient differs by {err:.3e}"
