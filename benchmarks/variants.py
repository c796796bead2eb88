"""Variants, side by side in one run: tiledattention's block-sparse variants against full
causal attention (the issue-21 sparsity targets) and against FlexAttention (``torch.compile``d
``flex_attention`` with the equivalent ``score_mod`` and block mask) and cuDNN's causal SDPA.

Kernel time per call (CUDA events, L2 flushed before each call, methods interleaved over
rounds), forward and forward+backward; every tiledattention output is checked against
FlexAttention's (or the naive formula's where Flex cannot run). Prints a table and the
ratios; FlexAttention is reported unavailable (with the reason) where Triton is missing.

    python benchmarks/variants.py --sparsity   # window 1024 and 4 documents vs causal, S=16384
    python benchmarks/variants.py --flex       # B8 H16 S4096 D128 bf16, each variant
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import tiledattention as ta  # noqa: E402
from tiledattention import variants  # noqa: E402
from tiledattention.bench.runner import pass_callable  # noqa: E402
from tiledattention.timing import L2Flusher, time_cuda  # noqa: E402


def measure(fns: dict, rounds: int = 3, reps: int = 10) -> dict:
    flush = L2Flusher()
    samples = {n: [] for n in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            try:
                samples[name] += time_cuda(fn, warmup=2, reps=reps, flush=flush)
            except Exception as exc:  # one method failing must not hide the others
                samples[name] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    return {n: (sorted(v)[len(v) // 2] if isinstance(v, list) else v) for n, v in samples.items()}


def with_grad(fn, q, k, v):
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    return pass_callable(lambda: fn(qg, kg, vg), qg, kg, vg, torch.randn_like(q), "fwd+bwd")


def definitions(b, h, s, device="cuda"):
    """name -> (ta kwargs, flex score_mod, flex mask_mod) for the issue's variants."""
    ids = variants.segments_from_lengths([s // 4] * 4, device).expand(b, s).contiguous()
    slopes = variants.alibi_slopes(h, device)
    window = variants.sliding_window(1024)
    ids_long = ids.long()

    def causal_mod(b_, h_, q, k):
        return q >= k

    flex = {  # (score_mod, mask_mod, batch of the block mask: None = broadcast)
        "causal": (None, causal_mod, None),
        "window 1024": (None, lambda b_, h_, q, k: (q >= k) & (q - k < 1024), None),
        "softcap 30": (lambda sc, b_, h_, q, k: 30.0 * torch.tanh(sc / 30.0), causal_mod,
                       None),
        "alibi": (lambda sc, b_, h_, q, k: sc + slopes[h_] * (k - q), causal_mod, None),
        "4 documents": (None, lambda b_, h_, q, k: (q >= k) & (ids_long[b_, q] ==
                                                                ids_long[b_, k]), b),
    }
    doc = variants.document(ids)
    ours = {
        "causal": dict(is_causal=True),
        "window 1024": dict(is_causal=True, block_mask=ta.block_mask(window, None, None, s, s)),
        "softcap 30": dict(is_causal=True, score_mod=variants.softcap(30.0)),
        "alibi": dict(is_causal=True, score_mod=variants.alibi(slopes)),
        "4 documents": dict(is_causal=True, block_mask=ta.block_mask(doc, b, None, s, s)),
    }
    return ours, flex


def flex_callable(s, score_mod, mask_mod, batch):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    # Every variant (and grad mode) is a recompile of the one flex_attention: without a
    # higher limit Dynamo falls back to eager after 8 and times the unfused math.
    torch._dynamo.config.recompile_limit = 256
    torch._dynamo.config.accumulated_recompile_limit = 4096
    compiled = torch.compile(flex_attention)
    bm = create_block_mask(mask_mod, batch, None, s, s)
    return lambda q, k, v: compiled(q, k, v, score_mod=score_mod, block_mask=bm)


def run(b, h, s, d, names, passes, rounds):
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    ours, flex = definitions(b, h, s)
    rows = []
    for name in names:
        fns = {"tiledattention": lambda q, k, v, kw=ours[name]: ta.sdpa(q, k, v, **kw)}
        try:
            fns["flex"] = flex_callable(s, *flex[name])
            err = (fns["tiledattention"](q, k, v).double() - fns["flex"](q, k, v).double()
                   ).norm() / fns["flex"](q, k, v).double().norm()
            check = f"vs flex {err.item():.1e}"
        except Exception as exc:
            fns.pop("flex", None)
            check = f"flex unavailable: {type(exc).__name__}: {str(exc).splitlines()[0][:60]}"
        if name == "causal":
            fns["cudnn"] = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)
        for p in passes:
            timed = {m: (lambda f=f: f(q, k, v)) if p == "fwd" else with_grad(f, q, k, v)
                     for m, f in fns.items()}
            rows.append((name, p, measure(timed, rounds), check))
            print(f"{name:12s} {p:8s} " + "  ".join(
                f"{m} {t:.3f} ms" if isinstance(t, float) else f"{m} {t}"
                for m, t in rows[-1][2].items()) + f"  [{check}]", flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sparsity", action="store_true")
    ap.add_argument("--flex", action="store_true")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.sparsity:
        print("== sparsity: B1 H16 S16384 D128 bf16 (targets: window >= 5x, 4 docs >= 3x "
              "faster than causal)")
        rows = run(1, 16, 16384, 128, ["causal", "window 1024", "4 documents"], ["fwd"],
                   args.rounds)
        base = rows[0][2]["tiledattention"]
        for name, p, t, _ in rows[1:]:
            print(f"  {name} {p}: {base / t['tiledattention']:.2f}x faster than causal")
    if args.flex:
        print("== vs FlexAttention: B8 H16 S4096 D128 bf16, causal base")
        rows = run(8, 16, 4096, 128, ["causal", "window 1024", "softcap 30", "alibi",
                                      "4 documents"], ["fwd", "fwd+bwd"], args.rounds)
        for name, p, t, _ in rows:
            if isinstance(t.get("flex"), float) and isinstance(t["tiledattention"], float):
                print(f"  {name} {p}: {t['flex'] / t['tiledattention']:.2f}x of FlexAttention")


if __name__ == "__main__":
    main()
