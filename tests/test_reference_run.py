"""What the reference runs need besides the study: the two-system table (`tiledattn
systems`), the bundle's words where no repository URL is known, `tiledattn precompile`'s
refusal without a GPU, and scripts/device-study.sh's refusals of bad arguments."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch

from tiledattention.cli import main
from tiledattention.errors import StudyError
from tiledattention.study.publication import prose
from tiledattention.study.references import reproduce

ROOT = Path(__file__).resolve().parent.parent


def _row(point, method, ms, pass_="fwd", status="ok"):
    d, s = point
    return {"point_key": f"float16-full-d{d}-s{s}-{pass_}", "method": method, "status": status,
            "dtype": "float16", "causal": False, "head_dim": d, "seq_q": s, "seq_kv": s,
            "batch": 2, "heads": 16, "gqa": 1, "pass": pass_,
            "time_ms": {"median_ms": ms}}


def _study(tmp_path, name, rows):
    path = tmp_path / f"{name}.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_systems_table_sets_each_systems_time_and_ratio_side_by_side(tmp_path):
    # h100: ours 2 ms and 1 ms, SDPA 2 ms and 2 ms; h200: ours 1 ms and 0.5 ms, SDPA 1 and 1.
    h100 = _study(tmp_path, "h100", [_row((64, 512), "tiledattention", 2.0),
                                     _row((64, 512), "torch_sdpa", 2.0),
                                     _row((128, 512), "tiledattention", 1.0),
                                     _row((128, 512), "torch_sdpa", 2.0),
                                     _row((64, 512), "tiledattention", 8.0, "fwd+bwd")])
    h200 = _study(tmp_path, "h200", [_row((64, 512), "tiledattention", 1.0),
                                     _row((64, 512), "torch_sdpa", 1.0),
                                     _row((128, 512), "tiledattention", 0.5),
                                     _row((128, 512), "torch_sdpa", 1.0),
                                     _row((64, 512), "tiledattention", 1.0, "fwd+bwd",
                                          status="oom")])
    out = tmp_path / "two"
    assert main(["systems", h100, h200, "--names", "H100", "H200", "--out", str(out)]) == 0
    lines = (out / "systems.csv").read_text().splitlines()
    assert lines[0] == ("pass,point,H100 ms,H100 % peak @ clock,H100 ratio to SDPA,H200 ms,"
                        "H200 % peak @ clock,H200 ratio to SDPA,H200 ÷ H100 time")
    # geomeans first: fwd over both points (ratios 1 and 2 -> 1.414; time ratio 0.5); no
    # clock in these rows: the % peak @ clock cells are empty, the geomeans still there
    fwd = lines[1].split(",")
    assert fwd[:2] == ["fwd", "geomean over 2 points"] and fwd[3] == fwd[6] == ""
    assert float(fwd[4]) == pytest.approx(1.414, abs=1e-3) and float(fwd[8]) == 0.5
    # a pass measured on one system only: its geomean covers no point, its row stays
    bwd = lines[2].split(",")
    assert bwd[:2] == ["fwd+bwd", "geomean over 0 points"] and bwd[2] == ""
    assert any(ln.startswith("fwd+bwd,float16 full D64 S512 B2 H16,8.0,,,,,,") for ln in lines)
    md = (out / "systems.md").read_text()
    assert "Systems: H100 (unknown); H200 (unknown)." in md  # rows files name no GPU
    assert ("| fwd | geomean over 2 points | 1.4142 | — | 1.414 | 0.7071 | — | 1.414 | 0.5 |"
            in md)
    assert "H100, H200: % peak @ clock: " in md and "no data-sheet peak listed for unknown" in md


def _clocked(rows, mhz):
    """The rows with the SM clock they ran at, and the FLOP that puts ours at 50 % of the
    H100's peak at 1000 MHz when the time is 1 ms (132 SMs x 1e9 Hz x 4096 FLOP per cycle)."""
    for r in rows:
        r.update(sm_clock_mhz=mhz, flops=132 * 1e9 * 4096 * 1e-3 * 0.5)
    return rows


def test_systems_table_gives_each_systems_peak_at_clock_without_blanking_the_geomeans():
    from tiledattention.study.references.systems import geomeans, side_by_side

    h100 = _clocked([_row((64, 512), "tiledattention", 1.0), _row((64, 512), "torch_sdpa", 1.0),
                     _row((128, 512), "tiledattention", 2.0),
                     _row((128, 512), "torch_sdpa", 2.0)], 1000.0)
    h200 = [_row((64, 512), "tiledattention", 0.5), _row((64, 512), "torch_sdpa", 1.0),
            _row((128, 512), "tiledattention", 1.0), _row((128, 512), "torch_sdpa", 2.0)]
    columns, rows = side_by_side([("H100", h100), ("H200", h200)],
                                 ["NVIDIA H100 80GB HBM3", "NVIDIA H200"])
    at = columns.index("H100 % peak @ clock")
    assert [r[at] for r in rows] == [50.0, 25.0]  # twice the time at one FLOP count: half
    assert [r[columns.index("H200 % peak @ clock")] for r in rows] == [None, None]  # no clock
    (mean,) = geomeans(columns, rows)
    assert mean[1] == "geomean over 2 points"  # the H200's missing clock blanks no point
    assert mean[at] == pytest.approx(35.4, abs=0.05)  # sqrt(50 x 25)
    assert mean[columns.index("H200 % peak @ clock")] is None
    assert mean[columns.index("H200 ratio to SDPA")] == 2.0


@pytest.mark.parametrize("args,words", [
    (["only-one.jsonl"], "name two or more studies"),
    (["a.jsonl", "b.jsonl", "--names", "x"], "1 name(s) for 2 studies"),
])
def test_systems_refuses_bad_input_in_one_line(tmp_path, capsys, args, words):
    for a in args:
        if a.endswith(".jsonl"):
            _study(tmp_path, a[:-6], [_row((64, 512), "tiledattention", 1.0)])
    args = [str(tmp_path / a) if a.endswith(".jsonl") else a for a in args]
    assert main(["systems", *args, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]


def test_the_readme_installs_the_bundles_own_wheel_with_the_gpu_extra_on_a_gpu():
    wheel = "source/tiledattention-0.1.0+gabc-py3-none-any.whl"
    gpu = prose.install_lines({"gpu": {"name": "NVIDIA H100 80GB HBM3"}}, wheel)
    assert gpu == [f'python -m pip install "{wheel}[gpu,workflow]"   # this run\'s package, '
                   "from this bundle"]
    cpu = prose.install_lines({"gpu": None}, wheel)
    assert "--index-url https://download.pytorch.org/whl/cpu" in cpu[0]  # no CUDA torch
    assert cpu[1].startswith(f'python -m pip install "{wheel}[workflow]"')
    assert "publication.repository" in prose.NO_REPOSITORY


def test_reproduce_from_a_checkout_without_a_repository_url_says_so(tmp_path):
    rec = reproduce.Recorded(b"", b"", "abc123", None, "0.1.0", None)
    with pytest.raises(StudyError, match="records no repository URL .*publication.repository"
                       ".*--source snapshot"):
        reproduce._checkout(rec, str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()  # nothing cloned, nothing written


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is visible: precompile runs")
def test_precompile_without_a_gpu_is_one_line_exit_2(tmp_path, capsys):
    cfg = tmp_path / "bench.yaml"
    cfg.write_text("grid: {seqs: [64], head_dims: [64], dtypes: [bfloat16], causal: [false],"
                   " shape_policy: explicit}\nmethods: [tiledattention, torch_sdpa]\n")
    assert main(["precompile", "--config", str(cfg)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no CUDA GPU visible" in err[0]


def test_precompile_takes_each_point_once_with_its_tiledattention_methods(tmp_path):
    from tiledattention.bench.precompile import _items

    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    grid = ("grid: {seqs: [64, 128], head_dims: [64], dtypes: [bfloat16], causal: [false], "
            "shape_policy: explicit}\n")
    a.write_text(grid + "methods: [tiledattention, torch_sdpa]\n")
    b.write_text(grid + "methods: [tiledattention@64x64_o1_c1_lk2_lv4, torch_sdpa]\n")
    items = _items([str(a), str(b)])
    assert len(items) == 2  # two points, each once
    assert all(m == ("tiledattention", "tiledattention@64x64_o1_c1_lk2_lv4")
               for _, m, _ in items)


def _device_script(name: str, args: list[str]) -> subprocess.CompletedProcess:
    """scripts/NAME.sh with ARGS, in a bare environment (no kit, no GPU tools on PATH)."""
    return subprocess.run(["bash", f"scripts/{name}.sh", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "OUT": f"/tmp/{name}-test"})


@pytest.mark.parametrize("args,words", [(["config/nope.yaml"], "no config config/nope.yaml"),
                                        (["config/smoke.yaml", "soon"], "BUDGET_S must be"),
                                        (["--reproduce", "results/nope"],
                                         "no bundle results/nope")])
def test_device_study_refuses_bad_arguments_in_one_line(args, words):
    out = _device_script("device-study", args)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        next(ln for ln in out.stderr.splitlines() if words in ln)]


@pytest.mark.parametrize("args,words", [(["config/scaling.yaml"], "name one or more GPU counts"),
                                        (["config/scaling.yaml", "1", "two"],
                                         "GPU counts are positive integers, got two")])
def test_device_scaling_refuses_bad_counts_in_one_line(args, words):
    out = _device_script("device-scaling", args)
    assert out.returncode == 2 and out.stderr.strip().splitlines() == [
        f"device-scaling: {words}"]
