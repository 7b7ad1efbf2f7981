"""Fitting the conv skip of a converted encoder to exact attention (nyscli.models.conv_fit)."""

from __future__ import annotations

import pytest
import torch

from nyscli.attention import build_attention
from nyscli.attention.multihead import ValueConvSkip
from nyscli.models.bert import BertConfig, BertEncoder
from nyscli.models.conv_fit import core_inputs, fit_conv_skips, shifted_values

TINY = {"dim": 16, "depth": 2, "num_heads": 2, "ffn_dim": 32, "max_len": 40, "norm": "post"}
VOCAB = 50


def tokens(lengths: list[int], width: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, VOCAB, (len(lengths), width), generator=gen)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    return ids * mask, mask, torch.zeros_like(ids)


@pytest.mark.parametrize("kernel", [5, 4])
def test_shifted_values_times_a_filter_is_the_conv_skip(kernel: int) -> None:
    torch.manual_seed(0)
    skip = ValueConvSkip(3, kernel).double()
    v = torch.randn(2, 3, 11, 4, dtype=torch.float64)
    mask = torch.arange(11)[None, :] < torch.tensor([11, 7])[:, None]
    expected = skip(v, mask)
    taps = shifted_values(v, mask, kernel)  # (B, H, n, d, k)
    got = torch.einsum("bhndk,hk->bhnd", taps, skip.conv.weight[:, 0, :, 0])
    assert torch.allclose(got, expected, atol=1e-14)


@torch.no_grad()
def relative_error(encoder: BertEncoder, layer: int, batches) -> float:
    """||exact - (core + skip)|| / ||exact|| over the real tokens of every batch, measured."""
    exact = build_attention({"name": "softmax"})
    attention = encoder.encoder.blocks[layer].attention
    residual = total = 0.0
    for batch in batches:
        q, k, v, mask = core_inputs(encoder, layer, batch)
        target = exact(q, k, v, mask)
        approx = attention.core(q, k, v, mask) + attention.conv_skip(v, mask)
        real = mask[:, None, :, None].double()
        residual += float(((target - approx) * real).square().sum())
        total += float((target * real).square().sum())
    return (residual / total) ** 0.5


def test_fit_is_the_least_squares_filter_and_reports_its_own_error() -> None:
    torch.manual_seed(0)
    attention = {"name": "nystrom", "num_landmarks": 4, "conv_kernel_size": 5}
    encoder = BertEncoder(BertConfig.create(vocab_size=VOCAB, attention=attention, **TINY)).double()
    for block in encoder.encoder.blocks:
        block.attention.conv_skip.init_for_conversion()
    batches = [tokens([24, 17], 24, seed=1), tokens([24, 9], 24, seed=2)]
    zero = relative_error(encoder.eval(), 0, batches)
    encoder.train()
    fits = fit_conv_skips(encoder, batches)
    assert encoder.training  # its mode is given back
    encoder.eval()
    assert len(fits) == 2 and fits[0].before == pytest.approx(zero, rel=1e-9)
    for layer, fit in enumerate(fits):
        measured = relative_error(encoder, layer, batches)
        assert fit.after == pytest.approx(measured, rel=1e-6)
        assert fit.after < fit.before
    # least squares: any other filter leaves a larger error
    weight = encoder.encoder.blocks[1].attention.conv_skip.conv.weight
    fitted = weight.detach().clone()
    for step in (1e-3, -1e-3):
        with torch.no_grad():
            weight.copy_(fitted + step * torch.randn_like(fitted))
        assert relative_error(encoder, 1, batches) > fits[1].after


def test_exact_core_needs_no_correction() -> None:
    torch.manual_seed(0)
    attention = {"name": "softmax", "conv_kernel_size": 3}
    encoder = BertEncoder(BertConfig.create(vocab_size=VOCAB, attention=attention, **TINY)).double()
    fits = fit_conv_skips(encoder, [tokens([20, 11], 20)])
    assert all(fit.before < 1e-12 and fit.after < 1e-12 for fit in fits)
    for block in encoder.encoder.blocks:
        assert block.attention.conv_skip.conv.weight.abs().max() < 1e-8
