"""What a reader sees in the study's figures: an empty panel says "no data" and why ("no
GPU" where that is the reason), baselines_d128 is about D=128, every measured S is a
labelled tick, legends sit outside the panels, and torch_sdpa stays visible on cudnn."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from tiledattention.study.presentation import figures, plotting  # noqa: E402

GPU_REASON = "needs a CUDA GPU"


def row(method, d, s, ms, *, status="ok", dtype="float16", causal=False):
    key = f"{dtype}-{'causal' if causal else 'full'}-d{d}-sq{s}-skv{s}-b1-h8-g1"
    r = {"point_key": key, "method": method, "status": status, "dtype": dtype,
         "causal": causal, "head_dim": d, "seq_q": s, "seq_kv": s, "batch": 1, "heads": 8,
         "gqa": 1}
    if status == "ok":
        flops = 4 * 8 * s * s * d
        r.update(time_ms={"median_ms": ms, "p95_ms": ms * 1.1}, flops=flops,
                 tflops=flops / (ms * 1e-3) / 1e12, gbytes_per_s=1.0)
    else:
        r["reason"] = GPU_REASON
    return r


# A GPU run: cudnn and torch_sdpa (which dispatched to cuDNN) with identical times.
GPU = [row(m, d, s, ms * s / 512) for d in (64, 128) for s in (64, 200, 512)
       for m, ms in (("tiledattention", 1.0), ("torch_sdpa", 0.9), ("cudnn", 0.9),
                     ("math", 5.0))]
# A CPU smoke run: eager ran, the GPU methods are unavailable; D=64 only.
CPU = [row("eager", 64, s, 1.0) for s in (64, 200)] + [
    row(m, 64, s, 0, status="unavailable") for m in ("tiledattention", "torch_sdpa")
    for s in (64, 200)]


@pytest.fixture
def drawn(monkeypatch):
    """The figures as drawn (rendered, not saved), by name."""
    figs = {}

    def save(fig, out_dir, name):
        fig.canvas.draw()
        figs[name] = fig
        return [name]

    monkeypatch.setattr(figures, "_save", save)
    yield figs
    import matplotlib.pyplot as plt

    plt.close("all")


def texts(ax) -> str:
    """The panel's text, unwrapped."""
    return " ".join(" ".join(t.get_text().split()) for t in ax.texts)


def test_a_study_that_did_not_tune_gets_no_tuning_panel_but_says_why(drawn, tmp_path):
    ladder = [row("tiledattention@64x64_o1_c1_lk2_lv4_natural", 64, 128, 0,
                  status="unavailable"), row("tiledattention", 64, 128, 0, status="unavailable")]
    figures.tile_sensitivity(ladder, [], str(tmp_path),
                             tune_reason="no CUDA GPU visible on node1")
    fig = drawn["tile_sensitivity"]
    (ladder_ax,) = [a for a in fig.axes if a.get_visible()]  # no empty tuning panel
    assert "no data (no GPU)" in texts(ladder_ax) and GPU_REASON in texts(ladder_ax)
    assert not ladder_ax.patches  # no zero-height bars pretending to be data
    assert "tuning did not run: no CUDA GPU visible on node1" in " ".join(
        fig._suptitle.get_text().split())
    figures.tile_sensitivity([], [], str(tmp_path))
    assert "no schedule ladder" in texts(drawn["tile_sensitivity"].axes[0])


def test_a_panel_without_gpu_rows_says_no_gpu(drawn, tmp_path):
    figures.ratios_vs_seq(CPU, str(tmp_path))
    (ax,) = [a for a in drawn["ratios_vs_seq_fwd"].axes if a.get_visible()]
    assert "no data (no GPU)" in texts(ax) and GPU_REASON in texts(ax)
    figures.throughput_vs_seq(CPU, str(tmp_path))
    assert "no data" not in texts(drawn["throughput_fwd_d64"].axes[0])  # eager ran


def test_baselines_d128_is_about_d128_and_says_so_without_d128(drawn, tmp_path):
    figures.baselines_at_d128(CPU, str(tmp_path))
    fig = drawn["baselines_d128_fwd"]
    assert fig._suptitle.get_text() == "no GPU recorded: forward, every baseline at D=128"
    assert "no D=128 points in this study (D measured: [64])" in texts(fig.axes[0])
    assert not fig.axes[0].lines
    figures.baselines_at_d128(GPU, str(tmp_path))
    fig = drawn["baselines_d128_fwd"]
    assert fig._suptitle.get_text().endswith("every baseline at D=128") and fig.axes[0].lines


def test_every_measured_seq_is_a_labelled_tick(drawn, tmp_path):
    figures.throughput_vs_seq(GPU, str(tmp_path))
    figures.baselines_at_d128(GPU, str(tmp_path))
    for name in ("throughput_fwd_d64", "baselines_d128_fwd"):
        ax = drawn[name].axes[0]
        labels = [t.get_text() for t in ax.get_xticklabels()]
        assert labels == ["64", "200", "512"], (name, labels)
        assert not ax.xaxis.get_minorticklocs().size


def test_legends_sit_below_the_panels_not_over_data(drawn, tmp_path):
    figures.throughput_vs_seq(GPU, str(tmp_path))
    figures.baselines_at_d128(GPU, str(tmp_path))
    figures.ratios_vs_seq(GPU, str(tmp_path))
    for name, fig in drawn.items():
        assert len(fig.legends) == 1, name
        box = fig.legends[0].get_window_extent()
        for ax in fig.axes:
            assert ax.get_legend() is None, name
            assert not box.overlaps(ax.get_window_extent()), name


def test_torch_sdpa_is_not_hidden_under_cudnn(drawn, tmp_path):
    figures.baselines_at_d128(GPU, str(tmp_path))
    lines = {ln.get_label(): ln for ln in drawn["baselines_d128_fwd"].axes[0].lines}
    sdpa, cudnn = lines["torch_sdpa"], lines["cudnn"]
    assert list(sdpa.get_ydata()) == list(cudnn.get_ydata())  # the same numbers ...
    assert sdpa.get_marker() != cudnn.get_marker()  # ... drawn distinctly
    assert sdpa.get_linestyle() != cudnn.get_linestyle()
    assert sdpa.get_markerfacecolor() == "none"  # hollow: cudnn's crosses show through
    assert sdpa.get_zorder() > cudnn.get_zorder()


def test_figures_cli_passes_on_why_the_tuning_table_is_empty(drawn, tmp_path):
    import json

    from tiledattention.cli import main

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps(r) + "\n" for r in CPU))
    table = tmp_path / "table.json"
    table.write_text(json.dumps({"format": "tiledattention-schedule-table/1", "entries": [],
                                 "meta": {
        "unavailable": "no CUDA GPU visible on node7"}}))
    assert main(["figures", "--rows", str(rows), "--out", str(tmp_path / "f"),
                 "--tune-table", str(table)]) == 0
    (ax,) = [a for a in drawn["tile_sensitivity"].axes if a.get_visible()]
    assert "tuning did not run: no CUDA GPU visible on node7" in texts(ax)


def test_the_ratio_figures_take_the_fastest_fused_baseline_and_name_it(drawn, tmp_path):
    """At D=128 flash is faster than cuDNN: the regime map's cells and ratios vs S compare
    with it there (and with cuDNN at D=64); math (unfused) never counts."""
    rows = GPU + [row("flash", 128, s, 0.5 * s / 512) for s in (64, 200, 512)]
    figures.regime_map(rows, str(tmp_path))
    fig = drawn["regime_map_fwd"]
    assert "fastest fused baseline" in fig._suptitle.get_text()
    cells = [t.get_text() for t in fig.axes[0].texts]
    assert "0.500\nflash" in cells  # 0.5 ms ÷ 1.0 ms at D=128
    assert "0.900\ntorch_sdpa=cudnn" in cells  # a tie at D=64 names both
    figures.ratios_vs_seq(rows, str(tmp_path))
    fig = drawn["ratios_vs_seq_fwd"]
    assert "the fastest fused baseline" in fig._suptitle.get_text()
    d128 = next(ln for ln in fig.axes[0].lines if ln.get_label() == "D=128 kernel time")
    assert list(d128.get_ydata()) == pytest.approx([0.5] * 3)


# The CPU smoke study as it runs: torch_sdpa ran (PyTorch's math backend), eager and math
# ran, TiledAttention and the other fused baselines are unavailable.
SMOKE = [dict(r, device="cpu") for r in
         [row(m, 64, s, 1.0) for m in ("torch_sdpa", "eager", "math") for s in (64, 200)]
         + [row(m, 64, s, 0, status="unavailable") for m in ("tiledattention", "cudnn")
            for s in (64, 200)]]


def test_an_empty_panel_says_truthfully_why_never_no_ok_rows_beside_ok_ones(drawn, tmp_path):
    for figure, name in ((figures.regime_map, "regime_map_fwd"),
                         (figures.ratios_vs_seq, "ratios_vs_seq_fwd")):
        figure(SMOKE, str(tmp_path))
        (ax,) = [a for a in drawn[name].axes if a.get_visible() and a.texts]
        text = texts(ax)
        assert "no point where tiledattention and a fused baseline were both ok" in text
        assert "no ok rows" not in text  # torch_sdpa's rows were ok
        assert f"unavailable: tiledattention 2, cudnn 2 ({GPU_REASON})" in text
        assert "ok: torch_sdpa 2" in text
        assert "ok but not plotted here: eager, math" in text and "(a CPU run)" in text
    # where no row of the panel is ok, "no ok rows" is what it says
    figures.ratios_vs_seq(CPU, str(tmp_path))
    (ax,) = [a for a in drawn["ratios_vs_seq_fwd"].axes if a.get_visible() and a.texts]
    assert "no ok rows; unavailable: tiledattention 2, torch_sdpa 2" in texts(ax)
    assert "ok but not plotted here: eager" in texts(ax)


def test_every_count_an_empty_panel_states_is_the_rows(tmp_path):
    import re

    text = plotting.no_pair(SMOKE, lambda r: True)
    stated = {m: int(n) for m, n in re.findall(r"(\w+) (\d+)", text)}
    for method, n in stated.items():
        assert n == sum(r["method"] == method for r in SMOKE), (method, text)


def test_a_figure_with_nothing_drawn_is_listed_beside_the_figures_and_dropped_once_drawn(
        tmp_path):
    """The workflow needs every figure's file, so an empty one is written; not-drawn.json
    names it with why, for the bundle to leave it out and say so."""
    import json

    out = tmp_path / "figures"
    figures.ratios_vs_seq(CPU, str(out))
    listed = json.loads((out / plotting.NOT_DRAWN).read_text())
    assert list(listed) == ["ratios_vs_seq_fwd"] and GPU_REASON in listed["ratios_vs_seq_fwd"]
    figures.ratios_vs_seq(GPU, str(out))  # the same figure, drawn this time
    assert json.loads((out / plotting.NOT_DRAWN).read_text()) == {}
    figures.throughput_vs_seq(CPU, str(out))  # eager ran: drawn, never listed
    assert json.loads((out / plotting.NOT_DRAWN).read_text()) == {}


def test_the_peaks_come_from_one_table_and_never_for_a_part_it_does_not_list():
    from tiledattention.study.presentation.hardware import peak_of

    assert peak_of("NVIDIA H100 80GB HBM3").hbm_tbs == 3.35
    assert peak_of("NVIDIA H200").hbm_tbs == 4.8
    assert peak_of("NVIDIA H200").dense_tflops == peak_of("NVIDIA H100 80GB HBM3").dense_tflops
    for other in ("NVIDIA H200 NVL", "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-80GB", None):
        assert peak_of(other) is None, other
