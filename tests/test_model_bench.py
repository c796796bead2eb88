"""The end-to-end model benchmark as study rows: where it cannot run its rows say why,
the model_e2e table reads ratios to transformers' sdpa from the rows, and the CLI refuses
a bad section in one line."""

from __future__ import annotations

import json

import pytest

from tiledattention.bench.config import ConfigError
from tiledattention.cli import main
from tiledattention.stages import model as model_bench
from tiledattention.stages.model import model_from_dict
from tiledattention.study.presentation.tables import NAMES, model_e2e

CFG = model_from_dict({"enabled": True, "batches": [1, 8], "prompt": 16, "steps": 2,
                       "reps": 1})


def test_without_a_gpu_every_row_is_unavailable_with_the_reason(tmp_path, monkeypatch):
    monkeypatch.setattr("tiledattention.bench.runner.no_gpu_reason",
                        lambda: "no CUDA GPU visible on x")
    result = model_bench.run_model(CFG, str(tmp_path))
    assert result["status"] == "unavailable"
    rows = model_bench.load_rows(str(tmp_path))
    # batches x (3 eager phases x 4 implementations + 2 compiled phases x 2)
    assert len(rows) == 2 * (3 * 4 + 2 * 2)
    assert {r["status"] for r in rows} == {"unavailable"}
    assert {r["reason"] for r in rows} == {"no CUDA GPU visible on x"}
    assert {r["config_hash"] for r in rows} == {CFG.digest()}
    assert len({r["point_key"] for r in rows}) == 2 * 5
    assert {(r["phase"], r["compiled"]) for r in rows} == {
        ("prefill", False), ("decode", False), ("train", False), ("prefill_compiled", True),
        ("train_compiled", True)}
    manifest = json.loads((tmp_path / "manifest-model.json").read_text())
    assert manifest["config"]["batches"] == [1, 8] and manifest["torch"]


def test_transformers_missing_is_recorded_as_unavailable(monkeypatch):
    import builtins

    real = builtins.__import__

    def no_transformers(name, *args, **kwargs):
        if name == "transformers":
            raise ImportError("no transformers")
        return real(name, *args, **kwargs)

    monkeypatch.setattr("tiledattention.bench.runner.no_gpu_reason", lambda: None)
    monkeypatch.setattr(builtins, "__import__", no_transformers)
    rows = model_bench.measure_model(CFG)
    assert {r["reason"] for r in rows} == {
        "transformers is not installed (pip install 'tiledattention[hf]')"}


def _ok(batch, phase, method, tps):
    return {"batch": batch, "phase": phase, "method": method, "status": "ok",
            "tokens_per_s": tps, "prompt": 16, "steps": 2, "reps": 3}


def test_model_table_gives_tokens_per_second_and_the_ratio_to_sdpa():
    rows = [_ok(1, "decode", "tiledattention", 90.0), _ok(1, "decode", "sdpa", 100.0),
            _ok(1, "prefill", "tiledattention", 300.0), _ok(1, "prefill", "sdpa", 200.0),
            {**_ok(1, "decode", "eager", 0), "status": "error", "reason": "boom"}]
    t = model_e2e(rows)
    assert "model_e2e" in NAMES
    cells = {(r[0], r[1], r[2]): r for r in t.rows}
    assert cells[1, "decode", "tiledattention"][4] == pytest.approx(0.9)
    assert cells[1, "prefill", "tiledattention"][4] == pytest.approx(1.5)
    assert cells[1, "decode", "eager"][3:6] == [None, None, "error: boom"]
    # against the fastest fused implementation at that batch and phase, named (sdpa here;
    # eager and ours never count)
    assert cells[1, "prefill", "tiledattention"][6:] == [pytest.approx(1.5), "sdpa"]
    assert cells[1, "decode", "sdpa"][6:] == [1.0, "sdpa"]
    assert [r[1] for r in t.rows[:2]] == ["prefill", "prefill"]  # prefill before decode


def test_an_empty_study_says_the_model_stage_was_off():
    assert "model.enabled: false" in model_e2e([]).to_markdown()


def test_cli_refuses_a_bad_model_option_in_one_line(tmp_path, capsys):
    assert main(["model", "--out", str(tmp_path), "--prompt", "9000"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["tiledattn model: model.prompt: 9000 must be <= 7168"]
    assert not (tmp_path / "rows.jsonl").exists()


def test_an_implementation_that_fails_is_recorded_and_the_others_are_measured(monkeypatch):
    """The GPU parts replaced by stand-ins on the CPU: eager runs out of memory in its B8
    prefill, and our compiled training step fails to compile; only those rows say so."""
    import torch

    calls = []

    class Runners:
        def __init__(self, cfg, impls):
            self.cfg = cfg

        def new_batch(self):
            calls.append("new_batch")

        def __call__(self, phase, impl, ids, warmup):
            calls.append((phase, impl, ids.shape[0], warmup))
            if impl == "eager" and phase == "prefill" and ids.shape[0] == 8:
                raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")
            if impl == "tiledattention" and phase == "train_compiled":
                raise RuntimeError("compile failed")
            return 0.001 * self.cfg.steps if phase == "decode" else 0.01

    monkeypatch.setattr(model_bench, "unavailable_reason", lambda: None)
    monkeypatch.setattr(model_bench, "impl_unavailable", lambda impl: None)
    monkeypatch.setattr(model_bench, "_Runners", Runners)
    gen, randint = torch.Generator, torch.randint
    monkeypatch.setattr(torch, "Generator", lambda device=None: gen())
    monkeypatch.setattr(torch, "randint", lambda *a, device=None, generator=None:
                        randint(*a, generator=generator))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    rows = {(r["batch"], r["phase"], r["method"]): r for r in model_bench.measure_model(CFG)}
    assert {k: r["status"] for k, r in rows.items() if r["status"] != "ok"} == {
        (8, "prefill", "eager"): "oom", (1, "train_compiled", "tiledattention"): "error",
        (8, "train_compiled", "tiledattention"): "error"}
    assert "compile failed" in rows[1, "train_compiled", "tiledattention"]["reason"]
    assert rows[8, "decode", "eager"]["status"] == "ok"  # its other phases go on
    assert rows[8, "decode", "sdpa"]["tokens_per_s"] == pytest.approx(8 * 2 / 0.002)
    assert rows[1, "prefill", "eager"]["tokens_per_s"] == pytest.approx(16 / 0.01)
    assert rows[8, "train", "tiledattention"]["tokens_per_s"] == pytest.approx(8 * 16 / 0.01)
    assert rows[1, "prefill_compiled", "sdpa"]["compiled"]
    assert len(rows[1, "decode", "tiledattention"]["times_ms"]) == CFG.reps
    assert calls.count("new_batch") == 2  # compiled afresh per batch size
    assert not any(impl == "eager" and phase.endswith("_compiled")
                   for phase, impl, *_ in (c for c in calls if c != "new_batch"))
    # The warm-up rep runs every phase first, then the timed reps.
    assert {c[3] for c in calls if c != "new_batch"} == {True, False}


def test_phases_are_chosen_in_the_config_and_checked(tmp_path, capsys):
    cfg = model_from_dict({"enabled": True, "phases": ["train", "train_compiled"]})
    rows = model_bench._base_rows(cfg, "cpu")
    assert {r["phase"] for r in rows} == {"train", "train_compiled"}
    with pytest.raises(SystemExit) as exit_:
        main(["model", "--out", str(tmp_path), "--phases", "warp"])
    assert exit_.value.code == 2
    assert "invalid choice: 'warp'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="model.phases: 'warp' is not one of"):
        model_from_dict({"phases": ["warp"]})


def test_model_table_keeps_eager_and_compiled_phases_apart():
    rows = [_ok(1, "train", "tiledattention", 90.0), _ok(1, "train", "sdpa", 100.0),
            _ok(1, "train_compiled", "tiledattention", 220.0),
            _ok(1, "train_compiled", "sdpa", 200.0)]
    cells = {(r[1], r[2]): r[4] for r in model_e2e(rows).rows}
    assert cells["train", "tiledattention"] == pytest.approx(0.9)
    assert cells["train_compiled", "tiledattention"] == pytest.approx(1.1)
