"""Padding-free training through tiledattention vs sdpa on the padded batch: one training
step (forward, loss, backward, SGD update) of the tiny Llama (hidden 2048, 16/4 heads,
D 128, random weights, no download) on the same sequences, side by side in one process,
and the ratio (issue 46's target: >= 1.0x).

- ours: the sequences packed into one row by ``DataCollatorWithFlattening`` (with
  ``return_flash_attn_kwargs=True``: offsets without a host sync), attention
  ``tiledattention`` (``sdpa_varlen`` per sequence);
- sdpa: the same sequences right-padded to the longest, with their attention mask and
  padded labels -100: what a user without varlen runs.

Sequence lengths: lognormal (median ``--median``, shape ``--sigma``; default median 512,
sigma 1.0, a stand-in for a pretraining corpus's document lengths), clipped to
[``--min-len``, ``--max-len``], drawn with ``--seed`` until ``--tokens`` (the last one cut
to fit exactly). Both sides train on the same useful tokens; padding is not counted.

    python benchmarks/transformers_packed.py [--tokens 16384] [--layers 4] [--reps 10]
        [--median 512] [--sigma 1.0] [--min-len 16] [--max-len 4096] [--seed 0] [--compile]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys


def lengths(tokens: int, median: float, sigma: float, lo: int, hi: int, seed: int) -> list[int]:
    """Lognormal lengths clipped to [lo, hi], summing to exactly ``tokens``."""
    import random

    rng, out, left = random.Random(seed), [], tokens
    while left > 0:
        n = min(max(int(round(rng.lognormvariate(math.log(median), sigma))), lo), hi, left)
        out.append(n)
        left -= n
    return out


def _packed_batch(seqs):
    from transformers import DataCollatorWithFlattening

    batch = DataCollatorWithFlattening(return_flash_attn_kwargs=True)(
        [{"input_ids": s} for s in seqs])
    return {k: v.cuda() if hasattr(v, "cuda") else v for k, v in batch.items()}


def _padded_batch(seqs):
    import torch

    longest = max(len(s) for s in seqs)
    ids = torch.zeros(len(seqs), longest, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, :len(s)] = torch.tensor(s)
        mask[i, :len(s)] = 1
    labels = ids.masked_fill(mask == 0, -100)
    return {"input_ids": ids.cuda(), "attention_mask": mask.cuda(), "labels": labels.cuda()}


def _step_fn(model, batch):
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=1e-4)

    def step():
        loss = model(**batch, use_cache=False).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def _step_ms(step) -> float:
    """Milliseconds of one step between CUDA events around it (host time counts where the
    GPU waits for the host)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    step()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end)


def run(args) -> str:
    import torch

    from tiledattention.integrations.transformers import register, tiny_llama

    seqs_len = lengths(args.tokens, args.median, args.sigma, args.min_len, args.max_len,
                       args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    seqs = [torch.randint(0, 1024, (n,), generator=gen).tolist() for n in seqs_len]
    sides = {"tiledattention, packed": (register(), _packed_batch(seqs)),
             "sdpa, padded": ("sdpa", _padded_batch(seqs))}
    steps = {}
    for label, (impl, batch) in sides.items():
        model = tiny_llama(impl, layers=args.layers).train()
        if args.compile:
            model = torch.compile(model)
        steps[label] = _step_fn(model, batch)
    times = {label: [] for label in steps}
    first = {label: step().item() for label, step in steps.items()}  # same weights, tokens
    for step in steps.values():  # warmup (and compile)
        for _ in range(3):
            step()
    torch.cuda.synchronize()
    for _ in range(args.reps):  # interleaved, so clock drift hits both sides alike
        for label, step in steps.items():
            times[label].append(_step_ms(step))
    med = {label: statistics.median(t) for label, t in times.items()}
    longest = max(seqs_len)
    slots = len(seqs_len) * longest
    lines = [f"{args.tokens} tokens in {len(seqs_len)} sequences (lognormal median "
             f"{args.median}, sigma {args.sigma}, clipped to [{args.min_len}, {args.max_len}]; "
             f"longest {longest}); padded batch {len(seqs_len)} x {longest} = {slots} slots "
             f"({100 * args.tokens / slots:.1f} % useful); {args.layers} layers"
             f"{', torch.compile' if args.compile else ''}; median of {args.reps} steps",
             f"{'':24s} {'step ms':>9s} {'useful tokens/s':>16s}"]
    for label, ms in med.items():
        lines.append(f"{label:24s} {ms:9.2f} {args.tokens / ms * 1e3:16.0f}")
    ratio = med["sdpa, padded"] / med["tiledattention, packed"]
    lines.append("first-step loss (same weights and tokens): " + ", ".join(
        f"{label} {loss:.5f}" for label, loss in first.items()))
    lines.append(f"ratio (sdpa padded / tiledattention packed): {ratio:.3f}x (target >= 1.0x)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=16384)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--median", type=float, default=512.0)
    ap.add_argument("--sigma", type=float, default=1.0)
    ap.add_argument("--min-len", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--compile", action="store_true", help="torch.compile both models")
    args = ap.parse_args(argv)
    for name in ("tokens", "layers", "reps", "min_len"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1")  # one line, exit 2
    if not args.min_len <= args.max_len <= 8192:
        ap.error("--max-len must be within [--min-len, 8192] (the model's positions)")
    if args.median <= 0 or args.sigma < 0:
        ap.error("--median must be > 0 and --sigma >= 0")
    try:
        import torch
        import transformers  # noqa: F401
    except ImportError as exc:
        print(f"transformers_packed: {exc} (pip install 'tiledattention[hf]')", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("transformers_packed: needs a CUDA GPU (torch.cuda.is_available() is False)",
              file=sys.stderr)
        return 2
    print(run(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
