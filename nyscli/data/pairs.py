"""BERT input layout for classification: ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]``.

Segment ids are 0 for ``[CLS] a [SEP]`` and 1 for ``b [SEP]``. Texts are truncated so that
the whole layout fits ``max_len`` tokens; pairs lose tokens longest-first (the end of the
longer text, ties from ``b``), as BERT's ``_truncate_seq_pair``.

A batch from :class:`PairCollate` is ``(ids (B, L) int64, mask (B, L) bool, segments (B, L)
int64, labels (B,) int64)``, padded with the tokenizer's ``[PAD]`` id to the longest example.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch.utils.data import Dataset

from nyscli.data.common import RaggedSequences, pad_batch

if TYPE_CHECKING:
    from nyscli.data.glue import TextExamples
    from nyscli.tokenizers.tokenizer import WordPieceTokenizer


def truncate_pair(a: list[int], b: list[int], budget: int) -> tuple[list[int], list[int]]:
    """Cut tokens off the end of the longer list (``b`` on ties) until ``len(a) + len(b) <=
    budget``."""
    a, b = list(a), list(b)
    while len(a) + len(b) > budget:
        if len(a) > len(b):
            a.pop()
        else:
            b.pop()
    return a, b


def layout(
    a: list[int], b: list[int] | None, max_len: int, cls_id: int, sep_id: int
) -> tuple[list[int], int]:
    """(ids, first-segment length) of ``[CLS] a [SEP]`` or ``[CLS] a [SEP] b [SEP]``.

    The first segment (``[CLS] a [SEP]``) has segment id 0, the rest 1.
    """
    if b is None:
        if max_len < 2:
            raise ValueError(f"max_len={max_len} cannot hold [CLS] and [SEP]")
        ids = [cls_id, *a[: max_len - 2], sep_id]
        return ids, len(ids)
    if max_len < 3:
        raise ValueError(f"max_len={max_len} cannot hold [CLS] and two [SEP]")
    a, b = truncate_pair(a, b, max_len - 3)
    return [cls_id, *a, sep_id, *b, sep_id], len(a) + 2


class EncodedExamples(Dataset):
    """Items ``(ids LongTensor (n,), first-segment length, label)`` of laid-out examples."""

    def __init__(self, seqs: RaggedSequences, first: np.ndarray, labels: np.ndarray) -> None:
        if not len(seqs) == len(first) == len(labels):
            raise ValueError(f"{len(seqs)} sequences, {len(first)} lengths, {len(labels)} labels")
        self.seqs = seqs
        self.first = np.asarray(first, dtype=np.int64)
        self.labels = np.asarray(labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int, int]:
        ids = torch.from_numpy(self.seqs[i].astype(np.int64))
        return ids, int(self.first[i]), int(self.labels[i])


def encode_examples(
    examples: TextExamples, tokenizer: WordPieceTokenizer, max_len: int
) -> EncodedExamples:
    """Tokenize and lay out every example (labels must be present) into a dataset."""
    if examples.labels is None:
        raise ValueError("these examples have no labels")
    first_texts = tokenizer.encode_batch(examples.text_a)
    second_texts = (
        [None] * len(first_texts)
        if examples.text_b is None
        else tokenizer.encode_batch(examples.text_b)
    )
    seqs, firsts = [], []
    for a, b in zip(first_texts, second_texts, strict=True):
        ids, first = layout(a, b, max_len, tokenizer.cls_id, tokenizer.sep_id)
        seqs.append(np.asarray(ids, dtype=np.int32))
        firsts.append(first)
    return EncodedExamples(
        RaggedSequences.from_list(seqs, np.int32), np.asarray(firsts), examples.labels
    )


@dataclass(frozen=True)
class PairCollate:
    """``[(ids (n_i,), first_i, label)]`` -> ``(ids, mask, segments, labels)`` (module doc).

    A dataclass rather than a closure so DataLoader worker processes can pickle it.
    """

    max_len: int
    pad_id: int = 0

    def __call__(self, batch: Sequence[tuple[torch.Tensor, int, int]]) -> tuple[torch.Tensor, ...]:
        ids, mask = pad_batch([b[0] for b in batch], self.max_len, self.pad_id)
        first = torch.tensor([b[1] for b in batch], dtype=torch.long)
        positions = torch.arange(ids.shape[1])
        segments = ((positions[None, :] >= first[:, None]) & mask).long()
        labels = torch.tensor([b[2] for b in batch], dtype=torch.long)
        return ids, mask, segments, labels
