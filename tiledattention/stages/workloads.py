"""The workloads stage: the batches attention runs on today, against FlashAttention-4,
FlexAttention, SDPA on the padded batch and the others of ``bench/methods.py`` with a
``workload`` call.

Points (``bench/workload_cases.py``): packed variable-length training batches (``varlen``:
document lengths from a stated lognormal, a total of 16k-64k tokens, D x mask x pass, H 16,
and a GQA set at the largest D, causal) and a paged KV cache (``decode``: one new token per
sequence; ``prefill``: a chunk of new tokens per sequence, ragged where a context is shorter)
with ragged context lengths, page sizes x B, GQA 32/8 at D 128. Each point's lengths come
from its own seed (``lengths_seed`` in the row).

Every row's output (and for fwd+bwd its dQ, dK, dV) is checked against the float64
reference (``workload_reference``) on a slice of heads of every sequence before it is timed:
``wrong`` rows are never timed. Timing is the harness' (``runner.time_methods``: L2 flushed
before each call, methods interleaved over rounds, then call latency); throughput counts
useful tokens only (``flops.ragged_attention_flops``), decode also GB/s of the K/V read.
Where no GPU is visible the GPU methods' rows say why and the CPU ones (SDPA on the padded
batch) run, so the float64 path is exercised; a later run on a GPU sets those rows aside
(their config hash names the device) and measures again.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
from dataclasses import dataclass

from ..bench.config import INT32, BenchConfig, option
from ..bench.methods import methods_help, workload_methods
from ..bench.workload_cases import KINDS, Lognormal, WorkloadPoint
from .base import TimedSection, measured_rows, measured_run, measured_stage
from .summary import by_point, cell, median_ms, status_counts

WORKLOAD_METHODS = tuple(workload_methods())
WORKLOAD_PASSES = ("fwd", "fwd+bwd")
WORKLOAD_DTYPES = ("bfloat16", "float16")
PAGE_SIZES = (16, 32, 64, 128, 256)


@dataclass(frozen=True)
class WorkloadsConfig(TimedSection):
    """Varlen and paged-KV workloads against FA4, Flex and padded SDPA (`tiledattn workloads`).

    One launcher job; its grid, length distributions, methods, timing and checks."""

    stage = "workloads"

    enabled: bool = option(False, "Time packed variable-length training batches and a paged "
                           "KV cache (decode, chunked prefill) against FlashAttention-4, "
                           "FlexAttention, SDPA on the padded batch and PyTorch's varlen, as "
                           "one launcher job; where the job finds no GPU the GPU methods' rows "
                           "say why.")
    kinds: tuple[str, ...] = option(KINDS, "varlen, packed training batches (cu_seqlens); "
                                    "decode, one new token per sequence against a paged cache; "
                                    "prefill, a chunk of new tokens per sequence against it.",
                                    choices=KINDS, unique=True, flag="--kinds")
    methods: tuple[str, ...] = option(WORKLOAD_METHODS, f"Methods compared - "
                                      f"{methods_help(WORKLOAD_METHODS)}. A method that "
                                      "cannot run a point has a row saying why.",
                                      choices=WORKLOAD_METHODS, unique=True, flag="--methods")
    dtypes: tuple[str, ...] = option(("bfloat16",), "Element types.", choices=WORKLOAD_DTYPES,
                                     unique=True, flag="--dtypes")
    varlen_tokens: tuple[int, ...] = option((16384, 32768, 65536), "Packed tokens per varlen "
                                            "batch (its documents' lengths sum to it).", min=1,
                                            max=INT32, unique=True, flag="--varlen-tokens")
    varlen_head_dims: tuple[int, ...] = option((64, 128), "Varlen head dims D.", min=8, max=256,
                                               unique=True, flag="--varlen-head-dims")
    varlen_heads: int = option(16, "Varlen query heads H.", min=1, max=INT32,
                               flag="--varlen-heads")
    varlen_gqa: tuple[int, ...] = option((1, 4), "Varlen query heads per key/value head: 1 "
                                         "on the whole varlen grid, each other ratio on its "
                                         "largest D, causal (one GQA point set).", min=1,
                                         max=INT32, unique=True, flag="--varlen-gqa")
    causal: tuple[bool, ...] = option((False, True), "Varlen mask: full, causal (paged points "
                                      "are causal, bottom-right: the new tokens are the last "
                                      "of their context).", unique=True, flag="--causal")
    passes: tuple[str, ...] = option(WORKLOAD_PASSES, "Varlen passes: fwd; fwd+bwd, a "
                                     "training step's attention (paged points: fwd, inference).",
                                     choices=WORKLOAD_PASSES, unique=True, flag="--passes")
    doc_mu: float = option(7.0, "Document lengths: lognormal mu (median e^mu = 1097 tokens).",
                           min=0, max=30, flag="--doc-mu")
    doc_sigma: float = option(1.0, "Document lengths: lognormal sigma.", above=0, max=10,
                              flag="--doc-sigma")
    doc_min: int = option(16, "Document lengths: clipped below here.", min=1, max=INT32,
                          flag="--doc-min")
    doc_max: int = option(8192, "Document lengths: clipped above here (the padded batch is "
                          "B x doc_max^2 scores).", min=1, max=INT32, flag="--doc-max")
    page_sizes: tuple[int, ...] = option((16, 64, 256), "Paged points: tokens per page.",
                                         choices=PAGE_SIZES, unique=True, flag="--page-sizes")
    decode_batches: tuple[int, ...] = option((1, 8, 32, 64), "Decode batch sizes B.", min=1,
                                             max=INT32, unique=True, flag="--decode-batches")
    prefill_batches: tuple[int, ...] = option((1, 4, 16), "Chunked-prefill batch sizes B.",
                                              min=1, max=INT32, unique=True,
                                              flag="--prefill-batches")
    chunk: int = option(512, "Chunked prefill: new tokens per sequence (fewer where its "
                        "context is shorter).", min=1, max=INT32, flag="--chunk")
    paged_heads: int = option(32, "Paged query heads H.", min=1, max=INT32,
                              flag="--paged-heads")
    paged_gqa: int = option(4, "Paged query heads per key/value head (32/8).", min=1,
                            max=INT32, flag="--paged-gqa")
    paged_head_dim: int = option(128, "Paged head dim D.", min=8, max=256,
                                 flag="--paged-head-dim")
    context_mu: float = option(8.3, "Context lengths: lognormal mu (median e^mu = 4024 "
                               "tokens).", min=0, max=30, flag="--context-mu")
    context_sigma: float = option(1.0, "Context lengths: lognormal sigma.", above=0, max=10,
                                  flag="--context-sigma")
    context_min: int = option(16, "Context lengths: clipped below here.", min=1, max=INT32,
                              flag="--context-min")
    context_max: int = option(32768, "Context lengths: clipped above here.", min=1,
                              max=INT32, flag="--context-max")
    warmup: int = option(5, "Untimed calls before the first round (FlexAttention and FA4 "
                         "compile in the point's correctness call, before them).", min=0,
                         max=10**6, flag="--warmup")
    reps: int = option(20, "Timed calls per method, over all rounds.", min=1, max=10**6,
                       flag="--reps")
    rounds: int = option(2, "Rounds, methods interleaved, order alternating.", min=1,
                         max=10**4, flag="--rounds")
    max_ref_heads: int = option(1, "Query heads (whole GQA groups) of every sequence checked "
                                "against the float64 reference, every row.", min=1,
                                max=INT32, flag="--max-ref-heads")
    seed: int = option(0, "Seed of the lengths and the inputs.", min=0, max=2**63 - 1,
                       flag="--seed")

    def __post_init__(self):
        """What one key's limits cannot say: a range the right way round, a GQA ratio that
        divides its heads (errors name ``workloads.<key>``)."""
        from ..errors import ConfigError

        def whole(*values):  # the limits (checked next) refuse the rest with their own line
            return all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                       for x in values)

        for name in ("doc", "context"):
            low, high = getattr(self, f"{name}_min"), getattr(self, f"{name}_max")
            if whole(low, high) and low > high:
                raise ConfigError(f"workloads.{name}_min: {low} exceeds {name}_max = {high}")
        if whole(self.paged_heads, self.paged_gqa) and self.paged_heads % self.paged_gqa:
            raise ConfigError(f"workloads.paged_gqa: {self.paged_gqa} does not divide "
                              f"paged_heads = {self.paged_heads}")
        ratios = self.varlen_gqa if isinstance(self.varlen_gqa, tuple) else ()
        bad = [g for g in ratios if whole(g, self.varlen_heads) and self.varlen_heads % g]
        if bad:
            raise ConfigError(f"workloads.varlen_gqa: {bad} do not divide varlen_heads = "
                              f"{self.varlen_heads}")

    def doc_dist(self) -> Lognormal:
        return Lognormal(self.doc_mu, self.doc_sigma, self.doc_min, self.doc_max)

    def context_dist(self) -> Lognormal:
        return Lognormal(self.context_mu, self.context_sigma, self.context_min,
                         self.context_max)

    def measure_digest(self, device: str | None = None) -> str:
        """What changes a row's numbers beyond its point and method: the timing, checks,
        seed, the length distributions and the device kind (``device``, default where this
        process measures: rows measured without a GPU go aside once one is there)."""
        if device is None:
            from ..bench.runner import no_gpu_reason

            device = "cpu" if no_gpu_reason() else "cuda"
        d = self.as_dict()
        blob = json.dumps({"bench": super().measure_digest(), "device": device,
                           **{k: d[k] for k in d if k.startswith(("doc_", "context_"))}},
                          sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def points(cfg: WorkloadsConfig) -> list[WorkloadPoint]:
    """The stage's points in the order they run: varlen (dtype, total, D, GQA, mask, pass:
    a batch's passes share its lengths), then decode and prefill (dtype, page size, B)."""
    from ..bench.workload_cases import context_lengths, lengths_seed, packed_lengths

    out = []
    docs, ctx = cfg.doc_dist(), cfg.context_dist()
    for dtype in cfg.dtypes:
        if "varlen" in cfg.kinds:
            for total in cfg.varlen_tokens:
                seed = lengths_seed(cfg.seed, "varlen", total)
                lens = packed_lengths(total, docs, seed)
                for d in cfg.varlen_head_dims:
                    for gqa in cfg.varlen_gqa:
                        for causal in cfg.causal:
                            if gqa != 1 and (d != max(cfg.varlen_head_dims) or not causal):
                                continue
                            out += [WorkloadPoint("varlen", dtype, d, cfg.varlen_heads, gqa,
                                                  causal, p, lens, lens, seed,
                                                  docs.describe(), tokens=total)
                                    for p in cfg.passes]
        for kind, batches in (("decode", cfg.decode_batches),
                              ("prefill", cfg.prefill_batches)):
            if kind not in cfg.kinds:
                continue
            for b in batches:
                seed = lengths_seed(cfg.seed, kind, b)
                contexts = context_lengths(b, ctx, seed)
                chunk = 1 if kind == "decode" else cfg.chunk
                news = tuple(min(chunk, n) for n in contexts)
                for page in cfg.page_sizes:
                    out.append(WorkloadPoint(kind, dtype, cfg.paged_head_dim, cfg.paged_heads,
                                             cfg.paged_gqa, True, "fwd", news, contexts, seed,
                                             ctx.describe(), page_size=page, chunk=chunk))
    return out


def run_point(point: WorkloadPoint, methods: list[str], bench: BenchConfig, device,
              flush) -> list[dict]:
    """Every method's row at ``point``: checked against float64 first, then timed through
    the harness' one timing loop (``runner.time_methods``)."""
    from ..bench.runner import _cpu_threads

    with _cpu_threads(device):
        return _run_point(point, methods, bench, device, flush)


def _run_point(point, methods, bench, device, flush) -> list[dict]:
    import statistics

    import torch

    from ..bench import workload_cases as wc
    from ..bench.methods import Unavailable, Unsupported, get_method
    from ..bench.runner import FORMAT, classify, no_gpu_reason, time_methods
    from ..timing import summarize

    t = bench.timing
    rtol = getattr(bench.correctness, f"rtol_{point.dtype}")
    timing = {"warmup": t.warmup, "reps": t.reps, "rounds": t.rounds, "flush_l2": t.flush_l2}
    base = {"format": FORMAT, "stage": "workloads", "point_key": point.key(),
            **point.as_dict(), "seed": bench.seed, "device": str(device), "timing": timing}
    rows = {m: {**base, "method": m} for m in methods}
    backward = point.pass_ != "fwd"
    try:
        inputs = wc.make_inputs(point, bench.seed, device)
        ref, grad_refs = wc.reference(inputs, point, bench.correctness.max_ref_heads,
                                      backward)
        hq, hk = wc.ref_heads(point, bench.correctness.max_ref_heads)
    except Exception as exc:  # OOM while allocating: every method shares the fate
        status, msg = classify(exc)
        return [{**r, "status": status, "reason": msg} for r in rows.values()]
    callables, eager, scopes = {}, {}, {}
    for m in methods:
        method, row = get_method(m), rows[m]
        try:
            if method.workload is None:
                raise Unsupported(f"{m} has no workloads call (bench/methods.py)")
            if method.needs_cuda and device.type != "cuda":
                raise Unavailable(f"needs a CUDA GPU ({no_gpu_reason() or device})")
            prep = method.workload(inputs, point)
            with torch.no_grad():
                got = prep.packed(prep.call())[:, :hq]
            row.update(_compared(got, ref, rtol), ref_heads=hq, details=prep.details or {})
            if not row["correct"]:
                row.update(status="wrong", reason=f"relative error {row['rel_err']:.3e} > "
                           f"{rtol:g} (or non-finite output)")
                continue
            fn = prep.call
            if backward:
                if not prep.leaves:
                    raise Unsupported(f"{m} has no backward pass here")
                step = _step(prep)
                step()
                row.update(_grads_compared(prep.grads(), grad_refs, hq, hk, point.dtype))
                if not row["grads_correct"]:
                    row.update(status="wrong", reason=f"gradient relative errors "
                               f"{row['grad_rel_err']} > {row['grad_rtol']:g}")
                    continue
                fn = step
            callables[m] = eager[m] = fn
            scopes[m] = method.scope
        except Exception as exc:
            status, msg = classify(exc)
            row.update(status=status, reason=msg)
            if status == "oom":
                torch.cuda.empty_cache()
    samples, call_samples, calls = time_methods(callables, eager, scopes, t, device, flush,
                                                rows)
    flops = wc.useful_flops(point)
    nbytes = wc.bytes_read(point) if point.paged else None
    for m in callables:
        st = summarize(samples[m])
        sec = st.median_ms * 1e-3
        rows[m].update(status="ok", time_ms=st.as_dict(), flops=flops,
                       tflops=flops / sec / 1e12, tokens_per_s=sum(point.seqs_q) / sec,
                       call_us=statistics.median(call_samples[m]), call_calls=calls)
        if nbytes is not None:
            rows[m].update(bytes_moved=nbytes, gbytes_per_s=nbytes / sec / 1e9)
    return list(rows.values())


def _step(prep):
    """One forward and backward of a prepared call, gradients reset (not accumulated)."""
    def step():
        for t in prep.leaves:
            t.grad = None
        prep.call().backward(prep.dout)
    return step


def _compared(got, ref, rtol: float) -> dict:
    import torch

    from ..tolerance import relative_error

    finite = bool(torch.isfinite(got).all())
    rel = relative_error(got, ref) if finite else math.inf
    return {"rel_err": rel, "rtol": rtol, "correct": finite and rel <= rtol}


def _grads_compared(grads, refs, hq: int, hk: int, dtype: str) -> dict:
    """Each of dQ, dK, dV on the reference's heads against float64, by ``rtol_bwd``."""
    import torch

    from ..tolerance import relative_error, rtol_bwd

    bound, errs = rtol_bwd(dtype), {}
    for name, g, h, ref in zip(("dq", "dk", "dv"), grads, (hq, hk, hk), refs):
        g = g[:, :h]
        errs[name] = relative_error(g, ref) if bool(torch.isfinite(g).all()) else math.inf
    worst = max(errs.values())
    return {"grad_rel_err": errs, "grad_rtol": bound,
            "grads_correct": math.isfinite(worst) and worst <= bound}


def run_workloads(cfg: WorkloadsConfig, out_dir: str, log=None) -> dict:
    """Measure (or resume) the stage into ``out_dir``; returns its status."""
    from ..bench.runner import measure, no_gpu_reason, resolve_device

    log = log or sys.stderr
    plan = [(p, list(cfg.methods)) for p in points(cfg)]
    reason = no_gpu_reason()
    device = resolve_device("cpu" if reason else "cuda")
    # rows of another device kind go aside too: the digest names it
    digest = cfg.measure_digest("cpu" if reason else "cuda")

    def measure_rows(store) -> bool:
        return measure(plan, _Digest(cfg.bench_config(), digest), store, device, log,
                       run=run_point)

    header = (f"{len(plan)} points x {len(cfg.methods)} methods on {device}"
              + (f" ({reason}: the GPU methods' rows say so)" if reason else ""))
    return measured_run(cfg, out_dir, plan, digest, header, measure_rows, summary, reason,
                        log)


class _Digest:
    """The harness' config with the stage's own digest (it names the device kind and the
    length distributions, which the bench config does not hold)."""

    def __init__(self, bench: BenchConfig, digest: str):
        self._bench, self._digest = bench, digest

    def __getattr__(self, name):
        return getattr(self._bench, name)

    def measure_digest(self) -> str:
        return self._digest


def load_rows(out_dir: str) -> list[dict]:
    """The stage's rows (``measured_rows``: its kind and pass named in each)."""
    return measured_rows(out_dir, "workloads", ("kind", "pass"))


def summary(rows: list[dict]) -> str:
    """Useful TFLOP/s of ours and the fastest baseline per point (by kernel time), and our
    speedup over it."""
    lines = [f"{'point':58s} {'ours TF/s':>9s} {'fastest':>16s} {'x fastest':>9s}"]
    for key, cells in by_point(rows).items():
        ours = cells.get("tiledattention")
        t_ours = median_ms(ours)
        best, t_best = _fastest(cells)
        lines.append(f"{key[:58]:58s} {cell(ours.get('tflops') if t_ours else None, 9)} "
                     f"{str(best or '—')[:16]:>16s} "
                     f"{cell(t_best / t_ours if t_ours and t_best else None, 9)}")
    return "\n".join([*lines, status_counts(rows)])


def _fastest(cells: dict) -> tuple[str | None, float | None]:
    """The fastest baseline at a point and its kernel time: ("none ok", None) where none
    ran, (None, None) where the point has no baseline row."""
    timed = [(t, m) for m, r in cells.items() if m != "tiledattention" and (t := median_ms(r))]
    if timed:
        t, m = min(timed)
        return m, t
    return ("none ok" if len(cells) > ("tiledattention" in cells) else None), None


# `tiledattn workloads --help`
HELP = ("packed variable-length training batches and a paged KV cache (decode, chunked "
        "prefill) against FlashAttention-4, FlexAttention, SDPA on the padded batch and "
        "PyTorch's varlen; every row checked against float64; resumable")


STAGE = measured_stage(WorkloadsConfig, run_workloads, load_rows, summary, HELP,
                       verbs=(("aggregate", "the workloads tables"),), key="kind",
                       compared=True)
