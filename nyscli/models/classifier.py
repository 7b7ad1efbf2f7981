"""Encoder + pooling + head: single-sequence and dual-encoder (retrieval) classifiers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import Tensor, nn

from nyscli.models.choices import POOLINGS
from nyscli.models.encoder import Encoder, EncoderConfig
from nyscli.models.heads import ClassifierHead, DualHead
from nyscli.models.pooling import pool


class PooledEncoder(nn.Module):
    """Shared part of the classifiers: an encoder and its pooling, ids -> (B, dim)."""

    def __init__(self, encoder: Encoder, pooling: str = "mean") -> None:
        super().__init__()
        self.encoder = encoder
        self.pooling = pooling

    def embed(self, ids: Tensor, mask: Tensor) -> Tensor:
        """ids (B, n) int64, mask (B, n) bool -> pooled (B, dim)."""
        hidden, mask = self.encoder(ids, mask)
        return pool(hidden, mask, self.pooling)


class SequenceClassifier(PooledEncoder):
    """ids (B, n) int64, mask (B, n) bool -> logits (B, num_classes)."""

    def __init__(self, encoder: Encoder, num_classes: int, pooling: str = "mean") -> None:
        super().__init__(encoder, pooling)
        self.head = ClassifierHead(encoder.config.dim, encoder.config.ffn_dim, num_classes)

    def forward(self, ids: Tensor, mask: Tensor) -> Tensor:
        return self.head(self.embed(ids, mask))


class DualEncoderClassifier(PooledEncoder):
    """Two sequences through one shared encoder, then ``[x0, x1, x0*x1, x0-x1]`` -> logits.

    ids0, mask0: (B, n0); ids1, mask1: (B, n1) -> logits (B, num_classes).
    """

    def __init__(self, encoder: Encoder, num_classes: int, pooling: str = "mean") -> None:
        super().__init__(encoder, pooling)
        self.head = DualHead(encoder.config.dim, encoder.config.ffn_dim, num_classes)

    def forward(self, ids0: Tensor, mask0: Tensor, ids1: Tensor, mask1: Tensor) -> Tensor:
        return self.head(self.embed(ids0, mask0), self.embed(ids1, mask1))


def build_classifier(
    *,
    vocab_size: int,
    max_len: int,
    num_classes: int,
    model: Mapping[str, Any],
    attention: Mapping[str, Any],
    dual: bool = False,
) -> SequenceClassifier | DualEncoderClassifier:
    """A classifier from a ``model`` config (dim, depth, num_heads, ffn_dim, dropout, pooling,
    init: ``encoder.INITS``; absent = normal).

    ``dual=True`` builds the retrieval dual encoder. Raises ValueError on an unknown pooling.
    """
    pooling = str(model.get("pooling", "mean"))
    if pooling not in POOLINGS:
        raise ValueError(
            f"model.pooling={pooling} is not allowed; choose one of: {', '.join(POOLINGS)}"
        )
    cfg = EncoderConfig(
        vocab_size=vocab_size,
        max_len=max_len,
        dim=int(model.get("dim", 64)),
        depth=int(model.get("depth", 2)),
        num_heads=int(model.get("num_heads", 2)),
        ffn_dim=int(model.get("ffn_dim", 128)),
        dropout=float(model.get("dropout", 0.1)),
        attention=dict(attention),
        cls_token=pooling == "cls",
        init=str(model.get("init", "normal")),
    )
    cls = DualEncoderClassifier if dual else SequenceClassifier
    return cls(Encoder(cfg), num_classes, pooling)
