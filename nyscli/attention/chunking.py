"""Running a core on groups of heads (to bound its per-head temporaries) or of sequences."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from nyscli.attention.core import backward_follows

Core = Callable[[Tensor, Tensor, Tensor, Tensor | None], Tensor]

# Largest temporary a group may create, in elements (16 MiB of fp32).
DEFAULT_BUDGET = 2**22


def in_head_groups(
    core: Core,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_padding_mask: Tensor | None,
    elements_per_head: int,
    budget: int = DEFAULT_BUDGET,
    out: Tensor | None = None,
) -> Tensor:
    """``core(q, k, v, mask)`` computed a few heads at a time; (B, H, n, d) -> (B, H, n, d).

    Heads never interact, so the result is the same as one call; only the peak memory of the
    core's temporaries (``elements_per_head`` each per sequence and head) drops to ``budget``.
    With ``out`` (B, H, n, d_v), the core is called with ``out=`` the group's slice, writes
    its result there (no copy of each group's result), and ``out`` is returned; with a
    backward to follow, the groups' results are joined by a cat instead.
    """
    b, h = q.shape[:2]
    group = max(1, budget // max(1, b * elements_per_head))
    if group < h and backward_follows(q, k, v):
        # Joined by a cat, whose backward is slices: writing each group into one output
        # would add a copy of the whole gradient per group to the backward.
        heads = [slice(i, i + group) for i in range(0, h, group)]
        return torch.cat([core(q[:, s], k[:, s], v[:, s], key_padding_mask) for s in heads], 1)
    if out is not None:
        for i in range(0, h, group):
            heads = slice(i, i + group)
            core(q[:, heads], k[:, heads], v[:, heads], key_padding_mask, out=out[:, heads])
        return out
    if group >= h:
        return core(q, k, v, key_padding_mask)
    first = core(q[:, :group], k[:, :group], v[:, :group], key_padding_mask)
    # Each group's result goes straight into the output: a list of parts and their
    # concatenation would hold the output twice at the peak.
    out = first.new_empty(b, h, *first.shape[2:])
    out[:, :group] = first
    del first
    for i in range(group, h, group):
        out[:, i : i + group] = core(
            q[:, i : i + group], k[:, i : i + group], v[:, i : i + group], key_padding_mask
        )
    return out


def by_length(
    approximate: Core,
    exact: Core,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    key_padding_mask: Tensor | None,
    limit: int,
) -> Tensor:
    """``exact`` for the sequences with at most ``limit`` real tokens, ``approximate`` for the
    rest; (B, H, n, d) -> (B, H, n, d).

    Deciding from the real tokens, not the padded length, means padding a batch never changes
    a sequence's output.
    """
    if q.shape[2] <= limit:
        return exact(q, k, v, key_padding_mask)
    if key_padding_mask is None:
        return approximate(q, k, v, None)
    short = key_padding_mask.sum(dim=1) <= limit  # (B,)
    if not short.any():
        return approximate(q, k, v, key_padding_mask)
    if short.all():
        return exact(q, k, v, key_padding_mask)
    long = ~short
    approx = approximate(q[long], k[long], v[long], key_padding_mask[long])
    exact_part = exact(q[short], k[short], v[short], key_padding_mask[short])
    out = approx.new_empty((q.shape[0], *approx.shape[1:]))
    out[long] = approx
    out[short] = exact_part.to(out.dtype)
    return out
