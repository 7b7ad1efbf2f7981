"""Routed keys for the Nyström-local hybrid: each query scores exactly the keys that its
landmark query scores highest.

A landmark pair (q~_c, k~_c) stands for a group of tokens (a segment, or a k-means cluster of
their [q, k] features). Queries of one group score keys alike, so the K keys that q~_c weighs
most in B' (already formed for the heavy keys and the far field) are a query-dependent choice
of keys at no extra scoring: every query takes the K favourites of the landmark nearest to it.
On MiniLM's real attention this is what the band and the global heavy keys miss in layers
1-2, whose heads attend sparsely to keys that move from query to query
(docs/results/hybrid.md).

Queries are laid out group by group, each group padded to whole blocks of ``block`` slots, so
that every block of queries shares one list of K keys: the scores are one batched product per
block, as the band's are, and a block's keys are gathered once, not once per query.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from nyscli.attention.masking import EXP_FLOOR


def take_rows(x: Tensor, index: Tensor) -> Tensor:
    """Rows of x (B, H, n, c) at ``index`` (B, H, ...) of each (B, H), as (B, H, ..., c): one
    row copy per entry (``index_select`` on the flattened rows: at n = 512, 12 heads, 3x faster
    on a CPU than indexing with the same flat index, and more than ``gather`` with the index
    expanded over c)."""
    b, h, n, c = x.shape
    base = torch.arange(b * h, device=x.device).view(b, h, *([1] * (index.dim() - 2))) * n
    flat = x.reshape(b * h * n, c).index_select(0, (index + base).flatten())
    return flat.view(*index.shape, c)


def block_size(n: int, m: int) -> int:
    """Query slots per block: larger blocks share each gathered key among more queries, but
    each of the m groups pads up to a whole block (at most m (block - 1) empty slots).

    At 12 heads, m 24, K 72, 1 thread (core forward, ms, blocks of 8 / 16 / 32 / 64): n 512,
    d 64: 47 / 44 / 41 / 53; batch 8, d 32: 267 / 255 / 236 / 303; n 8,192: 579 / 479 / 410 /
    380. Copying each block's keys costs more than computing padded slots, up to 32."""
    return max(32, min(64, n // (4 * m)))


@dataclass
class Layout:
    """Queries grouped by landmark, in blocks of ``block`` slots of one group each.

    slot_token (B, H, P): the token in each slot (n: an empty slot); dest (B, H, n): each
    token's slot; block_group (B, H, P / block): each block's group (0 for empty blocks).
    """

    slot_token: Tensor
    dest: Tensor
    block_group: Tensor
    block: int

    @classmethod
    def of(cls, group: Tensor, m: int, block: int) -> Layout:
        """The layout of tokens whose groups are ``group`` (B, H, n) in 0..m-1."""
        b, h, n = group.shape
        counts = torch.zeros(b, h, m, dtype=torch.long, device=group.device)
        counts.scatter_add_(2, group, torch.ones_like(group))
        padded = (counts + block - 1) // block * block
        starts = padded.cumsum(-1) - padded  # each group's first slot
        order = group.argsort(dim=-1, stable=True)  # tokens by group, in order within one
        sorted_group = group.gather(2, order)
        first = counts.cumsum(-1) - counts  # each group's first place in ``order``
        place = torch.arange(n, device=group.device).expand(b, h, n)
        slot_sorted = starts.gather(2, sorted_group) + place - first.gather(2, sorted_group)
        dest = torch.empty_like(order).scatter_(2, order, slot_sorted)
        # As many blocks as the fullest (sequence, head) needs (at most n / block + m).
        slots = int(padded.sum(-1).max())
        slot_token = torch.full((b, h, slots), n, dtype=torch.long, device=group.device)
        slot_token.scatter_(2, dest, place)
        slot_group = torch.zeros(b, h, slots, dtype=torch.long, device=group.device)
        slot_group.scatter_(2, dest, group)
        return cls(slot_token, dest, slot_group[..., ::block], block)

    def rows(self, x: Tensor) -> Tensor:
        """x (B, H, n, c) in slot order, (B, H, blocks, block, c); empty slots read row n - 1."""
        index = self.slot_token.clamp_max(x.shape[2] - 1)
        return take_rows(x, index).unflatten(2, (-1, self.block))

    def tokens(self, x: Tensor) -> Tensor:
        """x (B, H, blocks, block, c) back to token order, (B, H, n, c)."""
        return take_rows(x.flatten(2, 3), self.dest)


@dataclass
class Routed:
    """Each query's routed part (B, H, n, ...), scaled by exp(-shift): ``shift`` (B, H, n, 1)
    at least its largest routed and landmark score; ``sums`` (B, H, n, 2 (d_v + 1)) holds
    [sum exp(s - shift) v, sum exp(s - shift), sum K~ v, sum K~] over its routed keys: the
    exact part, then Nyström's K~ on the same keys (what the far field must not count
    twice). One tensor, so that it is laid back in token order and rescaled in one pass."""

    shift: Tensor
    sums: Tensor

    def split(self, sums: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``sums`` (or rows of it) as (num, mass, kernel_num, kernel)."""
        d_v = sums.shape[-1] // 2 - 1
        return sums[..., :d_v], sums[..., d_v : d_v + 1], sums[..., d_v + 1 : -1], sums[..., -1:]


def routed_part(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    group: Tensor,
    favourites: Tensor,
    landmark_keys: Tensor,
    z: Tensor,
    b_kernel: Tensor,
    key_ok: Tensor,
    radius: int,
    in_place: bool = False,
) -> Routed:
    """The routed part of every query (``Routed``), O(n K (d + d_v + m)).

    q, k: (B, H, n, d), v: (B, H, n, d_v); group: each query's landmark (B, H, n);
    favourites: each landmark's K keys (B, H, m, K); landmark_keys k~ (B, H, m, d); z =
    pinv(A') (B, H, m, m); b_kernel B' (B, H, m, n); key_ok: 1 for the keys a routed entry may
    score (real, not heavy), else 0 (B, H, n, 1). A routed key within ``radius`` of its query
    is the band's and is left out here, so no pair is counted twice. ``in_place``: no
    backward follows, so temporaries are overwritten instead of new ones made.
    """
    b, h, n, d = q.shape
    m, keys = favourites.shape[-2:]
    d_v = v.shape[-1]
    layout = Layout.of(group, m, block_size(n, m))
    blocks = layout.block_group.shape[-1]
    index = favourites.gather(2, layout.block_group[..., None].expand(-1, -1, -1, keys))
    # Every row a block's keys need, [k | v | 1 | key_ok | B' column], in one copy: the 1
    # makes one product give both sum e v and sum e.
    ones = key_ok.new_ones(b, h, n, 1)
    rows = take_rows(torch.cat([k, v, ones, key_ok, b_kernel.transpose(-1, -2)], -1), index)
    k_r, v_r, ok_keys, b_r = rows.split([d, d_v + 1, 1, m], -1)  # (B, H, blocks, K, ...)
    ok_keys = ok_keys.transpose(-1, -2)  # (B, H, blocks, 1, K)
    position = layout.slot_token.view(b, h, blocks, layout.block, 1).int()
    near = (position - index[..., None, :].int()).abs_() <= radius  # the band's, not ours
    ok = ok_keys.masked_fill(near, 0.0)  # (B, H, blocks, block, K)
    queries = layout.rows(q) / math.sqrt(d)  # (B, H, blocks, block, d)
    # Keys no entry of the block may score are -inf (a padded key's score may be anything);
    # the band's keys are only zeroed below: their scores are real ones.
    scores = queries @ k_r.transpose(-1, -2)
    scores.add_(torch.where(ok_keys > 0, 0.0, -math.inf).to(scores.dtype))
    land = queries.flatten(2, 3) @ landmark_keys.transpose(-1, -2)
    land = land.view(b, h, blocks, layout.block, m)
    shift = torch.maximum(scores.detach().amax(-1), land.detach().amax(-1))[..., None]
    if in_place:
        e = scores.sub_(shift).clamp_min_(EXP_FLOOR).exp_().mul_(ok)
    else:
        e = (scores - shift).clamp_min(EXP_FLOOR).exp() * ok
    with torch.autocast(device_type=q.device.type, enabled=False):
        f = (land - shift).clamp_min(EXP_FLOOR).exp().to(z.dtype)
        p = (f.flatten(2, 3) @ z).view(b, h, blocks, layout.block, m).to(e.dtype)
    kernel = p @ b_r.transpose(-1, -2)  # K~ on the routed entries
    kernel = kernel.mul_(ok) if in_place else kernel * ok
    sums = layout.tokens(torch.cat([shift, e @ v_r, kernel @ v_r], -1))
    return Routed(sums[..., :1], sums[..., 1:])
