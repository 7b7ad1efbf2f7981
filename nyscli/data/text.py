"""LRA Text: byte-level IMDB sentiment classification.

Sources (``source`` argument of :func:`load_imdb` / :func:`read_imdb`):

* an ``aclImdb`` folder (or a folder containing ``aclImdb/``) with ``train/pos``,
  ``train/neg``, ``test/pos``, ``test/neg`` of ``<id>_<rating>.txt`` files (``unsup`` is
  ignored). Files are read as raw bytes, in id order, negatives first.
* a CSV file (optionally ``.gz``) with columns ``review`` and ``sentiment`` (positive /
  negative, also pos/neg/1/0) and optionally ``split`` (train / test). Without ``split``
  the rows are split by a permutation seeded with ``seed``: ``test_fraction`` (0.5, i.e.
  the 25k/25k of IMDB) of them go to test; both parts keep file order.
* ``"imdb"`` or ``"hf:imdb"`` (when no such local path exists): Hugging Face ``datasets``
  (needs the package and network access on first use).

With no source given, :func:`default_imdb_source` takes the IMDB CSV of ``../shared/data``
beside the checkout when it is there (this project's machines and CI), else ``"imdb"``.

Encoding: UTF-8 bytes, id = byte + 1 (``BYTE_OFFSET``), 0 = padding, vocabulary 257, as
LRA's ``ByteTextEncoder``. Texts are cut to ``max_len`` bytes (default 4000; the official
LRA code uses 1000 for this task). As in LRA, the test set doubles as the validation set
unless ``val_fraction > 0`` carves a validation set out of train.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from nyscli.data.common import (
    BYTE_VOCAB_SIZE,
    PAD_ID,
    ClassificationCollate,
    DataError,
    SequenceClassificationDataset,
    TaskData,
    encode_byte_texts,
    reading,
    seeded_permutation,
)

NUM_CLASSES = 2
EXPECTED = "an aclImdb folder or a CSV with columns review,sentiment"
SENTIMENTS = {"positive": 1, "pos": 1, "1": 1, "negative": 0, "neg": 0, "0": 0}
HF_NAMES = ("imdb", "hf:imdb")
# Relative to the checkout's parent (this project's machines keep ../shared beside it).
SHARED_IMDB = Path("shared/data/imdb/aclImdb_v1_labeled.csv.gz")
CHECKOUT = Path(__file__).resolve().parents[2]

Split = tuple[list[bytes], np.ndarray]  # texts (n,), labels (n,) int64


def _review_key(path: Path) -> tuple[int, str]:
    """Sort ``<id>_<rating>.txt`` by numeric id (file-name order would put 10 before 2)."""
    head = path.stem.split("_", 1)[0]
    return (int(head), path.name) if head.isdigit() else (1 << 62, path.name)


def _acl_root(path: Path) -> Path | None:
    for cand in (path, path / "aclImdb"):
        if (cand / "train" / "pos").is_dir() and (cand / "test" / "neg").is_dir():
            return cand
    return None


def read_aclimdb_folder(root: Path) -> dict[str, Split]:
    """``{"train": ..., "test": ...}`` from an aclImdb tree (neg = 0, then pos = 1)."""
    out = {}
    for split in ("train", "test"):
        texts: list[bytes] = []
        labels: list[int] = []
        for name, label in (("neg", 0), ("pos", 1)):
            files = sorted((root / split / name).glob("*.txt"), key=_review_key)
            with reading(root, "data.path", EXPECTED):
                texts.extend(f.read_bytes() for f in files)
            labels.extend([label] * len(files))
        out[split] = (texts, np.asarray(labels, dtype=np.int64))
    return out


def read_imdb_csv(path: Path, test_fraction: float = 0.5, seed: int = 0) -> dict[str, Split]:
    """``{"train": ..., "test": ...}`` from a review/sentiment[/split] CSV (see module doc)."""
    import pandas as pd

    with reading(path, "data.path", EXPECTED):
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
    missing = {"review", "sentiment"} - set(df.columns)
    if missing:
        raise DataError(
            f"data.path={path}: CSV lacks column(s) {','.join(sorted(missing))} "
            f"(has {','.join(map(str, df.columns))}); expected {EXPECTED}"
        )
    sentiment = df["sentiment"].str.strip().str.lower()
    bad = ~sentiment.isin(list(SENTIMENTS))
    if bad.any():
        row = int(np.argmax(bad.to_numpy()))
        raise DataError(
            f"data.path={path}: row {row + 2}: sentiment {df['sentiment'].iloc[row]!r}; "
            "expected positive or negative"
        )
    labels = sentiment.map(SENTIMENTS).to_numpy(dtype=np.int64)
    texts = df["review"].tolist()
    if "split" in df.columns:
        split = df["split"].str.strip().str.lower().to_numpy()
        if not np.isin(split, ["train", "test"]).all():
            raise DataError(f"data.path={path}: column split must hold train or test")
        parts = {s: np.flatnonzero(split == s) for s in ("train", "test")}
    else:
        if not 0.0 < test_fraction < 1.0:
            raise DataError(f"imdb: test_fraction={test_fraction}; expected 0 < f < 1")
        perm = seeded_permutation(len(texts), seed)
        n_test = int(round(test_fraction * len(texts)))
        parts = {"train": np.sort(perm[n_test:]), "test": np.sort(perm[:n_test])}
    return {s: ([texts[i].encode("utf-8") for i in idx], labels[idx]) for s, idx in parts.items()}


def read_imdb_hf(name: str = "imdb") -> dict[str, Split]:
    """``{"train": ..., "test": ...}`` from Hugging Face ``datasets`` (online use)."""
    try:
        import datasets  # lazy: optional dependency, and slow to import
    except ImportError:
        raise DataError(
            f"data.path={name} means the Hugging Face dataset, which needs `pip install "
            f"datasets` and network access; offline, pass {EXPECTED}"
        ) from None
    try:
        ds = datasets.load_dataset(name)
    except Exception as exc:  # network, hub and cache errors come in many types
        msg = f"data.path={name}: loading from the Hugging Face hub failed ({exc})"
        raise DataError(msg) from None
    return {
        s: ([t.encode("utf-8") for t in ds[s]["text"]], np.asarray(ds[s]["label"], np.int64))
        for s in ("train", "test")
    }


def default_imdb_source(checkout: Path = CHECKOUT) -> str:
    """``<checkout>/../shared/data/imdb/aclImdb_v1_labeled.csv.gz`` if it exists, else ``imdb``."""
    path = checkout.parent / SHARED_IMDB
    return str(path) if path.is_file() else "imdb"


def read_imdb(
    source: str | os.PathLike[str], test_fraction: float = 0.5, seed: int = 0
) -> dict[str, Split]:
    """Raw IMDB ``{"train": (texts, labels), "test": (texts, labels)}`` from any source."""
    path = Path(source).expanduser()
    if not path.exists():
        if str(source) in HF_NAMES:
            return read_imdb_hf("imdb")
        raise DataError(f"data.path={source} does not exist; expected {EXPECTED}")
    if path.is_dir():
        root = _acl_root(path)
        if root is None:
            raise DataError(
                f"data.path={source} has no train/pos, train/neg, test/pos, test/neg; "
                f"expected {EXPECTED}"
            )
        return read_aclimdb_folder(root)
    return read_imdb_csv(path, test_fraction, seed)


def load_imdb(
    source: str | os.PathLike[str],
    *,
    max_len: int = 4000,
    val_fraction: float = 0.0,
    test_fraction: float = 0.5,
    seed: int = 0,
    pad_to_max_len: bool = False,
) -> TaskData:
    """IMDB train/val/test datasets of ``(byte ids (n <= max_len,), label)``.

    ``val`` is ``test`` (LRA's choice) unless ``val_fraction > 0``, which moves that
    fraction of train (seeded permutation) into ``val``.
    """
    raw = read_imdb(source, test_fraction, seed)
    train_texts, train_labels = raw["train"]
    test = SequenceClassificationDataset(encode_byte_texts(raw["test"][0], max_len), raw["test"][1])
    if val_fraction > 0:
        perm = seeded_permutation(len(train_texts), seed + 1)
        n_val = int(round(val_fraction * len(train_texts)))
        val_idx, train_idx = np.sort(perm[:n_val]), np.sort(perm[n_val:])
        val = SequenceClassificationDataset(
            encode_byte_texts([train_texts[i] for i in val_idx], max_len), train_labels[val_idx]
        )
        train_texts = [train_texts[i] for i in train_idx]
        train_labels = train_labels[train_idx]
    else:
        val = test
    train = SequenceClassificationDataset(encode_byte_texts(train_texts, max_len), train_labels)
    return TaskData(
        train=train,
        val=val,
        test=test,
        vocab_size=BYTE_VOCAB_SIZE,
        num_classes=NUM_CLASSES,
        collate=ClassificationCollate(max_len, PAD_ID, pad_to_max_len),
        dataset="IMDB",
    )
