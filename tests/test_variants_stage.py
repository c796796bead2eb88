"""The variants stage on a CPU: its config refuses bad input in one line (exit 2), every
variant's eager and SDPA-mask rows pass the harness' float64 check, FlexAttention and ours
are `unavailable` with the reason, a study without a GPU gets unavailable rows (measured
later where a GPU is), the table, figure and headline from synthetic rows, and the
workflow's wiring (dry runs)."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("cuda.tile", reason="cuTile not installed: pip install 'cuda-tile[tileiras]'")

import torch  # noqa: E402

from tiledattention.bench import variant_cases as registry  # noqa: E402
from tiledattention.bench.config import ConfigError  # noqa: E402
from tiledattention.bench.methods import METHODS, Unavailable  # noqa: E402
from tiledattention.bench.runner import run_point  # noqa: E402
from tiledattention.bench.variant_cases import VARIANT_NAMES, VariantPoint  # noqa: E402
from tiledattention.cli import main  # noqa: E402
from tiledattention.stages import stage_from_dict  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
METHOD_NAMES = ["tiledattention", "flex", "sdpa_mask", "eager"]


def _cfg(**kw):
    return stage_from_dict("variants", {"warmup": 0, "reps": 1, "rounds": 1, **kw})


@pytest.mark.parametrize("argv,words", [
    (["--variants", "sinkz"], "argument --variants: invalid choice: 'sinkz'"),
    (["--seqs", "0"], "argument --seqs: 0 must be >= 1"),
    (["--config", "{cfg}"], "variants: unknown key(s) ['seqz']; valid keys are"),
    (["--head-dims", "512"], "variants.head_dims: 512 must be <= 256"),
    (["--passes", "bwd"], "argument --passes: invalid choice: 'bwd'"),
])
def test_bad_input_is_one_line_and_exit_2(argv, words, tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("variants: {seqz: [1024]}\n")
    argv = [a.replace("{cfg}", str(bad)) for a in argv]
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(["variants", "--out", str(tmp_path / "out"), *argv]))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("tiledattn variants") and words in err, err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out" / "rows.jsonl").exists()


def test_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"^variants.methods: 'flash' is not one of"):
        stage_from_dict("variants", {"methods": ["flash"]})
    with pytest.raises(ConfigError, match=r"^variants.variants: listed more than once"):
        stage_from_dict("variants", {"variants": ["alibi", "alibi"]})


@pytest.mark.parametrize("name", VARIANT_NAMES)
def test_every_variant_eager_and_sdpa_mask_rows_match_float64(name):
    registry._parts.cache_clear()
    causal = registry.VARIANTS[name].causal
    for pass_ in ("fwd", "fwd+bwd"):
        point = VariantPoint("float32", causal, 16, 96, 96, 2, 4, 1, pass_, variant=name)
        rows = {r["method"]: r for r in run_point(point, METHOD_NAMES, _cfg().bench_config(),
                                                  torch.device("cpu"), None)}
        assert rows["eager"]["status"] == "ok" and rows["eager"]["correct"], rows["eager"]
        if name == "softcap":  # no mask expresses a score modification
            assert rows["sdpa_mask"]["status"] == "unsupported"
            assert "softcapping is not a mask" in rows["sdpa_mask"]["reason"]
        else:
            assert rows["sdpa_mask"]["status"] == "ok" and rows["sdpa_mask"]["correct"]
        if pass_ == "fwd+bwd":
            assert rows["eager"]["grads_correct"], rows["eager"]["grad_rel_err"]
        for m in ("tiledattention", "flex"):
            assert (rows[m]["status"], rows[m]["reason"]) == ("unavailable", "needs a CUDA GPU")
    registry._parts.cache_clear()


def test_a_torch_mod_that_disagrees_with_the_reference_is_a_wrong_row(monkeypatch):
    def wrong(batch, heads, seq, device):  # ALiBi's reference, the bias the wrong way
        parts = registry._build_alibi(batch, heads, seq, device)
        slopes = registry.VARIANTS  # keep the linter quiet about the closure below
        del slopes
        good = parts.score
        parts.score = lambda s, b, h, q, k: 2 * s - good(s, b, h, q, k)
        return parts

    monkeypatch.setitem(registry.VARIANTS, "alibi",
                        registry.Variant("alibi", "wrong", True, wrong))
    registry._parts.cache_clear()
    point = VariantPoint("float32", True, 16, 96, 96, 1, 4, 1, "fwd", variant="alibi")
    rows = {r["method"]: r for r in run_point(point, ["eager"], _cfg().bench_config(),
                                              torch.device("cpu"), None)}
    assert rows["eager"]["status"] == "wrong", rows["eager"]
    registry._parts.cache_clear()


def test_flex_without_triton_is_unavailable_with_the_reason(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "triton" else real(name, *a))
    point = VariantPoint("bfloat16", True, 64, 256, 256, 1, 2, variant="window")
    with pytest.raises(Unavailable, match="FlexAttention needs Triton"):
        METHODS["flex"].check(point, torch.device("cuda"))
    with pytest.raises(Unavailable, match="on a CUDA GPU only"):
        METHODS["flex"].check(point, torch.device("cpu"))


def test_without_a_gpu_every_row_is_unavailable_and_measured_once_a_gpu_is_there(
        tmp_path, monkeypatch):
    from tiledattention.bench import runner
    from tiledattention.stages.variants import load_rows, points, run_variants

    cfg = _cfg(variants=["window", "alibi"], seqs=[256], head_dims=[64], dtypes=["bfloat16"])
    monkeypatch.setattr(runner, "no_gpu_reason", lambda: "no CUDA GPU visible on node7")
    out = run_variants(cfg, str(tmp_path))
    rows = load_rows(str(tmp_path))
    assert out["status"] == "unavailable"
    assert len(rows) == len(points(cfg)) * len(cfg.methods) == 4 * len(cfg.methods)
    assert {(r["status"], r["reason"]) for r in rows} == {
        ("unavailable", "no CUDA GPU visible on node7")}
    manifest = json.loads((tmp_path / "manifest-variants.json").read_text())
    assert manifest["config"] == json.loads(json.dumps(cfg.as_dict()))
    # Where a GPU is, those rows are measured (the harness gets every point again).
    planned = []
    monkeypatch.setattr(runner, "no_gpu_reason", lambda: None)
    monkeypatch.setattr(runner, "resolve_device", lambda name: torch.device("cpu"))
    monkeypatch.setattr(runner, "measure", lambda plan, *a: planned.extend(plan))
    run_variants(cfg, str(tmp_path))
    assert [p.key() for p, _ in planned] == [p.key() for p in points(cfg)]
    assert load_rows(str(tmp_path)) == [] and list(tmp_path.glob("stale-rows-*.jsonl"))


def test_rows_missing_after_the_harness_are_an_incomplete_stage_never_ok(monkeypatch,
                                                                           tmp_path, capsys):
    # On the H100 the stage returned "ok" with 36 of 72 rows: the harness had been stopped
    # (SIGTERM: the point it cut is measured on resume) and the stage did not say so.
    from tiledattention.bench import runner
    from tiledattention.stages.variants import load_rows, points, run_variants

    cfg = _cfg(variants=["window", "alibi"], seqs=[256], head_dims=[64], dtypes=["bfloat16"])
    half = points(cfg)[:2]

    def stopped_measure(plan, bench_cfg, store, device, log):
        for p, methods in plan:
            if p in half:
                for m in methods:
                    store.append({"point_key": p.key(), "method": m, "status": "ok",
                                  **p.as_dict(), "device": "cuda"})
        return True

    monkeypatch.setattr(runner, "no_gpu_reason", lambda: None)
    monkeypatch.setattr(runner, "resolve_device", lambda name: torch.device("cpu"))
    monkeypatch.setattr(runner, "measure", stopped_measure)
    out = run_variants(cfg, str(tmp_path))
    want = len(points(cfg)) * len(cfg.methods)
    assert out["status"] == "incomplete" and out["stopped"] is True
    assert out["reason"].startswith(f"{want // 2} of {want} rows missing (stopped by a signal")
    assert len(load_rows(str(tmp_path))) == want // 2
    # Without a stop, rows the harness did not return are named as such.
    monkeypatch.setattr(runner, "measure", lambda *a: False)
    out = run_variants(cfg, str(tmp_path / "b"))
    assert out["status"] == "incomplete" and "harness returned no row" in out["reason"]
    # The command exits non-zero: 130 when stopped, 1 for a gap.
    assert main(["variants", "--variants", "window", "--seqs", "256", "--head-dims", "64",
                 "--dtypes", "bfloat16", "--out", str(tmp_path / "c")]) == 1
    assert "rows missing" in capsys.readouterr().out


def test_points_keep_b_times_s_and_name_the_variant():
    from tiledattention.stages.variants import points

    pts = points(_cfg(seqs=[1024, 16384], head_dims=[128], dtypes=["float16"]))
    assert {(p.seq_q, p.batch, p.heads) for p in pts} == {(1024, 16, 16), (16384, 1, 16)}
    assert len({p.key() for p in pts}) == len(pts) == 2 * len(VARIANT_NAMES) * 2
    assert pts[0].key().startswith("causal-float16-causal-d128-sq1024")
    assert [p for p in pts if p.variant == "prefix_lm"][0].causal is False


def _row(variant, seq, pass_, method, ms=None, status="ok", reason=None):
    key = f"{variant}-bfloat16-d128-s{seq}-{pass_}"
    row = {"point_key": key, "variant": variant, "dtype": "bfloat16", "head_dim": 128,
           "seq_q": seq, "seq_kv": seq, "batch": 16384 // seq, "heads": 16, "pass": pass_,
           "method": method, "status": status}
    if ms is not None:
        row["time_ms"] = {"median_ms": ms}
    if reason:
        row["reason"] = reason
    return row


def _synthetic():
    rows = []
    for variant, ours in (("window", 1.0), ("alibi", 2.0)):
        for seq in (1024, 4096):
            for pass_, k in (("fwd", 1.0), ("fwd+bwd", 3.0)):
                rows += [_row(variant, seq, pass_, "tiledattention", ours * k),
                         _row(variant, seq, pass_, "flex", ours * k * 2.0),
                         _row(variant, seq, pass_, "sdpa_mask", ours * k * 4.0),
                         _row(variant, seq, pass_, "eager", status="unsupported",
                              reason="eager needs ~70.0 GiB")]
    return rows


def test_table_headline_and_figure_from_synthetic_rows(tmp_path):
    from tiledattention.study.presentation.headline import lines, variants_sentence
    from tiledattention.study.presentation.variants_report import variants_figure, variants_table

    t = variants_table(_synthetic())
    assert t.columns[7:] == ["ours ms", "flex ms", "ours % peak @ clock", "flex % peak @ clock",
                             "× flex", "× sdpa+mask", "fastest fused", "× fastest"]
    assert [r[9:11] for r in t.rows] == [[None, None]] * 8  # no GPU named, no clock
    assert len(t.rows) == 8 and t.rows[0][:7] == ["window", "bfloat16", 128, 1024, 16, 16,
                                                  "fwd"]
    assert [r[-4:] for r in t.rows] == [[2.0, 4.0, "flex", 2.0]] * 8
    assert "eager unsupported: eager needs ~70.0 GiB" in t.notes
    line = variants_sentence(_synthetic())
    assert "fwd 2.000x (min 2.000x, faster at 4/4 points) against flex at 4" in line
    assert "fwd+bwd 2.000x" in line and "Variants (window, alibi)" in line
    # the backend of each baseline by its registry name and description
    assert "FlexAttention (`flex`: torch.compile'd FlexAttention" in line
    assert "SDPA + mask (`sdpa_mask`: " in line and "fwd 4.000x" in line
    assert [ln.cells()[:6] + ln.cells()[-1:] for ln in lines([], _synthetic())] == [
        ["fastest fused (variants), fwd", 4, 2.0, 2.0, 2.0, "4/4", "flex 4"],
        ["fastest fused (variants), fwd+bwd", 4, 2.0, 2.0, 2.0, "4/4", "flex 4"],
        ["FlexAttention (variants), fwd", 4, 2.0, 2.0, 2.0, "4/4", None],
        ["FlexAttention (variants), fwd+bwd", 4, 2.0, 2.0, 2.0, "4/4", None],
        ["SDPA + mask (variants), fwd", 4, 4.0, 4.0, 4.0, "4/4", None],
        ["SDPA + mask (variants), fwd+bwd", 4, 4.0, 4.0, 4.0, "4/4", None]]
    from tiledattention.study.presentation.variants_report import variants_summary

    summary = variants_summary(_synthetic())
    assert summary.rows[0] == ["window", "fwd", "2/2", 2.0, 2.0, "≥ 1.5x, min ≥ 1x", 4.0, "yes",
                               2.0, 2.0, "flex 2"]
    slow = [{**r, "time_ms": {"median_ms": r["time_ms"]["median_ms"] * 1.5}}
            if r["method"] == "tiledattention" else r for r in _synthetic()]
    assert [r[7] for r in variants_summary(slow).rows] == ["no", "yes"] * 2
    paths = variants_figure(_synthetic(), str(tmp_path))
    assert sorted(Path(p).name for p in paths) == ["variants.pdf", "variants.png"]
    assert all(Path(p).stat().st_size > 1000 for p in paths)


def test_the_fastest_fused_baseline_is_taken_at_each_point_and_named():
    """A faster fused baseline at one point (here SDPA + mask at S=4096, fwd) is the one
    compared with there; the other points keep FlexAttention."""
    from tiledattention.study.presentation.headline import variants_sentence
    from tiledattention.study.presentation.variants_report import ratio_rows

    rows = [dict(r, time_ms={"median_ms": 0.5}) if (r["method"], r["seq_q"], r["pass"]) ==
            ("sdpa_mask", 4096, "fwd") and r["variant"] == "window" else r
            for r in _synthetic()]
    recs = {(r["variant"], r["seq"], r["pass"]): r for r in ratio_rows(rows)}
    assert recs[("window", 4096, "fwd")]["best"] == "sdpa_mask"
    assert recs[("window", 4096, "fwd")]["x_best"] == 0.5
    assert recs[("window", 1024, "fwd")]["best"] == "flex"
    assert "against flex at 3, sdpa_mask at 1" in variants_sentence(rows)


def test_unavailable_rows_give_an_empty_table_with_the_reason_and_no_ratio(tmp_path):
    from tiledattention.study.presentation.headline import variants_sentence
    from tiledattention.study.presentation.variants_report import variants_figure, variants_table

    rows = [_row("window", 1024, "fwd", m, status="unavailable", reason="no CUDA GPU visible")
            for m in METHOD_NAMES]
    t = variants_table(rows)
    assert t.rows[0][7:] == ["unavailable", "unavailable", None, None, None, None, "none ok",
                             None]
    assert "no speedup over a fused baseline measured (flex unavailable: no CUDA GPU" in \
        variants_sentence(rows)
    assert variants_figure(rows, str(tmp_path))  # written, with the reason in place
    from tiledattention.study.presentation.variants_report import variants_summary

    assert variants_summary(rows).rows == [["window", "fwd", "0/1", None, None,
                                            "≥ 1.5x, min ≥ 1x", None, "not measured", None,
                                            None, "—"]]
    assert variants_table([]).notes == [
        "no variants stage in this study (config variants.enabled: false)."]
    assert variants_sentence([]) == ""


SNAKEMAKE = shutil.which("snakemake") or str(Path(sys.executable).with_name("snakemake"))
needs_snakemake = pytest.mark.skipif(not Path(SNAKEMAKE).exists(),
                                     reason="snakemake not installed (pip install '.[workflow]')")


def _dry_run(tmp_path, variants: str | None = None):
    """A dry run of the smoke study; ``variants``: its variants section replaced (a config
    file on top: --config passes nested values as strings)."""
    files = ["config/smoke.yaml"]
    if variants is not None:
        (tmp_path / "variants.yaml").write_text(f"variants: {variants}\n")
        files.append(str(tmp_path / "variants.yaml"))
    return subprocess.run([SNAKEMAKE, "--nolock", "-n", "-p", "--configfile", *files,
                           "--config", f"results_dir={tmp_path}/out"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


@needs_snakemake
def test_the_stage_is_one_launcher_job_feeding_aggregate_figures_and_manifest(tmp_path):
    out = _dry_run(tmp_path)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-2000:]
    assert re.search(r"^variants\s+1$", text, re.M)
    (job,) = [ln for ln in text.splitlines() if ln.startswith("Shell command: tiledattn "
                                                              "variants ")]
    assert "--variants window softcap --methods tiledattention fa4 flex flex_flash sdpa_mask " \
           "eager --seqs 256" in job and "--launcher local" in job
    assert f"--out {tmp_path}/out/variants" in job
    for verb in ("aggregate", "figures", "manifest"):
        (cmd,) = [ln for ln in text.splitlines() if ln.startswith(f"Shell command: "
                                                                  f"tiledattn {verb} ")]
        assert f"{tmp_path}/out/variants" in cmd, (verb, cmd)


@needs_snakemake
def test_a_study_without_the_stage_plans_no_job_and_passes_no_rows(tmp_path):
    out = _dry_run(tmp_path, "{enabled: false}")
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-2000:]
    assert not re.search(r"^variants\s+\d+$", text, re.M)
    assert "--variants" not in text


@needs_snakemake
def test_a_bad_variants_section_stops_the_study_in_one_line(tmp_path):
    out = _dry_run(tmp_path, "{enabled: true, seqs: [0]}")
    text = out.stdout + out.stderr
    assert out.returncode != 0 and "variants.seqs: 0 must be >= 1" in text, text[-2000:]
    assert len(text.splitlines()) < 15 and "bench_shard" not in out.stdout


def test_geomean_is_the_geometric_mean():
    from tiledattention.study.presentation.variants_report import geomean

    assert math.isclose(geomean([1.0, 4.0]), 2.0) and geomean([]) is None


def test_a_new_fused_variants_baseline_gets_its_column_and_competes(monkeypatch):
    """A registry entry the variants stage runs (here a stand-in for FlexAttention's FLASH
    backend) gets its own × column, and where it is the fastest the table, the summary and
    the headline say so."""
    from tiledattention.bench import methods
    from tiledattention.study.presentation.headline import lines
    from tiledattention.study.presentation.variants_report import variants_summary, variants_table

    monkeypatch.setitem(methods.METHODS, "flex_flash", methods.Method(
        "flex_flash", "FlexAttention, FLASH backend", True, methods.eager_attention))
    rows = _synthetic() + [dict(r, method="flex_flash", time_ms={
        "median_ms": r["time_ms"]["median_ms"] * 0.6}) for r in _synthetic()
        if r["method"] == "tiledattention"]
    t = variants_table(rows)
    assert t.columns[-3:] == ["× flex_flash", "fastest fused", "× fastest"]
    assert [r[-3:] for r in t.rows] == [[0.6, "flex_flash", 0.6]] * 8
    assert variants_summary(rows).rows[0][-3:] == [0.6, 0.6, "flex_flash 2"]
    best = [ln for ln in lines([], rows) if ln.baseline == "fastest fused"]
    assert [(ln.pass_, ln.fastest) for ln in best] == [("fwd", {"flex_flash": 4}),
                                                       ("fwd+bwd", {"flex_flash": 4})]
    assert best[0].kernel.geomean == pytest.approx(0.6)
