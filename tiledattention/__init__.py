"""TiledAttention: scaled-dot-product attention forward as a cuTile tile program."""

from .errors import (
    BackwardNotSupportedError,
    CompileError,
    DeviceError,
    DTypeError,
    GPUTooOldError,
    InputError,
    MaskError,
    NoGPUError,
    PlatformError,
    ScheduleError,
    ShapeError,
    TiledAttentionError,
    ToolchainMissingError,
    UnsupportedHeadDimError,
)

__version__ = "0.1.0"

# The call path (torch, cuTile) loads on first use, so `tiledattn --help` and the workflow's
# config checks do not pay for importing torch.
_LAZY = {"sdpa": ".api", "timed_call": ".api", "set_schedule_table": ".schedules.policy",
         "Schedule": ".schedules.schedule", "default_schedule": ".schedules.schedule",
         "TableError": ".schedules.table", "sdpa_mode": ".integrations.dropin",
         "SDPAMode": ".integrations.dropin"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "BackwardNotSupportedError", "CompileError", "DTypeError", "DeviceError", "GPUTooOldError",
    "InputError", "MaskError", "NoGPUError", "PlatformError", "SDPAMode", "Schedule",
    "ScheduleError", "ShapeError", "TableError", "TiledAttentionError", "ToolchainMissingError",
    "UnsupportedHeadDimError", "default_schedule", "sdpa", "sdpa_mode", "set_schedule_table",
    "timed_call",
]
