"""GPU tests: skipped with the reason where no CUDA GPU or no cuTile toolchain is present."""

import pytest
import torch


def _skip_reason() -> str | None:
    if not torch.cuda.is_available():
        return "no CUDA GPU visible to PyTorch (torch.cuda.is_available() is False)"
    try:
        from tiledattention.kernel.toolchain import check_gpu

        check_gpu(torch.cuda.current_device())
    except Exception as exc:  # toolchain missing, GPU too old
        return f"GPU present but unusable: {exc}"
    return None


def pytest_collection_modifyitems(config, items):
    reason = _skip_reason()
    if reason is None:
        return
    marker = pytest.mark.skip(reason=reason)
    for item in items:
        if "tests/gpu" in str(item.fspath).replace("\\", "/"):
            item.add_marker(marker)
