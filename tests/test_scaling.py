"""Study wall time against GPU count: the workflow records each run's start, end, GPU slots
and job times (logs/runs.jsonl); `tiledattn scaling` turns them into a table and a figure;
the local launcher runs as many GPU steps at once as the run has GPUs. Also the device kit
(scripts/pack-study-wheels.sh) pins what containers/requirements.lock pins."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tiledattention.cli import main
from tiledattention.study import timeline
from tiledattention.study.references import scaling

ROOT = Path(__file__).resolve().parent.parent
SNAKEMAKE = shutil.which("snakemake") or str(Path(sys.executable).with_name("snakemake"))


def _runs(study: Path, gpus: int, t0: float, jobs: list[tuple[str, bool, float, float]],
          end: float | None, status: str = "ok") -> None:
    """One run's records as the workflow writes them: jobs are (rule, gpu, start, end)."""
    (study / "logs").mkdir(parents=True, exist_ok=True)
    recs = [{"format": timeline.FORMAT, "event": "start", "run": f"r{gpus}", "time": t0,
             "gpus": gpus, "launcher": "local"}]
    if end is not None:
        recs.append({"format": timeline.FORMAT, "event": "end", "run": f"r{gpus}", "time": end,
                     "status": status,
                     "jobs": [{"rule": r, "wildcards": {}, "output": r, "gpu": g,
                               "start": t0 + s, "end": t0 + e} for r, g, s, e in jobs]})
    with open(study / timeline.NAME, "a") as f:
        f.writelines(json.dumps(r) + "\n" for r in recs)


def test_scaling_counts_gpu_steps_in_flight_and_the_serial_part(tmp_path):
    # 1 GPU: plan 0-2, four 10 s GPU steps back to back 2-42, aggregate 42-46, ends at 48.
    one, two = tmp_path / "g1", tmp_path / "g2"
    _runs(one, 1, 1000.0, [("plan", False, 0, 2)] + [("bench_shard", True, 2 + 10 * i,
                                                      12 + 10 * i) for i in range(4)]
          + [("aggregate", False, 42, 46)], end=1048.0)
    # 2 GPUs: the same steps two at a time, 2-22, aggregate 22-26, ends at 28.
    _runs(two, 2, 2000.0, [("plan", False, 0, 2)] + [("bench_shard", True, 2 + 10 * (i // 2),
                                                      12 + 10 * (i // 2)) for i in range(4)]
          + [("aggregate", False, 22, 26)], end=2028.0)
    out = tmp_path / "out"
    assert main(["scaling", str(two), str(one), "--out", str(out)]) == 0
    rows = (out / "scaling.csv").read_text().splitlines()
    head = rows[0].split(",")
    first, second = (dict(zip(head, r.split(","))) for r in rows[1:])
    assert first["GPUs"] == "1" and second["GPUs"] == "2"  # ordered by GPU count
    assert float(second["wall s"]) == 28.0 and float(second["speedup"]) == pytest.approx(
        48 / 28, abs=1e-3)
    assert float(second["ideal s"]) == 24.0  # 48 s shared linearly
    assert second["peak in flight"] == "2" and first["peak in flight"] == "1"
    assert float(second["GPU work s"]) == 40.0 and float(second["GPU busy s"]) == 20.0
    # serial: Snakemake's start before the first job (0 here) + plan 2 + aggregate 4
    assert float(first["serial s"]) == 6.0
    assert float(second["Amdahl s"]) == pytest.approx(6 + (48 - 6) / 2, abs=0.05)
    md = (out / "scaling.md").read_text()
    assert "| GPUs |" in md and "aggregate 4.0, plan 2.0" in md
    assert (out / "scaling.png").stat().st_size > 0


def test_a_run_stopped_or_failed_is_named_not_counted(tmp_path, capsys):
    study = tmp_path / "stopped"
    _runs(study, 1, 10.0, [], end=None)  # a signal: no end record
    _runs(study, 2, 20.0, [("bench_shard", True, 0, 5)], end=30.0, status="failed")
    assert main(["scaling", str(study), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "2 run(s) recorded, none finished with GPU steps timed" in err[0]


@pytest.mark.skipif(not Path(SNAKEMAKE).exists(), reason="snakemake not installed")
def test_a_two_gpu_run_records_itself_and_runs_two_gpu_steps_at_once(tmp_path):
    # Two GPUs named to the local launcher (on a CPU machine the steps run on the CPU, each
    # still holding its GPU's lock) and two gpu slots: the smoke study's GPU steps run two
    # at a time, and the run's record says so.
    results = tmp_path / "g2"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="0,1", TMPDIR=str(tmp_path))  # own locks
    out = subprocess.run([SNAKEMAKE, "--nolock", "--profile", "profiles/local", "--configfile",
                          "config/smoke.yaml", "--resources", "gpu=2", "--cores", "3",
                          "--config", f"results_dir={results}"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    runs = timeline.read(str(results))
    assert len(runs) == 1 and runs[0]["gpus"] == 2 and runs[0]["end"]["status"] == "ok"
    jobs = runs[0]["end"]["jobs"]
    assert {j["rule"] for j in jobs if j["gpu"]} == {"bench_shard", "ladder", "tune",
                                                     "profile", "shapes", "model", "variants",
                                                     "workloads"}
    assert {j["rule"] for j in jobs if not j["gpu"]} >= {"plan", "aggregate", "figures",
                                                         "bundle", "bundle_verify"}
    found, notes = scaling.collect([str(results)])
    assert notes == [] and found[0].count == 2 and found[0].peak == 2
    assert found[0].gpu_steps == 9
    # The table in the study's scaling/ goes into the bundle made next, which verifies.
    assert main(["scaling", str(results), "--out", str(results / "scaling")]) == 0
    assert main(["bundle", "create", "--study", str(results), "--config",
                 str(results / "plan" / "study-config.yaml"), "--out",
                 str(results / "bundle")]) == 0
    assert "| local | 2 |" in (results / "bundle" / "scaling" / "scaling.md").read_text()
    assert main(["bundle", "verify", str(results / "bundle")]) == 0


def _pins(text: str) -> dict[str, str]:
    return {m.group(1).lower().replace("_", "-"): m.group(2)
            for m in re.finditer(r"([A-Za-z0-9_.-]+)==([^\s\"')]+)", text)}


def test_the_device_kit_pins_the_locked_versions_except_snakemakes_own():
    kit = _pins((ROOT / "scripts" / "pack-study-wheels.sh").read_text())
    lock = _pins((ROOT / "containers" / "requirements.lock").read_text())
    # Snakemake 9.9.0 (no SQL metadata store, a greedy scheduler that keeps to --resources)
    # and what only it needs are not in the lock.
    only_kit = {"snakemake", "reretry", "appdirs", "snakemake-interface-logger-plugins"}
    assert kit["snakemake"] == "9.9.0"
    differ = {n: (v, lock.get(n)) for n, v in kit.items()
              if n not in only_kit and lock.get(n) != v}
    assert differ == {}
    assert not {"pulp", "sqlmodel", "sqlalchemy", "pydantic", "docutils"} & set(kit)
