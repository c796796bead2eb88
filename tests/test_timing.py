"""The one FLOP model and the timing statistics."""

import pytest

from tiledattention.flops import attention_flops, tflops_per_s
from tiledattention.timing import summarize


def test_flop_model_is_4bhsqskvd_halved_when_causal():
    assert attention_flops(2, 3, 5, 7, 64, False) == 4 * 2 * 3 * 5 * 7 * 64
    assert attention_flops(2, 3, 5, 7, 64, True) == 2 * 2 * 3 * 5 * 7 * 64
    assert tflops_per_s(1e12, 1000.0) == pytest.approx(1.0)


def test_summary_statistics():
    st = summarize([float(x) for x in range(1, 101)])
    assert st.median_ms == 50.5 and st.min_ms == 1.0 and st.reps == 100
    assert st.p95_ms == 95.0 and st.mean_ms == 50.5
