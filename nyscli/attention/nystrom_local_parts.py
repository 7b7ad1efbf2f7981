"""What the Nyström-local hybrid's query blocks share (``Parts``), the band's weights as one
autograd node, and how many band entries it scores at a time per device."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from nyscli.attention import routing
from nyscli.attention.masking import EXP_FLOOR


def per_query(x: Tensor, y: Tensor) -> Tensor:
    """x: (B, H, nb, block, a) @ y: (B, H, a, c) -> (B, H, nb, block, c), as one product per
    head: broadcasting y over the blocks would copy it once per block."""
    b, h, nb, block, _ = x.shape
    return (x.reshape(b, h, nb * block, -1) @ y).view(b, h, nb, block, -1)


@dataclass
class Parts:
    """What every query chunk of one head group shares: Z = pinv(A') (B, H, m, m), B'
    (B, H, m, n), B' 1 (B, H, m, 1), B' on the heavy keys (B, H, m, g); 1 for the heavy keys
    that are real, else 0 (B, H, 1, 1, g), and the same as 0 / -inf to add to scores; keys
    [heavy keys; k~] (B, H, g + m, d) and values [heavy values; B' V] (B, H, g + m, d_v); 1 for
    the keys the band scores (real, not heavy), else 0 (B, H, n, 1); the band's shape (block,
    span) as 1 / 0 and as 0 / -inf; the routed keys' part of every query (None without
    routed keys)."""

    z: Tensor
    b_kernel: Tensor
    b_mass: Tensor
    heavy_b: Tensor
    heavy_real: Tensor
    heavy_bias: Tensor
    small_k: Tensor
    small_v: Tensor
    band_keys: Tensor
    shape: Tensor
    shape_bias: Tensor
    routed: routing.Routed | None = None


def to_bias(keep: Tensor, dtype: torch.dtype) -> Tensor:
    """0 where ``keep`` (bool), else -inf, in ``dtype``: masking scores by an add, ~30x faster
    on a CPU than masked_fill with a broadcast mask."""
    return torch.where(keep, 0.0, -math.inf).to(dtype)


# Band entries (queries x span x heads) scored at a time on a CPU: 0.5 MB of fp32 per chunk,
# so the band's temporaries stay a few MB at any n.
CPU_CHUNK_ENTRIES = 2**17
# A band of at most this many entries (4 MB of fp32; all heads) is scored in one go on a CPU.
CPU_SMALL_BAND = 2**20
# On a GPU every kernel launch costs microseconds whatever its size, so the CPU's sizes made the
# hybrid thousands of small launches (docs/results/gpu-notes.md, "the hybrid's CUDA chunks").
# There, chunks of 2^25 entries (128 MB fp32).
ACCELERATOR_CHUNK_ENTRIES = 2**25


def chunk_sizes(device: torch.device) -> tuple[int, int]:
    """(band entries scored per chunk, the largest band scored in one go) on ``device``."""
    if device.type == "cpu":
        return CPU_CHUNK_ENTRIES, CPU_SMALL_BAND
    return ACCELERATOR_CHUNK_ENTRIES, ACCELERATOR_CHUNK_ENTRIES


class BandWeights(torch.autograd.Function):
    """The band's weights w = (exp(max(s - shift, EXP_FLOOR)) - K~) * shape * key_ok (B, H, c,
    block, span), with a backward of three passes over the band: autograd's, through the ~8 kernels
    of the same expression, took 6-10 ms of a training step at n = 512 and 12 heads, this one
    2.5-4 (throw-away timing, 1 thread, loaded machine).

    scores: the band's masked scores (-inf off the band); kernel: K~ on each block's span;
    shift (no gradient: it cancels in the ratio); shape (block, span) and key_ok (B, H, c, 1,
    span): 1 on the band's entries, else 0.
    The floor is treated as the identity in the backward: it only moves weights below e^-80
    of a query's largest, whose gradients are as small. Without a backward to follow
    (``in_place``) scores and kernel are overwritten instead of new buffers made.
    """

    @staticmethod
    def forward(
        ctx: Any,
        scores: Tensor,
        kernel: Tensor,
        shift: Tensor,
        shape: Tensor,
        key_ok: Tensor,
        in_place: bool,
    ) -> Tensor:
        if in_place:
            e = scores.sub_(shift).clamp_min_(EXP_FLOOR).exp_()
            return kernel.neg_().add_(e).mul_(shape).mul_(key_ok)
        e = (scores - shift).clamp_min_(EXP_FLOOR).exp_()
        ctx.save_for_backward(e, shape, key_ok)
        return (e - kernel).mul_(shape).mul_(key_ok)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        e, shape, key_ok = ctx.saved_tensors
        on_band = (grad * shape).mul_(key_ok)
        return on_band * e, on_band.neg_(), None, None, None, None
