"""The fast CPU dropout: its drop rate, scaling, gradient and seeding, against the formulas."""

from __future__ import annotations

import math

import pytest
import torch

from nyscli.attention.dropout import LEVELS, Dropout, drop_threshold, dropout


def test_drops_at_the_rounded_rate_and_scales_the_rest_exactly() -> None:
    torch.manual_seed(0)
    x = torch.rand(1_000_000, dtype=torch.float64) + 0.5  # no zeros: a zero output = dropped
    p = 0.1
    dropped_p = drop_threshold(p) / LEVELS
    assert abs(dropped_p - p) <= 0.5 / LEVELS
    out = dropout(x, p, training=True)
    kept = out != 0
    scale = 1.0 / (1.0 - dropped_p)
    torch.testing.assert_close(out[kept], x[kept] * scale, rtol=1e-15, atol=0)
    # The kept count is binomial: within 5 standard deviations of its mean.
    n = x.numel()
    sd = math.sqrt(n * dropped_p * (1 - dropped_p))
    assert abs(int(kept.sum()) - n * (1 - dropped_p)) < 5 * sd
    # Inverted dropout keeps the expectation: mean within 5 standard errors.
    assert abs(float(out.mean() - x.mean())) < 5 * float(out.std()) / math.sqrt(n)


def test_gradient_is_the_same_mask_and_scale() -> None:
    torch.manual_seed(1)
    x = (torch.rand(64, 33, dtype=torch.float64) + 0.5).requires_grad_()
    out = dropout(x, 0.3, training=True)
    upstream = torch.randn_like(out)
    out.backward(upstream)
    scale = LEVELS / (LEVELS - drop_threshold(0.3))
    torch.testing.assert_close(x.grad, upstream * (out != 0) * scale, rtol=1e-15, atol=0)


def test_torch_seed_repeats_the_masks_and_a_new_seed_changes_them() -> None:
    x = torch.ones(4096)
    torch.manual_seed(7)
    first = dropout(x, 0.5, training=True)
    torch.manual_seed(7)
    again = dropout(x, 0.5, training=True)
    torch.manual_seed(8)
    other = dropout(x, 0.5, training=True)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_identity_in_eval_or_at_zero_and_zeros_at_one() -> None:
    x = torch.randn(5, 7)
    assert dropout(x, 0.4, training=False) is x
    assert dropout(x, 0.0, training=True) is x
    assert torch.equal(dropout(x, 1.0, training=True), torch.zeros_like(x))
    module = Dropout(0.4).eval()
    assert module(x) is x
    assert module.state_dict() == {}


def test_keeps_dtype_and_non_contiguous_layout_values() -> None:
    torch.manual_seed(2)
    base = torch.rand(8, 16, 4) + 0.5
    x = base.transpose(0, 1).to(torch.bfloat16)
    out = dropout(x, 0.2, training=True)
    assert out.dtype == torch.bfloat16 and out.shape == x.shape
    kept = out != 0
    scale = LEVELS / (LEVELS - drop_threshold(0.2))
    torch.testing.assert_close(out[kept], (x[kept].float() * scale).to(torch.bfloat16))


@pytest.mark.parametrize("p", [-0.1, 1.5])
def test_bad_probability_is_refused(p: float) -> None:
    with pytest.raises(ValueError, match=str(p)):
        Dropout(p)


def test_neighbouring_decisions_are_independent() -> None:
    # Four neighbouring draws share one 64-bit PCG64 output: each pair of neighbours must still
    # be dropped together at p^2, and the mask must not repeat with period 4.
    torch.manual_seed(3)
    p = 0.25
    dropped = dropout(torch.ones(2_000_000), p, training=True) == 0
    dropped_p = drop_threshold(p) / LEVELS
    for lag in (1, 2, 3, 4):
        both = (dropped[:-lag] & dropped[lag:]).double().mean().item()
        n = dropped.numel() - lag
        sd = math.sqrt(dropped_p**2 * (1 - dropped_p**2) / n)
        assert abs(both - dropped_p**2) < 5 * sd, (lag, both)
