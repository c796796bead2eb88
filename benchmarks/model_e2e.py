"""End to end: prefill and decode tokens/s of the tiny Llama (4 layers, hidden 2048,
16 heads / 4 KV heads, D = 128, random weights) with each attention implementation,
measured side by side in one process: ours (``tiledattention``), transformers' built-in
``sdpa`` and ``eager``.

prefill: one forward over B x S prompt tokens (CUDA events, median of interleaved reps);
decode: a greedy loop of N steps with a DynamicCache after a prompt of S tokens, tokens/s
= B * N / time of the N steps (host included: what a caller gets from eager HF decode).

    python benchmarks/model_e2e.py [--batch 1 8] [--prompt 2048] [--steps 64] [--out f.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from tiledattention.integrations.transformers import register, tiny_llama

IMPLS = ("tiledattention", "sdpa", "eager")


@torch.inference_mode()
def prefill_s(model, ids) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    model(ids, use_cache=False)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3


@torch.inference_mode()
def decode_s(model, ids, steps: int) -> float:
    from transformers import DynamicCache

    cache = DynamicCache()
    out = model(ids, past_key_values=cache, use_cache=True)
    nxt = out.logits[:, -1:].argmax(-1)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(steps):
        out = model(nxt, past_key_values=cache, use_cache=True)
        nxt = out.logits[:, -1:].argmax(-1)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--prompt", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out")
    args = ap.parse_args()
    name = register()
    models = {impl: tiny_llama(name if impl == "tiledattention" else impl) for impl in IMPLS}
    rows = []
    for b in args.batch:
        ids = torch.randint(0, 1024, (b, args.prompt), device="cuda")
        for m in models.values():  # warm-up: compiles, allocator, cache growth
            prefill_s(m, ids)
            decode_s(m, ids, 4)
        pre = {i: [] for i in IMPLS}
        dec = {i: [] for i in IMPLS}
        for r in range(args.reps):
            order = IMPLS if r % 2 == 0 else IMPLS[::-1]
            for impl in order:
                pre[impl].append(prefill_s(models[impl], ids))
                dec[impl].append(decode_s(models[impl], ids, args.steps))
        for impl in IMPLS:
            p, d = statistics.median(pre[impl]), statistics.median(dec[impl])
            rows.append(dict(impl=impl, batch=b, prompt=args.prompt, steps=args.steps,
                             prefill_tok_s=b * args.prompt / p, decode_tok_s=b * args.steps / d,
                             prefill_ms=p * 1e3, decode_ms_per_step=d / args.steps * 1e3))
    print(f"{'impl':15s} {'B':>3s} {'prefill tok/s':>14s} {'x sdpa':>7s} "
          f"{'decode tok/s':>13s} {'x sdpa':>7s} {'ms/step':>8s}")
    for row in rows:
        ref = next(r for r in rows if r["impl"] == "sdpa" and r["batch"] == row["batch"])
        print(f"{row['impl']:15s} {row['batch']:3d} {row['prefill_tok_s']:14.0f} "
              f"{row['prefill_tok_s'] / ref['prefill_tok_s']:7.3f} {row['decode_tok_s']:13.1f} "
              f"{row['decode_tok_s'] / ref['decode_tok_s']:7.3f} "
              f"{row['decode_ms_per_step']:8.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
