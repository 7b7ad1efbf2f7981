"""Which device to train on, and how much memory the run needed at its peak."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import resource
from pathlib import Path

import torch

from nyscli.errors import UserInputError

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda if available else cpu; ``cuda`` (or ``cuda:<i>``) without a GPU is a
    one-line error. The one device resolver of every command."""
    kind, _, index = name.partition(":")
    if kind not in DEVICES or (index and (kind != "cuda" or not index.isdigit())):
        raise UserInputError(f"device={name} is not allowed; choose one of: {', '.join(DEVICES)}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if kind == "cuda" and not torch.cuda.is_available():
        raise UserInputError(f"device={name} is not allowed here: no CUDA device; use cpu or auto")
    return torch.device(name)


def _peak_rss_kb() -> int | None:
    """The kernel's peak resident set of this process (VmHWM, KiB); None without /proc."""
    with contextlib.suppress(OSError, ValueError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return None


def reset_peak_memory(device: torch.device) -> None:
    """Start a new peak for :func:`peak_memory_mb`, so each run of a sweep that runs its jobs
    in one process reports its own: CUDA's allocator statistics; on CPU free heap pages go
    back to the OS and VmHWM restarts from the current RSS (``/proc/self/clear_refs``)."""
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        return
    release_free_heap()
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def peak_memory_mb(device: torch.device) -> float:
    """CUDA: peak allocated tensor memory; CPU: the process's peak resident set since the
    last :func:`reset_peak_memory` (VmHWM; ru_maxrss, the lifetime peak, without /proc)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    peak = _peak_rss_kb()
    if peak is None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # Linux reports KiB
    return peak / 1024


def _load_libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"))
        libc.malloc_trim  # noqa: B018 - glibc only; probing the symbol
    except (OSError, AttributeError, TypeError):
        return None
    return libc


_LIBC = _load_libc()


def release_free_heap() -> None:
    """Give the heap's free pages back to the OS (glibc ``malloc_trim``; elsewhere a no-op).

    With batch shapes that change every step (ListOps: 500-2000 tokens) glibc serves large
    tensors from a heap that fragments and is never returned: a 2-layer LRA model grew to
    8-13 GB of RSS. Trimming every few updates keeps it near the working set (0.34 GB against
    1.8 GB after 60 steps in a check, for ~4% more time; trimming every step cost ~40%).
    """
    if _LIBC is not None:
        _LIBC.malloc_trim(0)
