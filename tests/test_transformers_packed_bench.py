"""benchmarks/transformers_packed.py on the CPU: the stated length distribution and the
one-line refusal of bad arguments (the timing itself needs a GPU)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location(
        "transformers_packed_bench", ROOT / "benchmarks/transformers_packed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_lengths_sum_to_the_tokens_within_the_clip_and_repeat_by_seed():
    bench = _script()
    got = bench.lengths(16384, 512, 1.0, 16, 4096, seed=0)
    assert sum(got) == 16384 and len(got) > 4
    assert all(16 <= n <= 4096 for n in got[:-1]) and 1 <= got[-1] <= 4096
    assert got == bench.lengths(16384, 512, 1.0, 16, 4096, seed=0)
    assert got != bench.lengths(16384, 512, 1.0, 16, 4096, seed=1)


@pytest.mark.parametrize("argv", [["--max-len", "9000"], ["--tokens", "0"],
                                  ["--median", "0"]])
def test_bad_arguments_exit_2_with_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        _script().main(argv)
    assert exc.value.code == 2
    assert len(capsys.readouterr().err.strip().splitlines()[-1]) > 0
