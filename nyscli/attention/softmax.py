"""Exact softmax attention: PyTorch's fused SDPA and the explicit n x n version."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from nyscli.attention.core import CausalOnlyCore
from nyscli.attention.masking import check_qkv, masked_softmax
from nyscli.attention.registry import register


def keep_mask(
    key_padding_mask: Tensor | None, n: int, causal: bool, device: torch.device
) -> Tensor | None:
    """Bool (B or 1, 1, n or 1, n): True where query i may attend key j."""
    keep = None
    if key_padding_mask is not None:
        keep = key_padding_mask[:, None, None, :]
    if causal:
        tril = torch.ones(n, n, dtype=torch.bool, device=device).tril()[None, None]
        keep = tril if keep is None else keep & tril
    return keep


@register("softmax")
class SoftmaxAttention(CausalOnlyCore):
    """Exact attention through ``torch.nn.functional.scaled_dot_product_attention``.

    PyTorch picks a fused (flash / memory-efficient) kernel where it can, so memory is O(n)
    without a mask; with a mask it may fall back to the math kernel.
    """

    def label(self) -> str:
        return "softmax (SDPA)"

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        """q, k, v: (B, H, n, d); key_padding_mask: (B, n), True = real token -> (B, H, n, d)."""
        check_qkv(q, k, v, key_padding_mask)
        if key_padding_mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)
        keep = keep_mask(key_padding_mask, q.shape[2], self.causal, q.device)
        # Padded queries would see an all-False row only if the sequence is empty; attending to
        # themselves keeps such rows finite instead of NaN.
        empty = ~key_padding_mask.any(dim=1)
        if empty.any():
            keep = keep | empty[:, None, None, None]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep)


@register("softmax_naive")
class NaiveSoftmaxAttention(CausalOnlyCore):
    """Exact attention with the n x n matrix written out (the paper's "Transformer" row)."""

    def label(self) -> str:
        return "softmax_naive"

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        """q, k, v: (B, H, n, d); key_padding_mask: (B, n), True = real token -> (B, H, n, d)."""
        check_qkv(q, k, v, key_padding_mask)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, n, n)
        keep = keep_mask(key_padding_mask, q.shape[2], self.causal, q.device)
        return masked_softmax(scores, keep) @ v
