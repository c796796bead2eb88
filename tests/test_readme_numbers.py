"""The README's results table: every number is what `tiledattention.study.ratios` computes
from the committed reference rows (results/reference/<system>/data/rows.jsonl.gz)."""

from __future__ import annotations

import functools
import gzip
import json
import re
from pathlib import Path

import pytest

from tiledattention.study.ratios import compare, pass_of

ROOT = Path(__file__).resolve().parent.parent
BASELINES = {"fused SDPA": "torch_sdpa", "forced FlashAttention-2": "flash"}
SCOPES = {"forward, paper grid": ("fwd", False), "forward+backward, paper grid":
          ("fwd+bwd", False), "decode": ("fwd", True)}  # (pass, decode points)
SYSTEMS = ("h100", "h200")  # the table's column pairs, in order


def _table() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Results: the reference study on an H100 and an H200", 1)[1]
    lines = [ln for ln in section.split("\n\n| TiledAttention ÷", 1)[1].splitlines()
             if ln.startswith("| ")]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]


@functools.cache
def _rows(system: str) -> tuple[dict, ...]:
    path = ROOT / "results" / "reference" / system / "data" / "rows.jsonl.gz"
    with gzip.open(path, "rt") as f:
        return tuple(json.loads(line) for line in f if line.strip())


def _numbers(cell: str) -> list[float]:
    return [float(x) for x in re.findall(r"\d+\.\d+", cell)]


def test_the_results_table_has_a_line_per_scope_and_baseline():
    assert len(_table()) == 5


@pytest.mark.parametrize("line", _table(), ids=lambda ln: ln[0][:50])
def test_each_results_number_is_computed_from_the_committed_rows(line):
    what, cells = line[0], line[1:]
    baseline = next(v for k, v in BASELINES.items() if what.startswith(k + ","))
    pass_, decode = next(v for k, v in SCOPES.items() if what.endswith(", " + k))
    for i, system in enumerate(SYSTEMS):
        rows = [r for r in _rows(system) if pass_of(r) == pass_]

        def where(p):
            return (p["seq_q"] != p["seq_kv"]) == decode

        k = compare(rows, "tiledattention", baseline, where)
        c = compare(rows, "tiledattention", baseline, where, "call")
        kernel, call = cells[2 * i], cells[2 * i + 1]
        assert _numbers(kernel) == pytest.approx([k.geomean, k.min], abs=6e-4), (what, system)
        assert f"{k.wins}/{k.n})" in kernel, (what, system, k.wins, k.n)
        assert _numbers(call) == pytest.approx([c.geomean, c.min], abs=6e-4), (what, system)
