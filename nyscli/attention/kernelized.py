"""Attention through a positive feature map: phi(Q) (phi(K)^T V) normalised by phi(Q) phi(K)^T 1.

Shared by the linear (ELU+1) and Performer (FAVOR+) cores. Cost O(n m d) for m features; the
causal form uses prefix sums over fixed-size chunks, so memory stays O(n (m + chunk) + n/chunk m d)
instead of the O(n m d) of a per-token cumulative sum.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

# Queries per chunk in the causal form: inside a chunk the (chunk x chunk) masked product is
# cheaper than carrying an (m x d) state for every token.
CAUSAL_CHUNK = 128


def kernelized_attention(phi_q: Tensor, phi_k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """out_i = sum_j (phi_q_i . phi_k_j) v_j / sum_j (phi_q_i . phi_k_j) over allowed j.

    phi_q, phi_k: (B, H, n, m) non-negative features, with padded keys' rows already zero;
    v: (B, H, n, d) -> (B, H, n, d). ``causal`` restricts query i to keys j <= i. A query whose
    normaliser is zero (no real key) gets a zero output rather than NaN.
    """
    if causal:
        numerator, normaliser = _causal_sums(phi_q, phi_k, v)
    else:
        numerator = phi_q @ (phi_k.transpose(-1, -2) @ v)  # (B, H, n, d) via an (m, d) state
        normaliser = phi_q @ phi_k.sum(dim=-2)[..., None]  # (B, H, n, 1)
    tiny = torch.finfo(normaliser.dtype).tiny
    return numerator / normaliser.clamp_min(tiny)


def _exclusive_cumsum(x: Tensor, dim: int) -> Tensor:
    """Sum of the entries strictly before each index along ``dim`` (the first gets zero)."""
    head = torch.zeros_like(x.narrow(dim, 0, 1))
    return torch.cat([head, x.narrow(dim, 0, x.shape[dim] - 1).cumsum(dim)], dim=dim)


def _causal_sums(phi_q: Tensor, phi_k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Causal numerator (B, H, n, d) and normaliser (B, H, n, 1), chunk by chunk.

    Keys in earlier chunks reach a query through the prefix sum of the per-chunk states
    phi_k^T V; keys in its own chunk through the explicitly masked (chunk x chunk) product.
    """
    b, h, n, m = phi_q.shape
    d = v.shape[-1]
    chunk = min(CAUSAL_CHUNK, n)
    n_chunks = -(-n // chunk)
    extra = n_chunks * chunk - n
    # Zero features for the filler positions: they add nothing to any sum. (F.pad would copy
    # even when there is nothing to add.)
    qc, kc, vc = (F.pad(x, (0, 0, 0, extra)) if extra else x for x in (phi_q, phi_k, v))
    qc = qc.reshape(b, h, n_chunks, chunk, m)
    kc = kc.reshape(b, h, n_chunks, chunk, m)
    vc = vc.reshape(b, h, n_chunks, chunk, d)
    state_before = _exclusive_cumsum(kc.transpose(-1, -2) @ vc, dim=2)  # (B, H, C, m, d)
    key_sum_before = _exclusive_cumsum(kc.sum(dim=-2), dim=2)  # (B, H, C, m)
    lower = torch.ones(chunk, chunk, dtype=torch.bool, device=phi_q.device).tril()
    within = (qc @ kc.transpose(-1, -2)) * lower  # (B, H, C, chunk, chunk)
    numerator = qc @ state_before + within @ vc
    normaliser = qc @ key_sum_before[..., None] + within.sum(dim=-1, keepdim=True)
    numerator = numerator.reshape(b, h, n_chunks * chunk, d)[:, :, :n]
    normaliser = normaliser.reshape(b, h, n_chunks * chunk, 1)[:, :, :n]
    return numerator, normaliser
