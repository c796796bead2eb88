"""TiledAttention: scaled-dot-product attention forward as a cuTile tile program."""

from .api import sdpa, timed_call
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
from .schedules.policy import set_schedule_table
from .schedules.schedule import Schedule, default_schedule
from .schedules.table import TableError

__version__ = "0.1.0"

__all__ = [
    "BackwardNotSupportedError", "CompileError", "DTypeError", "DeviceError", "GPUTooOldError",
    "InputError", "MaskError", "NoGPUError", "PlatformError", "Schedule", "ScheduleError",
    "ShapeError", "TableError", "TiledAttentionError", "ToolchainMissingError",
    "UnsupportedHeadDimError", "default_schedule", "sdpa", "set_schedule_table", "timed_call",
]
