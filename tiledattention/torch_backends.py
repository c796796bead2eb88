"""PyTorch's own SDPA as a baseline: forced backends, and which one auto-dispatch ran."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

FORCED = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}

# Substrings of CUDA kernel names that identify each backend.
_KERNEL_MARKERS = (
    ("cudnn", ("cudnn", "sm90_flash", "sm100_flash", "fmha_sm9", "_fprop_")),
    ("flash", ("flash_fwd",)),
    ("efficient", ("fmha_cutlass", "attention_kernel", "mem_eff")),
)


def torch_sdpa(q, k, v, *, causal=False, backend: str | None = None, attn_mask=None):
    """torch SDPA, automatic dispatch (``backend=None``) or one forced backend."""
    ctx = sdpa_kernel(FORCED[backend]) if backend else contextlib.nullcontext()
    with ctx:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, attn_mask=attn_mask,
                                              enable_gqa=q.shape[1] != k.shape[1])


def detect_auto_backend(q, k, v, *, causal=False) -> str:
    """Name of the backend auto-dispatch picks here, read from the kernels it launches."""
    from torch.profiler import ProfilerActivity, profile

    torch_sdpa(q, k, v, causal=causal)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch_sdpa(q, k, v, causal=causal)
        torch.cuda.synchronize()
    names = [e.name.lower() for e in prof.events() if e.device_type.name == "CUDA"]
    for backend, markers in _KERNEL_MARKERS:
        if any(m in n for n in names for m in markers):
            return backend
    return "math" if names else "unknown"
