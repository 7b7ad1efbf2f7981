"""Dropout with fast CPU masks: 16-bit draws from NumPy's PCG64, seeded from torch's generator.

PyTorch's CPU dropout draws every keep/drop decision with ``bernoulli_`` on one thread: on a
ListOps batch (32 x 2000 x 64 activations, 2 cores) that took ~40 ms a call, 22% of a Nyström
training step and the largest single cost after the matmuls. Drawing 16 random bits per element
with PCG64 and comparing them with a threshold takes ~4 ms (each 64-bit PCG64 output is cut
into four 16-bit draws: ``random_raw`` skips ``integers``' per-draw range handling). The mask is
kept as 0/1 bytes, not bools: torch multiplies a float tensor by a uint8 one ~5x faster than by
a bool one (1.8 vs 10 ms at that shape), in forward and backward. The drop probability is then
p rounded to a multiple of 2^-16 (0.1 becomes 0.1000061), and the kept values are scaled by
1 / (1 - that p), so the expectation is exactly the input's. Each mask's seed is drawn from
torch's default generator, so ``torch.manual_seed`` makes runs repeat as before. On other
devices this is ``F.dropout``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

LEVELS = 1 << 16  # mask resolution: p is rounded to a multiple of 1 / LEVELS


def drop_threshold(p: float) -> int:
    """Draws below this of LEVELS are dropped: the effective probability is threshold / LEVELS."""
    return round(p * LEVELS)


def draw_seed() -> int:
    """A mask seed from torch's default generator (so ``torch.manual_seed`` repeats runs)."""
    return int(torch.randint(0, 2**62, (), dtype=torch.int64))


def seeded_keep_mask(
    shape: tuple[int, ...],
    p: float,
    seed: int | tuple[int, ...],
    device: torch.device | None = None,
    dtype: torch.dtype = torch.uint8,
) -> Tensor:
    """(shape) 0/1 of ``dtype``, 1 = kept, each independently with probability
    1 - threshold / LEVELS, the same for the same ``seed`` (an int or a tuple of ints, e.g.
    (seed, block)): on the CPU from PCG64's 16-bit draws, elsewhere from a torch generator on
    ``device``. A float mask is made by NumPy: multiplying by it is ~5x faster than by a
    uint8 one, whose conversion torch does on one thread inside the ``mul``."""
    if device is not None and torch.device(device).type != "cpu":
        key = seed if isinstance(seed, int) else hash(tuple(seed)) & (2**62 - 1)
        generator = torch.Generator(device).manual_seed(key)
        draws = torch.rand(shape, generator=generator, device=device)
        return (draws >= drop_threshold(p) / LEVELS).to(dtype)
    count = math.prod(shape)
    raw = np.random.default_rng(seed).bit_generator.random_raw(-(-count // 4))
    kept = raw.view(np.uint16)[:count].reshape(tuple(shape)) >= drop_threshold(p)
    if dtype == torch.uint8:
        return torch.from_numpy(kept).view(torch.uint8)
    if dtype in (torch.float32, torch.float64):
        return torch.from_numpy(kept.astype(np.float32 if dtype == torch.float32 else np.float64))
    return torch.from_numpy(kept).to(dtype)


def cpu_keep_mask(shape: torch.Size, p: float) -> Tensor:
    """(shape) uint8, 1 = kept, each independently with probability 1 - threshold / LEVELS."""
    return seeded_keep_mask(tuple(shape), p, draw_seed())


class _MaskAndScale(torch.autograd.Function):
    """x * keep * scale, saving only the 0/1 uint8 mask (1 byte an element) for backward."""

    @staticmethod
    def forward(ctx: Any, x: Tensor, keep: Tensor, scale: float) -> Tensor:
        ctx.save_for_backward(keep)
        ctx.scale = scale
        return x.mul(keep).mul_(scale)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        (keep,) = ctx.saved_tensors
        return grad.mul(keep).mul_(ctx.scale), None, None


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Inverted dropout of x (any shape): identity unless ``training`` and p > 0."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or not x.is_floating_point():
        return F.dropout(x, p, training=True)
    threshold = drop_threshold(p)
    if threshold >= LEVELS:
        return x * 0.0
    keep = cpu_keep_mask(x.shape, p)
    return _MaskAndScale.apply(x, keep, LEVELS / (LEVELS - threshold))


class Dropout(nn.Module):
    """``nn.Dropout`` with :func:`dropout`'s fast CPU masks; same argument and state dict."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
