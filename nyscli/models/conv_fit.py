"""Fit the conv skips of a converted encoder to what its new attention core misses.

A softmax checkpoint converted to Nyström (or any core) with a conv skip starts with zero
filters (``ValueConvSkip.init_for_conversion``): the skip adds nothing until training finds a
use for it. Fitted instead, each layer's per-head filter is the least-squares fit of
(exact softmax attention - the core's output) from V, over the real tokens of calibration
batches: the skip starts as the best local correction of the approximation. The error it
leaves is local-in-position only where the attention is: heads that attend to a neighbour
gain most, content-driven heads little.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from nyscli.attention import build_attention
from nyscli.attention.masking import zero_padded
from nyscli.attention.multihead import window_left
from nyscli.models.bert import BertEncoder

RIDGE = 1e-6  # relative to the Gram matrix's mean diagonal: keeps all-zero taps solvable


@dataclass(frozen=True)
class LayerFit:
    """One layer's relative output error ||exact - approx|| / ||exact|| over the calibration
    tokens, with the zero filter (``before``) and the fitted one (``after``)."""

    before: float
    after: float


def shifted_values(v: Tensor, key_padding_mask: Tensor | None, kernel_size: int) -> Tensor:
    """v: (B, H, n, d) -> (B, H, n, d, k): tap j holds v[i + j - (k-1)//2] (zero outside the
    sequence and at padding), so that ``ValueConvSkip`` with filter w gives (this @ w)."""
    v = zero_padded(v, key_padding_mask)
    left = window_left(kernel_size)
    padded = F.pad(v, (0, 0, left, kernel_size - 1 - left))
    return padded.unfold(2, kernel_size, 1)


class _Captured(Exception):
    """Raised by the capture hook: the rest of the forward is not needed."""


def core_inputs(
    encoder: BertEncoder, layer: int, batch: tuple[Tensor, Tensor, Tensor | None]
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """q, k, v (B, H, n, d) and the (B, n) mask that block ``layer``'s core reads for ``batch``
    (ids, mask, segments); the blocks after it are not run."""
    captured: list[Tensor] = []

    def keep(_module: torch.nn.Module, args: tuple[Tensor, ...]) -> None:
        captured.extend(args[:4])
        raise _Captured

    device = encoder.token_embeddings.weight.device
    handle = encoder.encoder.blocks[layer].attention.core.register_forward_pre_hook(keep)
    try:
        encoder(*(None if t is None else t.to(device) for t in batch))
    except _Captured:
        pass
    finally:
        handle.remove()
    q, k, v, mask = captured
    return q, k, v, mask


@torch.no_grad()
def fit_conv_skips(
    encoder: BertEncoder, batches: Iterable[tuple[Tensor, Tensor, Tensor | None]]
) -> list[LayerFit]:
    """Set every block's conv-skip filter (H, 1, k, 1) to its least-squares fit, layer by
    layer, each on the inputs the layers already fitted hand it; returns the fit per layer.

    batches: (ids (B, n), mask (B, n) bool, segments (B, n) or None), re-iterable. Normal
    equations per head in float64 (k x k); the encoder is left in the mode it was in.
    """
    batches = list(batches)
    exact = build_attention({"name": "softmax"})
    training = encoder.training
    encoder.eval()  # dropout off: the fit is of the model, not of one dropout draw
    fits = []
    try:
        for layer, block in enumerate(encoder.encoder.blocks):
            fits.append(_fit_layer(encoder, layer, block.attention, exact, batches))
    finally:
        encoder.train(training)
    return fits


def _fit_layer(
    encoder: BertEncoder,
    layer: int,
    attention: torch.nn.Module,
    exact: torch.nn.Module,
    batches: list[tuple[Tensor, Tensor, Tensor | None]],
) -> LayerFit:
    """Fit one block's skip: accumulate the normal equations over all real tokens, solve."""
    skip = attention.conv_skip
    heads, size = skip.conv.weight.shape[0], skip.kernel_size
    float64 = {"dtype": torch.float64, "device": skip.conv.weight.device}
    gram = torch.zeros(heads, size, size, **float64)
    cross = torch.zeros(heads, size, **float64)
    residual_sq = exact_sq = 0.0
    for batch in batches:
        q, k, v, mask = core_inputs(encoder, layer, batch)
        target = exact(q, k, v, mask)
        residual = zero_padded((target - attention.core(q, k, v, mask)).double(), mask)
        for one in range(v.shape[0]):  # one sequence at a time: the taps are k copies of v
            row = None if mask is None else mask[one : one + 1]
            taps = shifted_values(v[one : one + 1].double(), row, size)  # (1, H, n, d, k)
            if row is not None:  # the taps of padded query rows leave the fit too
                taps = taps * row[:, None, :, None, None].double()
            taps = taps[0].flatten(1, 2)  # (H, n*d, k)
            gram += taps.transpose(1, 2) @ taps
            cross += (taps.transpose(1, 2) @ residual[one].flatten(1, 2).unsqueeze(-1))[..., 0]
        residual_sq += float(residual.square().sum())
        exact_sq += float(zero_padded(target.double(), mask).square().sum())
    ridge = RIDGE * gram.diagonal(dim1=1, dim2=2).mean(-1).clamp_min(1e-30)
    eye = torch.eye(size, **float64)
    filters = torch.linalg.solve(gram + ridge[:, None, None] * eye, cross)  # (H, k)
    explained = 2 * (filters * cross).sum() - torch.einsum("hi,hij,hj->", filters, gram, filters)
    skip.conv.weight.copy_(filters.to(skip.conv.weight.dtype)[:, None, :, None])
    scale = max(exact_sq, 1e-30)
    after = max(residual_sq - float(explained), 0.0)
    return LayerFit(before=(residual_sq / scale) ** 0.5, after=(after / scale) ** 0.5)
