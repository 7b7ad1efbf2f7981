"""Running a core on groups of heads, to bound the size of its per-head temporaries."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

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
) -> Tensor:
    """``core(q, k, v, mask)`` computed a few heads at a time; (B, H, n, d) -> (B, H, n, d).

    Heads never interact, so the result is the same as one call; only the peak memory of the
    core's temporaries (``elements_per_head`` each per sequence and head) drops to ``budget``.
    """
    b, h = q.shape[:2]
    group = max(1, budget // max(1, b * elements_per_head))
    if group >= h:
        return core(q, k, v, key_padding_mask)
    parts = [
        core(q[:, i : i + group], k[:, i : i + group], v[:, i : i + group], key_padding_mask)
        for i in range(0, h, group)
    ]
    return torch.cat(parts, dim=1)
