"""The FP8 (e4m3) forward beside the bf16 ones, in one process (GPU; issue 48 item 1,
benchmarks/notes/head-shapes.md §40h).

Methods per point: ``ta_fp8`` (``ta.sdpa`` on e4m3 with per-tensor descales, V transposed
in the call by the ``transpose`` kernel, as a user pays it), ``ta_fp8_torch_vt`` (V^T made
by torch's copy in the call, then read in place: what ``ta_fp8`` paid before §42g),
``ta_fp8_vt`` (V given as a transposed view of an aligned V^T: no copy, the kernel alone),
``ta_bf16`` (ours on the dequantized inputs in bf16), ``sdpa_bf16`` (torch's SDPA, its own
backend choice: cuDNN or flash, as a user without FP8 runs it) and ``cudnn_fp8`` (cuDNN's
FP8 SDPA through ``bench.cudnn_fe``, per-tensor descales; unavailable with the frontend's
reason). Shapes: D 128 and 256, S 4k,
8k and 16k, causal and not, tokens B·S = 16k and H·D = 2048 (H 16 at D 128, 8 at D 256).

Every method is checked first against float64 (FP8: of the dequantized inputs, by the
tolerance table's e4m3 bound; bf16: of the bf16 inputs, by its bf16 bound) on the first
two heads of batch 0, then timed by ``timing.time_cuda`` (L2 flushed); TFLOP/s by
``flops.attention_flops``. Each point prints as it ends, with each method's speed-up over
``ta_bf16`` and over ``cudnn_fp8``.

    python benchmarks/fp8_forward.py [--dims 128 256] [--seqs 4096 8192 16384] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import tiledattention as ta  # noqa: E402
from tiledattention.bench import cudnn_fe  # noqa: E402
from tiledattention.flops import attention_flops  # noqa: E402
from tiledattention.reference import fp8_attention, naive_attention  # noqa: E402
from tiledattention.timing import L2Flusher, summarize, time_cuda  # noqa: E402
from tiledattention.tolerance import relative_error, rtol  # noqa: E402

E4M3, BF16 = torch.float8_e4m3fn, torch.bfloat16
TOKENS, WIDTH = 16384, 2048  # B·S and H·D of every point
CHECKED_HEADS = 2  # the float64 check's heads (of batch 0): S 16k is 2 GB a head


def quantized(x):
    """(e4m3 x / descale, descale): a per-tensor descale filling e4m3's range (448)."""
    d = (x.abs().amax() / 448.0).float()
    return (x / d).to(E4M3), d


def inputs(b, h, s, d):
    q, k, v = (torch.randn(b, h, s, d, device="cuda") for _ in range(3))
    (q8, qd), (k8, kd), (v8, vd) = (quantized(t) for t in (q, k, v))
    # the bf16 methods run on the same numbers: the dequantized e4m3 values
    bf = tuple((t.float() * ds).to(BF16) for t, ds in ((q8, qd), (k8, kd), (v8, vd)))
    return (q8, k8, v8), (qd, kd, vd), bf


def aligned_vt(v8):
    """V^T in a buffer whose key rows are padded to 16, as the transposed view the FP8
    forward reads in place."""
    b, h, s, d = v8.shape
    buf = torch.empty(b, h, d, -(-s // 16) * 16, dtype=E4M3, device=v8.device)
    vt = buf[..., :s]
    vt.copy_(v8.transpose(2, 3))
    return vt.transpose(2, 3)


def methods(fp8, scales, bf, causal):
    q8, k8, v8 = fp8
    qd, kd, vd = scales
    ds = dict(q_descale=qd, k_descale=kd, v_descale=vd)
    v_view = aligned_vt(v8)
    out = {"ta_fp8": lambda: ta.sdpa(q8, k8, v8, is_causal=causal, **ds),
           "ta_fp8_torch_vt": lambda: ta.sdpa(q8, k8, aligned_vt(v8), is_causal=causal, **ds),
           "ta_fp8_vt": lambda: ta.sdpa(q8, k8, v_view, is_causal=causal, **ds),
           "ta_bf16": lambda: ta.sdpa(*bf, is_causal=causal),
           "sdpa_bf16": lambda: F.scaled_dot_product_attention(*bf, is_causal=causal)}
    reason = cudnn_fe.import_error()
    out["cudnn_fp8"] = (f"unavailable: {reason}" if reason else
                        lambda: cudnn_fe.sdpa_fp8(q8, k8, v8, qd, kd, vd, causal=causal))
    return out


def references(fp8, scales, bf, causal):
    """(FP8 reference, bf16 reference) in float64 over the checked heads of batch 0."""
    cut = lambda t: t[:1, :CHECKED_HEADS]  # noqa: E731
    q8, k8, v8 = (cut(t) for t in fp8)
    ref8, _ = fp8_attention(q8, k8, v8, q_descale=scales[0], k_descale=scales[1],
                            v_descale=scales[2], causal=causal)
    ref16, _ = naive_attention(*(cut(t) for t in bf), causal=causal)
    return ref8, ref16


def point(d, s, causal, flush):
    h, b = WIDTH // d, max(1, TOKENS // s)
    fp8, scales, bf = inputs(b, h, s, d)
    with torch.no_grad():
        ref8, ref16 = references(fp8, scales, bf, causal)
    flops = attention_flops(b, h, s, s, d, causal, "fwd")
    rows = []
    for name, fn in methods(fp8, scales, bf, causal).items():
        row = dict(d=d, s=s, b=b, h=h, causal=causal, method=name)
        if isinstance(fn, str):
            rows.append(dict(row, status=fn))
            continue
        is8 = "fp8" in name
        try:
            with torch.no_grad():
                err = relative_error(fn()[:1, :CHECKED_HEADS], ref8 if is8 else ref16)
                bound = rtol(E4M3 if is8 else BF16)
                if not err <= bound:
                    rows.append(dict(row, status=f"wrong: rel err {err:.2e} > {bound:.2e}"))
                    continue
                ms = summarize(time_cuda(fn, flush=flush)).median_ms
            rows.append(dict(row, status="ok", err=err, ms=ms, tflops=flops / ms / 1e9))
        except Exception as exc:  # noqa: BLE001 - one method's failure is a row
            rows.append(dict(row, status=f"error: {type(exc).__name__}: {exc}"[:200]))
    return rows


def show(rows) -> None:
    ms = {r["method"]: r["ms"] for r in rows if r.get("ms")}
    r0 = rows[0]
    print(f"D{r0['d']} S{r0['s']} B{r0['b']} H{r0['h']} "
          f"{'causal' if r0['causal'] else 'full'}:")
    for r in rows:
        if not r.get("ms"):
            print(f"  {r['method']:<15} {r['status']}")
            continue
        ratios = "".join(f"  {ms[base] / r['ms']:.2f}x {base}" for base in ("ta_bf16", "cudnn_fp8")
                         if base in ms and base != r["method"])
        print(f"  {r['method']:<15} {r['ms']:8.3f} ms {r['tflops']:7.1f} TFLOP/s "
              f"err {r['err']:.1e}{ratios}")
    sys.stdout.flush()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dims", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--seqs", type=int, nargs="+", default=[4096, 8192, 16384])
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    flush = L2Flusher()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}; cudnn_fe: "
          f"{cudnn_fe.import_error() or 'importable'}; speed-up = other's ms / this one's")
    rows = []
    for d in args.dims:
        for s in args.seqs:
            for causal in (False, True):
                new = point(d, s, causal, flush)
                show(new)
                rows += new
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
