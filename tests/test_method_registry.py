"""The study side reads what it needs of a method from the registry (bench/methods.py): a
baseline added there reaches the headline, the figures' colours, the profiles and the
workflow schema's profile enum without an edit under study/."""

from __future__ import annotations

import dataclasses

import yaml

from tiledattention.bench import methods
from tiledattention.stages import profile
from tiledattention.study.presentation import plotting, tables


def _rows(method: str) -> list[dict]:
    rows = []
    for m, t in (("tiledattention", 1.0), (method, 2.0)):
        rows.append({"point_key": "p", "method": m, "status": "ok", "head_dim": 64,
                     "seq_q": 512, "dtype": "float16", "causal": False,
                     "time_ms": {"median_ms": t}, "call_us": 1000 * t})
    return rows


def _with_new_method(monkeypatch):
    new = dataclasses.replace(methods.METHODS["math"], name="new_baseline", color="#123456",
                              kernel_filter="regex:new_kernel", headline="a new baseline")
    monkeypatch.setitem(methods.METHODS, "new_baseline", new)


def test_a_method_added_to_the_registry_reaches_the_headline(monkeypatch):
    _with_new_method(monkeypatch)
    t = tables.headline(_rows("new_baseline"))
    row = next(r for r in t.rows if r[0] == "a new baseline")
    assert row[1] == 1 and row[3] == 2.0  # one point, kernel geomean 2x


def test_a_method_added_to_the_registry_reaches_figures_and_profiles(monkeypatch):
    _with_new_method(monkeypatch)
    assert plotting.color("new_baseline") == "#123456"
    assert profile.kernel_filters()["new_baseline"] == "regex:new_kernel"


def test_the_schema_profile_enum_is_the_registry_profilable_methods():
    from tiledattention.stages import study_schema

    with open("workflow/schemas/config.schema.yaml") as f:
        schema = study_schema(yaml.safe_load(f))
    enum = schema["properties"]["profile"]["properties"]["methods"]["items"]["enum"]
    assert enum == methods.profilable()


def test_headline_rows_follow_the_registry_order():
    rows = _rows("torch_sdpa") + [dict(r, method="eager") for r in _rows("x")[1:]]
    labels = [r[0] for r in tables.headline(rows).rows]
    assert labels[0] == "fastest fused baseline, all points"  # then the registry's, in order
    labels = [lb for lb in labels if not lb.startswith("fastest fused")]
    assert labels[0] == methods.METHODS["torch_sdpa"].headline
    assert labels[-1] == methods.METHODS["eager"].headline
