"""End to end: prefill, decode and training-step tokens/s of the tiny Llama (4 layers,
hidden 2048, 16 heads / 4 KV heads, D = 128, bf16, random weights, no download) with each
attention implementation, measured side by side in one process: ours (``tiledattention``,
through ``integrations.transformers``), transformers' built-in ``sdpa`` and ``eager``, and
FlashAttention-4 through transformers' own ``flash_attention_4`` path (``fa4``; its rows say
``unavailable`` and why where flash-attn-4 or that path is missing).

Phases (``model.phases``):
- prefill: one forward over B x prompt tokens (CUDA events around the call, so host time
  counts where the host is slower);
- decode: a greedy loop of ``steps`` steps with a DynamicCache after the prompt, tokens/s
  = B * steps / time of the steps (host included: what a caller gets from eager HF decode);
- train: one training step on B x prompt tokens: forward with the next-token loss,
  backward, an SGD step (lr 0: the weights, and so every later phase, stay as they were)
  and zero_grad; tokens/s = B * prompt / step time (CUDA events, host included);
- prefill_compiled, train_compiled: the same through ``torch.compile(model)`` (static
  shapes, compiled afresh per batch size; compilation is in the warm-up rep), for
  tiledattention and sdpa.

Reps interleave the implementations, order alternating; each row holds the median and every
rep. One row per (batch, phase, implementation), in the bench rows' format (point_key,
method, status, reason, recorded, config_hash), next to a ``manifest-model.json`` (GPU,
torch, tileiras, git revision) like a bench shard's. Where no GPU is visible or transformers
is missing, every row is ``unavailable`` with the reason and the study goes on; an
implementation that fails in one phase gets that phase's row marked with the reason and
keeps its other phases.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from dataclasses import dataclass

from ..bench.config import option, section_from_dict
from .base import (
    ROWS_FILE,
    Cli,
    ConfigTask,
    Publish,
    Rows,
    SectionConfig,
    Stage,
    field_options,
    given,
    json_object,
    launcher_option,
    one_line,
    section_json_schema,
)

MODEL_PHASES = ("prefill", "decode", "train", "prefill_compiled", "train_compiled")


@dataclass(frozen=True)
class ModelConfig(SectionConfig):
    """Optional end-to-end model benchmark (the `model_e2e` table), one launcher job."""

    stage = "model"

    enabled: bool = option(False, "Time prefill, decode and training-step tokens/s of the tiny "
                           "Llama (4 layers, hidden 2048, 16/4 heads, D 128, random weights) per "
                           "attention implementation (tiledattention, sdpa, eager), as one "
                           "launcher job.")
    phases: tuple[str, ...] = option(MODEL_PHASES, "What is timed - prefill, decode (eager); "
                                     "train, a training step (forward, loss, backward, SGD step) "
                                     "on B x prompt tokens; prefill_compiled, train_compiled: the "
                                     "same under torch.compile (tiledattention and sdpa).",
                                     choices=MODEL_PHASES, unique=True, flag="--phases")
    batches: tuple[int, ...] = option((1, 8), "Batch sizes B.", min=1, max=4096, unique=True,
                                      flag="--batches")
    prompt: int = option(2048, "Prompt tokens per sequence (prefill length; the decode "
                         "steps start after it).", min=1, max=8192 - 1024, flag="--prompt")
    steps: int = option(64, "Greedy decode steps timed per rep.", min=1, max=1024,
                        flag="--steps")
    reps: int = option(5, "Timed reps per implementation, interleaved, order alternating.",
                       min=1, max=1000, flag="--reps")
    seed: int = option(0, "Seed of the weights and the prompt.", min=0, max=2**63 - 1,
                       flag="--seed")


def model_from_dict(data: dict | None) -> ModelConfig:
    """The ``model`` section, validated; errors name ``model.<key>``."""
    return section_from_dict(ModelConfig, "model", data)


def model_json_schema() -> dict:
    """The study config's ``model`` section, from ``ModelConfig`` (like ``bench``)."""
    return section_json_schema(ModelConfig)


IMPLS = ("tiledattention", "sdpa", "eager", "fa4")
# A baseline's transformers attn_implementation where it is not the method's name: fa4 is
# transformers' own FlashAttention-4 path ("flash_attention_4", flash_attn.cute), as a user
# switches a model to it. Its rows say `unavailable` where it cannot run; the stage goes on.
ATTN = {"fa4": "flash_attention_4"}
OPTIONAL = ("fa4",)
# torch.compile of transformers' eager attention is nobody's baseline: compiled phases time
# ours against sdpa (FA4's CuTe DSL kernels are timed eager).
COMPILED_IMPLS = ("tiledattention", "sdpa")
FORMAT = 1


def point_key(batch: int, phase: str, cfg: ModelConfig) -> str:
    return f"llama-tiny|b{batch}|p{cfg.prompt}|{phase}" + (
        f"|n{cfg.steps}" if phase == "decode" else "")


def impls_of(phase: str) -> tuple[str, ...]:
    return COMPILED_IMPLS if phase.endswith("_compiled") else IMPLS


def tokens_of(batch: int, phase: str, cfg: ModelConfig) -> int:
    return batch * (cfg.steps if phase == "decode" else cfg.prompt)


def _base_rows(cfg: ModelConfig, device: str) -> list[dict]:
    return [{"format": FORMAT, "point_key": point_key(b, ph, cfg), "method": impl,
             "model": "llama-tiny", "phase": ph, "compiled": ph.endswith("_compiled"),
             "batch": b, "prompt": cfg.prompt,
             "steps": cfg.steps if ph == "decode" else None, "reps": cfg.reps,
             "dtype": "bfloat16", "device": device, "seed": cfg.seed}
            for b in cfg.batches for ph in cfg.phases for impl in impls_of(ph)]


def unavailable_reason() -> str | None:
    """Why the model benchmark cannot run here (None where it can)."""
    from ..bench.runner import no_gpu_reason

    reason = no_gpu_reason()
    if reason:
        return reason
    try:
        import transformers  # noqa: F401
    except ImportError:
        return "transformers is not installed (pip install 'tiledattention[hf]')"
    return None


def impl_unavailable(impl: str) -> str | None:
    """Why an optional implementation cannot run here (None where it can)."""
    if impl != "fa4":
        return None
    import torch

    from ..bench.methods import fa4_import_error

    why = fa4_import_error()
    if why:
        return why
    major, minor = torch.cuda.get_device_capability()
    if major not in (9, 10, 11):
        return f"FA4 is measured on sm_90 and sm_100, not sm_{major}{minor}"
    try:
        from transformers import AttentionInterface

        AttentionInterface()[ATTN[impl]]
    except Exception:
        return (f"this transformers has no attn_implementation={ATTN[impl]!r} (FA4 through "
                "transformers' own path)")
    return None


def _events_s(fn) -> float:
    """Seconds of one call of ``fn`` between CUDA events recorded around it (the GPU waits
    for the host's enqueueing, so a host-bound call counts its host time)."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3


def _prefill_s(model, ids) -> float:
    import torch

    with torch.inference_mode():
        return _events_s(lambda: model(ids, use_cache=False))


def _decode_s(model, ids, steps: int) -> float:
    import torch
    from transformers import DynamicCache

    with torch.inference_mode():
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


def _train_s(model, ids, optimizer) -> float:
    def step():
        model(ids, labels=ids, use_cache=False).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return _events_s(step)


class _Runners:
    """Each phase's timed call per implementation: eager models built once, their compiled
    wrappers afresh per batch size (``new_batch``)."""

    def __init__(self, cfg: ModelConfig, impls=IMPLS):
        import torch

        from ..integrations.transformers import register, tiny_llama

        names = {"tiledattention": register(), **ATTN}
        self.cfg = cfg
        self.models = {impl: tiny_llama(names.get(impl, impl), seed=cfg.seed)
                       for impl in impls}
        # lr 0: the step's work, without changing the weights the other phases use.
        self.optimizers = {impl: torch.optim.SGD(m.parameters(), lr=0.0, foreach=True)
                           for impl, m in self.models.items()}
        self.compiled: dict = {}

    def new_batch(self) -> None:
        import torch

        torch._dynamo.reset()  # recompile per batch size: no dynamic shapes, no cache limit
        self.compiled = {impl: torch.compile(self.models[impl], dynamic=False)
                         for impl in COMPILED_IMPLS}

    def __call__(self, phase: str, impl: str, ids, warmup: bool) -> float:
        model = self.compiled[impl] if phase.endswith("_compiled") else self.models[impl]
        if phase.startswith("prefill"):
            return _prefill_s(model, ids)
        if phase == "decode":
            return _decode_s(model, ids, min(4, self.cfg.steps) if warmup else self.cfg.steps)
        return _train_s(model, ids, self.optimizers[impl])


def measure_model(cfg: ModelConfig, log=sys.stderr) -> list[dict]:
    """Every (batch, phase, implementation) row of ``cfg``; unavailable rows where the
    benchmark cannot run here."""
    reason = unavailable_reason()
    if reason:
        return [{**r, "status": "unavailable", "reason": reason}
                for r in _base_rows(cfg, "cpu")]
    import torch

    from ..bench.runner import classify

    missing = {impl: why for impl in OPTIONAL if (why := impl_unavailable(impl))}
    run = _Runners(cfg, [impl for impl in IMPLS if impl not in missing])
    rows = {(r["batch"], r["phase"], r["method"]): r
            for r in _base_rows(cfg, str(torch.device("cuda")))}
    for r in rows.values():
        if r["method"] in missing:
            r.update(status="unavailable", reason=missing[r["method"]])
    gen = torch.Generator(device="cuda").manual_seed(cfg.seed)
    for b in cfg.batches:
        ids = torch.randint(0, 1024, (b, cfg.prompt), device="cuda", generator=gen)
        run.new_batch()
        failed: dict[tuple[str, str], tuple[str, str]] = {}  # (impl, phase) that raised: why
        times = {(ph, i): [] for ph in cfg.phases for i in impls_of(ph)}
        for rep in range(-1, cfg.reps):  # rep -1: warm-up (compiles, allocator, cache)
            for impl in IMPLS if rep % 2 == 0 else IMPLS[::-1]:
                for ph in cfg.phases:
                    if impl not in impls_of(ph) or (impl, ph) in failed or impl in missing:
                        continue
                    try:
                        secs = run(ph, impl, ids, warmup=rep < 0)
                    except Exception as exc:  # OOM, a refusal: this row says so, others go on
                        failed[impl, ph] = classify(exc)
                        torch.cuda.empty_cache()
                        continue
                    if rep >= 0:
                        times[ph, impl].append(secs)
        for (impl, ph), (status, why) in failed.items():
            rows[b, ph, impl].update(status=status, reason=why)
        for (ph, impl), secs in times.items():
            if (impl, ph) in failed or impl in missing:
                continue
            med = statistics.median(secs)
            tokens = tokens_of(b, ph, cfg)
            rows[b, ph, impl].update(status="ok", tokens_per_s=tokens / med,
                                     time_ms=med * 1e3, times_ms=[s * 1e3 for s in secs])
            print(f"model: b{b} {ph:16s} {impl:15s} {tokens / med:12.1f} tok/s", file=log,
                  flush=True)
    return list(rows.values())


def run_model(cfg: ModelConfig, out_dir: str, log=sys.stderr) -> dict:
    """Measure and write ``out_dir``/rows.jsonl (replaced whole) and manifest-model.json."""
    from ..bench.manifest import capture, now

    os.makedirs(out_dir, exist_ok=True)
    started = now()
    rows = measure_model(cfg, log)
    finished = now()
    for r in rows:
        r.update(recorded=finished, config_hash=cfg.digest())
    _write(os.path.join(out_dir, "manifest-model.json"),
           json.dumps(capture(cfg, started=started, finished=finished), indent=1, default=str))
    _write(os.path.join(out_dir, ROWS_FILE),
           "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    # An optional baseline that cannot run here says so in its rows; the stage is still ok.
    bad = [r for r in rows if r["status"] != "ok"
           and not (r["status"] == "unavailable" and r["method"] in OPTIONAL
                    and r["device"] != "cpu")]
    if bad:
        print(f"model: not run: {bad[0]['reason']}", file=log)
        return {"status": bad[0]["status"], "reason": bad[0]["reason"], "out": out_dir}
    return {"status": "ok", "out": out_dir}


def _write(path: str, text: str) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_rows(out_dir: str) -> list[dict]:
    """The model benchmark's rows (bounded, regular file only); a line that is not a row
    object is one StudyError naming the file and line."""
    from ..safeio import read_row_objects

    return read_row_objects(os.path.join(out_dir, ROWS_FILE), "model rows",
                            ("method", "status", "phase"))


def summary(rows: list[dict]) -> str:
    """tokens/s per (batch, phase, implementation) and the ratio to transformers' sdpa."""
    ref = {(r["batch"], r["phase"]): r.get("tokens_per_s") for r in rows
           if r["method"] == "sdpa" and r["status"] == "ok"}
    lines = [f"{'impl':15s} {'B':>3s} {'phase':16s} {'tok/s':>12s} {'x sdpa':>7s}"]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"{r['method']:15s} {r['batch']:3d} {r['phase']:16s} {r['status']}: "
                         f"{r['reason']}")
            continue
        base = ref.get((r["batch"], r["phase"]))
        ratio = f"{r['tokens_per_s'] / base:7.3f}" if base else "      —"
        lines.append(f"{r['method']:15s} {r['batch']:3d} {r['phase']:16s} "
                     f"{r['tokens_per_s']:12.1f} {ratio}")
    return "\n".join(lines)


# `tiledattn model`: its options (its config's fields, ``base.field_options``) and its
# handler.
def add_arguments(p) -> None:
    p.add_argument("--out", required=True, help="directory for rows.jsonl and the manifest")
    field_options(p, ModelConfig)
    launcher_option(p)


def _model(args) -> int:
    import os

    cfg = model_from_dict({"enabled": True, **given(args, ModelConfig)})
    out = os.path.abspath(args.out)
    if args.launcher:
        from ..launchers import run_step

        options = json_object(args.launcher_options, "--launcher-options")
        run_step(args.launcher, options, os.path.join(out, "logs"), cfg.task(out, run_model))
    else:
        run_model(cfg, out)
    print(summary(load_rows(out)))
    return 0


# `tiledattn model --help`
HELP = ("prefill, decode and training-step tokens/s (eager and compiled) of a tiny random "
        "Llama per attention implementation (tiledattention, sdpa, eager); records why when "
        "it cannot run")


def not_run(out_dir: str, checked) -> list[str]:
    """The bundle README's bullet for the rows that did not run (``checked``: the study's
    guard on a path it reads)."""
    if not os.path.lexists(os.path.join(out_dir, ROWS_FILE)):
        return []
    skipped = [r for r in load_rows(out_dir) if r.get("status") != "ok"]
    return [f"- model benchmark (model_e2e): {skipped[0]['status']} at {len(skipped)} "
            f"row(s): {one_line(skipped[0].get('reason') or '—')}"] if skipped else []


STAGE = Stage("model", ModelConfig, run_model, ConfigTask,
              rows=Rows(load_rows, ROWS_FILE, what="the model benchmark's rows",
                        verbs=(("aggregate", "the model_e2e table"),
                               ("figures", "the model_stage figure")),
                        key="phase", compared=True, measure="model"),
              publish=Publish("model-rows.jsonl",
                              "the tiny Llama's tokens/s rows (model stage)",
                              "the tiny Llama's tokens/s rows, when the study ran the model "
                              "stage", not_run=not_run),
              cli=Cli(HELP, add_arguments, _model))
