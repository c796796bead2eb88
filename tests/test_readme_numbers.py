"""The README's "since the reference study" table: each line names its rows file, and its
numbers are what `tiledattention.study.ratios` computes from that file."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest

from tiledattention.study.ratios import compare

ROOT = Path(__file__).resolve().parent.parent
BASELINE = {"fused SDPA": ["torch_sdpa"],
            "forced cuDNN / FlashAttention-2": ["cudnn", "flash"],
            "forced FlashAttention-2": ["flash"]}


def _since_table() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("### Since the reference study", 1)[1].split("\n\n", 2)[1]
    lines = [ln for ln in section.splitlines() if ln.startswith("| ")][1:]
    return [[c.strip() for c in ln.strip("|").split("|")] for ln in lines]


def _numbers(cell: str) -> list[float]:
    return [float(x) for x in re.findall(r"\d+\.\d+", cell)]


def _rows(name: str) -> list[dict]:
    with gzip.open(ROOT / "benchmarks" / "results" / name, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.mark.parametrize("line", _since_table(), ids=lambda ln: ln[0][:40])
def test_each_since_number_is_computed_from_the_rows_file_it_names(line):
    what, kernel, call, rows_file, _ = line
    rows = _rows(rows_file.strip("`"))
    baselines = next(v for k, v in BASELINE.items() if what.endswith(f"÷ {k}")
                     or f"÷ {k}," in what)
    want_kernel, want_call = _numbers(kernel), _numbers(call)
    got_kernel, got_call = [], []
    for b in baselines:
        k, c = compare(rows, "tiledattention", b), compare(rows, "tiledattention", b,
                                                           measure="call")
        got_kernel.append(k.geomean)
        got_call.append(c.geomean)
        if len(baselines) == 1:
            got_kernel.append(k.min)
            got_call.append(c.min)
            assert f"{k.wins}/{k.n}" in kernel, (kernel, k.wins, k.n)
    assert want_kernel == pytest.approx(got_kernel, abs=6e-4), what
    assert want_call == pytest.approx(got_call, abs=6e-4), what
