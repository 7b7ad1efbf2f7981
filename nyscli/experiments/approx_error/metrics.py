"""Error measures between an approximation and exact softmax attention (pure functions, but
for a reused scratch buffer)."""

from __future__ import annotations

import functools
from collections.abc import Iterable

import torch
from torch import Tensor

# Nyström's pinv residual and its output error with an exact pinv sit beside its error: they
# tell whether the iterative pseudo-inverse, not the landmarks, sets the error (``PINV_FLOOR``).
METRICS = (
    "output_error",
    "exact_pinv_error",
    "pinv_residual",
    "matrix_error",
    "rowsum_deviation",
)
METRIC_LABELS = {
    "output_error": "‖SV−ŜV‖/‖SV‖",
    "exact_pinv_error": "… with exact pinv",
    "pinv_residual": "‖AZA−A‖/‖A‖",
    "matrix_error": "‖S−Ŝ‖/‖S‖",
    "rowsum_deviation": "mean |Ŝ1−1|",
}
# The pinv is the floor when an exact pinv would more than halve Nyström's output error.
PINV_FLOOR = 2.0
# An exact pinv this many times worse than the iterative one: a near-singular A in some heads.
PINV_UNSTABLE = 10.0


@functools.lru_cache(maxsize=4)
def _scratch(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """A buffer for ``relative_error``'s difference, reused: at n = 4,096 a fresh n x n
    difference per method and head costs more to allocate and fault in than to compute."""
    return torch.empty(shape, dtype=dtype, device=device)


def relative_error(approx: Tensor, exact: Tensor, exact_norm: Tensor | None = None) -> float:
    """||approx - exact||_F / ||exact||_F over all entries (shapes broadcast); ``exact_norm``,
    when given, is ||exact||_F (a head's S is measured against many approximations)."""
    return relative_error_of_blocks(
        [(approx, exact)], exact.norm() if exact_norm is None else exact_norm
    )


def relative_error_of_blocks(blocks: Iterable[tuple[Tensor, Tensor]], exact_norm: Tensor) -> float:
    """``relative_error`` of A against E given as matching blocks (A_i, E_i) that tile them,
    and exact_norm = ||E||_F: A need never exist whole (an implied n x n matrix, a block of
    columns at a time)."""
    norms = []
    with torch.no_grad():  # a measure, never trained through (and out= takes no grad)
        for approx, exact in blocks:
            shape = tuple(torch.broadcast_shapes(approx.shape, exact.shape))
            buffer = _scratch(shape, torch.result_type(approx, exact), exact.device)
            diff = torch.sub(approx, exact, out=buffer)  # the same values as approx - exact
            norms.append(diff.norm())
        total = norms[0] if len(norms) == 1 else torch.stack(norms).norm()
        return (total / exact_norm.clamp_min(torch.finfo(exact_norm.dtype).tiny)).item()


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
