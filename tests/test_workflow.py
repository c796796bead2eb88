"""The Snakemake workflow: lint-clean, dry-runs plan the right jobs, bad configs stop it
before any job, and the smoke study runs end to end with the local profile."""

from __future__ import annotations

import csv
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SNAKEMAKE = shutil.which("snakemake") or str(Path(sys.executable).with_name("snakemake"))
pytestmark = pytest.mark.skipif(not Path(SNAKEMAKE).exists(),
                                reason="snakemake not installed (pip install '.[workflow]')")


def smk(*args, timeout=300):
    return subprocess.run([SNAKEMAKE, "--nolock", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_lint_is_clean():
    out = smk("--lint")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Congratulations" in out.stdout + out.stderr


@pytest.mark.parametrize("configfile,shards", [("config/config.yaml", 8),
                                               ("config/smoke.yaml", 2)])
def test_dry_run_plans_one_job_per_shard(configfile, shards, tmp_path):
    out = smk("-n", "--configfile", configfile, "--config", f"results_dir={tmp_path}")
    assert out.returncode == 0, out.stderr
    table = out.stdout + out.stderr
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", table, re.M))
    assert counts["bench_shard"] == str(shards)
    for rule in ("plan", "ladder", "aggregate", "figures", "manifest", "profile", "bundle",
                 "bundle_verify"):
        assert counts.get(rule) == "1", (rule, counts)


@pytest.mark.parametrize("override,words", [
    ("shards=0", "shards"),
    ("launcher=pbs", "launcher"),
    ('bench={"grid": {"seq": [64]}}', "grid: unknown key(s) ['seq']; valid keys are"),
    ('bench={"methods": ["triton"]}', "methods: 'triton' is not one of"),
])
def test_bad_config_fails_before_any_job_naming_the_key(override, words, tmp_path):
    out = smk("-n", "--configfile", "config/smoke.yaml", "--config",
              f"results_dir={tmp_path}", override)
    assert out.returncode != 0
    assert words in out.stdout + out.stderr
    assert "bench_shard" not in out.stdout


def test_smoke_study_runs_end_to_end_with_the_local_profile(tmp_path):
    results = tmp_path / "smoke"
    out = smk("--profile", "profiles/local", "--configfile", "config/smoke.yaml", "--config",
              f"results_dir={results}", timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    with open(results / "aggregate" / "rows.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 * 6  # 4 points x 6 methods
    statuses = {(r["method"], r["status"]) for r in rows}
    assert ("eager", "ok") in statuses and ("math", "ok") in statuses
    assert all(r["status"] in ("ok", "unavailable") for r in rows)
    assert (results / "shards" / "manifest-shard0of2.json").exists()
    # It ends with a verified bundle: tables, figures, the profile step's reason, metadata.
    assert "bundle verify: OK" in (results / "bundle.verified").read_text()
    bundle = results / "bundle"
    for name in ("tables/table4_ratios.tex", "tables/table6_ladder.md", "figures/regime_map.pdf",
                 "data/rows.parquet", "profiles.zip", ".zenodo.json", "CITATION.cff"):
        assert (bundle / name).stat().st_size > 0, name
    summary = (results / "profile" / "summary.md").read_text()
    # Profiled where ncu and a GPU are present; otherwise the reason is recorded.
    assert ("| bfloat16-full-d64-s256 | tiledattention |" in summary
            or "ncu (Nsight Compute) not found" in summary or "no CUDA GPU" in summary), summary
    ladder = (results / "aggregate" / "tables" / "table6_ladder.md").read_text()
    assert "64x64_o1_c1_lk2_lv4_natural" in ladder  # the ladder ran (unavailable on a CPU)
    report = smk("--configfile", "config/smoke.yaml", "--config", f"results_dir={results}",
                 "--report", str(results / "report.html"))
    assert report.returncode == 0, report.stderr[-2000:]
    html = (results / "report.html").read_text(errors="replace")
    assert "regime_map.png" in html and "table4_ratios.csv" in html
    # Nothing left to do on a rerun.
    again = smk("--profile", "profiles/local", "--configfile", "config/smoke.yaml",
                "--config", f"results_dir={results}", "-n")
    assert "Nothing to be done" in again.stdout + again.stderr
