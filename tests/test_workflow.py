"""The Snakemake workflow: lint-clean, dry-runs plan the right jobs, bad configs stop it
before any job, and the smoke study runs end to end with the local profile."""

from __future__ import annotations

import csv
import os
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


def test_a_shapes_grid_runs_the_methods_it_names(tmp_path):
    """A shapes grid's ``methods`` reach its sweep's bench config (plan/shapes-g0.yaml), the
    study's timing beside them; a grid without them keeps the kernel and SDPA."""
    import shutil

    import yaml

    results = tmp_path / "results"
    cfg = tmp_path / "extra.yaml"
    cfg.write_text(f"results_dir: {results}\nshapes: {{enabled: true, grids: ["
                   "{seqs: [64], head_dims: [64], methods: [tiledattention, math]}, "
                   "{seqs: [64], head_dims: [64]}]}\n")
    snakemake = shutil.which("snakemake") or str(Path(sys.executable).with_name("snakemake"))
    run = subprocess.run([snakemake, str(results / "plan" / "shapes-g0.yaml"),
                          str(results / "plan" / "shapes-g1.yaml"), "--cores", "1",
                          "--configfile", "config/smoke.yaml", str(cfg)], cwd=ROOT,
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert run.returncode == 0, run.stderr[-2000:]
    smoke = yaml.safe_load((ROOT / "config" / "smoke.yaml").read_text())
    g0 = yaml.safe_load((results / "plan" / "shapes-g0.yaml").read_text())
    g1 = yaml.safe_load((results / "plan" / "shapes-g1.yaml").read_text())
    assert g0["methods"] == ["tiledattention", "math"] and "methods" not in g0["grid"]
    assert g1["methods"] == ["tiledattention", "torch_sdpa"]
    assert g0["timing"] == g1["timing"] == smoke["bench"]["timing"]


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
    # The smoke study is the default study in miniature: the same steps.
    for rule in ("plan", "tune", "ladder", "aggregate", "figures", "manifest", "profile",
                 "model", "variants", "bundle", "bundle_verify"):
        assert counts.get(rule) == "1", (rule, counts)
    # One job per shapes grid (two in the paper's study, one in the smoke study).
    assert counts.get("shapes") == str(2 if configfile == "config/config.yaml" else 1)


def _gpu_commands(out) -> list[str]:
    return [ln for ln in (out.stdout + out.stderr).splitlines()
            if re.match(r"(Shell command: )?tiledattn (sweep|tune|profile|model|variants) ", ln)]


def test_a_command_line_config_keeps_the_profiles_launcher(tmp_path):
    # Snakemake replaces the profile's `config:` list with the command line's --config; the
    # workflow puts the profile's launcher back, so every GPU step still goes to SLURM.
    out = smk("-n", "-p", "--profile", "profiles/slurm", "--configfile", "config/smoke.yaml",
              "--config", "shards=3", f"results_dir={tmp_path}")
    assert out.returncode == 0, out.stderr[-2000:]
    commands = _gpu_commands(out)
    # three shards, ladder, tune, profile, one shapes grid, model, variants
    assert len(commands) == 3 + 6
    assert all("--launcher slurm" in c and '"partition": "gpu"' in c for c in commands), commands
    # Typed as the launcher reads them (issue 38: "account": "null", numbers as strings).
    assert all('"account": null' in c and '"gpus_per_job": 1,' in c and
               '"time_min": 120,' in c for c in commands), commands
    assert "config: launcher, launcher_options from the profile" in out.stderr


def test_gpu_rules_declare_a_gpu_slot_locally_and_no_gpu_0_under_slurm(tmp_path):
    # Under SLURM the jobs hold no local slot: a GPU step shown with `gpu=0` read as "no GPU".
    gpu_rules = ("bench_shard", "ladder", "tune", "profile", "shapes", "model", "variants")

    def resources(out):
        text, rule, found = out.stdout + out.stderr, None, {}
        for line in text.splitlines():
            m = re.match(r"\s*(?:localrule|rule) (\w+):", line)
            if m:
                rule = m.group(1)
            m = re.match(r"\s*resources: (.*)", line)
            if m and rule:
                found.setdefault(rule, set()).add(m.group(1))
        return found

    slurm = smk("-n", "-p", "--profile", "profiles/slurm", "--configfile", "config/smoke.yaml",
                "--config", f"results_dir={tmp_path}/s")
    assert slurm.returncode == 0, slurm.stderr[-2000:]
    local = smk("-n", "-p", "--configfile", "config/smoke.yaml", "--config",
                f"results_dir={tmp_path}/l")
    assert local.returncode == 0, local.stderr[-2000:]
    on_slurm, on_local = resources(slurm), resources(local)
    assert set(gpu_rules) <= set(on_local) and set(gpu_rules) <= set(on_slurm), on_slurm
    for rule in gpu_rules:
        assert all("gpu=1" in r for r in on_local[rule]), (rule, on_local[rule])
        assert not any("gpu=" in r for r in on_slurm[rule]), (rule, on_slurm[rule])


def test_a_command_line_launcher_contradicting_the_profile_is_refused(tmp_path):
    out = smk("-n", "--profile", "profiles/slurm", "--configfile", "config/smoke.yaml",
              "--config", "launcher=local", f"results_dir={tmp_path}")
    assert out.returncode != 0
    assert ("this profile runs the study with launcher=slurm, but --config says "
            "launcher=local") in out.stdout + out.stderr
    assert not _gpu_commands(out)


def test_without_a_profile_the_configs_launcher_runs_every_gpu_step(tmp_path):
    out = smk("-n", "-p", "--configfile", "config/smoke.yaml", "--config",
              f"results_dir={tmp_path}")
    commands = _gpu_commands(out)
    assert len(commands) == 2 + 6 and all("--launcher local" in c for c in commands), commands


def test_a_configfile_replaces_the_default_config(tmp_path):
    # A minimal study inherits nothing from config/config.yaml (no tuning, no ladder, not
    # the paper's tokens/width): the schema's defaults fill the rest.
    minimal = tmp_path / "minimal.yaml"
    minimal.write_text(f"results_dir: {tmp_path / 'out'}\nshards: 1\nlauncher: local\n"
                       "bench: {grid: {seqs: [64], head_dims: [64], dtypes: [bfloat16], "
                       "causal: [false], shape_policy: explicit, batch: 1, heads: 2}}\n")
    out = smk("-n", "--configfile", str(minimal))
    assert out.returncode == 0, out.stderr[-2000:]
    counts = dict(re.findall(r"^(\w+)\s+(\d+)$", out.stdout + out.stderr, re.M))
    assert counts["bench_shard"] == "1" and "tune" not in counts and "ladder" not in counts


@pytest.mark.parametrize("text,words", [
    ("{}\n", "the study config is empty"),
    ("- 1\n", "Config file must be given as JSON or YAML with keys at top level"),
])
def test_an_empty_or_non_mapping_config_fails_with_one_line(text, words, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    out = smk("-n", "--configfile", str(bad))
    assert out.returncode != 0 and words in out.stdout + out.stderr, out.stdout[-2000:]
    assert "bench_shard" not in out.stdout + out.stderr


@pytest.mark.parametrize("override,words", [
    ("shards=0", "shards"),
    ("launcher=pbs", "launcher"),
    ('bench={"grid": {"seq": [64]}}', "grid: unknown key(s) ['seq']; valid keys are"),
    ('bench={"methods": ["triton"]}', "methods: 'triton' is not one of"),
    ('profile={"shapes": ["float16:causal:128"]}', "expected dtype:mask:D:S"),
    ('ladder={"steps": ["64x64"]}', "is not like 64x128_o2_c1_lk2_lv4"),
    ('model={"batches": []}', "model.batches: must not be empty"),
    ('model={"layers": 2}', "model: unknown key(s) ['layers']; valid keys are"),
    ('tune={"passes": ["bwd"]}', "'bwd' is not one of ['fwd', 'fwd+bwd']"),
    ("shardz=3", "config: unknown key(s) ['shardz']; valid keys are ['bench', 'ladder'"),
    ('launcher_options={"timeout_mins": 1}', "local launcher: unknown option(s) "
     "['timeout_mins']; valid options are ['timeout_s', 'timeout_min', 'python']"),
    ('launcher_options={"timeout_min": "ten"}', "option timeout_min: 'ten' is not a valid int"),
])
def test_bad_config_fails_before_any_job_naming_the_key(override, words, tmp_path):
    out = smk("-n", "--configfile", "config/smoke.yaml", "--config",
              f"results_dir={tmp_path}", override)
    assert out.returncode != 0
    assert words in out.stdout + out.stderr
    assert "bench_shard" not in out.stdout
    # One line, not the schema: the error and Snakemake's few lines of where it was raised.
    assert len((out.stdout + out.stderr).splitlines()) < 15, out.stderr[-3000:]


def test_tune_passes_run_the_backward_tune_into_the_same_table(tmp_path):
    passes = tmp_path / "passes.yaml"
    passes.write_text("tune: {enabled: true, head_dims: [64], passes: [fwd, fwd+bwd]}\n")
    out = smk("-n", "-p", "--configfile", "config/smoke.yaml", str(passes), "--config",
              f"results_dir={tmp_path}")
    assert out.returncode == 0, out.stderr[-2000:]
    (tune,) = [ln for ln in out.stdout.splitlines() if "tiledattn tune" in ln]
    assert "--pass fwd fwd+bwd " in tune  # one launcher job tunes both passes in order
    assert f"--out {tmp_path}/tune/schedule-table.json" in tune


def _readme_report_command() -> list[str]:
    # The README's command for the report of the study scripts/main.sh runs on a CPU box.
    text = (ROOT / "README.md").read_text()
    line = next(ln.strip() for ln in text.splitlines()
                if ln.strip().startswith("snakemake ") and "--report" in ln
                and "smoke" in ln)
    return line.split("#")[0].split()


def test_smoke_study_runs_end_to_end_with_the_local_profile(tmp_path):
    # A results directory with a space and a command substitution: every path is quoted.
    marker = tmp_path / "substituted"
    results = tmp_path / "smoke study" / f"$(touch {marker})"
    out = smk("--profile", "profiles/local", "--configfile", "config/smoke.yaml", "--config",
              f"results_dir={results}", timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert not marker.exists()
    with open(results / "aggregate" / "rows.csv") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 4 * 6  # 4 points x 6 methods
    statuses = {(r["method"], r["status"]) for r in rows}
    assert ("eager", "ok") in statuses and ("math", "ok") in statuses
    assert all(r["status"] in ("ok", "unavailable") for r in rows)
    assert (results / "shards" / "manifest-shard0of2.json").exists()
    # Every GPU step ran as a local launcher job (submitit's files in its log folder).
    for step in ("shards", "ladder", "tune", "profile", "shapes/g0", "model", "variants",
                 "workloads"):
        assert list((results / step / "logs").glob("*_submitted.pkl")), step
    # It ends with a verified bundle: tables, figures, the profile step's reason, metadata.
    assert "bundle verify: OK" in (results / "bundle.verified").read_text()
    bundle = results / "bundle"
    for name in ("tables/table4_ratios.tex", "tables/table6_ladder.md",
                 "data/rows.parquet", "profiles.zip", ".zenodo.json", "CITATION.cff"):
        assert (bundle / name).stat().st_size > 0, name
    readme = (bundle / "README.md").read_text()
    # A figure is in the bundle when it has data; one with nothing drawn (no GPU: no ratio)
    # is left out, the README saying so; the study's own figures/ holds every one.
    for name in ("regime_map_fwd.pdf", "shapes.png", "variants.png"):
        assert (results / "figures" / name).stat().st_size > 0, name
        stem = name.rsplit(".", 1)[0]
        assert (bundle / "figures" / name).exists() != (
            f"- figures: {stem} not drawn, nothing to draw" in readme), name
    summary = (results / "profile" / "summary.md").read_text()
    # Profiled where ncu and a GPU are present; otherwise the reason is recorded.
    assert ("| bfloat16-full-d64-s256 | tiledattention |" in summary
            or "ncu (Nsight Compute) not found" in summary or "no CUDA GPU" in summary), summary
    ladder = (results / "aggregate" / "tables" / "table6_ladder.md").read_text()
    assert "64x64_o1_c1_lk2_lv4_natural" in ladder  # the ladder ran (unavailable on a CPU)
    shapes = (results / "aggregate" / "tables" / "shapes.md").read_text()
    assert "| bfloat16 | full | fwd | 64 | 100 | 1 | 2 |" in shapes  # the shapes grid ran
    model = (bundle / "tables" / "model_e2e.md").read_text()
    assert "| 1 | decode | tiledattention |" in model  # the model job ran (rows either way)
    assert (bundle / "data" / "model-rows.jsonl").stat().st_size > 0
    variants = (bundle / "tables" / "variants.md").read_text()
    assert "| window | bfloat16 | 64 | 256 | 2 | 2 | fwd |" in variants  # the variants job ran
    assert (bundle / "data" / "variants-rows.jsonl").stat().st_size > 0
    workloads = (bundle / "tables" / "workloads_decode.md").read_text()
    assert "× sdpa_padded" in workloads  # the workloads job ran (SDPA on the padded batch)
    assert (bundle / "data" / "workloads-rows.jsonl").stat().st_size > 0
    table5 = (results / "aggregate" / "tables" / "table5_schedules.md").read_text()
    readme = (bundle / "README.md").read_text()
    assert "Workloads (lengths: contexts lognormal(mu=4, sigma=1; median 55 tokens) " \
        "clipped to [16, 80]; documents lognormal(mu=3.5, sigma=1; median 33 tokens)" in readme
    gpu = "| float16 | full | 64 |" in table5
    if not gpu:  # on a CPU the tuning job recorded why; Table 5 and the README say so
        assert "tuning did not run: no CUDA GPU visible" in table5
        assert "- tuning (Table 5): not run: no CUDA GPU visible" in readme
        assert "- benchmark: tiledattention unavailable at 4 point(s)" in readme
        # FA4 through transformers joined the model stage (f94f811): its rows too
        assert "- model benchmark (model_e2e): unavailable at 12 row(s): no CUDA GPU" in readme
        assert "- variants: flex unavailable at 4 point(s): no CUDA GPU" in readme
        assert "- workloads: fa4 unavailable at 6 point(s): needs a CUDA GPU (no CUDA" in readme
        assert "no speedup over a baseline measured (tiledattention unavailable: needs a " \
            "CUDA GPU" in readme
        assert "no speedup over a fused baseline measured (fa4 unavailable: no CUDA GPU" in readme
        assert "- figures: regime_map_fwd not drawn, nothing to draw" in readme
    # The exact config is the smoke config's own: nothing of config/config.yaml's grid.
    exact = (bundle / "config" / "study-config.yaml").read_text()
    for key in ("flush_l2", "tokens: 16384", "width: 2048", "seqs: [4096]", "- 4096"):
        assert key not in exact, key
    # The report, with the README's command (pointed at this study's results).
    command = _readme_report_command()
    assert command[:4] == ["snakemake", "--configfile", "config/smoke.yaml", "--report"]
    report = smk(*command[1:4], str(results / "report.html"), "--config",
                 f"results_dir={results}")
    assert report.returncode == 0, report.stderr[-2000:]
    html = (results / "report.html").read_text(errors="replace")
    assert "regime_map_fwd.png" in html and "table4_ratios.csv" in html
    if os.path.exists("/usr/bin/chromium"):  # the page as a browser renders it
        from test_report_page import dump_dom

        words = " ".join(dump_dom(results / "report.html").split())
        assert '<table id="headline">' in words and '<table id="status">' in words
        assert "A CPU study: nothing was timed on a GPU." in words or "Timed on" in words
    # Nothing left to do on a rerun.
    again = smk("--profile", "profiles/local", "--configfile", "config/smoke.yaml",
                "--config", f"results_dir={results}", "-n")
    assert "Nothing to be done" in again.stdout + again.stderr


def test_ctrl_c_on_the_local_profile_ends_with_one_line_saying_what_the_errors_are(tmp_path):
    # A terminal's Ctrl-C reaches Snakemake and its steps (the process group): Snakemake
    # prints an "Error in rule" block per running step; the workflow's last line says they
    # are stopped steps, not failures, and that the same command resumes.
    import os
    import signal
    import time

    out = tmp_path / "out.txt"
    with open(out, "w") as f:
        run = subprocess.Popen([SNAKEMAKE, "--nolock", "--profile", "profiles/local",
                                "--configfile", "config/smoke.yaml", "--config",
                                f"results_dir={tmp_path}/r"], cwd=ROOT, stdout=f,
                               stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while "rule ladder:" not in out.read_text() and run.poll() is None:
            assert time.monotonic() < deadline, out.read_text()[-3000:]
            time.sleep(0.2)
        os.killpg(run.pid, signal.SIGINT)
        run.wait(timeout=120)
    finally:
        run.kill()
    text = out.read_text()
    assert run.returncode != 0, text[-3000:]
    lines = [ln for ln in text.splitlines() if ln.startswith("workflow: stopped by")]
    assert lines == ["workflow: stopped by Ctrl-C (SIGINT): the 'Error in rule' blocks above "
                     "are the steps that were running, stopped, their jobs cancelled, not "
                     "failures; the same command resumes (finished rows are kept)"], text[-3000:]


def _snakemake_n(tmp_path: Path, extra: str) -> subprocess.CompletedProcess:
    import shutil

    cfg = tmp_path / "extra.yaml"
    cfg.write_text(f"results_dir: {tmp_path / 'results'}\n{extra}")
    snakemake = shutil.which("snakemake") or str(Path(sys.executable).with_name("snakemake"))
    return subprocess.run([snakemake, "-n", "--cores", "1", "--configfile", "config/smoke.yaml",
                           str(cfg)], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})


@pytest.mark.parametrize("extra,words", [
    ("benchh: {}\n", "config: unknown key(s) ['benchh']"),
    ("shapes: {enabled: true, grids: []}\n", "config: shapes: enabled with no grids"),
    ("bench: {grid: {seqs: [0]}}\n", "config: grid.seqs: 0 must be >= 1"),
    ("shapes: {enabled: true, grids: [{seqs: [64], head_dims: [64], methods: [nosuch]}]}\n",
     "config: shapes.grids[0]: methods: 'nosuch' is not one of"),
])
def test_a_bad_study_config_ends_the_workflow_in_one_line_exit_2(tmp_path, extra, words):
    run = _snakemake_n(tmp_path, extra)
    assert run.returncode == 2, run.stderr[-2000:]
    lines = [ln for ln in run.stderr.strip().splitlines() if "config:" in ln or "Error" in ln]
    assert lines == [next(ln for ln in lines if words in ln)], run.stderr[-2000:]
    assert "WorkflowError" not in run.stderr and "File \"" not in run.stderr
