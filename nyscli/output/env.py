"""What machine and software produced a run: written to every run folder as env.json."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

from nyscli.allocator import active
from nyscli.attention.gpu import gates


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str | None:
    """The commit of the nys checkout, with "+dirty" if it has uncommitted changes."""
    repo = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+dirty" if dirty else "")


def collect_env(
    device: str = "cpu", threads: int | None = None, allocator: str | None = None
) -> dict[str, Any]:
    """torch version, device, CPU/GPU model, threads, git commit, Python and platform.

    ``device="auto"`` is recorded as the device it resolves to; ``threads`` (a run's
    ``threads`` setting) is recorded instead of this process's torch default when given;
    ``allocator`` likewise instead of this process's (a command that measures in worker
    processes of its own).
    """
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    info: dict[str, Any] = {
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "device": device,
        "cpu_model": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": int(threads) if threads else torch.get_num_threads(),
        "cuda_available": torch.cuda.is_available(),
        "git_commit": git_commit(),
        # tcmalloc or glibc's malloc moves CPU training speed and peak memory (allocator.py).
        "allocator": allocator or active(),
        # which attention paths may run (NYS_GPU_CHECKED, NYS_HYBRID_LAUNCH, the interpreter)
        "gates": gates.current().record(),
    }
    if torch.cuda.is_available():
        info["gpu_model"] = torch.cuda.get_device_name(0)
        info["cuda_version"] = torch.version.cuda
    return info
