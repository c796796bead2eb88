"""TiledAttention: scaled-dot-product attention (forward, backward, decode, variants) as
cuTile tile programs."""

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
         "TableError": ".schedules.table", "block_mask": ".kernel.blockmask",
         "BlockMask": ".kernel.blockmask", "ScoreMod": ".kernel.mods",
         "VariantError": ".kernel.mods", "pinned_bwd_schedule": ".kernel.plan"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "BackwardNotSupportedError", "BlockMask", "CompileError", "DTypeError", "DeviceError",
    "GPUTooOldError", "InputError", "MaskError", "NoGPUError", "PlatformError", "Schedule",
    "ScheduleError", "ScoreMod", "ShapeError", "TableError", "TiledAttentionError",
    "ToolchainMissingError", "UnsupportedHeadDimError", "VariantError", "block_mask",
    "default_schedule", "pinned_bwd_schedule", "sdpa", "set_schedule_table", "timed_call",
]
