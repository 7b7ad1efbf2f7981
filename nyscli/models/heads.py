"""Classification heads: pooled vectors -> logits."""

from __future__ import annotations

import torch
from torch import Tensor, nn


class ClassifierHead(nn.Module):
    """(B, in_dim) -> (B, num_classes) through Linear -> ReLU -> Linear (as the LRA code)."""

    def __init__(self, in_dim: int, hidden: int, num_classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_dim, hidden), nn.ReLU(), nn.Linear(hidden, num_classes)
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class DualHead(nn.Module):
    """Two pooled vectors x0, x1 (B, dim) -> logits from ``[x0, x1, x0*x1, x0-x1]`` (B, 4 dim)."""

    def __init__(self, dim: int, hidden: int, num_classes: int) -> None:
        super().__init__()
        self.classifier = ClassifierHead(4 * dim, hidden, num_classes)

    @staticmethod
    def features(x0: Tensor, x1: Tensor) -> Tensor:
        return torch.cat([x0, x1, x0 * x1, x0 - x1], dim=-1)

    def forward(self, x0: Tensor, x1: Tensor) -> Tensor:
        return self.classifier(self.features(x0, x1))
