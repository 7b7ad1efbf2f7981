"""Which device to train on, how many CPU threads, and how much memory the run needed at its
peak."""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import logging
import os
import resource
import time
from pathlib import Path

import torch

from nyscli.console import FILE_ONLY
from nyscli.errors import UserInputError
from nyscli.train.config import DEVICES

log = logging.getLogger("nys")


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


# How long the CPU counters are watched before a run picks its threads: 10 ticks of the kernel's
# 100 Hz clock on each core, enough to tell a busy core from an idle one, and short beside
# torch's import.
_BUSY_SAMPLE_S = 0.1
_PROC_STAT = Path("/proc/stat")


@functools.cache
def _torch_default_threads() -> int:
    """torch's own thread count, read once, before a job first changes it."""
    return torch.get_num_threads()


def usable_cores() -> set[int]:
    """The cores this process may run on (its affinity; all of them where there is none)."""
    cores = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else None
    return cores or set(range(os.cpu_count() or 1))


def _core_ticks(cores: set[int]) -> dict[int, tuple[int, int]] | None:
    """{core: (all ticks, idle ticks)} from /proc/stat for the given cores; None without it."""
    ticks = {}
    try:
        lines = _PROC_STAT.read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        name, *fields = line.split()
        if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cores:
            continue
        values = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
        ticks[int(name[3:])] = (sum(values), values[3] + values[4])
    return ticks or None


def busy_cores(cores: set[int], sample_s: float = _BUSY_SAMPLE_S) -> float:
    """How many of ``cores`` other work keeps busy now (0 to len(cores)): their busy share over
    ``sample_s`` from /proc/stat, while this process sleeps; the 1-minute load average where
    there is no /proc (it lags a job that just started or ended)."""
    before = _core_ticks(cores)
    if before is None:
        return min(float(len(cores)), os.getloadavg()[0]) if hasattr(os, "getloadavg") else 0.0
    time.sleep(sample_s)
    after = _core_ticks(cores) or {}
    busy = 0.0
    for core, (total, idle) in after.items():
        elapsed = total - before.get(core, (total, idle))[0]
        if elapsed > 0:
            busy += 1 - (idle - before[core][1]) / elapsed
    return busy


def resolve_threads(threads: int | None) -> int:
    """The CPU threads a run uses, set for torch's intra-op pool and returned.

    ``threads`` as set, or for ``None`` torch's default less the cores other work keeps
    busy right now (at least 1). A torch op on a CPU splits over its threads and waits for
    all of them; a thread that shares its core with a busy process is descheduled for a time
    slice at every op, which made Nyström-64's module forward 1.4-1.7x slower at 2 threads
    than at 1 beside one busy process on 2 cores (docs/results/table1.md, "A busy machine").
    """
    if threads:
        torch.set_num_threads(int(threads))
        return int(threads)
    default = chosen = _torch_default_threads()
    if default > 1:
        cores = usable_cores()
        busy = round(busy_cores(cores))
        chosen = max(1, min(default, len(cores) - busy))
        if chosen < default:
            log.info(
                "threads: %d of %d (other work keeps %d core(s) busy; threads=%d uses all)",
                chosen,
                default,
                busy,
                default,
                extra={FILE_ONLY: True},  # the console's bench caption says "1 thread(s)"
            )
    torch.set_num_threads(chosen)
    return chosen


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
