"""``tiledattn check``: what this machine can do, and whether the kernel is right and fast.

CPU part (any machine): the tiled float64 algorithm against the naive definition,
input validation, and a real tileiras compile of one kernel variant for sm_90.
GPU part (when a CUDA GPU is visible): the kernel against float64 on a few shapes, and
its speed next to PyTorch's SDPA on one shape, measured by the benchmark harness; it
fails below ``MIN_SPEED_RATIO`` of SDPA's throughput.
"""

from __future__ import annotations

import platform
import time
from dataclasses import asdict, dataclass, field

import torch

from .bench.grid import Point


@dataclass
class CheckResult:
    name: str
    ok: bool
    detail: str


@dataclass
class Report:
    environment: dict
    results: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    def add(self, name: str, fn) -> None:
        try:
            ok, detail = fn()
        except Exception as exc:  # a check that crashes is a failed check, reported
            ok, detail = False, f"{type(exc).__name__}: {exc}"
        self.results.append(CheckResult(name, ok, detail))
        print(f"[{'PASS' if ok else 'FAIL'}] {name}: {detail}", flush=True)


def environment() -> dict:
    from .kernel.toolchain import tileiras_path, tileiras_version

    env = {"python": platform.python_version(), "torch": torch.__version__,
           "cuda_gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    try:
        import cuda.tile as ct

        env["cuda_tile"] = ct.__version__
    except ImportError:
        env["cuda_tile"] = None
    env["tileiras"] = tileiras_version() if tileiras_path() else None
    return env


def _reference_algorithm():
    from .reference import naive_attention, tiled_attention

    gen = torch.Generator().manual_seed(0)
    worst = 0.0
    for sq, sk, d, causal in ((1, 17, 96, False), (17, 1000, 160, True), (1000, 17, 40, True)):
        q = torch.randn(1, 4, sq, d, generator=gen, dtype=torch.float64)
        k, v = (torch.randn(1, 2, sk, d, generator=gen, dtype=torch.float64) for _ in range(2))
        mask = torch.rand(1, 1, 1, sk, generator=gen) > 0.3
        a, _ = naive_attention(q, k, v, causal=causal, attn_mask=mask)
        b, _ = tiled_attention(q, k, v, causal=causal, attn_mask=mask)
        worst = max(worst, (a - b).abs().max().item())
    return worst < 1e-12, f"max |tiled - naive| = {worst:.1e} (float64, GQA, masks, Sq != Skv)"


def _validation():
    from .api import sdpa
    from .errors import TiledAttentionError

    q = torch.zeros(1, 1, 4, 64, dtype=torch.float32)
    try:
        sdpa(q, q, q)
    except TiledAttentionError as exc:
        return True, f"{type(exc).__name__} raised as expected"
    return False, "float32 CPU input was accepted"


def _compile_one():
    from .kernel.compile import export_cubin
    from .kernel.variant import Variant
    from .schedules.schedule import default_schedule

    v = Variant("float16", 96, True, default_schedule(96, True))
    res = export_cubin(v, "sm_90")
    # Under a second means cuTile's disk cache held the cubin from an earlier compile.
    return res.cubin[:4] == b"\x7fELF", (f"{v.label()} -> sm_90 cubin, {len(res.cubin)} "
                                         f"bytes, {res.seconds:.1f}s (tileiras or cuTile's "
                                         "disk cache)")


def _gpu_correctness():
    from .api import sdpa
    from .reference import naive_attention
    from .tolerance import relative_error, rtol

    worst = {}
    for dtype in (torch.float16, torch.bfloat16):
        for sq, sk, d, causal in ((1, 1000, 64, False), (1000, 1000, 96, True),
                                  (333, 4096, 160, False), (4096, 4096, 128, True)):
            q = torch.randn(1, 4, sq, d, device="cuda", dtype=dtype)
            k, v = (torch.randn(1, 2, sk, d, device="cuda", dtype=dtype) for _ in range(2))
            out = sdpa(q, k, v, causal=causal, enable_gqa=True)
            ref, _ = naive_attention(q, k, v, causal=causal)
            err = relative_error(out, ref) / rtol(dtype)
            worst[str(dtype)] = max(worst.get(str(dtype), 0.0), err)
    ok = all(w <= 1.0 for w in worst.values())
    return ok, "worst relative error / tolerance: " + ", ".join(
        f"{k.removeprefix('torch.')} {v:.2f}" for k, v in worst.items())


# The speed check fails below this share of PyTorch SDPA's throughput at its point: the
# floor every point of the paper grid must clear (docs/RESULTS.md: measured >= 0.85x on H100).
MIN_SPEED_RATIO = 0.80
SPEED_POINT = Point.of_tokens("float16", False, 128, 4096)  # B=4, H=16


def speed_verdict(rows: dict[str, dict], min_ratio: float) -> tuple[bool, str]:
    """Pass when tiledattention reaches ``min_ratio`` of torch SDPA's TFLOP/s (bench rows
    of one point, by method); a row that is not ``ok`` fails, with its reason."""
    ours, theirs = rows["tiledattention"], rows["torch_sdpa"]
    for r in (ours, theirs):
        if r.get("status") != "ok":
            return False, f"{r['method']}: {r.get('status')} ({r.get('reason')})"
    ratio = ours["tflops"] / theirs["tflops"]
    return ratio >= min_ratio, (
        f"{ours['point_key']}: tiledattention {ours['tflops']:.0f} TFLOP/s, torch SDPA "
        f"{theirs['tflops']:.0f} TFLOP/s, ratio {ratio:.3f} (pass >= {min_ratio:g})")


def _gpu_speed(min_ratio: float):
    from .bench.config import BenchConfig
    from .bench.runner import run_point
    from .timing import L2Flusher

    # The benchmark harness measures it: same inputs, reference check, interleaved rounds.
    cfg = BenchConfig(methods=("tiledattention", "torch_sdpa"), device="cuda")
    rows = run_point(SPEED_POINT, list(cfg.methods), cfg, torch.device("cuda"), L2Flusher())
    return speed_verdict({r["method"]: r for r in rows}, min_ratio)


def run_check(json_path: str | None = None, min_speed_ratio: float = MIN_SPEED_RATIO) -> int:
    start = time.perf_counter()
    report = Report(environment())
    print("environment: " + ", ".join(f"{k}={v}" for k, v in report.environment.items()))
    report.add("reference algorithm (CPU)", _reference_algorithm)
    report.add("input validation (CPU)", _validation)
    if report.environment["cuda_tile"] and report.environment["tileiras"]:
        report.add("tileiras compile, no GPU needed", _compile_one)
    else:
        from .kernel.toolchain import INSTALL_LINE

        print(f"[SKIP] tileiras compile: cuTile toolchain not installed ({INSTALL_LINE})")
    if torch.cuda.is_available():
        report.add("kernel vs float64 (GPU)", _gpu_correctness)
        report.add("speed vs torch SDPA (GPU)", lambda: _gpu_speed(min_speed_ratio))
    else:
        print("[SKIP] no CUDA GPU: the kernel's GPU correctness and speed checks did not run; "
              "the CPU checks above did")
    passed = sum(r.ok for r in report.results)
    print(f"{passed} passed, {len(report.results) - passed} failed "
          f"({time.perf_counter() - start:.1f}s)")
    if json_path:
        from .safeio import write_json

        write_json(json_path, {"environment": report.environment,
                               "results": [asdict(r) for r in report.results]}, indent=1)
    return 0 if report.ok else 1
