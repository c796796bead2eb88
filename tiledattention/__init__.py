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
         "TableError": ".schedules.table", "BwdSchedule": ".schedules.backward",
         "default_bwd_schedule": ".schedules.backward"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "BackwardNotSupportedError", "BwdSchedule", "CompileError", "DTypeError", "DeviceError",
    "GPUTooOldError", "InputError", "MaskError", "NoGPUError", "PlatformError", "Schedule",
    "ScheduleError", "ShapeError", "TableError", "TiledAttentionError", "ToolchainMissingError",
    "UnsupportedHeadDimError", "default_bwd_schedule", "default_schedule", "sdpa",
    "set_schedule_table", "timed_call",
]
