import os

import pytest

# Compiles in tests go to a private cache unless the caller chose one: a test that
# claims "compiles" must not be satisfied by a cubin left behind by another run.
os.environ.setdefault("CUDA_TILE_CACHE_DIR", os.path.join(
    os.environ.get("PYTEST_CUTILE_CACHE_ROOT", "/tmp"), f"tiledattention-test-cache-{os.getpid()}"))


@pytest.fixture
def launches(monkeypatch):
    """Plans built on the CPU for an sm_90 with 132 SMs, their launches recorded instead of
    run: each launch's (kernel name, arguments). Needs cuTile (the plans' kernel objects)."""
    import torch

    from tiledattention.kernel import launch as launching
    from tiledattention.kernel import plan as planning
    from tiledattention.kernel import validate
    from tiledattention.schedules import policy

    seen = []
    monkeypatch.setattr(validate, "check_device", lambda q: None)
    monkeypatch.setattr(planning, "check_device", lambda q: None)
    monkeypatch.setattr(planning, "sm_count", lambda index: 132)
    monkeypatch.setattr(policy, "_capability", lambda index: "9.0")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (9, 0))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(launching, "launch_kernel",
                        lambda device, grid, kernel, args, pdl=False: seen.append(
                            (getattr(kernel, "__name__", None) or kernel._pyfunc.__name__,
                             args)))
    planning.clear()
    yield seen
    planning.clear()
