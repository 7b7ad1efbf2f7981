"""The interface every attention core shares, and the options of the exact ones.

A core is an ``nn.Module`` whose ``forward(q, k, v, key_padding_mask=None)`` maps
q, k, v: (B, H, n, d) and a bool key_padding_mask: (B, n) (True = real token) to (B, H, n, d).
It declares ``options`` (each constructor argument -> a rule) and ``budget_key`` (the option
that sets its cost; None for exact attention), and names itself in tables with ``label()``.

Budgets compare at equal cost as *scored query-key pairs per query* (``pairs()``; the inverse,
``at_pairs``, gives a core's options at a budget): Nyström-m 2m (m landmark keys in F, m
landmark queries in Bk), a window w its w - 1 neighbours, the hybrid w - 1 + 2m + g, Linformer
and Performer their projections or features. This is the one place the rule is written.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from nyscli.attention.errors import AttentionConfigError, option
from nyscli.rules import Bool, Rule


def backward_follows(*tensors: Tensor) -> bool:
    """Whether autograd records the work done on ``tensors`` now (grad mode on and one of them
    needs a gradient): the cores choose memory and kernels by it."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


class Path(str, Enum):
    """The code that serves a core's call, by name (``Core.path``; bench's ``path`` column)."""

    EXACT = "exact"  # exact attention: no more real tokens than the budget
    SDPA = "sdpa"  # PyTorch's fused scaled_dot_product_attention
    TORCH = "torch"  # the general torch code, all heads at once
    HEAD_GROUPS = "head-groups"  # the general torch code, a few heads at a time
    RECOMPUTE = "recompute"  # the general code, recomputed in backward (``recompute=True``)
    FUSED_CPU = "fused-cpu"  # Nyström's one autograd node over the CPU flash kernels
    TRITON = "triton"  # Nyström's landmark side as one Triton program per head, rest SDPA
    INFERENCE = "inference-op"  # Nyström at inference in four Triton kernels, no SDPA
    GRAPH = "cuda-graph"  # the inference op replayed from a CUDA graph
    GRAPH_TRAIN = "cuda-graph-train"  # the Triton training path's forward and backward, graphed
    KERNEL = "hybrid-kernel"  # the hybrid's forward as one Triton program per query block
    CHUNKS = "chunks"  # the general torch code over chunks of query blocks

    def __str__(self) -> str:
        return self.value


class Core(nn.Module):
    """Base of every core: its options, its budget key and its label (see the module doc)."""

    options: ClassVar[dict[str, Rule]]
    budget_key: ClassVar[str | None]

    def path(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None) -> Path:
        """The code that serves ``forward(q, k, v, key_padding_mask)`` in this context (grad
        mode, autocast, device): the general torch code unless a core says otherwise."""
        return Path.TORCH

    def label(self) -> str:
        raise NotImplementedError

    def pairs(self) -> int | None:
        """Scored query-key pairs per query (see the module doc); None = exact (all n)."""
        return None

    @classmethod
    def at_pairs(cls, pairs: int) -> dict[str, Any]:
        """The options (besides defaults) that give this core a budget of ``pairs``."""
        raise AttentionConfigError(f"attention '{cls.registry_name}' has no budget to set")


class CausalOnlyCore(Core):
    """A core whose one option is ``causal`` and which has no budget (exact softmax, linear
    attention)."""

    options: ClassVar[dict[str, Rule]] = {"causal": Bool()}
    budget_key: ClassVar[str | None] = None

    def __init__(self, causal: bool = False) -> None:
        super().__init__()
        configure(self, locals())


def configure(core: Core, arguments: dict[str, Any]) -> None:
    """Check each constructor argument (``locals()`` of ``__init__``) against the core's
    ``options`` and set it as an attribute: ``core.num_landmarks`` and the like."""
    for key in type(core).options:
        setattr(core, key, option(core, key, arguments[key]))
