"""Learning-rate schedules: linear warm-up, then linear decay (or constant)."""

from __future__ import annotations

from torch.optim import Optimizer
from torch.optim.lr_scheduler import LambdaLR


def warmup_decay_factor(step: int, warmup: int, total: int, decay: str, min_ratio: float) -> float:
    """Multiplier of the peak lr for the update number ``step`` (0-based).

    Warm-up rises linearly from 1/warmup to 1 over ``warmup`` updates; ``linear`` decay then
    falls to ``min_ratio`` at ``total``; ``constant`` stays at 1.
    """
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    if decay == "constant":
        return 1.0
    remaining = max(total - warmup, 1)
    progress = min(max(step - warmup, 0) / remaining, 1.0)
    return min_ratio + (1.0 - min_ratio) * (1.0 - progress)


def build_scheduler(
    optimizer: Optimizer, warmup: int, total: int, decay: str = "linear", min_ratio: float = 0.0
) -> LambdaLR:
    """A LambdaLR stepping once per optimizer update (its state is saved in checkpoints)."""
    return LambdaLR(
        optimizer, lambda step: warmup_decay_factor(step, warmup, total, decay, min_ratio)
    )
