"""Sequence pooling that respects padding: (B, n, dim), mask (B, n) -> (B, dim)."""

from __future__ import annotations

from torch import Tensor

from nyscli.models.choices import POOLINGS


def pool(x: Tensor, mask: Tensor, mode: str) -> Tensor:
    """``mean``: average over real tokens only; ``cls``: the first position (the [CLS] slot).

    x: (B, n, dim); mask: (B, n) bool, True = real token -> (B, dim). The reference LRA code
    averages over padded positions too; here padding never changes the result.
    """
    if mode == "cls":
        return x[:, 0]
    if mode == "mean":
        weights = mask.unsqueeze(-1).to(x.dtype)  # (B, n, 1)
        return (x * weights).sum(dim=1) / weights.sum(dim=1).clamp_min(1.0)
    raise ValueError(f"pooling={mode!r} is not allowed; choose one of: {', '.join(POOLINGS)}")
