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
_LAZY = {
    "BlockMask": ".kernel.blockmask",
    "BwdSchedule": ".schedules.backward",
    "SDPAMode": ".integrations.dropin",
    "Schedule": ".schedules.schedule",
    "ScoreMod": ".mods",
    "TableError": ".schedules.table",
    "VariantError": ".mods",
    "and_masks": ".variants",
    "block_mask": ".kernel.blockmask",
    "default_bwd_schedule": ".schedules.backward",
    "default_schedule": ".schedules.schedule",
    "or_masks": ".variants",
    "pinned_bwd_schedule": ".kernel.plan",
    "sdpa": ".api",
    "sdpa_mode": ".integrations.dropin",
    "sdpa_paged": ".varlen",
    "sdpa_varlen": ".varlen",
    "set_schedule_table": ".schedules.policy",
    "timed_call": ".api",
}


_LAZY_MODULES = ("variants",)  # ta.variants.sliding_window(...), ta.variants.sinks(...)


def __getattr__(name: str):
    if name in _LAZY or name in _LAZY_MODULES:
        import importlib

        if name in _LAZY:
            value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        else:
            value = importlib.import_module(f".{name}", __name__)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = [
    "BackwardNotSupportedError", "BlockMask", "BwdSchedule", "CompileError", "DTypeError",
    "DeviceError", "GPUTooOldError", "InputError", "MaskError", "NoGPUError", "PlatformError",
    "SDPAMode", "Schedule", "ScheduleError", "ScoreMod", "ShapeError", "TableError",
    "TiledAttentionError", "ToolchainMissingError", "UnsupportedHeadDimError", "VariantError",
    "and_masks", "block_mask", "default_bwd_schedule", "default_schedule", "or_masks",
    "pinned_bwd_schedule", "sdpa", "sdpa_mode", "sdpa_paged", "sdpa_varlen",
    "set_schedule_table", "timed_call", "variants",
]
