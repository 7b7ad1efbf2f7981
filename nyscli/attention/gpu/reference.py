"""The plain torch functions the GPU ops are held to (in float64 by ``tests/gpu/``).

Each computes what its op computes, with the core's own building blocks and autograd, so a
kernel's output and every gradient can be compared with it at any dtype. The hybrid's
reference is its core's torch path (``NystromLocalAttention.approximate``).
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor

from nyscli.attention import pinv
from nyscli.attention.masking import masked_softmax


def landmark_kernel(q_land: Tensor, k_land: Tensor, exists: Tensor | None) -> Tensor:
    """A = softmax(q~ k~^T / sqrt(d)): (B, H, m, m), empty landmarks' rows and columns zero."""
    land_cols = None if exists is None else exists[:, None, None, :]
    scores = q_land @ k_land.transpose(-1, -2) / math.sqrt(q_land.shape[-1])
    a = masked_softmax(scores, land_cols)
    return a if exists is None else a * exists[:, None, :, None].to(a.dtype)


def landmark_weights(
    q_land: Tensor, k_land: Tensor, bv: Tensor, exists: Tensor | None, iterations: int
) -> Tensor:
    """``landmark.landmark_weights``: W = pinv(A) bv, (B, H, m, d), the iterative pinv from
    its per-matrix start."""
    a = landmark_kernel(q_land, k_land, exists)
    return pinv.iterative_pinv(a, iterations) @ bv


def nystrom_inference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    landmarks: tuple[Tensor, Tensor, Tensor | None],
    key_padding_mask: Tensor | None,
    iterations: int,
) -> Tensor:
    """``inference.nystrom_inference`` (its landmarks q~, k~, exists as one tuple):
    softmax(q k~^T/√d) pinv(A) softmax(q~ k^T/√d) V, (B, H, n, d), padded keys and empty
    landmarks left out (a sequence with no landmark gets zeros)."""
    q_land, k_land, exists = landmarks
    token_keep = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
    bv = F.scaled_dot_product_attention(q_land, k, v, attn_mask=token_keep)
    if exists is not None:
        bv = bv * exists[:, None, :, None].to(bv.dtype)
    w = landmark_weights(q_land, k_land, bv, exists, iterations)
    land_keep = None
    if exists is not None:
        land_keep = (exists | ~exists.any(dim=1, keepdim=True))[:, None, None, :]
    return F.scaled_dot_product_attention(q, k_land, w.to(q.dtype), attn_mask=land_keep)
