"""Nsight Compute on the attention kernel only, for representative shapes of the study.

One launch after ``warmup`` is captured per (shape, method), filtered by kernel name; the
clock-control mode is chosen by the caller and recorded. Each capture leaves the report
(``.ncu-rep``), its raw CSV export, and a line in ``summary.md`` / ``summary.json``
(duration, SM and DRAM throughput, tensor-pipe utilisation, achieved occupancy, registers,
shared memory, top stall reasons). Without ``ncu``, without a GPU, or without permission
to read the counters (ERR_NVGPUCTRPERM) the summary says why and the call succeeds, so a
workflow finishes on nodes that cannot profile.
"""

from __future__ import annotations

import csv
import glob
import io
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass

from ..bench.config import INT32, option, section_from_dict
from ..bench.grid import TOKENS, WIDTH, Point
from ..bench.methods import METHODS, profilable
from ..errors import StudyError
from ..safeio import write_json, write_text
from .base import Cli, Publish, Stage, field_options, given, json_object, launcher_option, one_line

CLOCK_CONTROL = ("base", "none")


@dataclass(frozen=True)
class ProfileConfig:
    """Nsight Compute on representative shapes, one launcher job (`tiledattn profile`)."""

    enabled: bool = option(True, "Run the profile rule (without ncu, a GPU or counter "
                           "permission the job records why).")
    shapes: tuple[str, ...] = option(("float16:full:128:4096", "float16:causal:128:4096"),
                                     "dtype:mask:D:S, with B*S = tokens and H*D = width (checked "
                                     "by tiledattention).", flag="--shape", repeat=True)
    methods: tuple[str, ...] = option(("tiledattention", "torch_sdpa"), "Methods whose attention "
                                      "kernel is captured (those with a kernel filter in the "
                                      "method registry).", choices=tuple(profilable()),
                                      unique=True, flag="--methods")
    clock_control: str = option("base", "ncu clock control (base - locked base clocks; none - "
                                "boost, as the benchmark runs).", choices=CLOCK_CONTROL,
                                flag="--clock-control")
    warmup: int = option(5, "Launches skipped before the captured one.", min=0, max=10**6,
                         flag="--warmup")
    tokens: int = option(TOKENS, "B*S of the profiled points.", min=1, max=INT32,
                         flag="--tokens")
    width: int = option(WIDTH, "H*D of the profiled points.", min=1, max=INT32, flag="--width")

    def as_dict(self) -> dict:
        return asdict(self)

    def task(self, out_dir: str):
        """The stage's launcher job."""
        return ProfileTask(self.shapes, self.methods, out_dir, self.clock_control, self.warmup,
                           self.tokens, self.width)


# Kernel-name filters, from the method registry: ours is one cuTile kernel; PyTorch's
# fused kernels by backend.
def kernel_filters() -> dict[str, str]:
    """method -> Nsight Compute --kernel-name filter, read from the registry when asked (a
    method added there is profiled without touching this module)."""
    return {name: METHODS[name].kernel_filter for name in profilable()}


KERNEL_FILTERS = kernel_filters()  # at import (tests hold the schema's enum to it)

_METRICS = {  # summary key: (ncu metric, kind of unit)
    "duration_us": ("gpu__time_duration.sum", "time"),
    "sm_throughput_pct": ("sm__throughput.avg.pct_of_peak_sustained_elapsed", None),
    "dram_throughput_pct": ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", None),
    "achieved_occupancy_pct": ("sm__warps_active.avg.pct_of_peak_sustained_active", None),
    "registers_per_thread": ("launch__registers_per_thread", None),
    "block_size": ("launch__block_size", None),
    "grid_size": ("launch__grid_size", None),
}
_TENSOR = re.compile(r"sm__pipe_tensor_op_(gmma|hmma)_cycles_active\.avg\.pct_of_peak_sustained_"
                     r"active$")
_STALL = re.compile(r"smsp__average_warps_issue_stalled_(\w+?)_per_issue_active\.ratio$")
_SMEM = ("launch__shared_mem_per_block_static", "launch__shared_mem_per_block_dynamic")


@dataclass(frozen=True)
class Shape:
    dtype: str
    causal: bool
    head_dim: int
    seq: int

    @classmethod
    def parse(cls, text: str) -> Shape:
        """``dtype:mask:D:S``, e.g. ``float16:causal:128:4096`` (mask: full or causal)."""
        parts = text.split(":")
        if len(parts) != 4 or parts[0] not in ("float16", "bfloat16") \
                or parts[1] not in ("full", "causal") \
                or not (parts[2].isdigit() and parts[3].isdigit()):
            raise StudyError(f"profile shape {text!r}: expected dtype:mask:D:S, e.g. "
                             "float16:causal:128:4096 (dtype float16|bfloat16, mask full|causal)")
        return cls(parts[0], parts[1] == "causal", int(parts[2]), int(parts[3]))

    def tag(self) -> str:
        return f"{self.dtype}-{'causal' if self.causal else 'full'}-d{self.head_dim}-s{self.seq}"

    def point(self, tokens: int = TOKENS, width: int = WIDTH) -> Point:
        return Point.of_tokens(self.dtype, self.causal, self.head_dim, self.seq,
                               tokens=tokens, width=width)


def find_ncu() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    for pattern in ("/usr/local/cuda/bin/ncu", "/opt/nvidia/nsight-compute/*/ncu",
                    "/usr/local/cuda-*/bin/ncu"):
        hits = sorted(glob.glob(pattern))
        if hits:
            return hits[-1]
    return None


def why_not(ncu: str | None) -> str | None:
    """Why profiling cannot run here, or None."""
    if ncu is None:
        return "ncu (Nsight Compute) not found on PATH or in /usr/local/cuda, /opt/nvidia"
    try:
        import torch

        if not torch.cuda.is_available():
            return "no CUDA GPU visible"
    except ImportError:
        return "torch not importable"
    return None


def parse_raw_csv(text: str) -> tuple[list[dict[str, str]], dict[str, str]]:
    """ncu --page raw --csv: a header row, a units row, then one row per kernel.
    Returns (one dict per kernel, the unit of each metric)."""
    lines = [ln for ln in text.splitlines() if ln.startswith('"')]
    rows = list(csv.reader(io.StringIO("\n".join(lines))))
    if len(rows) < 3:
        return [], {}
    header = rows[0]
    return [dict(zip(header, r)) for r in rows[2:]], dict(zip(header, rows[1]))


# ncu reports each metric in the unit it finds readable; normalise to µs and bytes.
_TO_US = {"ns": 1e-3, "nsecond": 1e-3, "us": 1, "usecond": 1, "ms": 1e3, "msecond": 1e3,
          "s": 1e6, "second": 1e6}
_TO_BYTES = {"byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "KB": 1e3, "MB": 1e6, "KiB": 1024,
             "MiB": 1 << 20}


def _scaled(value: float | None, unit: str, table: dict[str, float], default: float):
    if value is None:
        return None
    base = unit.split("/")[0].strip()
    return value * table.get(base, default)


def _num(text: str | None) -> float | None:
    if text is None or text.strip() in ("", "n/a"):
        return None
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def summarize_metrics(raw: dict[str, str], units: dict[str, str] | None = None) -> dict:
    units = units or {}
    out: dict = {"kernel": raw.get("Kernel Name") or raw.get("kernel_name")}
    for key, (metric, kind) in _METRICS.items():
        v = _num(raw.get(metric))
        if kind == "time":  # ncu's raw default for durations is ns
            v = _scaled(v, units.get(metric, "ns"), _TO_US, 1e-3)
        if v is not None and key in ("registers_per_thread", "block_size", "grid_size"):
            v = int(v)
        out[key] = None if v is None else round(v, 3) if isinstance(v, float) else v
    tensor = [_num(v) for k, v in raw.items() if _TENSOR.match(k)]
    tensor = [t for t in tensor if t is not None]
    out["tensor_pipe_pct"] = round(max(tensor), 2) if tensor else None
    smem = [_scaled(_num(raw.get(k)), units.get(k, "byte"), _TO_BYTES, 1) for k in _SMEM]
    out["shared_mem_per_block_bytes"] = (int(sum(s for s in smem if s is not None))
                                         if any(s is not None for s in smem) else None)
    stalls = {m.group(1): _num(v) for k, v in raw.items() if (m := _STALL.match(k))}
    stalls = {k: v for k, v in stalls.items() if v is not None and k not in ("selected",)}
    out["top_stalls"] = [f"{k} {v:.2f}" for k, v in
                         sorted(stalls.items(), key=lambda kv: -kv[1])[:3]]
    return out


@dataclass
class Capture:
    shape: str
    method: str
    status: str  # ok | failed | skipped
    reason: str | None = None
    report: str | None = None
    csv: str | None = None
    metrics: dict | None = None


def run_profile(shapes: list[Shape], methods: list[str], out_dir: str, *,
                clock_control: str = "base", warmup: int = 5, tokens: int = TOKENS,
                width: int = WIDTH, ncu: str | None = None, timeout_s: float = 600) -> int:
    if clock_control not in CLOCK_CONTROL:
        raise StudyError(f"clock control {clock_control!r} is not one of {list(CLOCK_CONTROL)}")
    unknown = [m for m in methods if m not in kernel_filters()]
    if unknown:
        raise StudyError(f"profile methods {unknown}: valid are {sorted(kernel_filters())}")
    os.makedirs(out_dir, exist_ok=True)
    ncu = ncu or find_ncu()
    reason = why_not(ncu)
    captures: list[Capture] = []
    for shape in shapes:
        for m in methods:
            if reason:
                captures.append(Capture(shape.tag(), m, "skipped", reason))
                continue
            captures.append(_capture(ncu, shape, m, out_dir, clock_control, warmup, tokens,
                                     width, timeout_s))
            if captures[-1].reason and "ERR_NVGPUCTRPERM" in captures[-1].reason:
                reason = ("profiling counters not permitted on this node (ERR_NVGPUCTRPERM): "
                          "ask for NVreg_RestrictProfilingToAdminUsers=0 or run as admin")
                captures[-1].reason = reason
    summary = {"ncu": ncu, "ncu_version": _ncu_version(ncu) if ncu else None,
               "clock_control": clock_control, "warmup_launches_skipped": warmup,
               "launches_captured": 1,
               "kernel_filters": {m: kernel_filters()[m] for m in methods},
               "captures": [asdict(c) for c in captures]}
    write_json(os.path.join(out_dir, "summary.json"), summary, indent=1)
    write_text(os.path.join(out_dir, "summary.md"), summary_markdown(summary))
    failed = [c for c in captures if c.status == "failed"]
    for c in failed:
        print(f"profile: {c.shape} {c.method} failed: {c.reason}", file=sys.stderr)
    return 0


def _ncu_version(ncu: str) -> str | None:
    try:
        out = subprocess.run([ncu, "--version"], capture_output=True, text=True, timeout=60)
        return out.stdout.strip().splitlines()[-1] if out.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def _capture(ncu, shape, method, out_dir, clock_control, warmup, tokens, width,
             timeout_s) -> Capture:
    name = f"{shape.tag()}-{method}"
    base = os.path.join(out_dir, name)
    cmd = [ncu, "--kernel-name", kernel_filters()[method], "--launch-skip", str(warmup),
           "--launch-count", "1", "--clock-control", clock_control, "--set", "full",
           "--export", base, "--force-overwrite",
           sys.executable, "-m", "tiledattention.stages.profile_target", "--method", method,
           "--point", json.dumps(shape.point(tokens, width).as_dict()), "--warmup", str(warmup)]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Capture(shape.tag(), method, "failed", f"ncu ran over {timeout_s:.0f}s")
    log = run.stdout + run.stderr
    write_text(base + ".log", " ".join(cmd) + "\n" + log)
    report = base + ".ncu-rep"
    if "ERR_NVGPUCTRPERM" in log:
        return Capture(shape.tag(), method, "failed", "ERR_NVGPUCTRPERM")
    if run.returncode != 0 or not os.path.exists(report):
        tail = log.strip().splitlines()[-3:]
        return Capture(shape.tag(), method, "failed",
                       f"ncu exit {run.returncode}: {' | '.join(tail)}")
    exp = subprocess.run([ncu, "--import", report, "--csv", "--page", "raw"],
                         capture_output=True, text=True, timeout=timeout_s)
    write_text(base + ".csv", exp.stdout)
    kernels, units = parse_raw_csv(exp.stdout)
    if not kernels:
        return Capture(shape.tag(), method, "failed", "no kernel matched the filter "
                       f"{kernel_filters()[method]} after {warmup} launches", report)
    return Capture(shape.tag(), method, "ok", None, os.path.basename(report),
                   os.path.basename(base + ".csv"), summarize_metrics(kernels[0], units))


def summary_markdown(summary: dict) -> str:
    lines = ["# Nsight Compute summary", "",
             f"ncu: {summary['ncu'] or 'not found'} ({summary['ncu_version'] or '—'}); clock "
             f"control: {summary['clock_control']}; {summary['warmup_launches_skipped']} "
             "warm-up launches skipped, 1 captured; `--set full`.", ""]
    caps = summary["captures"]
    skipped = [c for c in caps if c["status"] != "ok"]
    ok = [c for c in caps if c["status"] == "ok"]
    if ok:
        lines += ["| shape | method | kernel | time (µs) | SM % | DRAM % | tensor pipe % | "
                  "occupancy % | regs | smem (B) | grid × block | top stalls |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for c in ok:
            m = c["metrics"]
            kernel = (m["kernel"] or "")[:48]
            lines.append(
                f"| {c['shape']} | {c['method']} | `{kernel}` | {m['duration_us']} | "
                f"{m['sm_throughput_pct']} | {m['dram_throughput_pct']} | "
                f"{m['tensor_pipe_pct']} | {m['achieved_occupancy_pct']} | "
                f"{m['registers_per_thread']} | {m['shared_mem_per_block_bytes']} | "
                f"{m['grid_size']} × {m['block_size']} | {', '.join(m['top_stalls'])} |")
        lines.append("")
    if skipped:
        lines += ["Not profiled:", ""]
        lines += [f"- {c['shape']} {c['method']}: {c['status']} — {c['reason']}"
                  for c in skipped]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ProfileTask:
    """``run_profile`` as a picklable job, so a launcher can put it on a GPU node."""

    shapes: tuple[str, ...]
    methods: tuple[str, ...]
    out_dir: str
    clock_control: str = "base"
    warmup: int = 5
    tokens: int = TOKENS
    width: int = WIDTH
    job_name: str = "tiledattn-profile"

    def __call__(self) -> dict:
        run_profile([Shape.parse(s) for s in self.shapes], list(self.methods), self.out_dir,
                    clock_control=self.clock_control, warmup=self.warmup, tokens=self.tokens,
                    width=self.width)
        return {"out_dir": self.out_dir}


def _run(cfg: ProfileConfig, out_dir: str) -> dict:
    """The stage's in-process run."""
    return cfg.task(out_dir)()


# `tiledattn profile`: its options (its config's fields, ``base.field_options``; a shape
# must be given) and its handler.
def add_arguments(p) -> None:
    p.add_argument("--out", required=True, help="directory for reports and summary.md")
    field_options(p, ProfileConfig, required=("shapes",))
    launcher_option(p)


def _profile(args) -> int:
    import os

    cfg = section_from_dict(ProfileConfig, "profile", given(args, ProfileConfig))
    shapes = [Shape.parse(s) for s in cfg.shapes]
    code = 0
    if args.launcher:
        from ..launchers import get_launcher

        task = cfg.task(os.path.abspath(args.out))
        options = json_object(args.launcher_options, "--launcher-options")
        get_launcher(args.launcher, os.path.join(args.out, "logs"), options).run([task])
    else:
        code = run_profile(shapes, list(cfg.methods), args.out,
                           clock_control=cfg.clock_control, warmup=cfg.warmup,
                           tokens=cfg.tokens, width=cfg.width)
    with open(os.path.join(args.out, "summary.md")) as f:
        print(f.read())
    return code


# `tiledattn profile --help`
HELP = ("Nsight Compute on the attention kernels of representative shapes (records why when "
        "it cannot run)")


def not_run(out_dir: str, checked) -> list[str]:
    """The bundle README's bullets: one per capture that did not run, with its reason
    (``checked``: the study's guard on a path it reads)."""
    from ..safeio import JSON_MAX, UnsafeFileError, load_json

    path = os.path.join(out_dir, "summary.json")
    if not os.path.lexists(path):
        return []
    try:
        caps = load_json(checked(path), cap=JSON_MAX, what="profile summary")
    except UnsafeFileError as exc:
        raise StudyError(str(exc)) from None
    caps = caps.get("captures") if isinstance(caps, dict) else None
    return [f"- profile {c.get('shape')} {c.get('method')}: {c.get('status')}: "
            f"{one_line(c.get('reason'))}" for c in (caps if isinstance(caps, list) else [])
            if isinstance(c, dict) and c.get("status") != "ok"]


STAGE = Stage("profile", ProfileConfig, _run, ProfileTask,
              publish=Publish(archive="profiles.zip", waits_for="summary.md",  # zipped whole
                              not_run=not_run),
              cli=Cli(HELP, add_arguments, _profile))
