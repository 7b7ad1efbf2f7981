"""The attention core: one interface, one registry, every variant.

A core maps q, k, v: (batch, heads, n, head_dim) and an optional bool key_padding_mask
(batch, n) (True = real token) to (batch, heads, n, head_dim). ``MultiHeadAttention`` wraps a
core with projections. This package imports nothing else from ``nyscli``.
"""

from nyscli.attention import (  # noqa: F401  (registers the cores)
    linear,
    linformer,
    longformer,
    nystrom,
    performer,
    reformer,
    softmax,
)
from nyscli.attention.errors import AttentionConfigError
from nyscli.attention.multihead import MultiHeadAttention
from nyscli.attention.registry import attention_label, available, build_attention, core_class

__all__ = [
    "attention_label",
    "AttentionConfigError",
    "MultiHeadAttention",
    "available",
    "build_attention",
    "core_class",
]
