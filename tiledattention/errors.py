"""One typed hierarchy for everything ``tiledattention`` refuses.

Every message names the argument at fault and what would have been accepted.
"""

from __future__ import annotations


class TiledAttentionError(Exception):
    """Base class of every error raised by tiledattention."""


class InputError(TiledAttentionError, ValueError):
    """An argument of ``sdpa`` is not acceptable (shape, value, flag)."""


class DeviceError(InputError):
    """Tensors are on the CPU, or on different devices."""


class DTypeError(InputError, TypeError):
    """A tensor's dtype is not supported or differs from the others."""


class ShapeError(InputError):
    """Rank, batch, head-count, sequence or head-dim mismatch."""


class UnsupportedHeadDimError(ShapeError):
    """The head dim is outside what the kernel implements."""


class MaskError(InputError):
    """``attn_mask`` has an unsupported dtype or a shape that does not broadcast."""


class ScheduleError(InputError):
    """A schedule (tile sizes, hints) is invalid; rejected before any compile."""


class BackwardNotSupportedError(TiledAttentionError, NotImplementedError):
    """A gradient was asked for that the backward does not compute (``attn_mask``)."""


class PlatformError(TiledAttentionError, RuntimeError):
    """The machine cannot run the kernel: see the subclasses."""


class NoGPUError(PlatformError):
    """No CUDA GPU is visible to PyTorch."""


class GPUTooOldError(PlatformError):
    """The GPU's compute capability is below what cuTile supports."""


class ToolchainMissingError(PlatformError):
    """cuda-tile or its tileiras compiler is not installed or not usable."""


class CompileError(TiledAttentionError, RuntimeError):
    """tileiras failed to compile a kernel variant."""


class ConfigError(TiledAttentionError, ValueError):
    """A benchmark config or a command-line value is invalid; the message names the key
    and the problem."""


class StudyError(TiledAttentionError, ValueError):
    """Study inputs are missing or inconsistent; the message names the file or column."""
