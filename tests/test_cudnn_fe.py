"""cuDNN through its Python frontend (``cudnn_fe``, issue 48 item 4): a registry entry every
benchmark config takes, ``unavailable`` with the reason where the frontend, a Hopper GPU or
cuDNN's support for the shape is missing, one built graph per ``GraphKey`` (built once,
cached), and the baselines extra, the containers' lock and the device kit carry its wheel.
(On a GPU: tests/gpu/test_cudnn_fe_gpu.py.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import tomllib
import torch

from tiledattention.bench import cudnn_fe as fe
from tiledattention.bench import methods
from tiledattention.bench.config import ConfigError, from_dict
from tiledattention.bench.grid import Point
from tiledattention.bench.methods import METHODS, Unavailable, Unsupported
from tiledattention.bench.runner import make_inputs, run_point
from tiledattention.errors import InputError

ROOT = Path(__file__).resolve().parent.parent
CUDA = torch.device("cuda")
POINT = Point("bfloat16", True, 128, 512, 512, 2, 8, 4, "fwd+bwd")


def test_cudnn_fe_is_a_fused_registry_entry_with_a_backward_and_a_colour_of_its_own():
    m = METHODS["cudnn_fe"]
    assert m.fused and m.has_backward and m.needs_cuda and not m.variants
    assert [x.color for x in METHODS.values()].count(m.color) == 1
    assert "nvidia-cudnn-frontend" in methods.methods_help(["cudnn_fe"])


def test_the_benchmark_config_accepts_cudnn_fe_and_still_refuses_an_unknown_name():
    cfg = from_dict({"methods": ["tiledattention", "cudnn", "cudnn_fe"]})
    assert cfg.methods == ("tiledattention", "cudnn", "cudnn_fe")
    with pytest.raises(ConfigError, match="methods: 'cudnn_frontend' is not one of"):
        from_dict({"methods": ["cudnn_frontend"]})


def test_the_timing_config_for_the_next_gpu_session_measures_cudnn_fe():
    import yaml

    cfg = from_dict(yaml.safe_load((ROOT / "config/bench-cudnn-fe.yaml").read_text()))
    assert "cudnn_fe" in cfg.methods and set(cfg.grid.passes) == {"fwd", "fwd+bwd"}


def test_on_a_cpu_the_harness_gives_cudnn_fe_an_unavailable_row():
    cfg = from_dict({"methods": ["eager", "cudnn_fe"], "device": "cpu",
                     "timing": {"warmup": 0, "reps": 1, "rounds": 1}})
    point = Point("float32", True, 16, 64, 64, 1, 2)
    rows = {r["method"]: r for r in run_point(point, ["eager", "cudnn_fe"], cfg,
                                              torch.device("cpu"), None)}
    assert rows["eager"]["status"] == "ok"
    assert (rows["cudnn_fe"]["status"], rows["cudnn_fe"]["reason"]) == ("unavailable",
                                                                        "needs a CUDA GPU")


def test_without_the_frontend_the_reason_names_the_import_error_and_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "cudnn", None)  # import cudnn raises ImportError
    fe.import_error.cache_clear()
    try:
        why = fe.import_error()
    finally:
        fe.import_error.cache_clear()
    assert why.startswith("the cuDNN frontend (import cudnn) cannot be imported: ModuleNotFound")
    assert why.endswith(fe.FE_INSTALL)
    monkeypatch.setattr(fe, "import_error", lambda: why)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    with pytest.raises(Unavailable) as exc:
        METHODS["cudnn_fe"].check(POINT, CUDA)
    assert str(exc.value) == why


@pytest.fixture
def frontend_here(monkeypatch):
    """A machine where the frontend imports, found torch's cuDNN, and the GPU is sm_90."""
    monkeypatch.setattr(fe, "import_error", lambda: None)
    monkeypatch.setattr(fe, "second_cudnn_error", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    built = []
    monkeypatch.setattr(fe, "cached_graph", lambda key: built.append(key))
    return built


def test_the_check_builds_the_graphs_the_pass_executes(frontend_here):
    METHODS["cudnn_fe"].check(POINT, CUDA)
    assert [k.kind for k in frontend_here] == ["fwd_stats", "bwd"]
    assert frontend_here[0].k.shape == (2, 2, 512, 128)  # GQA 4: K/V with H / 4 heads
    frontend_here.clear()
    METHODS["cudnn_fe"].check(Point("float16", False, 64, 1, 4096, 4, 32, 4), CUDA)
    assert [k.kind for k in frontend_here] == ["fwd"]


def test_an_older_gpu_a_second_cudnn_and_a_refused_shape_are_unavailable_with_why(
        frontend_here, monkeypatch):
    check = METHODS["cudnn_fe"].check
    monkeypatch.setattr(fe, "second_cudnn_error",
                        lambda: "the cuDNN frontend loaded cuDNN 91000, torch runs 91900")
    with pytest.raises(Unavailable, match="loaded cuDNN 91000, torch runs 91900"):
        check(POINT, CUDA)
    monkeypatch.setattr(fe, "second_cudnn_error", lambda: None)

    def refuse(key):
        raise fe.GraphRefused(f"cuDNN 91900 refuses {key.label()} at check_support: "
                              "cudnnGraphNotSupportedError: head dim 512")
    monkeypatch.setattr(fe, "cached_graph", refuse)
    with pytest.raises(Unavailable, match=r"refuses fwd bfloat16 .* D_qk=512 D_v=512 at "
                                          r"check_support: cudnnGraphNotSupportedError"):
        check(Point("bfloat16", False, 512, 1024, 1024, 1, 4), CUDA)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (8, 0))
    with pytest.raises(Unavailable, match="sm_90 and newer .* not sm_80"):
        check(POINT, CUDA)


def test_dtypes_and_passes_it_does_not_take_are_unsupported_before_any_build(frontend_here):
    with pytest.raises(Unsupported, match="dtype float32"):
        METHODS["cudnn_fe"].check(Point("float32", False, 64, 256, 256, 1, 2), CUDA)
    with pytest.raises(Unsupported, match="inference only"):
        METHODS["cudnn_fe"].check(Point(fe.FP8, False, 128, 256, 256, 1, 2, 1, "fwd+bwd"),
                                  CUDA)
    METHODS["cudnn_fe"].check(Point(fe.FP8, True, 128, 256, 256, 1, 2), CUDA)
    assert [(k.kind, k.dtype, k.out_dtype) for k in frontend_here] == [
        ("fp8_fwd", fe.FP8, "bfloat16")]


# --- the graph cache ----------------------------------------------------------------------
def test_the_key_is_what_the_graph_depends_on_shapes_strides_dtype_mask_kind():
    q, k, v = make_inputs(POINT, 0, torch.device("cpu"))
    key = fe.key_of("fwd", q, k, v, True)
    assert key == fe.key_of("fwd", q.clone(), k.clone(), v.clone(), True)  # not the data
    assert key.scale == 1 / 128 ** 0.5 and key.o_shape == (2, 8, 512, 128)
    assert key != fe.key_of("fwd", q, k, v, False)
    assert key != fe.key_of("fwd_stats", q, k, v, True)
    assert key != fe.key_of("fwd", q.half(), k.half(), v.half(), True)
    bshd = q.transpose(1, 2).contiguous().transpose(1, 2)  # same shape, other strides
    assert key != fe.key_of("fwd", bshd, k, v, True)
    # The check's key (from the point alone) is the one the runner's inputs give.
    assert fe.point_key("fwd", POINT, -1) == key
    # D_v: O takes V's head dim.
    v64 = torch.zeros(2, 2, 512, 64, dtype=torch.bfloat16)
    assert fe.key_of("fwd", q, k, v64, True).o_shape == (2, 8, 512, 64)
    assert "D_qk=128 D_v=64 causal" in fe.key_of("fwd", q, k, v64, True).label()


def test_a_graph_is_built_once_per_key_a_refusal_is_remembered_and_old_ones_leave(
        monkeypatch):
    monkeypatch.setattr(fe, "_CACHE", type(fe._CACHE)())
    builds = []

    def build(key):
        builds.append(key)
        if key.causal:
            raise fe.GraphRefused("cuDNN refuses it")
        return fe.Built(object(), {}, None, {})
    monkeypatch.setattr(fe, "_build", build)
    keys = [fe.point_key("fwd", Point("bfloat16", False, 64, s, s, 1, 2)) for s in
            range(64, 64 * (fe.CACHE_SIZE + 2), 64)]
    first = fe.cached_graph(keys[0])
    assert fe.cached_graph(keys[0]) is first and builds == [keys[0]]
    refused = fe.point_key("fwd", Point("bfloat16", True, 64, 64, 64, 1, 2))
    for _ in range(2):
        with pytest.raises(fe.GraphRefused, match="refuses"):
            fe.cached_graph(refused)
    assert builds.count(refused) == 1
    for key in keys:
        fe.cached_graph(key)
    assert len(fe._CACHE) == fe.CACHE_SIZE and keys[0] not in fe._CACHE


def test_fp8_without_scales_or_with_per_head_scales_is_one_typed_error():
    q = torch.zeros(1, 2, 64, 64, dtype=torch.float8_e4m3fn)
    point = Point(fe.FP8, False, 64, 64, 64, 1, 2)
    with pytest.raises(InputError, match="FP8 attention needs descale_q"):
        METHODS["cudnn_fe"].run(q, q, q, point)
    one, per_head = torch.ones(1), torch.ones(2)
    with pytest.raises(InputError, match="descale_k has 2 elements: .* not per-head"):
        METHODS["cudnn_fe"].run(q, q, q, point, descale=(one, per_head, one))


def test_the_loaded_libcudnn_is_read_from_the_process_maps_without_its_sub_libraries():
    maps = ("7f00-7f01 r-xp 0 08:01 1 /site/nvidia/cudnn/lib/libcudnn.so.9\n"
            "7f02-7f03 r-xp 0 08:01 2 /site/nvidia/cudnn/lib/libcudnn_graph.so.9\n"
            "7f04-7f05 r--p 0 08:01 1 /site/nvidia/cudnn/lib/libcudnn.so.9\n")
    assert fe.loaded_libcudnn(maps) == ["/site/nvidia/cudnn/lib/libcudnn.so.9"]
    assert fe.loaded_libcudnn("") == []


# --- the wheel: pinned in the baselines extra (so the lock and the device kit carry it) ----
def test_the_frontend_is_pinned_in_the_baselines_extra_the_device_kit_packs():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["baselines"]
    pins = dict(d.split("==") for d in deps)
    assert pins["nvidia-cudnn-frontend"] == "1.32.0"
    # Its own requirements (the wheel's METADATA) are already there: no second cuDNN (no
    # nvidia-cudnn-cu* wheel; it loads torch's libcudnn).
    assert {"nvidia-cutlass-dsl", "apache-tvm-ffi"} <= set(pins)
    assert not any(n.startswith("nvidia-cudnn-cu") for n in pins)
