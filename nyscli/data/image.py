"""LRA Image: grayscale CIFAR-10 as 1024-pixel sequences; Fashion-MNIST padded to 32x32.

CIFAR-10 ("python version"): a folder with ``data_batch_1`` .. ``data_batch_5`` and
``test_batch`` (or a folder containing ``cifar-10-batches-py/``, or the
``cifar-10-python.tar.gz`` archive itself). Each batch is a pickled dict with ``b'data'``
(N, 3072) uint8, rows holding the 1024 red, then green, then blue values of a 32x32 image
in row-major order, and ``b'labels'`` (N,) ints 0..9. Pickle can run code: only read files
you trust.

Grayscale uses the ITU-R 601 luminance weights that LRA's ``tf.image.rgb_to_grayscale``
uses (0.2989, 0.5870, 0.1140), rounded to the nearest integer. (TF converts back to uint8
by truncating ``x * 255.5 / 255``; the results differ by at most one grey level.)

Fashion-MNIST (the offline substitute for CIFAR-10: 10 classes, but clothing photographed on
a plain background, so much easier): the IDX files
``{train,t10k}-{images-idx3,labels-idx1}-ubyte`` (gzip'd with ``.gz`` or not), e.g. from the
Debian package ``dataset-fashion-mnist`` in
``/usr/share/datasets/fashion-mnist``. IDX: 2 zero bytes, a type byte (0x08 = uint8), the
number of dimensions, then each dimension as a big-endian uint32, then the data. The 28x28
images are zero-padded by 2 pixels on each side to 32x32.

Sequences: the H * W = 1024 pixels row-major, id = grey value (vocabulary 256), labels 0..9.
All sequences have the same length, so no padding happens. Splits follow LRA: the last
``val_fraction`` (10 %) of the training set is the validation set (CIFAR 45k/5k/10k,
Fashion-MNIST 54k/6k/10k).
"""

from __future__ import annotations

import gzip
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np

from nyscli.data.common import (
    ClassificationCollate,
    DataError,
    TaskData,
    image_dataset,
    reading,
    require_path,
    split_counts,
)

VOCAB_SIZE = 256
NUM_CLASSES = 10
GRAY_WEIGHTS = (0.2989, 0.5870, 0.1140)
CIFAR_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))
CIFAR_TEST = "test_batch"
# The offline substitute's folder: $NYSCLI_FASHION_MNIST if set, else the Debian package's.
FASHION_MNIST_ENV = "NYSCLI_FASHION_MNIST"
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_HINT = (
    "sudo apt-get install dataset-fashion-mnist (Debian/Ubuntu package), or set "
    f"{FASHION_MNIST_ENV}=<folder with its IDX files>"
)
CIFAR10 = "CIFAR-10"
FASHION_MNIST = "Fashion-MNIST (substitute for CIFAR-10)"
IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def rgb_to_gray(planar: np.ndarray) -> np.ndarray:
    """CIFAR rows (N, 3072) uint8 (R plane, G plane, B plane) -> (N, 32, 32) uint8 grey."""
    rgb = planar.reshape(-1, 3, 32, 32).astype(np.float64)
    gray = np.tensordot(np.asarray(GRAY_WEIGHTS), rgb, axes=([0], [1]))
    return np.clip(np.rint(gray), 0, 255).astype(np.uint8)


def _unpickle(blob: bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
    try:
        d = pickle.loads(blob, encoding="bytes")
        data = np.asarray(d[b"data"], dtype=np.uint8)
        labels = np.asarray(d[b"labels"], dtype=np.int64)
    except Exception as exc:  # truncated files raise anything from EOFError to KeyError
        raise DataError(f"{name}: not a CIFAR-10 python batch ({exc!r})") from None
    if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
        raise DataError(f"{name}: data is {data.shape}, expected (N, 3072) with N labels")
    return data, labels


def _cifar_blobs(path: Path) -> dict[str, bytes]:
    """Raw bytes of the six batch files from a folder or the .tar.gz archive."""
    names = (*CIFAR_TRAIN, CIFAR_TEST)
    if path.is_file():
        with reading(path, "data.path", "cifar-10-python.tar.gz"), tarfile.open(path) as tar:
            members = {Path(m.name).name: m for m in tar.getmembers() if m.isfile()}
            missing = [n for n in names if n not in members]
            if missing:
                raise DataError(f"data.path={path}: archive lacks {', '.join(missing)}")
            return {n: tar.extractfile(members[n]).read() for n in names}  # type: ignore[union-attr]
    for root in (path, path / "cifar-10-batches-py"):
        if all((root / n).is_file() for n in names):
            with reading(root, "data.path", "the CIFAR-10 python batches"):
                return {n: (root / n).read_bytes() for n in names}
    raise DataError(
        f"data.path={path}: no data_batch_1..5 and test_batch; expected the CIFAR-10 python "
        "version (cifar-10-batches-py folder or cifar-10-python.tar.gz)"
    )


def read_cifar10(path: str | os.PathLike[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{"train": (images (50000, 32, 32) uint8 grey, labels), "test": (10000 ...)}``."""
    root = require_path(path, "the CIFAR-10 python batches (cifar-10-batches-py)")
    blobs = _cifar_blobs(root)
    parts = {n: _unpickle(blobs[n], n) for n in blobs}
    train = [parts[n] for n in CIFAR_TRAIN]
    return {
        "train": (
            rgb_to_gray(np.concatenate([d for d, _ in train])),
            np.concatenate([lab for _, lab in train]),
        ),
        "test": (rgb_to_gray(parts[CIFAR_TEST][0]), parts[CIFAR_TEST][1]),
    }


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """An IDX array (gzip detected by its magic bytes, not the file name)."""
    with reading(path, "data.path", "a Fashion-MNIST IDX file"):
        raw = Path(path).read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
    if len(raw) < 4 or raw[:2] != b"\x00\x00" or raw[2] not in IDX_DTYPES:
        raise DataError(f"{path}: not an IDX file")
    ndim = raw[3]
    dims = np.frombuffer(raw, dtype=">u4", count=ndim, offset=4).astype(np.int64)
    dtype = np.dtype(IDX_DTYPES[raw[2]])
    count = int(np.prod(dims))
    offset = 4 + 4 * ndim
    if len(raw) - offset != count * dtype.itemsize:
        raise DataError(f"{path}: {len(raw) - offset} data bytes for dims {dims.tolist()}")
    return (
        np.frombuffer(raw, dtype=dtype, offset=offset).reshape(dims).astype(dtype.newbyteorder("="))
    )


def _idx_file(root: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz"):
        if (root / name).is_file():
            return root / name
    raise DataError(f"data.path={root}: missing {stem}[.gz]; expected Fashion-MNIST IDX files")


def fashion_mnist_dir() -> Path:
    """Where the offline substitute is read from when no ``data.path`` is given."""
    return Path(os.environ.get(FASHION_MNIST_ENV) or FASHION_MNIST_DIR)


def read_fashion_mnist(
    path: str | os.PathLike[str] | None = None,
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{"train": (images (60000, 32, 32) uint8, labels), "test": (10000, ...)}``, padded.

    ``path`` None: :func:`fashion_mnist_dir`."""
    if path is None and not fashion_mnist_dir().is_dir():
        raise DataError(
            f"Fashion-MNIST is not installed at {fashion_mnist_dir()}: {FASHION_MNIST_HINT}; "
            "or give data.path=<cifar-10-batches-py> for CIFAR-10"
        )
    path = fashion_mnist_dir() if path is None else path
    root = require_path(path, "a folder with Fashion-MNIST IDX files (train-images-idx3-ubyte)")
    out = {}
    for split, prefix in (("train", "train"), ("test", "t10k")):
        images = read_idx(_idx_file(root, f"{prefix}-images-idx3-ubyte"))
        labels = read_idx(_idx_file(root, f"{prefix}-labels-idx1-ubyte")).astype(np.int64)
        if images.ndim != 3 or len(images) != len(labels):
            raise DataError(
                f"data.path={root}: {prefix} images {images.shape}, labels {labels.shape}"
            )
        out[split] = (pad_to(images.astype(np.uint8), 32), labels)
    return out


def pad_to(images: np.ndarray, size: int) -> np.ndarray:
    """Zero-pad (N, h, w) images symmetrically to (N, size, size) (28 -> 32 adds 2 per side)."""
    n, h, w = images.shape
    top, left = (size - h) // 2, (size - w) // 2
    out = np.zeros((n, size, size), dtype=images.dtype)
    out[:, top : top + h, left : left + w] = images
    return out


def _task(
    raw: dict[str, tuple[np.ndarray, np.ndarray]], val_fraction: float, dataset: str
) -> TaskData:
    """Train/val/test image datasets; val is the last ``val_fraction`` of train (as LRA)."""
    images, labels = raw["train"]
    n_train = split_counts(len(labels), (1.0 - val_fraction, val_fraction))[0]
    test_images, test_labels = raw["test"]
    seq_len = images.shape[1] * images.shape[2]
    return TaskData(
        train=image_dataset(images[:n_train], labels[:n_train]),
        val=image_dataset(images[n_train:], labels[n_train:]),
        test=image_dataset(test_images, test_labels),
        vocab_size=VOCAB_SIZE,
        num_classes=NUM_CLASSES,
        collate=ClassificationCollate(seq_len),
        dataset=dataset,
    )


def load_cifar10(path: str | os.PathLike[str], *, val_fraction: float = 0.1) -> TaskData:
    """Grey CIFAR-10 datasets of ``(pixel ids (1024,), label)``: 45k/5k/10k by default."""
    return _task(read_cifar10(path), val_fraction, CIFAR10)


def load_fashion_mnist(
    path: str | os.PathLike[str] | None = None, *, val_fraction: float = 0.1
) -> TaskData:
    """Fashion-MNIST datasets of ``(pixel ids (1024,), label)`` padded to 32x32: 54k/6k/10k."""
    return _task(read_fashion_mnist(path), val_fraction, FASHION_MNIST)
