"""Which device to train on, and how much memory the run needed at its peak."""

from __future__ import annotations

import resource

import torch

from nyscli.errors import UserInputError

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(name: str) -> torch.device:
    """``auto`` -> cuda if available else cpu; ``cuda`` without a GPU is a one-line error."""
    if name not in DEVICES:
        raise UserInputError(f"device={name} is not allowed; choose one of: {', '.join(DEVICES)}")
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise UserInputError("device=cuda is not allowed here: no CUDA device; use cpu or auto")
    return torch.device(name)


def peak_memory_mb(device: torch.device) -> float:
    """CUDA: peak allocated tensor memory; CPU: the process's peak resident set (ru_maxrss)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB
