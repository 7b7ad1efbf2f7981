"""LRA Retrieval: byte-level AAN document matching (do two papers cite each other?).

Release files (``lra_release/tsv_data/``): ``new_aan_pairs.train.tsv``,
``new_aan_pairs.eval.tsv``, ``new_aan_pairs.test.tsv``. Each line is
``label<TAB>id1<TAB>id2<TAB>text1<TAB>text2``; the LRA pipeline reads them with no header
(``header=False``), no quote handling (``use_quote_delim=False``) and a float label column,
so labels such as ``1`` or ``1.0`` are accepted here. A header line (first field not a
number, e.g. ``label``) is skipped if present; CRLF line ends are accepted.

Each text is encoded as its raw bytes, id = byte + 1 (``BYTE_OFFSET``), 0 = padding
(vocabulary 257, LRA's ``ByteTextEncoder``), and cut to ``max_len`` bytes (default 4000,
as in LRA's retrieval config). The collate returns the two documents separately:
``(ids1 (B, L1), mask1 (B, L1), ids2 (B, L2), mask2 (B, L2), labels (B,))`` for a two-tower
model.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from nyscli.data.common import (
    BYTE_VOCAB_SIZE,
    PAD_ID,
    DataError,
    RaggedSequences,
    TaskData,
    encode_byte_texts,
    pad_batch,
    reading,
    require_path,
)

NUM_CLASSES = 2
SPLIT_SUFFIXES = {"train": ("train",), "val": ("eval", "val", "dev"), "test": ("test",)}
EXPECTED = "a folder with new_aan_pairs.train.tsv, new_aan_pairs.eval.tsv, new_aan_pairs.test.tsv"


def _is_number(field: bytes) -> bool:
    try:
        float(field)
    except ValueError:
        return False
    return True


def read_aan_tsv(path: str | os.PathLike[str]) -> tuple[list[bytes], list[bytes], np.ndarray]:
    """(texts1 (n,) bytes, texts2 (n,) bytes, labels (n,) int64) of one AAN TSV file."""
    path = require_path(path, "an AAN TSV file (label, id1, id2, text1, text2)")
    texts1: list[bytes] = []
    texts2: list[bytes] = []
    labels: list[int] = []
    with reading(path, "data.path", "an AAN TSV file"), open(path, "rb") as f:
        for lineno, line in enumerate(f, start=1):
            line = line.rstrip(b"\r\n")
            if not line:
                continue
            fields = line.split(b"\t")
            if len(fields) != 5:
                raise DataError(
                    f"{path}:{lineno}: {len(fields)} TAB-separated fields; expected 5 "
                    "(label, id1, id2, text1, text2)"
                )
            if not _is_number(fields[0]):
                if lineno == 1:
                    continue  # header
                raise DataError(f"{path}:{lineno}: label {fields[0][:20]!r} is not a number")
            labels.append(int(float(fields[0])))
            texts1.append(fields[3])
            texts2.append(fields[4])
    return texts1, texts2, np.asarray(labels, dtype=np.int64)


def aan_split_paths(data_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """``{split: path}``: ``*.train.tsv``, ``*.eval.tsv`` (or val/dev), ``*.test.tsv``.

    The release names (``new_aan_pairs.<split>.tsv``) win when several files match.
    """
    root = require_path(data_dir, EXPECTED)
    out = {}
    for split, suffixes in SPLIT_SUFFIXES.items():
        found = [root / f"new_aan_pairs.{s}.tsv" for s in suffixes]
        found = [p for p in found if p.is_file()]
        found += sorted(p for s in suffixes for p in root.glob(f"*.{s}.tsv"))
        if not found:
            raise DataError(f"data.path={data_dir}: no *.{suffixes[0]}.tsv; expected {EXPECTED}")
        out[split] = found[0]
    return out


class PairDataset(Dataset):
    """Items are ``(ids1 LongTensor (n1,), ids2 LongTensor (n2,), label int)``."""

    def __init__(self, seqs1: RaggedSequences, seqs2: RaggedSequences, labels: np.ndarray):
        if not len(seqs1) == len(seqs2) == len(labels):
            raise ValueError("seqs1, seqs2 and labels must have the same length")
        self.seqs1, self.seqs2 = seqs1, seqs2
        self.labels = np.asarray(labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        a = torch.from_numpy(self.seqs1[i].astype(np.int64))
        b = torch.from_numpy(self.seqs2[i].astype(np.int64))
        return a, b, int(self.labels[i])


@dataclass(frozen=True)
class PairCollate:
    """``[(ids1, ids2, label)]`` -> ``(ids1 (B, L1), mask1, ids2 (B, L2), mask2, labels (B,))``.

    Each side is truncated to ``max_len`` and padded on its own (masks True = real token).
    """

    max_len: int
    pad_id: int = PAD_ID
    pad_to_max_len: bool = False

    def __call__(
        self, batch: Sequence[tuple[torch.Tensor, torch.Tensor, int]]
    ) -> tuple[torch.Tensor, ...]:
        args = (self.max_len, self.pad_id, self.pad_to_max_len)
        ids1, mask1 = pad_batch([b[0] for b in batch], *args)
        ids2, mask2 = pad_batch([b[1] for b in batch], *args)
        labels = torch.tensor([b[2] for b in batch], dtype=torch.long)
        return ids1, mask1, ids2, mask2, labels


def load_aan(
    data_dir: str | os.PathLike[str], *, max_len: int = 4000, pad_to_max_len: bool = False
) -> TaskData:
    """AAN train/val/test datasets of ``(ids1, ids2, label)`` from the release TSV folder."""
    sets = {}
    for split, path in aan_split_paths(data_dir).items():
        t1, t2, labels = read_aan_tsv(path)
        sets[split] = PairDataset(
            encode_byte_texts(t1, max_len), encode_byte_texts(t2, max_len), labels
        )
    collate = PairCollate(max_len, PAD_ID, pad_to_max_len)
    return TaskData.from_splits(sets, BYTE_VOCAB_SIZE, NUM_CLASSES, collate)
