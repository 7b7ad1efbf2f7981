"""Honest peak-memory measurement of one call, on CPU (peak RSS) and CUDA (allocator stats).

CPU: the caller runs each measurement in a fresh process. Before the call we collect garbage,
return freed heap pages to the OS (``malloc_trim``) and reset the kernel's peak-RSS counter by
writing 5 to /proc/self/clear_refs; the peak is VmHWM after the call minus RSS before it.
CUDA: ``max_memory_allocated`` after ``reset_peak_memory_stats``, minus what was allocated
before the call (inputs and weights).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc
from collections.abc import Callable
from pathlib import Path

import torch

MB = 1024 * 1024


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def _release_free_heap() -> None:
    gc.collect()
    # Without glibc the peak is still right, only less tight.
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


def cpu_peak_mb(call: Callable[[], object]) -> float:
    """Peak resident memory (MB) that ``call()`` adds above the process's RSS before it."""
    _release_free_heap()
    Path("/proc/self/clear_refs").write_text("5")
    before = _status_kb("VmRSS")
    result = call()
    peak = _status_kb("VmHWM")
    del result
    return (peak - before) * 1024 / MB


def cuda_peak_mb(call: Callable[[], object], device: torch.device) -> float:
    """Peak CUDA memory (MB) allocated by ``call()`` above what was allocated before it."""
    torch.cuda.synchronize(device)
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    result = call()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    del result
    return (peak - before) / MB


def peak_mb(call: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        return cuda_peak_mb(call, device)
    return cpu_peak_mb(call)
