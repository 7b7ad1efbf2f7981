"""Pieces shared by every LRA data module: errors, atomic writes, caches, datasets, collates.

Conventions used by all tasks:

* A *sequence* is a 1-D integer array of token ids; id ``PAD_ID == 0`` is reserved for
  padding in every vocabulary that needs padding (ListOps, byte-level text).
* A batch from :class:`ClassificationCollate` is ``(ids (B, L) int64, mask (B, L) bool,
  labels (B,) int64)`` with ``mask`` True on real tokens, False on padding.
* Byte-level text maps byte ``b`` to id ``b + BYTE_OFFSET`` (``BYTE_OFFSET == 1``), so the
  vocabulary has ``BYTE_VOCAB_SIZE == 257`` ids; this is what LRA's
  ``tfds.deprecated.text.ByteTextEncoder()`` does (id 0 is its padding id).
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import logging
import os
import pickle
import tarfile
import zipfile
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch
from torch.utils.data import Dataset

from nyscli.errors import UserInputError
from nyscli.files import atomic_writer, exclusive_lock

log = logging.getLogger(__name__)
T = TypeVar("T")

PAD_ID = 0
BYTE_OFFSET = 1
BYTE_VOCAB_SIZE = 256 + BYTE_OFFSET

# Where generated data (ListOps TSVs, Pathfinder arrays) and decoded caches live by default.
CACHE_ENV = "NYSCLI_DATA_CACHE"


class DataError(UserInputError):
    """A user-facing data problem (missing path, malformed file), printed by the CLI as one line.

    Example message: ``data.path=/x does not exist; expected an aclImdb folder or a CSV with
    columns review,sentiment``.
    """


# What reading a truncated, corrupt or foreign file raises (gzip, zlib, pickle, numpy, pandas,
# tarfile, UTF-8 decoding): all become one DataError naming the file.
READ_ERRORS: tuple[type[BaseException], ...] = (
    OSError,
    EOFError,
    ValueError,
    zlib.error,
    pickle.UnpicklingError,
    tarfile.TarError,
    KeyError,
    IndexError,
)


@contextlib.contextmanager
def reading(path: str | os.PathLike[str], option: str, expected: str) -> Iterator[None]:
    """Turn any error raised while reading ``path`` into one DataError: the option, the file,
    the reason and what was ``expected`` (e.g. ``"a CSV with columns review,sentiment"``)."""
    try:
        yield
    except DataError as error:
        if str(path) in str(error):
            raise
        raise DataError(f"{path}: {error}") from None
    except READ_ERRORS as error:
        if isinstance(error, OSError) and error.errno in (errno.ENOSPC, errno.EACCES, errno.EROFS):
            raise  # a fault of the disk or permissions, not of the file's content
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
        raise DataError(
            f"{option}: cannot read {path} ({type(error).__name__}: {reason}); expected "
            f"{expected}; if it was downloaded, the download may be incomplete: fetch it again"
        ) from None


def read_text_file(
    path: Path, option: str, max_bad: float = 0.01, limit_bytes: int | None = None
) -> str:
    """A UTF-8 text file's content; DataError if it is missing, binary (NUL bytes) or more than
    ``max_bad`` of it is not UTF-8 (a few bad bytes are replaced, as in scraped text).

    ``limit_bytes``: read only that much of a longer file (memory stays bounded whatever its
    size), cut back to the last whitespace so no word or UTF-8 character is split.
    """
    if not path.is_file():
        raise DataError(f"{option}={path} is not a readable file; give a UTF-8 text file")
    with reading(path, option, "a UTF-8 text file"), open(path, "rb") as handle:
        raw = handle.read() if limit_bytes is None else handle.read(limit_bytes + 1)
    if limit_bytes is not None and len(raw) > limit_bytes:
        raw = raw[:limit_bytes]
        cut = max(raw.rfind(b" "), raw.rfind(b"\n"))
        raw = raw[:cut] if cut > 0 else raw
    text = raw.decode("utf-8", errors="replace")
    bad = text.count("\ufffd") - raw.decode("utf-8", errors="ignore").count("\ufffd")
    if b"\x00" in raw or bad > max_bad * max(len(text), 1):
        raise DataError(f"{option}={path} is a binary file, not UTF-8 text; give a UTF-8 text file")
    return text


def default_cache_dir() -> Path:
    """``$NYSCLI_DATA_CACHE`` if set, else ``~/.cache/nyscli/data``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env).expanduser() if env else Path.home() / ".cache" / "nyscli" / "data"


def require_path(path: str | os.PathLike[str], expected: str, option: str = "data.path") -> Path:
    """Return ``path`` as a Path, or raise DataError naming the option and what was expected."""
    p = Path(path).expanduser()
    if not p.exists():
        raise DataError(f"{option}={path} does not exist; expected {expected}")
    return p


def require_file(path: Path, what: str, option: str = "data.path") -> Path:
    """Raise DataError unless ``path`` is an existing regular file (``what`` names its role)."""
    if not path.is_file():
        raise DataError(f"{option}: missing {what} {path}")
    return path


def require_examples(sizes: dict[str, int], what: str, source: object) -> None:
    """A one-line error if the train split or any labelled split of ``source`` is empty:
    training or scoring on nothing is never a result."""
    empty = [split for split, size in sizes.items() if size == 0]
    if "train" not in sizes:
        empty.insert(0, "train")
    if empty:
        raise DataError(
            f"{what}: {source} has no labelled examples in split(s) {', '.join(empty)}; "
            "check the data folder (or the generator settings)"
        )


@contextlib.contextmanager
def progress_bar(description: str, total: int) -> Iterator[Callable[[int], None]]:
    """A rich progress bar on the shared console for a slow data step; yields ``advance(k)``.

    Disappears when done (the caller logs what was made); the log hears how far it got every
    ``HEARTBEAT_S`` seconds (a non-terminal shows no bar).
    """
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from nyscli.console import console, heartbeat

    bar = Progress(
        TextColumn("[bold]{task.description}[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=True,
    )
    with bar, heartbeat(log, f"{description}: 0/{total}") as beat:
        task = bar.add_task(description, total=total)
        done = 0

        def advance(k: int) -> None:
            nonlocal done
            done += k
            bar.advance(task, k)
            beat.say(f"{description}: {done}/{total}")

        yield advance


def atomic_save_npz(path: str | os.PathLike[str], **arrays: np.ndarray) -> None:
    """``np.savez`` through :func:`atomic_writer` (np.savez on a file object adds no suffix)."""
    with atomic_writer(path, "wb") as f:
        np.savez(f, **arrays)


def keyed_cache_dir(root: str | os.PathLike[str], prefix: str, params: dict[str, Any]) -> Path:
    """A directory ``<root>/<prefix>-<hash of params>`` holding a readable ``params.json``.

    Any change of a generation parameter changes the hash, so stale files are never reused.
    """
    blob = json.dumps(params, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(blob.encode()).hexdigest()[:12]
    d = Path(root).expanduser() / f"{prefix}-{digest}"
    d.mkdir(parents=True, exist_ok=True)
    meta = d / "params.json"
    if not meta.exists():
        with atomic_writer(meta, "w") as f:
            f.write(json.dumps(params, sort_keys=True, indent=2) + "\n")
    return d


class RaggedSequences:
    """Variable-length integer sequences stored as one flat array plus offsets.

    ``flat`` is (total,) of a small dtype (uint8/uint16), ``offsets`` is (n + 1,) int64 with
    sequence ``i`` = ``flat[offsets[i]:offsets[i + 1]]``. One flat buffer instead of n tensors
    keeps 96k ListOps sequences at ~100 MB instead of ~800 MB of int64 tensors.
    """

    def __init__(self, flat: np.ndarray, offsets: np.ndarray) -> None:
        offsets = np.asarray(offsets, dtype=np.int64)
        if offsets.ndim != 1 or offsets.size == 0 or offsets[0] != 0 or offsets[-1] != flat.size:
            raise ValueError("offsets must be (n + 1,) starting at 0 and ending at flat.size")
        self.flat = flat
        self.offsets = offsets

    @classmethod
    def from_list(cls, seqs: Sequence[np.ndarray], dtype: Any = np.uint16) -> RaggedSequences:
        """Concatenate ``seqs`` (each (n_i,)) into one ragged store of ``dtype``."""
        lengths = np.fromiter((len(s) for s in seqs), dtype=np.int64, count=len(seqs))
        offsets = np.zeros(len(seqs) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        flat = np.concatenate(seqs).astype(dtype) if seqs else np.zeros(0, dtype)
        return cls(flat, offsets)

    @classmethod
    def from_matrix(cls, matrix: np.ndarray) -> RaggedSequences:
        """Equal-length rows of ``matrix`` (n, L) as a ragged store (images: L = H * W)."""
        n, length = matrix.shape
        return cls(np.ascontiguousarray(matrix).reshape(-1), np.arange(n + 1) * length)

    def __len__(self) -> int:
        return self.offsets.size - 1

    def __getitem__(self, i: int) -> np.ndarray:
        return self.flat[self.offsets[i] : self.offsets[i + 1]]

    @property
    def lengths(self) -> np.ndarray:
        """(n,) int64 length of each sequence."""
        return np.diff(self.offsets)

    def subset(self, index: np.ndarray) -> RaggedSequences:
        """The sequences at ``index`` (any int array), copied into a new compact store."""
        return RaggedSequences.from_list([self[int(i)] for i in index], self.flat.dtype)


def encode_bytes(data: bytes | str, max_len: int | None) -> np.ndarray:
    """Byte-level ids: (min(len, max_len),) uint16 with id = byte + BYTE_OFFSET.

    ``str`` is encoded as UTF-8 first; truncation happens on bytes (as LRA does), so a
    multi-byte character may be cut.
    """
    raw = data.encode("utf-8") if isinstance(data, str) else data
    if max_len is not None:
        raw = raw[:max_len]
    return np.frombuffer(raw, dtype=np.uint8).astype(np.uint16) + BYTE_OFFSET


def encode_byte_texts(texts: Sequence[bytes | str], max_len: int | None) -> RaggedSequences:
    """Encode many texts with :func:`encode_bytes` into one ragged uint16 store."""
    return RaggedSequences.from_list([encode_bytes(t, max_len) for t in texts], np.uint16)


class SequenceClassificationDataset(Dataset):
    """Items are ``(ids LongTensor (n,), label int)``; padding is the collate's job."""

    def __init__(self, seqs: RaggedSequences, labels: np.ndarray) -> None:
        if len(seqs) != len(labels):
            raise ValueError(f"{len(seqs)} sequences but {len(labels)} labels")
        self.seqs = seqs
        self.labels = np.asarray(labels, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.from_numpy(self.seqs[i].astype(np.int64)), int(self.labels[i])


def image_dataset(images: np.ndarray, labels: np.ndarray) -> SequenceClassificationDataset:
    """Images (N, H, W) uint8 as row-major pixel sequences (H * W,) with id = pixel value."""
    return SequenceClassificationDataset(
        RaggedSequences.from_matrix(images.reshape(len(images), -1)), labels
    )


def pad_batch(
    seqs: Sequence[torch.Tensor], max_len: int, pad_id: int = PAD_ID, pad_to_max_len: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Truncate each (n_i,) sequence to ``max_len`` and right-pad to a common length L.

    L is ``max_len`` if ``pad_to_max_len`` else the longest truncated sequence (at least 1, so
    a batch of empty sequences still has a shape attention can take).
    Returns ids (B, L) int64 and mask (B, L) bool, True where the token is real.
    """
    lengths = [min(len(s), max_len) for s in seqs]
    width = max_len if pad_to_max_len else max(1, max(lengths, default=0))
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.bool)
    for row, (s, n) in enumerate(zip(seqs, lengths, strict=True)):
        ids[row, :n] = s[:n]
        mask[row, :n] = True
    return ids, mask


@dataclass(frozen=True)
class ClassificationCollate:
    """Collate ``[(ids (n_i,), label)]`` into ``(ids (B, L), mask (B, L), labels (B,))``.

    A dataclass rather than a closure so DataLoader worker processes can pickle it.
    """

    max_len: int
    pad_id: int = PAD_ID
    pad_to_max_len: bool = False

    def __call__(self, batch: Sequence[tuple[torch.Tensor, int]]) -> tuple[torch.Tensor, ...]:
        ids, mask = pad_batch([b[0] for b in batch], self.max_len, self.pad_id, self.pad_to_max_len)
        labels = torch.tensor([b[1] for b in batch], dtype=torch.long)
        return ids, mask, labels


@dataclass(frozen=True)
class TaskData:
    """What a trainer needs for one task: three splits, vocabulary/class sizes and a collate.

    ``dataset`` names the data actually read (e.g. ``CIFAR-10``); a stand-in for the
    benchmark's own data says "substitute" in it, and reports show it as given.
    """

    train: Dataset
    val: Dataset
    test: Dataset
    vocab_size: int
    num_classes: int
    collate: Callable[[Sequence[Any]], tuple[torch.Tensor, ...]]
    dataset: str = ""

    @classmethod
    def from_splits(
        cls,
        sets: dict[str, Dataset],
        vocab_size: int,
        num_classes: int,
        collate: Callable[[Sequence[Any]], tuple[torch.Tensor, ...]],
        dataset: str = "",
    ) -> TaskData:
        """From ``{"train": ..., "val": ..., "test": ...}``."""
        return cls(
            sets["train"], sets["val"], sets["test"], vocab_size, num_classes, collate, dataset
        )


SPLITS = ("train", "val", "test")


@dataclass(frozen=True)
class GeneratorConfig:
    """Base of the configs of generated tasks: split sizes and the seed.

    Subclasses add their generation parameters and set ``FORMAT`` (a version tag that goes
    into the cache key, so a change of the generator's output invalidates old caches).
    """

    n_train: int = 0
    n_val: int = 0
    n_test: int = 0
    seed: int = 0
    FORMAT: ClassVar[str] = "generated-v1"

    def __post_init__(self) -> None:
        if min(self.n_train, self.n_val, self.n_test) < 0:
            raise DataError(f"{type(self).__name__}: split sizes must be >= 0")

    def split_size(self, split: str) -> int:
        return {"train": self.n_train, "val": self.n_val, "test": self.n_test}[split]

    def generator_params(self) -> dict[str, Any]:
        """What a split's content depends on: everything but the sizes, which only set how
        long a prefix of the split's example stream is kept."""
        p = asdict(self)
        for k in ("n_train", "n_val", "n_test"):
            p.pop(k)
        p["format"] = self.FORMAT
        return p


def ensure_generated(
    cache_dir: str | os.PathLike[str] | None,
    prefix: str,
    cfg: GeneratorConfig,
    splits: Sequence[str],
    filename: Callable[[str, int], str],
    make: Callable[[Path, str], None],
) -> dict[str, Path]:
    """``{split: path}`` of cached generated files, calling ``make(path, split)`` for each
    missing one. Files live in ``<cache_dir>/<prefix>-<hash of cfg's generation params>/``
    and are named ``filename(split, size)``; ``make`` must write atomically."""
    root = keyed_cache_dir(cache_dir or default_cache_dir(), prefix, cfg.generator_params())
    paths = {}
    for split in splits:
        path = root / filename(split, cfg.split_size(split))
        if not path.exists():
            # The jobs of a parallel sweep need the same files: one generates each while the
            # others wait for it (two Pathfinder jobs each spent 261 s on the same 20k images).
            with exclusive_lock(root / f".{path.name}.lock"):
                if not path.exists():
                    make(path, split)
        paths[split] = path
    return paths


# What reading a damaged file raises: our own format errors, and numpy's on a bad npz.
DAMAGED_FILE_ERRORS = (DataError, OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile)


def read_cached(path: Path, read: Callable[[Path], T], rebuild: Callable[[], Path]) -> T:
    """``read(path)`` of a file that nys generated into a cache; a file that cannot be read is
    deleted and ``rebuild()`` (which must write it again and return its path) runs once.

    Cache files are written atomically, so a damaged one was changed from outside (a disk
    fault, a hand edit); regenerating is what a cache should do, and a rebuilt file that still
    fails raises as usual, naming it.
    """
    try:
        return read(path)
    except DAMAGED_FILE_ERRORS as error:
        log.warning("%s: cache file cannot be read (%s); generating it again", path, error)
        path.unlink(missing_ok=True)
        return read(rebuild())


def read_generated_splits(
    cfg: GeneratorConfig,
    ensure: Callable[[tuple[str, ...]], dict[str, Path]],
    read: Callable[[Path], tuple[Any, np.ndarray]],
) -> dict[str, tuple[Any, np.ndarray]]:
    """``{split: (data, labels)}`` of every split of a generated task.

    ``ensure(splits)`` returns the cached files, generating missing ones; ``read(path)`` reads
    one. A file that cannot be read, or holds other than ``cfg.split_size(split)`` examples (a
    truncated file can still parse), is generated again once (:func:`read_cached`).
    """

    def read_whole(split: str, path: Path) -> tuple[Any, np.ndarray]:
        data, labels = read(path)
        if len(labels) != cfg.split_size(split):
            raise DataError(
                f"{path}: {len(labels)} examples where {cfg.split_size(split)} were written"
            )
        return data, labels

    return {
        split: read_cached(
            path, functools.partial(read_whole, split), lambda split=split: ensure((split,))[split]
        )
        for split, path in ensure(SPLITS).items()
    }


def seeded_permutation(n: int, seed: int) -> np.ndarray:
    """(n,) permutation of range(n) from ``np.random.default_rng(seed)`` (stable across runs)."""
    return np.random.default_rng(seed).permutation(n)


def split_counts(n: int, fractions: Sequence[float]) -> list[int]:
    """Sizes of consecutive slices of ``n`` items for ``fractions`` (the last gets the rest).

    Uses ``int(round(f * n))`` cumulatively, so 80/10/10 of 200k is 160k/20k/20k exactly.
    """
    bounds = [0]
    acc = 0.0
    for f in fractions[:-1]:
        acc += f
        bounds.append(int(round(acc * n)))
    bounds.append(n)
    return [b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
