"""Error measures between an approximation and exact softmax attention (pure functions)."""

from __future__ import annotations

import torch
from torch import Tensor

METRICS = ("output_error", "matrix_error", "rowsum_deviation", "pinv_residual")
METRIC_LABELS = {
    "output_error": "‖SV−ŜV‖/‖SV‖",
    "matrix_error": "‖S−Ŝ‖/‖S‖",
    "rowsum_deviation": "mean |Ŝ1−1|",
    "pinv_residual": "‖AZA−A‖/‖A‖",
}


def relative_error(approx: Tensor, exact: Tensor) -> float:
    """||approx - exact||_F / ||exact||_F over all entries (both the same shape)."""
    return ((approx - exact).norm() / exact.norm().clamp_min(torch.finfo(exact.dtype).tiny)).item()


def rowsum_deviation(row_sums: Tensor) -> float:
    """Mean |r_i - 1| of the row sums r: (n,) of an attention matrix (0 for a stochastic one)."""
    return (row_sums - 1).abs().mean().item()


def pinv_residual(a: Tensor, z: Tensor) -> Tensor:
    """||A Z A - A||_F / ||A||_F per matrix: how far Z: (..., m, m) is from a pinv of A."""
    residual = (a @ z @ a - a).norm(dim=(-2, -1))
    return residual / a.norm(dim=(-2, -1)).clamp_min(torch.finfo(a.dtype).tiny)


def svd_tail_errors(singular_values: Tensor, ranks: list[int]) -> list[float]:
    """Relative Frobenius error of the best rank-r approximation (Eckart-Young), per rank.

    singular_values: (n,) in descending order; error(r) = sqrt(sum_{i>=r} s_i^2) / ||s||.
    """
    energy = singular_values.square().flip(0).cumsum(0).flip(0)  # energy[i] = sum_{j>=i} s_j^2
    total = energy[0]
    tail = torch.cat([energy, energy.new_zeros(1)])
    return [(tail[min(r, len(singular_values))] / total).sqrt().item() for r in ranks]
