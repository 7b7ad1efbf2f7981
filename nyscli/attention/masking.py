"""Small helpers shared by the cores for key-padding masks and numerically safe softmax."""

from __future__ import annotations

import torch
from torch import Tensor

from nyscli.attention.errors import AttentionConfigError

# Scores more than 80 below a query's largest are floored there before exp: CPU exp is 20-50x
# slower where float32 results turn denormal or underflow (and on -inf), and e^-80 ~ 1e-35
# of the largest weight changes nothing in any precision.
EXP_FLOOR = -80.0


def check_qkv(q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> None:
    """Validate the core interface: q, k, v (B, H, n, d) and mask (B, n) boolean."""
    if q.dim() != 4 or k.shape != q.shape or v.shape[:3] != q.shape[:3]:
        raise AttentionConfigError(
            "attention expects q, k, v of shape (batch, heads, n, head_dim); got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if key_padding_mask is not None:
        b, _, n, _ = q.shape
        if key_padding_mask.shape != (b, n) or key_padding_mask.dtype != torch.bool:
            raise AttentionConfigError(
                f"key_padding_mask must be a bool tensor of shape ({b}, {n}); got "
                f"{key_padding_mask.dtype} {tuple(key_padding_mask.shape)}"
            )


def masked_softmax(scores: Tensor, keep: Tensor | None) -> Tensor:
    """Softmax over the last dim that gives masked entries exactly zero weight.

    scores: (..., n_q, n_k); keep: bool, broadcastable to scores, True = attend.
    A row with nothing to attend to becomes all zeros instead of NaN.
    """
    if keep is None:
        return torch.softmax(scores, dim=-1)
    scores = scores.masked_fill(~keep, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1) * keep


def zero_padded(x: Tensor, key_padding_mask: Tensor | None) -> Tensor:
    """x: (B, H, n, d) with padded positions (mask False) set to zero."""
    if key_padding_mask is None:
        return x
    return x * key_padding_mask[:, None, :, None].to(x.dtype)
