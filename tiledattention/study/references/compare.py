"""A study held against a reference: per point and method, kernel time and call latency,
and TiledAttention's speed ratio to each baseline, each checked against a reference tuple
(value, lower, upper) as ReFrame writes them (bounds as fractions of the value).

The reference is another study (a bundle, its zip, a results directory, a rows file) or a
system whose tuples ship in the package (``references/<system>.json.gz``, built from committed
rows by ``python -m tiledattention.study.references.compare build``). A time above its upper
bound, or a ratio below its lower bound, is a regression; a point the reference measured that
the new study did not measure ok is one too. Faster than the lower bound is reported, not
failed, and so are two departures the subject did not cause: a call latency where host time
shows (the call, in either study, longer than its kernel time by more than HOST_EXPOSED: it
then measures the host's CPU, which differs from machine to machine of one kind), and a speed
ratio that moved only because the baseline's own time left its bounds while TiledAttention's
stayed.

Every GPU stage with rows is held: the benchmark's rows, the variants stage's (the same row
format: kernel time and call latency) and the model stage's (tokens/s of a tiny Llama: one
time per row, the ``model`` measure). A stage the new study did not run is not measured.
"""

from __future__ import annotations

import contextlib
import csv
import gzip
import io
import json
import math
import os
import re
import zipfile
from dataclasses import dataclass, replace
from importlib import resources

from ...bench.methods import SUBJECT
from ...errors import StudyError
from ...stages import STAGES
from ..presentation.ratios import MEASURES as ROW_MEASURES
from ..presentation.ratios import geomean

FORMAT = "tiledattention-reference/1"
# What compare holds: a benchmark or variants row's kernel time and call latency, and a
# model-stage row's one time per (batch, phase) (prefill, train: CUDA events; decode: the
# step loop, host included), in ms.
MEASURES = {**ROW_MEASURES, "model": (
    "model time", lambda r: r.get("model_ms") if isinstance(r.get("model_ms"), (int, float))
    else None)}
# Default tolerances, as fractions: docs/STUDY.md ("Re-running a bundle and holding a
# study against a reference") says why.
# Kernel time on one H100, run to run: p95 2-3 %, max 4 % (benchmarks/results, bench80 runs);
# call latency adds the host (CPU, Python, driver): p95 4-7 %, max 17 %. The model stage's
# times are medians of 3 reps, host in every phase: as wide as call latency until a repeat
# on one machine measures them (two H100 runs a day and a code change apart moved -4 % to
# +61 %, B=1 prefill the most: benchmarks/results/h100-2026-11-23-model-rows.jsonl.gz).
TOLERANCE = {"kernel": 0.10, "call": 0.25, "model": 0.25}
# The GPU stages whose rows compare checks besides the benchmark's (registry order), and
# where their rows lie: a bundle's data/ (plain or compact), a study's results directory.
COMPARED = [s for s in STAGES.values() if s.rows and s.rows.compared]
STAGE_FILES = {s.name: (f"data/{s.publish.data_name}", f"data/{s.publish.data_name}.gz",
                        f"{s.name}/{s.rows.file}") for s in COMPARED}
# A call at most this much longer than its kernel time hides its host work behind the GPU:
# across three H100 machines, such calls moved like kernel times (p95 5 %, docs/STUDY.md); calls
# that showed host time moved 0.4-2.6x, the host CPU's doing (benchmarks/notes/study-pipeline.md
# §27).
HOST_EXPOSED = 1.10
# The host-bound calls still count together: their geometric-mean change, TiledAttention's
# over the baselines' (the machine's host speed cancels out), within this fraction. Across
# the three H100 machines it moved by at most 2.3 %.
HOST_GEOMEAN = 0.10
HOST_POINT = "(host-bound calls: geomean change ÷ the baselines')"
EXCUSES = ("host-bound", "baseline changed")
VERDICTS = ("pass", "faster", "slower", "regression", *EXCUSES, "not ok", "not measured")
MAX_ROWS_BYTES = 256 << 20
# The shipped tuples, one file per system, gzipped (a whole study's points: ~150 KB a system
# as JSON, which the tracked tree's 3 MB cannot hold for several).
REF_SUFFIX = ".json.gz"


@dataclass(frozen=True)
class Check:
    point: str
    method: str  # a method, or "subject ÷ baseline" for a ratio
    quantity: str  # "time" or "ratio"
    measure: str  # "kernel" or "call"
    new: float | None
    reference: float
    lower: float  # fractions of the reference value, e.g. -0.10
    upper: float
    why: str = ""  # where there is no new value: why (the new row's status and reason)
    measured: bool = True  # the new study has a row for this point and method
    excuse: str = ""  # one of EXCUSES: a regression the subject did not cause (compare())
    stage: str = "bench"  # the GPU stage whose rows it checks: bench, variants, model

    @property
    def diff_pct(self) -> float | None:
        return None if self.new is None else 100 * (self.new / self.reference - 1)

    @property
    def verdict(self) -> str:
        if self.new is None:
            return "not ok" if self.measured else "not measured"
        rel = self.new / self.reference - 1
        # A time regresses upward, a speed ratio downward.
        worse, better = (rel > self.upper, rel < self.lower) if self.quantity == "time" \
            else (rel < self.lower, rel > self.upper)
        if worse:  # a baseline's own time is reported: its slowdown is not ours to fail
            if self.quantity == "time" and self.method != SUBJECT:
                return "slower"
            return self.excuse or "regression"
        return "faster" if better else "pass"


# --- reading studies and references ---------------------------------------------------------

def _json_lines(data: bytes, where: str) -> list[dict]:
    rows = []
    for n, line in enumerate(data.decode("utf-8", "replace").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            raise StudyError(f"{where}: line {n} is not JSON") from None
        if not isinstance(row, dict) or "point_key" not in row or "method" not in row:
            raise StudyError(f"{where}: line {n} is not a benchmark row")
        rows.append(_as_compared(row))
    return rows


def stage_of(row: dict) -> str:
    """The stage a row comes from: the first compared stage whose rows' ``key`` it holds
    (model: a per-phase time; variants), or bench."""
    return row.get("stage") or next((s.name for s in COMPARED
                                     if s.rows.key and s.rows.key in row), "bench")


def _as_compared(row: dict) -> dict:
    """The row of a stage with a measure of its own (model) with its time as
    ``<measure>_ms`` (its ``time_ms`` is one number, not a benchmark row's timing dict);
    other rows as they are."""
    stage = STAGES.get(stage_of(row))
    if stage is None or stage.rows is None or stage.rows.measure is None:
        return row
    out = {k: v for k, v in row.items() if k not in ("time_ms", "times_ms")}
    t = row.get("time_ms")
    if isinstance(t, (int, float)) and not isinstance(t, bool):
        out[f"{stage.rows.measure}_ms"] = t
    return dict(out, stage=stage.name)


def _read(path: str) -> bytes:
    if os.path.getsize(path) > MAX_ROWS_BYTES:
        raise StudyError(f"{path}: larger than the {MAX_ROWS_BYTES} bytes allowed")
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        return f.read(MAX_ROWS_BYTES + 1)


def _from_zip(path: str) -> tuple[list[dict], dict]:
    with zipfile.ZipFile(path) as z:
        names = {n.split("/", 1)[1] if "/" in n else n: n for n in z.namelist()}
        rel = next((r for r in ("data/rows.jsonl", "data/rows.jsonl.gz") if r in names), None)
        if rel is None:
            raise StudyError(f"{path}: a zip without data/rows.jsonl (not a study bundle)")
        info = z.getinfo(names[rel])
        if info.file_size > MAX_ROWS_BYTES:
            raise StudyError(f"{path}: {rel} over {MAX_ROWS_BYTES} bytes")
        with z.open(info) as f, (gzip.GzipFile(fileobj=f) if rel.endswith(".gz")
                                 else contextlib.nullcontext(f)) as g:
            data = g.read(MAX_ROWS_BYTES + 1)  # a compact bundle's rows: capped as a file's
        if len(data) > MAX_ROWS_BYTES:
            raise StudyError(f"{path}: {rel} over {MAX_ROWS_BYTES} bytes decompressed")
        rows = _json_lines(data, f"{path}:{rel}")
        for files in STAGE_FILES.values():
            for rel in (f for f in files if f.startswith("data/") and f in names):
                info = z.getinfo(names[rel])
                if info.file_size > MAX_ROWS_BYTES:
                    raise StudyError(f"{path}: {rel} over {MAX_ROWS_BYTES} bytes")
                with z.open(info) as f, (gzip.GzipFile(fileobj=f) if rel.endswith(".gz")
                                         else contextlib.nullcontext(f)) as g:
                    data = g.read(MAX_ROWS_BYTES + 1)
                if len(data) > MAX_ROWS_BYTES:
                    raise StudyError(f"{path}: {rel} over {MAX_ROWS_BYTES} bytes decompressed")
                rows += _json_lines(data, f"{path}:{rel}")
        manifest = json.loads(z.read(names["manifest.json"])) if "manifest.json" in names \
            else {}
    return rows, manifest


def _manifest_near(*candidates: str) -> dict:
    for c in candidates:
        if os.path.isfile(c):
            with open(c) as f:
                return json.load(f)
    return {}


def _real(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_rows(rows: list[dict], where: str) -> None:
    """Rows a comparison can use, or one StudyError: string keys, ok rows' times finite
    positive numbers (or absent), no (point, method) given twice with different values."""
    seen: dict[tuple, dict] = {}
    for n, r in enumerate(rows, 1):
        key = (r.get("point_key"), r.get("method"))
        if not all(isinstance(k, str) and k for k in key):
            raise StudyError(f"{where}: row {n}: point_key and method must be strings, got "
                             f"{key[0]!r} and {key[1]!r}")
        if r.get("status") == "ok":
            if r.get("time_ms") is not None and not isinstance(r["time_ms"], dict):
                raise StudyError(f"{where}: row {n} ({key[0]}, {key[1]}): time_ms must be "
                                 f"an object of times, got {r['time_ms']!r}")
            for label, time_of in MEASURES.values():
                t = time_of(r)
                if t is not None and not (_real(t) and math.isfinite(t) and t > 0):
                    raise StudyError(f"{where}: row {n} ({key[0]}, {key[1]}): {label} "
                                     f"{t!r} is not a finite positive number")
        if key in seen and seen[key] != r:
            raise StudyError(f"{where}: ({key[0]}, {key[1]}) is given twice with different "
                             "values; which one was measured? (aggregate the study again)")
        seen[key] = r


def _gpu_name(manifest, where: str) -> str | None:
    if not isinstance(manifest, dict):
        raise StudyError(f"{where}: manifest.json is not a JSON object")
    gpu = manifest.get("gpu")
    if gpu is not None and not isinstance(gpu, dict):
        raise StudyError(f"{where}: manifest.json's gpu is not an object ({gpu!r})")
    name = (gpu or {}).get("name")
    return name if isinstance(name, str) else None


def load_study(path: str) -> tuple[list[dict], str]:
    """(rows, GPU name) of a bundle directory or zip (compact too), a study's results directory (its
    aggregate/rows.jsonl) or a rows file (.jsonl, .jsonl.gz)."""
    try:
        if os.path.isdir(path):
            for rel, man in (("data/rows.jsonl", "manifest.json"),
                             ("data/rows.jsonl.gz", "manifest.json"),  # a compact bundle
                             ("aggregate/rows.jsonl", "manifest.json"),
                             ("bundle/data/rows.jsonl", "bundle/manifest.json")):
                if os.path.isfile(os.path.join(path, rel)):
                    if not rel.startswith("aggregate/"):  # a bundle's rows: as published?
                        _check_sums(os.path.join(path, rel.split("data/")[0]))
                    rows = _json_lines(_read(os.path.join(path, rel)), os.path.join(path, rel))
                    rows += _stage_rows(os.path.join(path, rel.split("data/")[0]
                                                     if "data/" in rel else ""))
                    manifest = _manifest_near(os.path.join(path, man))
                    break
            else:
                raise StudyError(f"{path}: no data/rows.jsonl (a bundle) nor "
                                 "aggregate/rows.jsonl (a study's results directory) there")
        elif not os.path.isfile(path):  # a FIFO or device is never opened: it may block
            raise StudyError(f"{path}: no such bundle, study directory or rows file"
                             + (" (a special file)" if os.path.exists(path) else ""))
        elif zipfile.is_zipfile(path):
            _check_sums(path)
            rows, manifest = _from_zip(path)
        else:
            rows = _json_lines(_read(path), path)
            manifest = {}
    except (OSError, zipfile.BadZipFile, EOFError, ValueError, KeyError) as exc:
        if isinstance(exc, StudyError):
            raise
        raise StudyError(f"{path}: unreadable ({exc})") from None
    _check_rows(rows, path)
    gpu = _gpu_name(manifest, path) or _row_device(rows)
    return rows, gpu


def _check_sums(bundle: str) -> None:
    """A bundle (a directory or zip holding SHA256SUMS or the bundle marker) whose files are
    the ones it was made with, or one StudyError naming the first that is not: rows edited
    after the bundle was made are never compared (nor PASSed)."""
    from ..publication.archive import MARKER, SUMS
    from ..publication.verify import checksums

    if os.path.isdir(bundle):
        if not any(os.path.lexists(os.path.join(bundle, n)) for n in (SUMS, MARKER)):
            return  # rows in a directory, not a bundle: nothing vouches for them
    else:
        with zipfile.ZipFile(bundle) as z:
            tops = {n.split("/", 1)[-1] for n in z.namelist()}
        if not tops & {SUMS, MARKER}:
            return
    problems = checksums(bundle)
    if problems:
        more = f" and {len(problems) - 1} more" if len(problems) > 1 else ""
        where = bundle.rstrip(os.sep) or bundle
        raise StudyError(f"{where}: the bundle fails its checksums ({problems[0]}{more}): it "
                         "was changed after it was made, so it is not compared; tiledattn "
                         f"bundle verify {where} names every problem")


def _stage_rows(root: str) -> list[dict]:
    """The variants and model stages' rows under ``root`` (a bundle or a results
    directory), the first file found per stage."""
    rows = []
    for files in STAGE_FILES.values():
        rel = next((f for f in files if os.path.isfile(os.path.join(root, f))), None)
        if rel is not None:
            rows += _json_lines(_read(os.path.join(root, rel)), os.path.join(root, rel))
    return rows


def _row_device(rows: list[dict]) -> str:
    devices = {r.get("device") for r in rows if r.get("device")}
    return ", ".join(sorted(devices)) or "unknown"


def systems() -> list[str]:
    """The systems whose reference tuples ship in the package."""
    root = resources.files("tiledattention.study") / "references"
    return sorted(p.name[:-len(REF_SUFFIX)] for p in root.iterdir()
                  if p.name.endswith(REF_SUFFIX))


def shipped_system(gpu_name: str) -> str | None:
    """The shipped reference measured on this GPU's model (``h200`` for "NVIDIA H200"), or
    None: another model's times are no reference for it (nor is a GH200 an H200's)."""
    found = re.search(r"(?<![A-Za-z0-9])H\d{3}(?![0-9])", gpu_name, re.IGNORECASE)
    name = found.group(0).lower() if found else None
    return name if name in systems() else None


def load_reference(name_or_path: str, tolerance: dict[str, float] | None = None) -> dict:
    """A reference: the tuples of a shipped system (``h100``), or tuples built from another
    study with ``tolerance`` (default TOLERANCE). ``tolerance`` also overrides a shipped
    system's own bounds."""
    if not os.path.exists(name_or_path) and name_or_path.lower() in systems():
        ref_file = resources.files("tiledattention.study") / "references" / \
            f"{name_or_path.lower()}{REF_SUFFIX}"
        ref = json.loads(gzip.decompress(ref_file.read_bytes()))
        if tolerance:
            ref = _with_tolerance(ref, tolerance)
        return ref
    if not os.path.exists(name_or_path):
        raise StudyError(f"{name_or_path}: neither a bundle, study directory or rows file nor "
                         f"a shipped system (shipped: {', '.join(systems()) or 'none'})")
    rows, gpu = load_study(name_or_path)
    return build(rows, system=gpu, source={"study": os.path.abspath(name_or_path)},
                 tolerance=tolerance)


def _with_tolerance(ref: dict, tolerance: dict[str, float]) -> dict:
    out = dict(ref, tolerance={**ref.get("tolerance", {}), **tolerance}, entries=[])
    for e in ref["entries"]:
        e = dict(e)
        for m, tol in tolerance.items():
            if m in e:
                e[m] = [e[m][0], -tol, tol]
        out["entries"].append(e)
    return out


def build(rows: list[dict], *, system: str, source: dict,
          tolerance: dict[str, float] | None = None) -> dict:
    """Reference tuples from ok rows: per (point, method), each measure's time as
    [value, lower, upper] (kernel: ms; call: us)."""
    tolerance = {**TOLERANCE, **(tolerance or {})}
    entries = []
    for r in rows:
        if r.get("status") != "ok":
            continue
        e = {"point": r["point_key"], "method": r["method"]}
        if stage_of(r) != "bench":  # the benchmark's entries as before the stages
            e["stage"] = stage_of(r)
        for m, (_, time_of) in MEASURES.items():
            t = time_of(r)
            if t and t > 0:
                e[m] = [float(f"{t:.6g}"), -tolerance[m], tolerance[m]]
        if any(m in e for m in MEASURES):
            entries.append(e)
    entries.sort(key=lambda e: (e["point"], e["method"]))
    return {"format": FORMAT, "system": system, "source": source,
            "units": {"kernel": "ms (median CUDA-event time)", "call": "us per call"},
            "tolerance": tolerance, "entries": entries}


def _check_reference(ref: dict, where: str) -> None:
    if not isinstance(ref, dict) or ref.get("format") != FORMAT or \
            not isinstance(ref.get("entries"), list):
        raise StudyError(f"{where}: not a reference ({FORMAT})")
    for n, e in enumerate(ref["entries"], 1):
        if not isinstance(e, dict) or not isinstance(e.get("point"), str) or \
                not isinstance(e.get("method"), str):
            raise StudyError(f"{where}: entry {n} is not a (point, method) entry")
        for m in MEASURES:
            t = e.get(m)
            if t is None:
                continue
            if not (isinstance(t, list) and len(t) == 3 and all(_real(v) and math.isfinite(v)
                                                                 for v in t)
                    and t[0] > 0 and t[1] <= 0 <= t[2]):
                raise StudyError(f"{where}: entry {n} ({e['point']}, {e['method']}): {m} "
                                 f"{t!r} is not [value > 0, lower <= 0, upper >= 0], all "
                                 "finite")


# --- the comparison ---------------------------------------------------------------------------


def compare(rows: list[dict], ref: dict) -> list[Check]:
    """Every check of ``rows`` against ``ref``: each reference time, then TiledAttention's
    speed ratio to each baseline at each point where the reference has both."""
    _check_reference(ref, "reference")
    by_key = {(r["point_key"], r["method"]): r for r in rows}
    times, rows_of, stages = {}, {}, {}
    checks = []
    for e in ref["entries"]:
        row = by_key.get((e["point"], e["method"]))
        stage = stages[e["point"]] = e.get("stage", "bench")
        for m, (_, time_of) in MEASURES.items():
            if m not in e:
                continue
            value, lower, upper = e[m]
            new = time_of(row) if row and row.get("status") == "ok" else None
            new = new if new and new > 0 else None
            times[(e["point"], e["method"], m)] = (new, value, lower, upper)
            why = "" if new is not None else (f"{row['status']}: {row.get('reason', '')}"
                                              if row else "not in the new study")
            checks.append(Check(e["point"], e["method"], "time", m, new, value, lower,
                                upper, why, row is not None, stage=stage))
            rows_of[(e["point"], e["method"])] = row is not None
    for (point, method, m), (new_b, ref_b, lo, up) in sorted(times.items()):
        if method == SUBJECT or (point, SUBJECT, m) not in times:
            continue
        new_s, ref_s, lo_s, up_s = times[(point, SUBJECT, m)]
        new = new_b / new_s if new_b and new_s else None
        # The ratio's bounds: the wider of its two times' (a shipped tuple may be tighter).
        tol_lo, tol_up = min(lo, lo_s), max(up, up_s)
        measured = rows_of[(point, method)] and rows_of[(point, SUBJECT)]
        checks.append(Check(point, f"{SUBJECT} ÷ {method}", "ratio", m, new, ref_b / ref_s,
                            tol_lo, tol_up, "" if new else "a time is missing", measured,
                            stage=stages[point]))
    time_checks = {(c.point, c.method, c.measure): c for c in checks if c.quantity == "time"}
    checks = [_excused(c, times, time_checks) for c in checks]
    return checks + _host_geomean(checks, times)


def _host_geomean(checks: list[Check], times: dict) -> list[Check]:
    """One check over every host-bound call: TiledAttention's geometric-mean change over the
    baselines' at their own host-bound calls, so a slower call path shows even where each
    point is too noisy to tell it from the machine's CPU."""
    hosted = [c for c in checks if c.quantity == "time" and c.measure == "call" and c.new
              and _host_shows(times, c.point, c.method)]
    mine = [c.new / c.reference for c in hosted if c.method == SUBJECT]
    theirs = [c.new / c.reference for c in hosted if c.method != SUBJECT]
    if not mine or not theirs:
        return []
    host = geomean(theirs)
    return [Check(HOST_POINT, SUBJECT, "time", "call", geomean(mine) / host, 1.0,
                  -HOST_GEOMEAN, HOST_GEOMEAN,
                  f"{len(mine)} TiledAttention and {len(theirs)} baseline calls; the "
                  f"baselines' change, the host's: {100 * (host - 1):+.1f} %")]


def _host_shows(times: dict, point: str, method: str) -> bool:
    """Whether the call latency of (point, method), in the reference or the new study, is
    longer than its kernel time by more than HOST_EXPOSED (kernel: ms, call: us)."""
    kernel, call = times.get((point, method, "kernel")), times.get((point, method, "call"))
    if not kernel or not call:
        return False
    return any(k and c and c > HOST_EXPOSED * 1000 * k
               for k, c in ((kernel[0], call[0]), (kernel[1], call[1])))


def _excused(c: Check, times: dict, time_checks: dict) -> Check:
    """The check with its excuse, where a regression was not the subject's doing."""
    if c.verdict != "regression":
        return c
    methods = [SUBJECT] if c.quantity == "time" else [SUBJECT, c.method.split(" ÷ ")[1]]
    if c.measure == "call" and any(_host_shows(times, c.point, m) for m in methods):
        return replace(c, excuse="host-bound")
    if c.quantity == "ratio":
        own = time_checks.get((c.point, SUBJECT, c.measure))
        base = time_checks.get((c.point, methods[1], c.measure))
        if own and base and own.verdict in ("pass", "faster") and \
                base.verdict not in ("pass", "not ok", "not measured"):
            return replace(c, excuse="baseline changed")
    return c


def summary(checks: list[Check]) -> dict[str, int]:
    out = dict.fromkeys(VERDICTS, 0)
    for c in checks:
        out[c.verdict] += 1
    return out


def failed(checks: list[Check]) -> list[Check]:
    """The checks that fail the comparison, regressions first."""
    return sorted((c for c in checks if c.verdict in ("regression", "not ok")),
                  key=lambda c: c.verdict != "regression")




def per_method(checks: list[Check]) -> list[list]:
    """Per method (or ratio) and measure: checks, geometric mean of new ÷ reference,
    regressions (a stage other than the benchmark's prefixes its methods: "variants: flex")."""
    groups: dict[tuple, list[Check]] = {}
    for c in checks:
        label = c.method if c.stage == "bench" else f"{c.stage}: {c.method}"
        groups.setdefault((label, c.measure), []).append(c)
    out = []
    for (method, measure), cs in sorted(groups.items()):
        rel = [c.new / c.reference for c in cs if c.new is not None]
        g = geomean(rel)
        out.append([method, MEASURES[measure][0], len(cs),
                    None if g is None else round(100 * (g - 1), 2),
                    sum(c.verdict == "regression" for c in cs),
                    sum(c.verdict == "not ok" for c in cs),
                    sum(c.verdict == "not measured" for c in cs)])
    return out


# --- outputs ----------------------------------------------------------------------------------

COLUMNS = ["point", "method", "quantity", "measure", "new", "reference", "diff %", "lower %",
           "upper %", "verdict", "why", "stage"]


def _cells(c: Check) -> list:
    return [c.point, c.method, c.quantity, c.measure,
            None if c.new is None else float(f"{c.new:.6g}"), float(f"{c.reference:.6g}"),
            None if c.diff_pct is None else round(c.diff_pct, 2), round(100 * c.lower, 1),
            round(100 * c.upper, 1), c.verdict, c.why, c.stage]


def write(checks: list[Check], out_dir: str, *, new_name: str, ref: dict,
          gpu: str | None = None) -> list[str]:
    """compare.csv (every check), compare.md (the verdict, per method, then the checks that
    did not pass) and compare.png/.pdf (percent differences against the bounds)."""
    os.makedirs(out_dir, exist_ok=True)
    paths = [os.path.join(out_dir, n) for n in ("compare.csv", "compare.md")]
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(COLUMNS)
    w.writerows(["" if v is None else v for v in _cells(c)] for c in checks)
    with open(paths[0], "w") as f:
        f.write(buf.getvalue())
    with open(paths[1], "w") as f:
        f.write(markdown(checks, new_name=new_name, ref=ref))
    return paths + figure(checks, out_dir, gpu)


def verdict_line(checks: list[Check]) -> str:
    s = summary(checks)
    bad = s["regression"] + s["not ok"]
    head = "FAIL" if bad else "PASS"
    return (f"{head}: {len(checks) - s['not measured']} checks, {s['pass']} within tolerance, "
            f"{s['faster']} faster and {s['slower']} baseline times slower than the bounds, "
            f"{s['regression']} regressions, {s['host-bound']} host-bound call latencies and "
            f"{s['baseline changed']} ratios moved by their baseline outside the bounds, "
            f"{s['not ok']} not ok here ({s['not measured']} reference entries not in this "
            "study)")


def stages_line(checks: list[Check]) -> str:
    """Per stage: its checks here, and how many failed or were not measured."""
    parts = []
    # bench, then the stages timed by the benchmark's measures, then those with their own
    # (registry order within each).
    order = ["bench"] + sorted((s.name for s in COMPARED), key=lambda n: STAGES[n].rows.measure
                               is not None)
    for stage in sorted({c.stage for c in checks},
                        key=lambda st: (order.index(st) if st in order else len(order), st)):
        mine = [c for c in checks if c.stage == stage]
        s = summary(mine)
        parts.append(f"{stage} {len(mine) - s['not measured']} checks, "
                     f"{s['regression'] + s['not ok']} failed"
                     + (f", {s['not measured']} not measured" if s["not measured"] else ""))
    return "Stages: " + "; ".join(parts) + "." if parts else "Stages: none."


def markdown(checks: list[Check], *, new_name: str, ref: dict) -> str:
    tol = ", ".join(f"{MEASURES[m][0]} ±{100 * v:g} %" for m, v in
                    (ref.get("tolerance") or {}).items() if m in MEASURES)
    src = ref.get("source") or {}
    lines = [f"# {new_name} against the {ref.get('system')} reference", "",
             verdict_line(checks), "", stages_line(checks), "",
             f"Reference: {ref.get('system')} ({src.get('rows') or src.get('study') or '—'}"
             f"{', revision ' + src['git_commit'] if src.get('git_commit') else ''}); "
             f"tolerances: {tol or 'per tuple'}. A time above its upper bound or a speed "
             "ratio (TiledAttention ÷ baseline) below its lower bound is a regression (a "
             "baseline's own time above its bound is reported as slower, not failed); a "
             "row measured here that is not ok fails too; points or methods this study did "
             "not run are not measured (no failure). Reported, not failed: host-bound (a "
             f"call latency, or a ratio of them, where a call took over {HOST_EXPOSED:g}x its "
             "kernel time in either study: it measures the host CPU) and baseline changed (a "
             "ratio that left its bounds because the baseline's own time did, "
             "TiledAttention's staying within its own).", "",
             "## Per method", "",
             "| method | measure | checks | geomean new ÷ reference − 1 (%) | regressions "
             "| not ok | not measured |", "|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join("—" if v is None else str(v) for v in r) + " |"
              for r in per_method(checks)]
    bad = [c for c in checks if c.verdict not in ("pass", "not measured")]
    lines += ["", "## Checks not within tolerance", ""]
    if not bad:
        lines.append("(none)")
    else:
        lines += ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
        lines += ["| " + " | ".join("—" if v is None or v == "" else str(v)
                                    for v in _cells(c)) + " |" for c in bad]
    return "\n".join(lines) + "\n"


def figure(checks: list[Check], out_dir: str, gpu: str | None = None) -> list[str]:
    """Percent difference per point: times (top) and ratios (bottom), one panel per measure
    (kernel time, call latency, the model stage's time), the tolerance band shaded; the GPU
    the new rows ran on opens the title, as on every figure of the study."""
    from ..presentation.plotting import color, grid, no_data, plt, save

    p = plt()
    fig, axes = grid(p, 2 * len(MEASURES))
    points = sorted({c.point for c in checks})
    x = {k: i for i, k in enumerate(points)}
    for ax, (quantity, measure) in zip(axes, [(q, m) for q in ("time", "ratio")
                                              for m in MEASURES]):
        cs = [c for c in checks if (c.quantity, c.measure) == (quantity, measure)]
        ax.set_title(f"{'time' if quantity == 'time' else 'speed ratio'}: "
                     f"{MEASURES[measure][0]}")
        drawn = [c for c in cs if c.new is not None]
        if not drawn:
            no_data(ax, "nothing to compare")
            continue
        lo = min(100 * c.lower for c in cs)
        up = max(100 * c.upper for c in cs)
        ax.axhspan(lo, up, color="0.85", zorder=0)
        for i, method in enumerate(sorted({c.method for c in drawn})):
            mine = [c for c in drawn if c.method == method]
            ax.plot([x[c.point] for c in mine], [c.diff_pct for c in mine], "o", ms=3,
                    color=color(method.split(" ÷ ")[-1]) or f"C{i % 10}", label=method)
        bad = [c for c in drawn if c.verdict == "regression"]
        if bad:
            ax.plot([x[c.point] for c in bad], [c.diff_pct for c in bad], "x", color="red",
                    ms=6, label="regression")
        ax.axhline(0, color="0.4", lw=0.8)
        ax.set_xlabel("point (sorted by key)")
        ax.set_ylabel("new ÷ reference − 1 (%)")
        ax.legend(loc="best", fontsize=6)
    fig.suptitle(f"{gpu + ': ' if gpu else ''}against the reference (grey: tolerance band)")
    return save(fig, out_dir, "compare", record=False)


# --- the command ------------------------------------------------------------------------------

def parse_tolerance(items: list[str] | None) -> dict[str, float] | None:
    """``--tolerance 15`` (percent, both measures) or ``kernel=10 call=30``; None: keep the
    reference's own bounds (a shipped system's) or TOLERANCE."""
    if not items:
        return None
    bare = [i for i in items if "=" not in i]
    if bare and len(items) > 1:  # `10 25` once meant ±25 % for both, silently
        raise StudyError(f"--tolerance {' '.join(items)}: one bare percent sets both measures;"
                         " to set each, name it (kernel=10 call=25)")
    out: dict[str, float] = {}
    for item in items:
        measure, _, pct = item.rpartition("=")
        targets = [measure] if measure else list(MEASURES)
        if measure and measure in out:
            raise StudyError(f"--tolerance {' '.join(items)}: {measure} is given twice")
        if any(t not in MEASURES for t in targets):
            raise StudyError(f"--tolerance {item}: the measure must be one of "
                             f"{', '.join(MEASURES)} (e.g. kernel=10)")
        try:
            value = float(pct)
        except ValueError:
            raise StudyError(f"--tolerance {item}: {pct!r} is not a number of percent") \
                from None
        if not (math.isfinite(value) and 0 < value < 1000):
            raise StudyError(f"--tolerance {item}: a percentage above 0 and below 1000")
        out.update({t: value / 100 for t in targets})
    return out


def run(new: str, reference: str, *, tolerance: list[str] | None, out: str | None) -> tuple[
        list[Check], list[str]]:
    """The comparison of ``new`` against ``reference``, written to ``out`` (default: a
    ``compare/`` directory beside the new study's rows); (checks, files written)."""
    tol = parse_tolerance(tolerance)
    out = check_out(out) if out else default_out(new)
    rows, gpu = load_study(new)
    ref = load_reference(reference, tol)
    _check_reference(ref, reference)
    if any(e["method"] == SUBJECT for e in ref["entries"]) and \
            not any(str(r["method"]).startswith(SUBJECT) for r in rows):
        raise StudyError(f"{new}: no TiledAttention rows at all (methods: "
                         f"{', '.join(sorted({r['method'] for r in rows})) or 'none'}): "
                         "nothing of TiledAttention's to hold against the reference")
    checks = compare(rows, ref)
    if all(c.verdict == "not measured" for c in checks):
        raise StudyError(f"{new} and {reference} share no point and method measured ok in "
                         "the reference: nothing to compare (a different grid?)")
    return checks, write(checks, out, new_name=f"{new} ({gpu})", ref=ref, gpu=gpu)


def check_out(out: str) -> str:
    """``--out``, unless it is or lies inside a bundle (writing there breaks its verify)."""
    from ..publication.archive import bundle_holding

    held = bundle_holding(out)
    if held:
        raise StudyError(f"--out {out}: inside the bundle {held} (its files are checksummed; "
                         "writing there breaks its verify); name a directory outside it")
    return out


def default_out(new: str) -> str:
    """compare/ in the study's results directory, where the next ``tiledattn bundle
    create`` picks it up; never inside a bundle (its files are checksummed), nor beside a
    bundle that is not in a study (a committed reference: the tracked tree)."""
    new = os.path.abspath(new)
    if os.path.isdir(new) and not os.path.isfile(os.path.join(new, "SHA256SUMS")):
        return check_out(os.path.join(new, "compare"))
    parent = os.path.dirname(new)
    bundle = os.path.isfile(os.path.join(new, "SHA256SUMS")) or new.endswith(".zip")
    if bundle and not any(os.path.exists(os.path.join(parent, n))
                          for n in ("manifest.json", "aggregate", "plan")):
        raise StudyError(f"{new}: a bundle outside a study's results directory; name where "
                         "the comparison goes with --out (nothing is written beside it)")
    return check_out(os.path.join(parent, "compare"))


# --- building a shipped reference -------------------------------------------------------------

def _build_main(argv: list[str]) -> int:
    """python -m tiledattention.study.references.compare build SYSTEM OUT ROWS...: reference tuples
    for SYSTEM from committed rows (bundles, study directories or rows files)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m tiledattention.study.references.compare build")
    p.add_argument("system")
    p.add_argument("out")
    p.add_argument("rows", nargs="+")
    p.add_argument("--gpu", help="the GPU the rows were measured on (rows name only cuda)")
    a = p.parse_args(argv)
    rows, gpus = [], set()
    for path in a.rows:
        r, gpu = load_study(path)
        rows += r
        gpus.add(gpu)
    gpu = a.gpu or ", ".join(sorted(gpus))
    ref = build(rows, system=a.system, source={"rows": a.rows, "gpu": gpu})
    entries = ref.pop("entries")
    head = json.dumps(ref, indent=1)[:-2]  # one entry a line: `zdiff` shows what changed
    text = (head + ',\n "entries": [\n' + ",\n".join(json.dumps(e) for e in entries)
            + "\n ]\n}\n").encode()
    with open(a.out, "wb") as raw:  # OUT.json.gz (shipped) gzipped, byte-stable; else plain
        if a.out.endswith(".gz"):
            with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0) as g:
                g.write(text)
        else:
            raw.write(text)
    print(f"{a.out}: {len(entries)} entries for {a.system} ({gpu})")
    return 0


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] != ["build"]:
        sys.exit("usage: python -m tiledattention.study.references.compare build SYSTEM OUT "
                 "ROWS...")
    sys.exit(_build_main(sys.argv[2:]))
