"""The head shapes past one D (issue 48): D_qk != D_v (MLA training's (192, 128), and
(128, 64)) and D = 512 / (576, 512), side by side with their equal-D neighbours, in one
process (GPU).

Methods per point: ``ta.sdpa``; cuDNN's frontend (``bench.cudnn_fe``, its graph built once
per shape); FlashAttention-4's ``flash_attn_func`` (``--fa4-site`` on
PYTHONPATH, else unavailable; [B, S, H, D]); torch SDPA (its own backend choice: cuDNN,
flash or memory-efficient, as a user gets it). Every output is checked against torch SDPA's
in fp32 first; kernel time by ``timing.time_cuda`` (L2 flushed); TFLOP/s by ``flops.
attention_flops`` (2·Sq·Skv·(D + D_v) per matmul pair); ratios to ``ta`` in the same run.
D > 256 is forward only (the library refuses its backward).

    python benchmarks/head_shapes.py [--fa4-site /tmp/fa4site] [--seq 4096] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from varlen import backward_row, fa4, table  # noqa: E402

import tiledattention as ta  # noqa: E402
from tiledattention.bench import cudnn_fe  # noqa: E402
from tiledattention.flops import attention_flops  # noqa: E402
from tiledattention.timing import L2Flusher, summarize, time_cuda  # noqa: E402
from tiledattention.tolerance import relative_error  # noqa: E402

BF16 = torch.bfloat16
# (D_qk, D_v, heads, fwd+bwd): MLA's training shapes beside their equal-D neighbours, then
# the wide ones (forward only).
SHAPES = [(192, 128, 16, True), (192, 192, 16, True), (128, 128, 16, True),
          (128, 64, 16, True), (64, 64, 32, True), (512, 512, 8, False), (576, 512, 8, False)]


def methods(q, k, v, causal, fa):
    out = {"ta": lambda: ta.sdpa(q, k, v, is_causal=causal),
           "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)}
    reason = cudnn_fe.import_error()
    out["cudnn_fe"] = (f"unavailable: {reason}" if reason
                       else lambda: cudnn_fe.sdpa(q, k, v, causal=causal))
    if callable(fa):
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        out["fa4"] = lambda: fa(qt, kt, vt, causal=causal)[0].transpose(1, 2)
    else:
        out["fa4"] = fa
    return out


def point(dqk, dv, h, train, causal, b, s, fa, flush):
    # Leaves for varlen.backward_row's forward+backward; the forward runs under no_grad.
    q, k = (torch.randn(b, h, s, dqk, device="cuda", dtype=BF16, requires_grad=train)
            for _ in range(2))
    v = torch.randn(b, h, s, dv, device="cuda", dtype=BF16, requires_grad=train)
    with torch.no_grad():
        ref = F.scaled_dot_product_attention(*(t.float() for t in (q, k, v)), is_causal=causal)
    base = dict(d=dqk, dv=dv, h=h, causal=causal)
    rows = []
    fns = methods(q, k, v, causal, fa)
    for name, fn in fns.items():
        row = dict(base, method=name, pass_="fwd")
        if isinstance(fn, str):
            rows.append(dict(row, status=fn))
            continue
        try:
            with torch.no_grad():
                err = relative_error(fn(), ref)
                if not err <= 2e-2:
                    rows.append(dict(row, status=f"wrong: rel err {err:.2e}"))
                    continue
                ms = summarize(time_cuda(fn, flush=flush)).median_ms
            flops = attention_flops(b, h, s, s, dqk, causal, "fwd", head_dim_v=dv)
            rows.append(dict(row, status="ok", ms=ms, tflops=flops / ms / 1e9))
        except Exception as exc:  # noqa: BLE001 - one method's failure is a row
            rows.append(dict(row, status=f"error: {type(exc).__name__}: {exc}"[:160]))
        if train and rows[-1]["status"] == "ok":
            # backward_row counts 3.5x the forward's FLOPs: attention_flops' fwd+bwd.
            rows.append(backward_row(row, name, fns, flops, flush, q, k, v))
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fa4-site")
    ap.add_argument("--seq", type=int, default=4096)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--json")
    ap.add_argument("--shapes", nargs="*", help="D_qk,D_v pairs to run (default: all)")
    args = ap.parse_args(argv)
    fa = fa4(args.fa4_site, "flash_attn_func")
    print("fa4:", "importable" if callable(fa) else fa)
    flush = L2Flusher()
    rows = []
    print(f"-- B{args.batch} S{args.seq} bf16, ms (ratio to ta), each point as it ends")
    for dqk, dv, h, train in SHAPES:
        if args.shapes and f"{dqk},{dv}" not in args.shapes:
            continue
        for causal in (False, True):
            new = point(dqk, dv, h, train, causal, args.batch, args.seq, fa, flush)
            table(new, ["d", "dv", "h", "causal", "pass_"])
            sys.stdout.flush()
            rows += new
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
