"""Landmark selection for Nyström attention: segment means that respect padding."""

from __future__ import annotations

import torch
from torch import Tensor


def segment_means_matrix(
    n: int, m: int, key_padding_mask: Tensor | None, dtype: torch.dtype, device: torch.device
) -> tuple[Tensor, Tensor]:
    """Averaging matrix P (B or 1, m, n) with landmarks = P @ x, and which landmarks exist.

    The real tokens of each sequence, in order, are cut into m contiguous segments whose sizes
    differ by at most one (any n, divisible or not). Padded tokens get weight zero, so they never
    move a landmark. If a sequence has fewer than m real tokens, every token is its own segment
    and the remaining landmarks are empty; the returned bool (B or 1, m) marks the non-empty ones.
    """
    if key_padding_mask is None:
        real = torch.ones(1, n, dtype=torch.bool, device=device)
    else:
        real = key_padding_mask
    rank = real.long().cumsum(dim=1) - 1  # (B, n): position among the real tokens
    n_real = real.long().sum(dim=1, keepdim=True).clamp_min(1)  # (B, 1)
    segment = torch.div(rank.clamp_min(0) * m, n_real, rounding_mode="floor")  # (B, n)
    one_hot = torch.nn.functional.one_hot(segment, m).to(dtype) * real[..., None].to(dtype)
    membership = one_hot.transpose(1, 2)  # (B, m, n)
    counts = membership.sum(dim=-1, keepdim=True)  # (B, m, 1)
    return membership / counts.clamp_min(1), counts[..., 0] > 0


def segment_means(x: Tensor, m: int, key_padding_mask: Tensor | None) -> tuple[Tensor, Tensor | None]:
    """Landmarks (B, H, m, d) of x: (B, H, n, d), and the (B, m) mask of non-empty landmarks.

    Without padding and with m dividing n this is a reshape and mean (no extra memory); the mask
    is then None because every landmark exists.
    """
    b, h, n, d = x.shape
    if key_padding_mask is None and n % m == 0:
        return x.reshape(b, h, m, n // m, d).mean(dim=-2), None
    averaging, exists = segment_means_matrix(n, m, key_padding_mask, x.dtype, x.device)
    landmarks = averaging[:, None] @ x  # (B or 1, 1, m, n) @ (B, H, n, d)
    if key_padding_mask is None:
        return landmarks, None
    return landmarks, exists
