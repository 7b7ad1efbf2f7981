"""nys approx-error and the Nyström pseudo-inverse: ``attention.pinv_tolerance`` (iterate to a
residual instead of a fixed count), checked in float64 against an exact pinv, and the pinv
floor marked in the results (issue 29, item 4)."""

from __future__ import annotations

import pytest
import torch

from nyscli.attention import build_attention
from nyscli.attention.pinv import iterative_pinv
from nyscli.errors import UserInputError
from nyscli.experiments.approx_error import command as approx_error
from nyscli.experiments.approx_error import sources
from nyscli.experiments.approx_error.metrics import pinv_residual
from tests.test_approx_error import config


def landmark_kernel(**options) -> tuple[torch.Tensor, torch.nn.Module]:
    """A: (1, 2, 32, 32), float64, of a smooth n = 256 input (condition number ~1e3)."""
    inputs = sources.smooth(256, 16, 2, 1.0, 8.0, seed=0)
    core = build_attention({"name": "nystrom", "num_landmarks": 32, **options})
    _, a, _ = core.kernels(inputs.q, inputs.k)
    assert a.dtype == torch.float64
    return a, core


@pytest.mark.parametrize("tolerance", [1e-4, 1e-9])
def test_pinv_tolerance_reaches_the_residual_and_the_exact_pinv_in_float64(tolerance) -> None:
    a, core = landmark_kernel(pinv_tolerance=tolerance)
    exact = torch.linalg.pinv(a)
    z = core.pseudo_inverse(a)
    assert pinv_residual(a, z).max().item() <= tolerance
    six = iterative_pinv(a, core.pinv_iterations, core.pinv_init)  # the paper's 6 steps
    assert pinv_residual(a, six).max().item() > 0.01  # 6 steps stop short here (~0.03)
    distance = ((z - exact).norm() / exact.norm()).item()
    six_distance = ((six - exact).norm() / exact.norm()).item()
    assert distance < six_distance
    if tolerance <= 1e-9:
        assert distance < 1e-8  # converged: the exact pinv to float64 precision


def test_no_tolerance_keeps_the_fixed_iteration_count_bit_for_bit() -> None:
    a, core = landmark_kernel()
    assert core.pinv_tolerance is None
    assert torch.equal(core.pseudo_inverse(a), iterative_pinv(a, 6, "per_matrix"))


@pytest.mark.parametrize("bad", ["0", "1", "-0.1", "abc", "true", "[0.1]"])
def test_bad_pinv_tolerance_is_a_one_line_error(bad: str) -> None:
    with pytest.raises(UserInputError, match=r"attention.pinv_tolerance=.*number > 0 and < 1"):
        approx_error.validate(config(f"attention.pinv_tolerance={bad}"))
