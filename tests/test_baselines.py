"""The newest baselines (issue 35): FlashAttention-4 (``fa4``), torch SDPA on FA4
(``sdpa_fa4``) and FlexAttention's FLASH backend (``flex_flash``) are registry entries that
every stage picks up; where they cannot run their rows say why; the configs, the extra, the
containers' lock and the device kit carry them. (On a GPU: tests/gpu/test_baselines_gpu.py.)"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch
import yaml

from tiledattention.bench import methods
from tiledattention.bench.config import ConfigError, from_dict
from tiledattention.bench.grid import PAPER_HEAD_DIMS, PAPER_SEQS, Point, expand
from tiledattention.bench.methods import (
    METHODS,
    Unavailable,
    Unsupported,
    fa4_head_dim_error,
    fa4_import_error,
)
from tiledattention.bench.runner import run_point
from tiledattention.bench.variant_cases import (
    VARIANT_NAMES,
    VARIANTS,
    WINDOW,
    VariantPoint,
    indices,
)
from tiledattention.bench.variant_cases import parts_for as variant_parts
from tiledattention.stages import stage_from_dict, study_schema
from tiledattention.stages.variants import VARIANT_METHODS

ROOT = Path(__file__).resolve().parent.parent
NEW = ("fa4", "sdpa_fa4", "flex_flash")
CUDA = torch.device("cuda")


def test_the_new_baselines_are_registry_entries_the_stages_pick_up():
    assert set(NEW) <= set(METHODS)
    # The variants stage takes its choices from the registry: FA4 and both Flex backends.
    assert {"fa4", "flex", "flex_flash"} <= set(VARIANT_METHODS)
    assert "sdpa_fa4" not in VARIANT_METHODS  # SDPA's flash backend takes only causal
    with open(ROOT / "workflow/schemas/config.schema.yaml") as f:
        schema = study_schema(yaml.safe_load(f))
    enum = schema["properties"]["variants"]["properties"]["methods"]["items"]["enum"]
    assert enum == list(VARIANT_METHODS)
    # The benchmark (grid and decode) validates any registry name.
    cfg = from_dict({"methods": ["tiledattention", "fa4", "sdpa_fa4"]})
    assert cfg.methods == ("tiledattention", "fa4", "sdpa_fa4")
    assert stage_from_dict("variants", {"methods": ["fa4", "flex_flash"]}).methods == (
        "fa4", "flex_flash")
    with pytest.raises(ConfigError, match="methods: 'fa5' is not one of"):
        from_dict({"methods": ["fa5"]})
    for name in NEW:  # a colour of their own in every figure
        colors = [m.color for m in METHODS.values()]
        assert colors.count(METHODS[name].color) == 1, name


@pytest.mark.skipif(fa4_import_error() is None, reason="flash_attn.cute imports here")
def test_without_flash_attn_cute_every_new_baseline_is_unavailable_with_the_reason(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(methods.importlib.util, "find_spec", lambda name, *a: object())
    point = Point("bfloat16", True, 128, 512, 512, 2, 4)
    for name in ("fa4", "sdpa_fa4"):
        with pytest.raises(Unavailable, match=r"flash_attn.cute \(FlashAttention-4\) cannot "
                                              r"be imported: .*tiledattention\[baselines\]"):
            METHODS[name].check(point, CUDA)
    variant = VariantPoint("bfloat16", True, 64, 256, 256, 1, 2, variant="causal")
    with pytest.raises(Unavailable, match="FLASH backend needs FA4: flash_attn.cute"):
        METHODS["flex_flash"].check(variant, CUDA)


def test_without_a_gpu_the_harness_gives_every_new_baseline_an_unavailable_row():
    cfg = from_dict({"methods": ["eager", *NEW], "timing": {"warmup": 0, "reps": 1,
                                                            "rounds": 1}, "device": "cpu"})
    point = Point("float32", True, 16, 64, 64, 1, 2)
    rows = {r["method"]: r for r in run_point(point, list(cfg.methods), cfg,
                                              torch.device("cpu"), None)}
    assert rows["eager"]["status"] == "ok"
    for name in NEW:
        assert (rows[name]["status"], rows[name]["reason"]) == ("unavailable",
                                                                "needs a CUDA GPU")


@pytest.fixture
def fa4_here(monkeypatch):
    """A machine where FA4 imports and the GPU is an sm_90."""
    monkeypatch.setattr(methods, "fa4_import_error", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(methods, "parts_for", lambda point, device: variant_parts(point, "cpu"))


def test_fa4_takes_head_dims_as_its_kernels_do():
    assert fa4_head_dim_error(256, 9) is None and fa4_head_dim_error(8, 9) is None
    assert "8..256" in fa4_head_dim_error(264, 9)
    assert "multiples of 8" in fa4_head_dim_error(100, 9)
    assert fa4_head_dim_error(256, 10) is None and "8..128 and 256" in fa4_head_dim_error(192, 10)


def test_fa4_checks_arch_dtype_and_head_dim_with_reasons(fa4_here, monkeypatch):
    fa4 = METHODS["fa4"].check
    fa4(Point("bfloat16", True, 256, 512, 512, 2, 8), CUDA)  # D = 256 on sm_90
    with pytest.raises(Unsupported, match="8..256, not 264"):
        fa4(Point("bfloat16", True, 264, 512, 512, 2, 8), CUDA)
    with pytest.raises(Unsupported, match="dtype float32"):
        fa4(Point("float32", True, 64, 512, 512, 2, 8), CUDA)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    with pytest.raises(Unavailable, match="not sm_80"):
        fa4(Point("bfloat16", True, 64, 512, 512, 2, 8), CUDA)


@pytest.mark.parametrize("name", VARIANT_NAMES)
def test_every_variant_has_an_fa4_form_or_the_reason_next_to_its_definition(name, fa4_here):
    point = VariantPoint("bfloat16", VARIANTS[name].causal, 64, 256, 256, 1, 2, variant=name)
    parts = variant_parts(point, "cpu")
    if parts.fa4 is None:
        if name == "alibi":  # a CuTe DSL score_mod, where the DSL imports
            assert parts.no_fa4 == "the CuTe DSL (cutlass) cannot be imported"
        else:  # mask_mod without block sparsity would handicap FA4: Flex FLASH is its form
            assert "block-sparse" in parts.no_fa4 and "flex_flash" in parts.no_fa4
        with pytest.raises(Unsupported) as exc:
            METHODS["fa4"].check(point, CUDA)
        assert str(exc.value) == parts.no_fa4
    else:
        METHODS["fa4"].check(point, CUDA)
        assert parts.fa4["causal"] is VARIANTS[name].causal
    native = {"causal", "window", "softcap"} | ({"alibi"} if fa4_import_error() is None
                                                else set())
    assert {n for n in VARIANT_NAMES if variant_parts(
        VariantPoint("bfloat16", VARIANTS[n].causal, 64, 256, 256, 1, 2, variant=n),
        "cpu").fa4} == native


def test_fa4_window_keeps_the_keys_the_variant_keeps():
    seq = WINDOW + 300
    point = VariantPoint("bfloat16", True, 64, seq, seq, 1, 1, variant="window")
    parts = variant_parts(point, "cpu")
    left, right = parts.fa4["window_size"]
    _, _, q, k = indices(1, 1, seq, "cpu")
    fa4_keeps = (k >= q - left) & (k <= q + right) & (k <= q)  # FA's local + causal mask
    assert torch.equal(fa4_keeps, parts.mask(0, 0, q, k))


def test_fa4_softcap_is_the_variants_cap_on_scaled_scores():
    point = VariantPoint("bfloat16", True, 64, 256, 256, 1, 1, variant="softcap")
    parts = variant_parts(point, "cpu")
    s = torch.linspace(-200, 200, 101)
    cap = parts.fa4["softcap"]  # FA4: cap * tanh(s / cap) of s = q.k * scale
    assert torch.allclose(cap * torch.tanh(s / cap), parts.score(s, 0, 0, 0, 0))


def test_the_harness_holds_a_methods_scope_around_each_of_its_calls(monkeypatch):
    held = []

    class Scope:
        def __enter__(self):
            held.append(True)

        def __exit__(self, *exc):
            held.pop()

    def run(q, k, v, point):
        assert held, "called outside its scope"
        return METHODS["math"].run(q, k, v, point)

    def other(q, k, v, point):
        assert not held, "another method ran inside the scope"
        return METHODS["math"].run(q, k, v, point)

    monkeypatch.setitem(METHODS, "scoped", dataclasses.replace(
        METHODS["math"], name="scoped", run=run, scope=Scope))
    monkeypatch.setitem(METHODS, "plain", dataclasses.replace(
        METHODS["math"], name="plain", run=other))
    cfg = from_dict({"timing": {"warmup": 1, "reps": 2, "rounds": 2}, "device": "cpu"})
    for pass_ in ("fwd", "fwd+bwd", "bwd"):
        point = Point("float32", True, 16, 64, 64, 1, 2, 1, pass_)
        rows = run_point(point, ["scoped", "plain"], cfg, torch.device("cpu"), None)
        assert [r["status"] for r in rows] == ["ok", "ok"], rows
        assert held == []


def test_sdpa_fa4_switches_the_flash_impl_and_restores_the_previous_one(monkeypatch):
    import torch.nn.attention as attn

    calls, state = [], {"impl": None}

    def activate(impl):
        calls.append(("activate", impl))
        state["impl"] = impl

    def restore(*a, **k):
        calls.append(("restore",))
        state["impl"] = None

    monkeypatch.setattr(attn, "activate_flash_attention_impl", activate, raising=False)
    monkeypatch.setattr(attn, "restore_flash_attention_impl", restore, raising=False)
    monkeypatch.setattr(attn, "current_flash_attention_impl", lambda: state["impl"],
                        raising=False)
    with METHODS["sdpa_fa4"].scope():
        assert state["impl"] == "FA4"
    assert state["impl"] is None and calls == [("activate", "FA4"), ("restore",)]
    state["impl"] = "FA3"  # a user's own choice is put back, not FA2
    with METHODS["sdpa_fa4"].scope():
        assert state["impl"] == "FA4"
    assert state["impl"] == "FA3"


def test_sdpa_fa4_leaves_the_variants_to_sdpa_mask(fa4_here):
    point = VariantPoint("bfloat16", True, 64, 256, 256, 1, 2, variant="causal")
    with pytest.raises(Unsupported, match="sdpa_mask"):
        METHODS["sdpa_fa4"].check(point, CUDA)


# --- configs --------------------------------------------------------------------------------
def _config(name):
    with open(ROOT / "config" / name) as f:
        return yaml.safe_load(f)


@pytest.mark.parametrize("name", ["reference.yaml", "config.yaml"])
def test_the_study_configs_measure_the_new_baselines(name):
    data = _config(name)
    bench = from_dict(data["bench"])
    assert {"fa4", "sdpa_fa4"} <= set(bench.methods)
    variants = stage_from_dict("variants", data["variants"])
    assert {"fa4", "flex", "flex_flash"} <= set(variants.methods)


def test_the_reference_adds_d256_forward_and_backward_and_keeps_the_80_point_grid():
    bench = from_dict(_config("reference.yaml")["bench"])
    grid = [p for p in expand(bench) if p.seq_q == p.seq_kv and p.seq_q in PAPER_SEQS]
    for pass_ in ("fwd", "fwd+bwd"):
        paper = [p for p in grid if p.pass_ == pass_ and p.head_dim in PAPER_HEAD_DIMS]
        d256 = [p for p in grid if p.pass_ == pass_ and p.head_dim == 256]
        assert len(paper) == 80 and len(d256) == 20, pass_
        assert {(p.batch * p.seq_q, p.heads) for p in d256} == {(16384, 8)}
    assert 1 in bench.decode.batches  # decode at B = 1


# --- the extra, the lock, the device kit ----------------------------------------------------
def _baselines_extra() -> dict[str, str]:
    import tomllib

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["baselines"]
    return dict(d.split("==") for d in deps)


def test_the_baselines_extra_is_pinned_and_the_containers_lock_carries_it():
    extra = _baselines_extra()
    assert extra["flash-attn-4"] == "4.0.0b36" and extra["nvidia-cutlass-dsl"] == "4.8.1"
    for lib in ("base", "core", "cu12", "cu13"):
        assert extra[f"nvidia-cutlass-dsl-libs-{lib}"] == "4.8.1"
    lock = dict(line.split("==") for line in (ROOT / "containers/requirements.lock")
                .read_text().splitlines() if line and not line.startswith("#"))
    assert {n: lock.get(n) for n in extra} == extra
    sys.path.insert(0, str(ROOT / "containers"))
    try:
        import lock as lock_py
    finally:
        sys.path.pop(0)
    assert lock_py.pinned_extras() == extra


def test_the_lock_refuses_an_extra_line_that_is_not_one_exact_pin(tmp_path):
    sys.path.insert(0, str(ROOT / "containers"))
    try:
        import lock as lock_py
    finally:
        sys.path.pop(0)
    bad = tmp_path / "pyproject.toml"
    bad.write_text('[project.optional-dependencies]\nbaselines = ["flash-attn-4>=4"]\n')
    with pytest.raises(SystemExit, match="not one exact == pin"):
        lock_py.pinned_extras(pyproject=bad)


def _wheel(folder: Path, name: str, payload: bytes) -> Path:
    """A minimal pure-Python wheel whose module holds ``payload``'s length."""
    path = folder / f"{name}-1.0-py3-none-any.whl"
    dist = f"{name}-1.0.dist-info"
    files = {f"{name}/__init__.py": f"SIZE = {len(payload)}\n".encode(),
             f"{name}/blob.bin": payload,
             f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
             f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
                              b"Tag: py3-none-any\n"}
    record = "".join(f"{n},,\n" for n in files) + f"{dist}/RECORD,,\n"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for n, data in files.items():
            z.writestr(n, data)
        z.writestr(f"{dist}/RECORD", record)
    return path


def _kit(tmp_path, **env):
    src = tmp_path / "src"
    src.mkdir()
    _wheel(src, "fakebig", os.urandom(9000))  # over PART: split
    _wheel(src, "fakesmall", b"x" * 100)
    kit = tmp_path / "kit"
    run = subprocess.run(["bash", "scripts/pack-baseline-wheels.sh", str(kit), "3.11"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "FROM": str(src), "PINS": "fakebig==1.0 "
                              "fakesmall==1.0", "PART": "4000", "LOAD": "6000", **env})
    assert run.returncode == 0, run.stderr
    return src, kit, sorted(kit.glob("load*"))


def _install(tmp_path, *loads):
    env = {**os.environ, "STAGE": str(tmp_path / "stage"), "FA4_SITE": str(tmp_path / "site"),
           "FA4KIT": str(tmp_path / "no-kit-here")}
    return subprocess.run(["bash", "scripts/device-baselines.sh", *map(str, loads)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)


def test_the_kit_splits_big_wheels_into_loads_and_the_machine_joins_and_installs_them(
        tmp_path):
    src, kit, loads = _kit(tmp_path)
    assert (kit / ".gitignore").read_text() == "*\n"  # never committed
    assert len(loads) >= 2
    for load in loads:
        assert sum(f.stat().st_size for f in load.glob("*.whl*")) <= 6000
        assert (load / "MD5SUMS").exists() and (load / "PARTS").exists()
    parts = sorted(p.name for p in kit.glob("load*/fakebig-*.part*"))
    assert len(parts) == 3 and not list(kit.glob("load*/fakebig-1.0-py3-none-any.whl"))
    for load in loads[:-1]:  # one load per device call: incomplete until the last
        run = _install(tmp_path, load)
        assert run.returncode == 3 and "carry the next load" in run.stderr, run.stderr
    run = _install(tmp_path, loads[-1])
    assert run.returncode == 0, run.stderr
    site = tmp_path / "site"
    assert run.stdout.strip() == f"{site}:{site}/nvidia_cutlass_dsl/dsl_packages"
    assert (site / "fakebig" / "blob.bin").stat().st_size == 9000
    joined = tmp_path / "stage" / "fakebig-1.0-py3-none-any.whl"
    assert hashlib.md5(joined.read_bytes()).hexdigest() == hashlib.md5(
        (src / joined.name).read_bytes()).hexdigest()
    again = _install(tmp_path)  # a later call (device-study.sh): installed already
    assert again.returncode == 0 and again.stdout.strip() == run.stdout.strip()


def test_a_corrupted_part_is_refused_before_anything_is_installed(tmp_path):
    _, kit, loads = _kit(tmp_path)
    part = sorted(kit.glob("load*/fakebig-*.part01"))[0]
    data = part.read_bytes()  # random bytes: flip one, never overwrite it with what it may be
    part.write_bytes(bytes([data[0] ^ 0xFF]) + data[1:])
    for load in loads[:-1]:
        _install(tmp_path, load)
    run = _install(tmp_path, loads[-1])
    assert run.returncode == 1 and "md5 differs" in run.stderr, run.stderr
    assert not (tmp_path / "site").exists()


def test_no_kit_and_nothing_staged_is_exit_2(tmp_path):
    run = _install(tmp_path)
    assert run.returncode == 2 and "no kit" in run.stderr


# --- the model stage --------------------------------------------------------------------------
@pytest.mark.skipif(fa4_import_error() is None, reason="flash_attn.cute imports here")
def test_the_model_stage_times_fa4_through_transformers_or_says_why_not(tmp_path, monkeypatch):
    from tiledattention.stages import model as model_bench
    from tiledattention.stages.model import model_from_dict

    assert "fa4" in model_bench.IMPLS and model_bench.ATTN["fa4"] == "flash_attention_4"
    why = model_bench.impl_unavailable("fa4")
    assert why == fa4_import_error()
    cfg = model_from_dict({"enabled": True, "batches": [1], "prompt": 16, "steps": 2,
                           "reps": 1})
    rows = [{**r, "status": "ok"} if r["method"] != "fa4" else
            {**r, "status": "unavailable", "reason": why}
            for r in model_bench._base_rows(cfg, "cuda:0")]
    monkeypatch.setattr(model_bench, "measure_model", lambda cfg, log: rows)
    # FA4 missing on a GPU machine: its rows say why, the stage's other rows stand.
    assert model_bench.run_model(cfg, str(tmp_path))["status"] == "ok"
    saved = {r["method"]: r for r in model_bench.load_rows(str(tmp_path))}
    assert saved["fa4"]["reason"] == why
    rows[0].update(status="error", reason="boom")  # one of ours failing fails the stage
    assert model_bench.run_model(cfg, str(tmp_path))["status"] == "error"


# --- what the H100 run found (GPU-FINDINGS of issue 35) ----------------------------------
def _fake_package(monkeypatch, tmp_path, files: dict[str, str]):
    """Packages written under tmp_path and imported from there (the real ones set aside)."""
    for rel, text in files.items():
        path = tmp_path / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for name in [m for m in sys.modules if m == "flash_attn" or m.startswith("flash_attn.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()


FA4_FWD = """
def _flash_attn_fwd(q, k, v, return_lse=False):
    def helper():
        return 1, 2
    if not return_lse:
        return q, None, None, None, None
    return q, k, v, None, None
"""


def test_sdpa_fa4_is_unavailable_where_torch_unpacks_two_values_and_fa4_returns_five(
        monkeypatch, tmp_path, fa4_here):
    # FA4 4.0.0b36's _flash_attn_fwd returns (out, lse, p, row_max, o_lo); torch's FA4 impl
    # unpacks out, lse: on the H100 every sdpa_fa4 row was "too many values to unpack".
    _fake_package(monkeypatch, tmp_path, {"flash_attn/cute/__init__.py":
                                          "__version__ = '4.0.0b36'\n",
                                          "flash_attn/cute/interface.py": FA4_FWD})
    # the release comes from the distribution's metadata (the package says 0.0.0)
    monkeypatch.setattr(methods, "fa4_version", lambda: "4.0.0b36")
    methods.sdpa_fa4_error.cache_clear()
    try:
        why = methods.sdpa_fa4_error()
        assert why is not None and "unpacks 2 values" in why and "4.0.0b36 returns 5" in why
        point = Point("bfloat16", False, 128, 256, 256, 1, 2, 1, "fwd")
        with pytest.raises(methods.Unavailable, match="unpacks 2 values"):
            methods._sdpa_fa4_check(point, torch.device("cuda"))
    finally:
        methods.sdpa_fa4_error.cache_clear()


def test_sdpa_fa4_runs_where_fa4_returns_what_torch_unpacks(monkeypatch, tmp_path):
    _fake_package(monkeypatch, tmp_path, {
        "flash_attn/cute/__init__.py": "",
        "flash_attn/cute/interface.py": "def _flash_attn_fwd(q, k, v, **kw):\n"
                                        "    return q, k\n"})
    methods.sdpa_fa4_error.cache_clear()
    try:
        assert methods.sdpa_fa4_error() is None
    finally:
        methods.sdpa_fa4_error.cache_clear()


def test_arities_read_returns_of_the_function_itself_and_tuple_unpacks_of_its_calls():
    src = FA4_FWD + "\ndef caller(m):\n    out, lse = m._flash_attn_fwd(1, 2, 3)\n"
    assert methods._fwd_arities(src, "_flash_attn_fwd") == ({5}, {2})


def test_flash_attn_is_unavailable_where_the_flash_attn_namespace_is_fa4s(monkeypatch,
                                                                          tmp_path):
    # flash-attn-4 ships flash_attn/ as a namespace holding only cute/: no FA2 there.
    _fake_package(monkeypatch, tmp_path, {"flash_attn/cute/__init__.py": ""})
    point = Point("bfloat16", False, 128, 256, 256, 1, 2, 1, "fwd")
    with pytest.raises(methods.Unavailable, match="FlashAttention-4's namespace.*"
                       "FlashAttention-2 is not installed"):
        methods._flash_attn_check(point, torch.device("cuda"))
    # FA2 itself (flash_attn_interface beside its __init__) passes the check.
    _fake_package(monkeypatch, tmp_path / "fa2", {
        "flash_attn/__init__.py": "", "flash_attn/flash_attn_interface.py": ""})
    methods._flash_attn_check(point, torch.device("cuda"))


class _Reg:
    """A CuTe DSL register tensor stand-in: indexable, load/store of its one value."""

    def __init__(self, n, dtype):
        self.v = [0] * n

    def __getitem__(self, i):
        return self.v[i]

    def __setitem__(self, i, x):
        self.v[i] = x

    def store(self, x):
        self.v[0] = x

    def load(self):
        return _Num(self.v[0])


class _Num(float):
    def to(self, dtype):
        return _Num(self)

    def __sub__(self, other):
        return _Num(float(self) - other)


def test_fa4_alibi_score_mod_makes_registers_as_the_pinned_cutedsl_does(monkeypatch):
    # nvidia-cutlass-dsl 4.8.1 has cute.make_rmem_tensor and no cute.make_fragment (the
    # H100's "module 'cutlass.cute' has no attribute 'make_fragment'" on the alibi row):
    # the stand-in has only what 4.8.1 has, and the mod must compute s + slope[h]·(k − q).
    import types

    from tiledattention.bench import variant_cases as variants

    cute = types.ModuleType("cutlass.cute")
    cute.jit = lambda f: f
    cute.make_rmem_tensor = _Reg
    cutlass = types.ModuleType("cutlass")
    cutlass.cute, cutlass.Int32, cutlass.Float32 = cute, int, float
    monkeypatch.setitem(sys.modules, "cutlass", cutlass)
    monkeypatch.setitem(sys.modules, "cutlass.cute", cute)
    variants._fa4_alibi_mods.cache_clear()
    try:
        score_mod, score_mod_bwd = variants._fa4_alibi_mods()
        slopes = type("Slopes", (), {"element_type": float,
                                     "__getitem__": lambda self, i: [0.5, 0.25][i]})()
        got = score_mod(1.0, 0, 1, _Num(7), _Num(3), None, [slopes])
        assert got == 1.0 + 0.25 * (3 - 7)
        assert score_mod_bwd("g", 1.0, 0, 1, 7, 3, None, [slopes]) == "g"
    finally:
        variants._fa4_alibi_mods.cache_clear()


def test_device_baselines_refuses_an_fa4_site_holding_the_users_files(tmp_path):
    # FA4_SITE naming a directory of the user's was removed whole (rm -rf "$FA4_SITE").
    _, _, loads = _kit(tmp_path)
    site = tmp_path / "site"
    site.mkdir()
    (site / "thesis.tex").write_text("years of work")
    run = _install(tmp_path, *loads)
    assert run.returncode == 2, run.stderr
    assert "did not install; nothing removed" in run.stderr
    assert len(run.stderr.strip().splitlines()) == len(loads) + 1  # 'staged' lines, then it
    assert sorted(p.name for p in site.iterdir()) == ["thesis.tex"]
    assert (site / "thesis.tex").read_text() == "years of work"


def test_device_baselines_replaces_only_the_site_it_installed(tmp_path):
    _, _, loads = _kit(tmp_path)
    site = tmp_path / "site"
    assert _install(tmp_path, *loads).returncode == 0
    made = (site / ".fa4site").read_text().split()
    assert {"fakebig", "fakesmall", ".kit", ".pythonpath", ".fa4site"} <= set(made)
    assert sorted(p.name for p in site.iterdir()) == sorted(made)
    (site / ".kit").write_text("an older kit\n")  # a new kit: the site is reinstalled
    run = _install(tmp_path)
    assert run.returncode == 0 and "installed 2 wheels" in run.stderr, run.stderr
    assert (site / "fakebig" / "blob.bin").stat().st_size == 9000
    assert not list(tmp_path.glob("site.new-*"))  # the install's temporary directory is gone
    (site / ".kit").write_text("an older kit\n")
    (site / "notes.txt").write_text("the user's, put in later")
    run = _install(tmp_path)
    assert run.returncode == 2 and (site / "notes.txt").exists() and (site / "fakebig").exists()


@pytest.mark.parametrize("name", ["../evil-1.0-py3-none-any.whl", "/tmp/evil-1.0-py3-none-any.whl",
                                  "sub/evil-1.0-py3-none-any.whl", ".."])
@pytest.mark.parametrize("listing", ["MD5SUMS", "PARTS"])
def test_device_baselines_refuses_a_load_naming_a_path_instead_of_a_file(tmp_path, name,
                                                                          listing):
    _, _, loads = _kit(tmp_path)
    with open(loads[0] / listing, "a") as f:
        f.write(f"{'0' * 32}  {name}\n")
    before = sorted(p.name for p in tmp_path.iterdir())
    run = _install(tmp_path, *loads)
    assert run.returncode == 2, run.stderr
    assert run.stderr.strip().splitlines() == [
        f"device-baselines: {loads[0] / listing} names '{name}', not a plain file name; "
        "refused, nothing written"]
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no stage, no site
