"""The SM clock while a point is timed, sampled through NVML from a thread.

A data-sheet peak assumes one clock (the H100/H200's 989 TFLOP/s dense bf16: 1830 MHz);
a GPU at its power limit runs below it, so a row's share of the peak is stated against the
peak at the clock it ran (``presentation.hardware.peak_at_clock``). NVML is the driver's own
``libnvidia-ml.so.1``, called through ctypes (no Python package); where it or a GPU is
missing the sampler records nothing and rows carry no clock.
"""

from __future__ import annotations

import ctypes
import functools
import threading

PERIOD_S = 0.002  # kernels of a timed point last 0.01-100 ms; NVML reads take ~10 us
NVML_CLOCK_SM = 1  # nvmlClockType_t NVML_CLOCK_SM

_lib: object = None  # the loaded library; False once it failed to load or initialise


def _nvml():
    global _lib
    if _lib is None:
        try:
            lib = ctypes.CDLL("libnvidia-ml.so.1")
            _lib = lib if lib.nvmlInit_v2() == 0 else False
        except OSError:
            _lib = False
    return _lib or None


def _handle(device):
    """NVML's handle of the torch CUDA ``device`` (looked up once per device)."""
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    return _handle_of(index)


@functools.cache
def _handle_of(index: int):
    """NVML's handle of CUDA device ``index``, found by PCI address (NVML's indices ignore
    CUDA_VISIBLE_DEVICES); None where NVML or the device is not there."""
    lib = _nvml()
    if lib is None:
        return None
    import torch

    p = torch.cuda.get_device_properties(index)
    bus = f"{p.pci_domain_id:08x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0".encode()
    handle = ctypes.c_void_p()
    if lib.nvmlDeviceGetHandleByPciBusId_v2(ctypes.c_char_p(bus), ctypes.byref(handle)):
        return None
    return handle


def sm_clock_mhz(handle) -> int | None:
    """The SM clock now (MHz), or None if NVML does not answer."""
    value = ctypes.c_uint()
    if _nvml().nvmlDeviceGetClockInfo(handle, NVML_CLOCK_SM, ctypes.byref(value)):
        return None
    return value.value


class ClockSampler:
    """``with ClockSampler(device) as c:`` samples the SM clock every ``PERIOD_S`` while
    the block runs; ``c.samples`` holds the MHz read (empty without NVML or a GPU)."""

    def __init__(self, device):
        self.samples: list[int] = []
        self._handle = _handle(device) if getattr(device, "type", None) == "cuda" else None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while True:
            mhz = sm_clock_mhz(self._handle)
            if mhz is not None:
                self.samples.append(mhz)
            if self._stop.wait(PERIOD_S):
                return

    def __enter__(self) -> ClockSampler:
        if self._handle is not None:
            self._thread = threading.Thread(target=self._run, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
