"""The attention core: one interface, one registry, every variant.

A core maps q, k, v: (batch, heads, n, head_dim) and an optional bool key_padding_mask
(batch, n) (True = real token) to (batch, heads, n, head_dim). ``MultiHeadAttention`` wraps a
core with projections. Each core declares its options (rules) and its budget key once.
This package imports nothing from ``nyscli`` but the ground floor (``errors``, ``rules``).
"""

from nyscli.attention import (  # noqa: F401  (registers the cores)
    linear,
    linformer,
    longformer,
    nystrom,
    nystrom_local,
    performer,
    reformer,
    softmax,
)
from nyscli.attention.errors import AttentionConfigError
from nyscli.attention.multihead import MultiHeadAttention, check_width
from nyscli.attention.registry import (
    attention_label,
    available,
    budget,
    budget_key,
    build_attention,
    check_config,
    config_at_pairs,
    core_class,
    pairs_per_query,
)

__all__ = [
    "attention_label",
    "AttentionConfigError",
    "MultiHeadAttention",
    "available",
    "budget",
    "budget_key",
    "build_attention",
    "check_config",
    "check_width",
    "config_at_pairs",
    "core_class",
    "pairs_per_query",
]
