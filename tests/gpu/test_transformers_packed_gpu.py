"""Padding-free training and continuous batching through the transformers integration on a
GPU: the tiny Llama (random weights, no download; D = 128, GQA 16/4) on a packed batch of
ragged sequences from ``DataCollatorWithFlattening``, against eager attention on the same
packed batch; one step under ``torch.compile``; and ``generate_batch`` through
``paged|tiledattention`` against eager greedy generation.

The tolerance ("within bf16 noise"): the truth is the same model in float32 with eager
attention. Our bf16 loss and every parameter's gradient must lie within 2x the distance of
eager attention run in bf16 from that truth (plus a floor of rtol(bf16) / 10 for tensors
where bf16 eager happens to land very close): attention is one op of many in the step, and
the bf16 rounding of the whole model (matmuls, norms, the softmax's P) sets the noise; a
kernel as accurate as bf16 eager sits at ~1x of it, a wrong mask or offset at >> 10x.
"""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers", reason="transformers not installed: "
                                   "pip install 'tiledattention[hf]'")

from transformers import DataCollatorWithFlattening, GenerationConfig  # noqa: E402
from transformers.generation.configuration_utils import ContinuousBatchingConfig  # noqa: E402

from tiledattention import varlen  # noqa: E402
from tiledattention.integrations.transformers import register, tiny_llama  # noqa: E402
from tiledattention.tolerance import relative_error, rtol  # noqa: E402

DTYPE = torch.bfloat16
LENGTHS = (37, 300, 1, 129, 512, 64, 255, 17)  # ragged; a length-1 sequence; 1315 tokens


def _packed(fa_kwargs: bool, lengths=LENGTHS, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    features = [{"input_ids": torch.randint(0, 1024, (n,), generator=gen).tolist()}
                for n in lengths]
    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=fa_kwargs)(features)
    return {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in batch.items()}


def _step(model, batch):
    model.zero_grad(set_to_none=True)
    loss = model(**batch, use_cache=False).loss  # a cache would drop eager's packed mask
    loss.backward()
    # A compiled model's names carry torch.compile's "_orig_mod." prefix.
    return loss.detach().double(), {n.removeprefix("_orig_mod."): p.grad.double()
                                    for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def truth_and_eager():
    """(fp32 eager, bf16 eager) loss and gradients on both packed batches."""
    out = {}
    for fa in (True, False):
        batch = _packed(fa)
        fp32 = tiny_llama("eager", dtype=torch.float32, layers=2).train()
        bf16 = tiny_llama("eager", dtype=DTYPE, layers=2).train()
        out[fa] = _step(fp32, batch), _step(bf16, batch)
        del fp32, bf16
    return out


def _within_bf16_noise(ours, truth, eager, what=""):
    (loss, grads), (t_loss, t_grads), (e_loss, e_grads) = ours, truth, eager
    floor = rtol(DTYPE) / 10
    err, noise = relative_error(loss, t_loss), relative_error(e_loss, t_loss)
    assert err <= 2 * noise + floor, f"{what}loss: {err:.2e} vs eager bf16 {noise:.2e}"
    worst = []
    for name, g in grads.items():
        err = relative_error(g, t_grads[name])
        noise = relative_error(e_grads[name], t_grads[name])
        worst.append((err / (2 * noise + floor), name, err, noise))
    ratio, name, err, noise = max(worst)
    assert ratio <= 1.0, f"{what}{name}: grad error {err:.2e} vs eager bf16 {noise:.2e}"


@pytest.mark.parametrize("fa_kwargs", [True, False], ids=["cu_seq_lens", "position_ids"])
def test_a_packed_training_step_matches_eager_within_bf16_noise(truth_and_eager, fa_kwargs,
                                                                monkeypatch):
    calls = []
    real = varlen.sdpa_varlen
    monkeypatch.setattr(varlen, "sdpa_varlen",
                        lambda *a, **k: calls.append(k["causal"]) or real(*a, **k))
    model = tiny_llama(register(), dtype=DTYPE, layers=2).train()
    ours = _step(model, _packed(fa_kwargs))
    assert calls and all(calls)  # the packed path ran, causal
    truth, eager = truth_and_eager[fa_kwargs]
    _within_bf16_noise(ours, truth, eager)


def test_a_compiled_packed_training_step_matches_eager_within_bf16_noise(truth_and_eager):
    model = tiny_llama(register(), dtype=DTYPE, layers=2).train()
    compiled = torch.compile(model)
    batch = _packed(True)  # the collator's offsets: no host sync inside the graph
    _step(compiled, batch)  # compile
    truth, eager = truth_and_eager[True]
    _within_bf16_noise(_step(compiled, batch), truth, eager, "compiled: ")


@pytest.mark.parametrize("graphs", [False, None], ids=["launched", "cuda-graphs-default"])
def test_generate_batch_through_the_paged_cache_matches_eager_greedy(monkeypatch, graphs):
    """Token for token, except where eager's own top-2 margin is within bf16 rounding of
    the logits (random weights give near-ties, where rounding alone picks either). Without
    CUDA graphs, and with transformers' default for a mask-free implementation like ours:
    CUDA graphs (padded shapes, max_seqlen_k rounded up) and asynchronous batching."""
    calls = []
    real = varlen.sdpa_paged
    monkeypatch.setattr(varlen, "sdpa_paged",
                        lambda *a, **k: calls.append(k["max_seqlen_q"]) or real(*a, **k))
    name = register()
    ours = tiny_llama("paged|" + name, dtype=DTYPE, layers=2)
    ref = tiny_llama("eager", dtype=DTYPE, layers=2)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 1024, (n,), generator=gen).tolist() for n in (5, 100, 333, 700)]
    new = 16
    cfg = GenerationConfig(max_new_tokens=new, do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    cb = ContinuousBatchingConfig(block_size=64, num_blocks=64, max_batch_tokens=256,
                                  use_cuda_graph=graphs)
    out = ours.generate_batch(prompts, generation_config=cfg, continuous_batching_config=cb,
                              progress_bar=False)
    assert calls  # sdpa_paged ran (under graphs: while capturing; padding states max_q)
    if graphs is False:
        assert any(q > 1 for q in calls) and any(q == 1 for q in calls)  # chunks, decode
    exact = 0
    for i, p in enumerate(prompts):
        got = out[f"req_{i}"].generated_tokens
        want = ref.generate(torch.tensor([p], device="cuda"), max_new_tokens=new,
                            do_sample=False, pad_token_id=0)[0, len(p):].tolist()
        t = next((t for t, (a, b) in enumerate(zip(got, want)) if a != b), None)
        if t is None:
            exact += 1
            continue
        with torch.inference_mode():
            logits = ref(torch.tensor([p + want[:t]], device="cuda")).logits[0, -1].float()
        margin = (logits[want[t]] - logits[got[t]]).item()
        bound = 8 * 2.0 ** -8 * logits.abs().max().item()  # 8 bf16 ulps of the largest logit
        assert margin <= bound, f"request {i} step {t}: {got[t]} vs {want[t]}, margin {margin}"
    assert exact >= len(prompts) // 2
