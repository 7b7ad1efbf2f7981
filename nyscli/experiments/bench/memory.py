"""Honest peak-memory measurement of one call, on CPU (peak RSS) and CUDA (allocator stats).

CPU: the caller runs each measurement in a fresh process. Before the call we collect garbage,
return freed heap pages to the OS (``malloc_trim``) and reset the kernel's peak-RSS counter by
writing 5 to /proc/self/clear_refs; the peak is VmHWM after the call minus RSS before it.
``warm_peak_mb`` runs the warm-up calls and the measured one with every allocation of 128 KiB
or more in its own mapping, so a freed tensor leaves RSS at once and the peak counts the
tensors alive together. With glibc's default, freed blocks stay in its heap and are handed out
again, and the peak depends on how the heap happened to be cut up: Nyström-64 training at
n = 8192 read 158 to 206 MB in four runs of the same point; now 120-122 MB, as its tensors add
up to.
CUDA: ``max_memory_allocated`` after ``reset_peak_memory_stats``, minus what was allocated
before the call (inputs and weights).
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import gc
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

MB = 1024 * 1024


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


# mallopt parameters (malloc.h) and the values glibc adapts to on its own once large blocks
# have been freed (its maximum mmap threshold on 64-bit, and twice that for trimming).
M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3
OWN_MAPPING_BYTES = 128 * 1024
STEADY_MMAP_BYTES, STEADY_TRIM_BYTES = 32 * MB, 64 * MB


@functools.cache
def _glibc() -> ctypes.CDLL | None:
    # Without glibc the peak is still right, only less tight.
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def _release_free_heap() -> None:
    gc.collect()
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


@contextlib.contextmanager
def own_mappings() -> Iterator[None]:
    """Allocations of 128 KiB or more get their own mappings inside the block; afterwards
    glibc's thresholds are where its own adaptation takes them in a long job."""
    libc = _glibc()
    if libc is None:
        yield
        return
    libc.mallopt(M_MMAP_THRESHOLD, OWN_MAPPING_BYTES)
    try:
        yield
    finally:
        libc.mallopt(M_MMAP_THRESHOLD, STEADY_MMAP_BYTES)
        libc.mallopt(M_TRIM_THRESHOLD, STEADY_TRIM_BYTES)


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


def warm_peak_mb(call: Callable[[], object], device: torch.device, warmup: int) -> float:
    """Run ``call`` ``warmup`` times, then return the peak memory (MB) of one more call, plus
    on CUDA what the warm-up left allocated (a core's CUDA graph keeps its output buffer)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        for _ in range(warmup):
            call()
        torch.cuda.synchronize(device)
        gc.collect()
        kept = max(0, torch.cuda.memory_allocated(device) - before)
        return cuda_peak_mb(call, device) + kept / MB
    with own_mappings():  # from the first call on, or blocks freed before stay in the heap
        for _ in range(warmup):
            call()
        return cpu_peak_mb(call)
