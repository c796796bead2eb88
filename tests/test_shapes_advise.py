"""The shapes study (tables, figure) from hand-made rows, and `tiledattn advise`: prediction
from the nearest measured point, refusal outside the measurements, suggestions that keep
H·D, flags from the launch geometry, and one-line exit-2 refusals."""

from __future__ import annotations

import os

import pytest

from tiledattention.cli import main
from tiledattention.study import advice
from tiledattention.study.advice import AdviceError, Shape


def srow(method, d, s, tflops, *, b=2, h=16, waves=1.0, tail=1.0, status="ok"):
    key = f"float16-full-d{d}-sq{s}-skv{s}-b{b}-h{h}-g1"
    flops = 4.0 * b * h * s * s * d
    r = {"point_key": key, "method": method, "status": status, "dtype": "float16",
         "causal": False, "head_dim": d, "seq_q": s, "seq_kv": s, "batch": b, "heads": h,
         "gqa": 1, "flops": flops}
    if status == "ok":
        r.update(tflops=tflops, time_ms={"median_ms": flops / tflops / 1e9, "p95_ms": 1.0})
    if method == "tiledattention":
        r["geometry"] = {"programs": 100, "per_sm": 2, "waves": waves, "tail_efficiency": tail,
                         "head_dim_pad_fraction": 0.0, "seq_q_pad_fraction": 0.0,
                         "seq_kv_pad_fraction": 0.0}
        r["details"] = {"schedule": "64x128_o2_c1_lk2_lv4"}
    return r


SHAPE_ROWS = [srow("tiledattention", 128, 1024, 400.0), srow("torch_sdpa", 128, 1024, 500.0),
              srow("tiledattention", 80, 1024, 200.0), srow("torch_sdpa", 80, 1024, 300.0),
              srow("tiledattention", 128, 1088, 300.0, waves=1.03, tail=0.03),
              srow("torch_sdpa", 128, 1088, 250.0),
              srow("tiledattention", 64, 1024, 350.0), srow("torch_sdpa", 64, 1024, 360.0)]


def test_shapes_table_lists_geometry_and_the_ratio_to_sdpa():
    from tiledattention.study.shapes import shapes_table

    t = shapes_table(SHAPE_ROWS)
    assert len(t.rows) == 4
    first = dict(zip(t.columns, t.rows[0]))
    assert first["÷ SDPA"] == pytest.approx(0.8) and first["waves"] == 1.0


def test_shapes_cost_compares_unaligned_shapes_with_their_aligned_neighbour():
    from tiledattention.study.shapes import shapes_cost_table

    t = shapes_cost_table(SHAPE_ROWS)
    cells = {(r[6], r[2], r[3]): dict(zip(t.columns, r)) for r in t.rows}
    d80 = cells[("D", 80, 1024)]  # D=80 against D=128 (next multiple of 64), same S
    assert d80["aligned"] == 128
    assert d80["tiledattention TFLOP/s ratio"] == pytest.approx(0.5)
    assert d80["torch_sdpa TFLOP/s ratio"] == pytest.approx(0.6)
    s1088 = cells[("S", 128, 1088)]  # 1088 against 1024 (1152 not measured)
    assert s1088["aligned"] == 1024
    assert s1088["tiledattention TFLOP/s ratio"] == pytest.approx(0.75)
    assert ("D", 64, 1024) not in cells  # aligned shapes have no row


def test_shapes_tables_and_figure_say_why_when_there_is_no_shapes_grid(tmp_path):
    from tiledattention.study.shapes import shapes_cost_table, shapes_figure, shapes_table

    assert not shapes_table([]).rows and "no shapes grid" in shapes_table([]).notes[0]
    assert "no shapes grid" in shapes_cost_table([]).notes[0]
    for rows, sub in ((SHAPE_ROWS, "full"), ([], "empty")):
        paths = shapes_figure(rows, str(tmp_path / sub))
        assert [os.path.basename(p) for p in paths] == ["shapes.png", "shapes.pdf"]
        assert all(os.path.getsize(p) > 5000 for p in paths)


def point(d, s, b, h, ours, sdpa, source="shapes"):
    return {"source": source, "dtype": "float16", "causal": False, "head_dim": d, "seq": s,
            "batch": b, "heads": h, "tiledattention": ours, "torch_sdpa": sdpa}


DATA = {"format": advice.FORMAT, "gpu": "NVIDIA H100 80GB HBM3", "sms": 132,
        "compute_capability": "9.0", "sources": {"t": "test table"},
        "points": [point(128, 4096, 4, 16, 600.0, 640.0, "reference"),
                   point(128, 1024, 2, 16, 400.0, 450.0),
                   point(64, 4096, 4, 32, 450.0, 480.0, "reference"),
                   point(256, 4096, 2, 16, 650.0, 700.0)]}


def test_prediction_is_the_nearest_measured_point_and_says_how_near():
    text = advice.advise(Shape(32, 128, 4096, 2), data=DATA)
    assert "nearest measured point, D=128 S=4096 B=4 H=16 [reference]" in text
    assert "tiledattention 600.0 TFLOP/s, torch_sdpa 640.0 TFLOP/s" in text
    assert "B·H 64 vs 64" not in text and "D same, S same, B·H same" in text
    assert "test table" in text and "NVIDIA H100 80GB HBM3" in text


def test_shapes_outside_the_measurements_are_refused_not_guessed():
    for shape in (Shape(16, 128, 16384, 4), Shape(16, 200, 4096, 4),
                  Shape(16, 128, 4096, 4, causal=True), Shape(256, 128, 4096, 4)):
        with pytest.raises(AdviceError, match="not guessing"):
            advice.advise(shape, data=DATA)


def test_suggestions_keep_hidden_size_and_list_only_faster_measured_shapes():
    text = advice.advise(Shape(32, 128, 4096, 2), data=DATA)
    tail = text.split("same hidden size H·D = 4096")[1]
    # D=256 (H=16) measured faster; D=64 (H=64) measured slower and is not suggested.
    assert "H=16 D=256: tiledattention 650.0 vs 600.0 TFLOP/s, +8.3%" in tail
    assert "D=64" not in tail
    for line in tail.splitlines()[1:]:
        h, d = (int(x.split("=")[1]) for x in line.split(":")[0].split())
        assert h * d == 32 * 128


def test_wave_and_head_dim_quantization_are_flagged_from_the_geometry():
    # S=1088 on the shipped table's schedule for D=64 S<=2048 (128x64 occupancy 2, 8
    # worker warps): 288 programs on 264 slots, the second wave 9% full.
    text = advice.advise(Shape(16, 64, 1088, 2))
    assert "wave quantization: 288 programs on 264 slots = 1.09 waves" in text
    text = advice.advise(Shape(20, 80, 2048, 2))
    assert "head dim 80 is not a multiple of 64: split 64+16, no padding" in text


def test_the_shipped_measurements_hold_the_reference_study_and_the_shapes_grids():
    data = advice.load("h100")
    sources = {p["source"] for p in data["points"]}
    assert sources == {"reference", "shapes"} and data["sms"] == 132
    assert sum(p["source"] == "reference" for p in data["points"]) == 80


@pytest.mark.parametrize("argv", [
    ["advise", "--heads", "32", "--head-dim", "128", "--seq", "100000"],
    ["advise", "--heads", "32", "--head-dim", "100", "--seq", "4096"],
    ["advise", "--heads", "0", "--head-dim", "128", "--seq", "4096"],
    ["advise", "--heads", "32", "--head-dim", "128", "--seq", "4096", "--gpu", "b200"],
])
def test_bad_or_unmeasured_input_exits_2_with_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(argv))
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("tiledattn advise") and len(err.strip().splitlines()) == 1
