"""Longformer attention (Beltagy et al., 2020): a sliding window plus optional global tokens."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from nyscli.attention.chunking import in_head_groups
from nyscli.attention.core import Core, configure
from nyscli.attention.masking import check_qkv, masked_softmax
from nyscli.attention.registry import register
from nyscli.rules import Bool, Int

# Smallest query block: below this the per-block overhead outweighs the saved band entries.
MIN_BLOCK = 16


def _windows(x: Tensor, left: int, right: int, span: int, step: int) -> Tensor:
    """Overlapping windows along dim 2 of x: (B, H, n, d) padded by ``left``/``right`` zeros.

    Returns (B, H, n_blocks, span, d); window t covers padded positions [t*step, t*step+span).
    """
    return F.pad(x, (0, 0, left, right)).unfold(2, span, step).transpose(-1, -2)


@register("longformer")
class LongformerAttention(Core):
    """Softmax attention restricted to a band |i - j| <= (window - 1) / 2, plus global tokens.

    Queries are cut into blocks of about (window - 1) / 2; each block scores only the keys its
    band can reach, so memory is O(n * window) and no n x n matrix is ever formed. Any n works:
    the ends are padded and masked.

    Args:
        window: band width w, odd: each token sees itself and (w - 1) / 2 tokens on each side
            (paper row: 257).
        global_tokens: G, the first G tokens attend to every token and every token attends to
            them (Longformer's global attention, e.g. a [CLS] token). 0 turns it off.
        causal: query i sees keys j <= i only: the left half of the band (i - (w - 1) / 2 .. i)
            and the global tokens before it.
    """

    options = {
        # Odd: the token itself plus the same number of neighbours on each side.
        "window": Int(low=1, odd=True),
        "global_tokens": Int(low=0),
        "causal": Bool(),
    }
    budget_key = "window"

    def __init__(self, window: int = 257, global_tokens: int = 0, causal: bool = False) -> None:
        super().__init__()
        configure(self, locals())  # every argument checked against options

    def label(self) -> str:
        return f"longformer-{self.window}"

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        """q, k, v: (B, H, n, d); key_padding_mask: (B, n), True = real token -> (B, H, n, d).

        Heads are processed in groups so that the band scores of a group stay within a fixed
        budget: at n = 8192 and 12 heads this cuts the peak from ~440 MB to ~100 MB.
        """
        check_qkv(q, k, v, key_padding_mask)
        n = q.shape[2]
        radius = min((self.window - 1) // 2, n - 1)
        block = min(max(radius, MIN_BLOCK), n)
        band_entries = n * (block + 2 * radius + min(self.global_tokens, n))
        return in_head_groups(self._attend, q, k, v, key_padding_mask, band_entries)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        """The banded attention of all given heads at once; shapes as in ``forward``."""
        b, h, n, d = q.shape
        scale = 1.0 / math.sqrt(d)
        radius = min((self.window - 1) // 2, n - 1)  # a wider band reaches nothing more
        n_global = min(self.global_tokens, n)
        block = min(max(radius, MIN_BLOCK), n)
        span = block + 2 * radius  # keys [t*block - radius, (t+1)*block + radius) for block t
        n_blocks = -(-n // block)
        left, right = radius, n_blocks * block - n + radius
        real = (
            torch.ones(1, n, dtype=torch.bool, device=q.device)
            if key_padding_mask is None
            else key_padding_mask
        )
        positions = torch.arange(n, device=q.device)

        q_blocks = F.pad(q, (0, 0, 0, right - radius)).view(b, h, n_blocks, block, d)
        scores = q_blocks @ _windows(k, left, right, span, block).transpose(-1, -2) * scale
        # Global keys are scored in their own columns below; dropping them from the band keeps
        # them from being counted twice.
        key_ok = F.pad(real & (positions >= n_global), (left, right), value=False)
        key_ok = key_ok.unfold(1, span, block)[:, None, :, None, :]  # (B, 1, blocks, 1, span)
        offset = torch.arange(span, device=q.device) - torch.arange(block, device=q.device)[:, None]
        band = (offset >= 0) & (offset <= (radius if self.causal else 2 * radius))
        keep = band & key_ok  # (B, 1, blocks, block, span): O(n * window)
        if n_global > 0:
            g_scores, g_keep = self._global_columns(q_blocks, k, real, n_global)
            scores = torch.cat([scores, g_scores], dim=-1)
            keep = torch.cat([keep, g_keep], dim=-1)
        # Masking in place keeps a single score-sized buffer besides the weights.
        weights = torch.softmax(scores.masked_fill_(~keep, torch.finfo(scores.dtype).min), -1)
        out = weights[..., :span] @ _windows(v, left, right, span, block)
        if n_global > 0:
            out = out + weights[..., span:] @ v[:, :, None, :n_global]
        # A query with nothing to attend to (a pad amid pads) gets zeros, not a uniform mean.
        out = out * keep.any(dim=-1, keepdim=True)
        out = out.reshape(b, h, n_blocks * block, v.shape[-1])[:, :, :n]
        if n_global == 0:
            return out
        return torch.cat([self._global_rows(q, k, v, real, n_global), out[:, :, n_global:]], 2)

    def _global_columns(
        self, q_blocks: Tensor, k: Tensor, real: Tensor, n_global: int
    ) -> tuple[Tensor, Tensor]:
        """Scores (B, H, blocks, block, G) of every query against the G global keys, and which
        of them are allowed (B, 1, blocks, block, G). q_blocks: (B, H, blocks, block, d)."""
        _, _, n_blocks, block, d = q_blocks.shape
        g_scores = q_blocks @ k[:, :, None, :n_global].transpose(-1, -2) / math.sqrt(d)
        g_keep = real[:, None, None, None, :n_global]  # (B, 1, 1, 1, G)
        if self.causal:
            query_pos = torch.arange(n_blocks * block, device=k.device).view(n_blocks, block, 1)
            g_keep = g_keep & (torch.arange(n_global, device=k.device) <= query_pos)
        return g_scores, g_keep.expand(-1, -1, n_blocks, block, -1)

    def _global_rows(self, q: Tensor, k: Tensor, v: Tensor, real: Tensor, n_global: int) -> Tensor:
        """Outputs (B, H, G, d) of the global queries, which attend to every (allowed) key."""
        n = k.shape[2]
        scores = q[:, :, :n_global] @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B,H,G,n)
        keep = real[:, None, None, :]
        if self.causal:
            rows = torch.arange(n_global, device=q.device)[:, None]
            keep = keep & (torch.arange(n, device=q.device) <= rows)
        return masked_softmax(scores, keep) @ v
