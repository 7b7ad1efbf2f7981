"""Longformer attention (Beltagy et al., 2020): a sliding window plus optional global tokens."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from nyscli.attention.chunking import in_head_groups
from nyscli.attention.core import Core, backward_follows, configure
from nyscli.attention.masking import check_qkv, masked_softmax
from nyscli.attention.registry import register
from nyscli.rules import Bool, Int

# Smallest query block: below this the per-block overhead outweighs the saved band entries.
MIN_BLOCK = 16


def _rows(x: Tensor, start: int, stop: int) -> Tensor:
    """Rows start..stop-1 of x: (B, H, n, d) along dim 2, zero rows where they fall outside
    [0, n): a view of x when none does (no copy of a chunk in the middle)."""
    n = x.shape[2]
    low, high = max(start, 0), min(stop, n)
    inside = x[:, :, low:high]
    if (low, high) == (start, stop):
        return inside
    return F.pad(inside, (0, 0, low - start, stop - high))


class _Windows(torch.autograd.Function):
    """rows (N, d) -> windows (W, span, d), window i = rows[i * step : i * step + span]: a view
    of rows (unfold), with a backward that adds each window's gradient back in ceil(span /
    step) strided slices; unfold's own backward, a scatter, took 11% of the hybrid's training
    step at n = 512."""

    @staticmethod
    def forward(ctx: Any, rows: Tensor, span: int, step: int) -> Tensor:
        ctx.n_rows, ctx.span, ctx.step = rows.shape[0], span, step
        return rows.unfold(0, span, step).transpose(1, 2)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None, None]:
        count, span, step = grad.shape[0], ctx.span, ctx.step
        # Room for every slice below; rows past n_rows get nothing (windows end within rows).
        out = grad.new_zeros((count + -(-span // step)) * step, grad.shape[-1])
        for offset in range(0, span, step):
            width = min(step, span - offset)
            rows = out[offset : offset + count * step].view(count, step, -1)
            rows[:, :width] += grad[:, offset : offset + width]
        return out[: ctx.n_rows], None, None


@dataclass(frozen=True)
class Band:
    """Where the band |i - j| <= radius of n tokens puts its keys, query block by query block.

    Queries are cut into ``n_blocks`` blocks of ``block``; block t scores the ``span`` keys
    [t*block - radius, (t+1)*block + radius) (the ends padded), so band scores take
    O(n * (block + 2 radius)) memory. Shared by Longformer and the Nyström-local hybrid.
    """

    n: int
    radius: int
    block: int

    @classmethod
    def of(cls, n: int, window: int) -> Band:
        """The band of an odd ``window`` over n tokens (a wider band reaches nothing more)."""
        radius = min((window - 1) // 2, n - 1)
        return cls(n, radius, min(max(radius, MIN_BLOCK), n))

    @property
    def span(self) -> int:
        return self.block + 2 * self.radius

    @property
    def n_blocks(self) -> int:
        return -(-self.n // self.block)

    def queries(self, x: Tensor, first: int = 0, stop: int | None = None) -> Tensor:
        """x: (B, H, n, d) -> query blocks first..stop-1 (all by default), (B, H, blocks,
        block, d), the end zero-padded."""
        stop = self.n_blocks if stop is None else stop
        rows = _rows(x, first * self.block, stop * self.block)
        return rows.unflatten(2, (stop - first, self.block))

    def keys(self, x: Tensor, first: int = 0, stop: int | None = None) -> Tensor:
        """x: (B, H, n, d) -> the keys (or values) of blocks first..stop-1 (all by default),
        (B, H, blocks, span, d), the ends zero-padded: a view of overlapping windows
        (``unfold``), for use without a backward (``flat_keys`` has a cheap one).
        """
        stop = self.n_blocks if stop is None else stop
        rows = _rows(x, first * self.block - self.radius, stop * self.block + self.radius)
        return rows.unfold(2, self.span, self.block).transpose(-1, -2)

    def flat_keys(self, x: Tensor) -> Tensor:
        """x: (B, H, n, d) -> the keys (or values) of every block, (B, H, n_blocks, span, d),
        as windows over one copy of x whose leading dimensions flatten without a copy.

        ``keys`` is zero-padded at each sequence's ends, and its windows flatten to one batch
        for a product only when B H = 1: with more, the product first copies them (at n = 512,
        12 heads, 7 of the hybrid's 25 ms). Here the B H sequences lie end to end, padded only
        at the very ends, so where ``keys`` has zeros before a sequence's first key or after
        its last, these windows hold the neighbouring sequence's rows: the caller must give
        those entries zero weight (the hybrid's key mask does). Finite inputs assumed.
        """
        b, h, n, d = x.shape
        if n < self.n_blocks * self.block:
            x = F.pad(x, (0, 0, 0, self.n_blocks * self.block - n))
        ends = x.new_zeros(self.radius, d)  # a cat, not F.pad: pad first fills all with zeros
        rows = torch.cat([ends, x.reshape(-1, d), ends])
        if backward_follows(rows):
            windows = _Windows.apply(rows, self.span, self.block)
        else:
            windows = rows.unfold(0, self.span, self.block).transpose(1, 2)
        return windows.unflatten(0, (b, h, self.n_blocks))

    def windows(self, x: Tensor, first: int = 0, stop: int | None = None) -> Tensor:
        """The keys (or values) of blocks first..stop-1 (all by default) for a product, (B, H,
        blocks, span, d): ``flat_keys`` for all blocks (no copy, a cheap backward; entries
        beyond a sequence's ends are other rows, which the caller's key mask must zero),
        ``keys`` for some (used without a backward only: the bands are chunked only then)."""
        stop = self.n_blocks if stop is None else stop
        if first == 0 and stop == self.n_blocks:
            return self.flat_keys(x)
        return self.keys(x, first, stop)

    def keep(
        self, key_ok: Tensor, causal: bool = False, first: int = 0, stop: int | None = None
    ) -> Tensor:
        """Which band entries of blocks first..stop-1 (all by default) count: (B, 1, blocks,
        block, span) bool, from key_ok (B or 1, n) (True = a key the band may use) and the
        band's offsets (left half if causal)."""
        stop = self.n_blocks if stop is None else stop
        ok = _rows(
            key_ok[:, None, :, None],
            first * self.block - self.radius,
            stop * self.block + self.radius,
        )
        ok = ok[:, 0, :, 0].unfold(1, self.span, self.block)[:, None, :, None, :]  # (B,1,c,1,span)
        return self.reach(causal, key_ok.device) & ok

    def reach(self, causal: bool = False, device: torch.device | None = None) -> Tensor:
        """(block, span) bool: which keys of its block's span each query reaches, from the
        offsets alone (the same for every block; the left half if causal)."""
        offset = (
            torch.arange(self.span, device=device)
            - torch.arange(self.block, device=device)[:, None]
        )
        return (offset >= 0) & (offset <= (self.radius if causal else 2 * self.radius))

    def unblock(self, x: Tensor) -> Tensor:
        """(B, H, n_blocks, block, d) -> (B, H, n, d), dropping the padded queries."""
        b, h = x.shape[:2]
        return x.reshape(b, h, self.n_blocks * self.block, x.shape[-1])[:, :, : self.n]


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

    def pairs(self) -> int:
        return self.window - 1 + self.global_tokens

    @classmethod
    def at_pairs(cls, pairs: int) -> dict[str, Any]:
        return {"window": pairs + 1 - pairs % 2}  # odd: the token and pairs/2 on each side

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        """q, k, v: (B, H, n, d); key_padding_mask: (B, n), True = real token -> (B, H, n, d).

        Heads are processed in groups so that the band scores of a group stay within a fixed
        budget: at n = 8192 and 12 heads this cuts the peak from ~440 MB to ~100 MB.
        """
        check_qkv(q, k, v, key_padding_mask)
        band = Band.of(q.shape[2], self.window)
        band_entries = band.n * (band.span + min(self.global_tokens, band.n))
        return in_head_groups(self._attend, q, k, v, key_padding_mask, band_entries)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None) -> Tensor:
        """The banded attention of all given heads at once; shapes as in ``forward``."""
        n = q.shape[2]
        band = Band.of(n, self.window)
        n_global = min(self.global_tokens, n)
        real = (
            torch.ones(1, n, dtype=torch.bool, device=q.device)
            if key_padding_mask is None
            else key_padding_mask
        )
        positions = torch.arange(n, device=q.device)

        q_blocks = band.queries(q)
        # Windows over the sequences end to end (no copy before the products); their entries
        # beyond a sequence's ends are masked by keep like the zero-padded ones were.
        k_windows, v_windows = band.windows(k), band.windows(v)
        scores = q_blocks @ k_windows.transpose(-1, -2) / math.sqrt(q.shape[-1])
        # Global keys are scored in their own columns below; dropping them from the band keeps
        # them from being counted twice.
        keep = band.keep(real & (positions >= n_global), self.causal)  # O(n * window)
        if n_global > 0:
            g_scores, g_keep = self._global_columns(q_blocks, k, real, n_global)
            scores = torch.cat([scores, g_scores], dim=-1)
            keep = torch.cat([keep, g_keep], dim=-1)
        # Masking in place keeps a single score-sized buffer besides the weights.
        weights = torch.softmax(scores.masked_fill_(~keep, torch.finfo(scores.dtype).min), -1)
        out = weights[..., : band.span] @ v_windows
        if n_global > 0:
            out = out + weights[..., band.span :] @ v[:, :, None, :n_global]
        # A query with nothing to attend to (a pad amid pads) gets zeros, not a uniform mean.
        out = band.unblock(out * keep.any(dim=-1, keepdim=True))
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
