"""Sequence (pair) classification on a BERT encoder, and longer inputs than it was trained on.

``BertClassifier``: encoder -> pooler (dense + tanh on the [CLS] position) -> dropout ->
Linear(dim, num_classes), as BERT's ``BertForSequenceClassification``. A ``nys pretrain``
checkpoint holds the encoder only, so the pooler starts fresh (BERT reuses its NSP pooler).

``extend_positions``: a longer position table whose new rows copy the learned ones in order
(rows 512..1023 from 0..511), how the Nyströmformer paper fine-tuned on 1024-token IMDB
inputs from a 512-token pre-training.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import Tensor, nn

from nyscli.attention.dropout import Dropout
from nyscli.models.bert import BertEncoder


def tiled_rows(table: Tensor, rows: int) -> Tensor:
    """(n, dim) -> (rows, dim): row i is ``table[i % n]`` (rows >= n keeps the first n as is)."""
    n = table.shape[0]
    if rows < n:
        raise ValueError(f"cannot shrink a table of {n} rows to {rows}")
    return table.repeat((rows + n - 1) // n, 1)[:rows].clone()


def extend_positions(encoder: BertEncoder, max_len: int) -> BertEncoder:
    """Grow ``encoder``'s position table to ``max_len`` rows in place (copies; see module doc).

    A table already that long is left alone. The encoder's config records the new max_len.
    """
    embeddings = encoder.encoder.embeddings
    old = embeddings.positions
    if max_len <= old.num_embeddings:
        return encoder
    table = tiled_rows(old.weight.detach(), max_len)
    embeddings.positions = nn.Embedding.from_pretrained(table, freeze=False).to(old.weight.device)
    encoder.encoder.config = dataclasses.replace(encoder.encoder.config, max_len=max_len)
    return encoder


class BertClassifier(nn.Module):
    """ids, mask, segments (B, n) -> logits (B, num_classes) from the [CLS] position."""

    def __init__(self, encoder: BertEncoder, num_classes: int, dropout: float = 0.1) -> None:
        super().__init__()
        dim = encoder.config.dim
        self.bert = encoder
        self.pooler = nn.Linear(dim, dim)
        self.dropout = Dropout(dropout)
        self.classifier = nn.Linear(dim, num_classes)
        init_std = encoder.encoder.config.init_std  # BERT's N(0, 0.02), zero biases
        for layer in (self.pooler, self.classifier):
            nn.init.normal_(layer.weight, std=init_std)
            nn.init.zeros_(layer.bias)

    def forward(self, ids: Tensor, mask: Tensor, segments: Tensor | None = None) -> Tensor:
        hidden = self.bert(ids, mask, segments)  # (B, n, dim)
        pooled = torch.tanh(self.pooler(hidden[:, 0]))  # (B, dim)
        return self.classifier(self.dropout(pooled))
