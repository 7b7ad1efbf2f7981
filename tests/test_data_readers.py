"""Readers on fixtures written here: IMDB (folder, CSV), AAN TSV, CIFAR-10, Fashion-MNIST."""

from __future__ import annotations

import io
import pickle
import struct
import sys
import tarfile
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from nyscli.data import common, image, retrieval, text
from nyscli.data.common import DataError
from nyscli.files import atomic_writer
from tests.helpers import idx_bytes, write_idx_files

# ------------------------------------------------------------------ common


def test_atomic_writer_and_keyed_cache(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "f.bin"
    with atomic_writer(target) as f:
        f.write(b"abc")
    assert target.read_bytes() == b"abc"
    with pytest.raises(RuntimeError), atomic_writer(target) as f:
        f.write(b"half")
        raise RuntimeError("crash")
    assert target.read_bytes() == b"abc"  # untouched, and no temp file left
    assert [p.name for p in target.parent.iterdir()] == ["f.bin"]
    a = common.keyed_cache_dir(tmp_path, "x", {"n": 1, "s": "a"})
    assert a == common.keyed_cache_dir(tmp_path, "x", {"s": "a", "n": 1})
    assert a != common.keyed_cache_dir(tmp_path, "x", {"n": 2, "s": "a"})
    assert '"n": 1' in (a / "params.json").read_text()


def _generate_in_a_job(cache: str, log: str) -> None:
    """One sweep job's ensure_generated: each file it makes is logged, slowly."""
    import time

    def make(path: Path, split: str) -> None:
        with open(log, "a") as f:
            f.write(f"{split}\n")
        time.sleep(0.3)  # long enough for the other job to find the file missing
        with atomic_writer(path) as f:
            f.write(split.encode())

    cfg = common.GeneratorConfig(n_train=3, n_val=1, n_test=1)
    common.ensure_generated(cache, "toy", cfg, common.SPLITS, lambda s, n: f"{s}-{n}", make)


def test_parallel_jobs_generate_each_cached_file_once(tmp_path: Path) -> None:
    """Two jobs of a parallel sweep needing the same generated data: one makes each file,
    the other waits for it and reads it (they used to both generate it, in full)."""
    import multiprocessing

    log = tmp_path / "made.txt"
    context = multiprocessing.get_context("fork")
    jobs = [
        context.Process(target=_generate_in_a_job, args=(str(tmp_path / "c"), str(log)))
        for _ in range(2)
    ]
    for job in jobs:
        job.start()
    for job in jobs:
        job.join(30)
    assert [job.exitcode for job in jobs] == [0, 0]
    assert sorted(log.read_text().split()) == ["test", "train", "val"]
    [root] = (tmp_path / "c").iterdir()
    assert (root / "train-3").read_bytes() == b"train"


def test_pad_batch_and_ragged() -> None:
    seqs = common.RaggedSequences.from_list([np.array([5, 6, 7]), np.array([], int), np.array([9])])
    assert seqs.lengths.tolist() == [3, 0, 1] and seqs[2].tolist() == [9]
    ids, mask = common.pad_batch([torch.from_numpy(s.astype(np.int64)) for s in seqs], 2)
    assert ids.tolist() == [[5, 6], [0, 0], [9, 0]]
    assert mask.tolist() == [[True, True], [False, False], [True, False]]
    ids, mask = common.pad_batch([torch.tensor([1])], 4, pad_id=3, pad_to_max_len=True)
    assert ids.tolist() == [[1, 3, 3, 3]] and mask.sum() == 1
    assert common.split_counts(200_000, (0.8, 0.1, 0.1)) == [160_000, 20_000, 20_000]
    assert common.encode_bytes("é!", None).tolist() == [0xC3 + 1, 0xA9 + 1, ord("!") + 1]


# ------------------------------------------------------------------ IMDB

REVIEWS = {
    ("train", "pos"): {"10_9": "Great film.", "2_8": "Café au lait <br />good"},
    ("train", "neg"): {"0_1": "Awful.", "3_2": "Bad\tacting"},
    ("test", "pos"): {"1_10": "Loved it"},
    ("test", "neg"): {"4_3": "Meh"},
}


def write_aclimdb(root: Path) -> Path:
    for (split, label), files in REVIEWS.items():
        d = root / "aclImdb" / split / label
        d.mkdir(parents=True)
        for stem, body in files.items():
            (d / f"{stem}.txt").write_bytes(body.encode("utf-8"))
    (root / "aclImdb" / "train" / "unsup").mkdir()
    (root / "aclImdb" / "train" / "unsup" / "0_0.txt").write_text("ignored")
    return root


def decode(ids: torch.Tensor) -> str:
    return bytes((ids - common.BYTE_OFFSET).tolist()).decode("utf-8")


def test_imdb_folder(tmp_path: Path) -> None:
    raw = text.read_imdb(write_aclimdb(tmp_path))  # the parent of aclImdb works too
    texts, labels = raw["train"]
    # negatives first, then positives; each in numeric id order (2 before 10)
    assert [t.decode() for t in texts] == [
        "Awful.",
        "Bad\tacting",
        "Café au lait <br />good",
        "Great film.",
    ]
    assert labels.tolist() == [0, 0, 1, 1]
    task = text.load_imdb(tmp_path / "aclImdb", max_len=8)
    assert (task.vocab_size, task.num_classes) == (257, 2)
    assert task.val is task.test  # LRA validates on the test set
    ids, label = task.train[2]
    assert ids.tolist() == [b + 1 for b in "Café au".encode()]  # 8 bytes: é is two
    assert label == 1
    ids, mask, labels = task.collate([task.test[0], task.test[1]])
    assert decode(ids[0][mask[0]]) == "Meh" and decode(ids[1][mask[1]]) == "Loved it"
    assert ids.shape == (2, 8) and ids[0, 3:].eq(0).all() and labels.tolist() == [0, 1]


def imdb_frame(with_split: bool) -> pd.DataFrame:
    rows = [
        (body, "positive" if label == "pos" else "negative", split)
        for (split, label), files in REVIEWS.items()
        for body in files.values()
    ]
    df = pd.DataFrame(rows, columns=["review", "sentiment", "split"])
    return df if with_split else df.drop(columns="split")


def test_imdb_csv_with_split(tmp_path: Path) -> None:
    path = tmp_path / "imdb.csv.gz"
    imdb_frame(with_split=True).to_csv(path, index=False)  # gzip by suffix
    raw = text.read_imdb(path)
    assert [t.decode() for t in raw["train"][0]] == [
        "Great film.",
        "Café au lait <br />good",
        "Awful.",
        "Bad\tacting",
    ]
    assert raw["train"][1].tolist() == [1, 1, 0, 0]
    assert raw["test"][1].tolist() == [1, 0]


def test_imdb_csv_without_split_is_seeded(tmp_path: Path) -> None:
    path = tmp_path / "imdb.csv"
    imdb_frame(with_split=False).to_csv(path, index=False)
    a = text.read_imdb(path, test_fraction=0.5, seed=0)
    b = text.read_imdb(path, test_fraction=0.5, seed=0)
    assert a["train"][0] == b["train"][0]
    assert len(a["train"][0]) == len(a["test"][0]) == 3
    everything = sorted(a["train"][0] + a["test"][0])
    assert everything == sorted(t.encode() for f in REVIEWS.values() for t in f.values())
    splits = {tuple(text.read_imdb(path, seed=s)["test"][0]) for s in range(8)}
    assert len(splits) > 1  # the seed matters
    task = text.load_imdb(path, val_fraction=0.34, seed=0)
    assert (len(task.train), len(task.val), len(task.test)) == (2, 1, 3)


def test_imdb_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    missing = tmp_path / "x"
    with pytest.raises(DataError) as err:
        text.load_imdb(missing)
    assert str(err.value) == (
        f"data.path={missing} does not exist; "
        "expected an aclImdb folder or a CSV with columns review,sentiment"
    )
    bad = tmp_path / "bad.csv"
    pd.DataFrame({"text": ["a"], "label": [1]}).to_csv(bad, index=False)
    with pytest.raises(DataError, match="lacks column"):
        text.read_imdb(bad)
    pd.DataFrame({"review": ["a", "b"], "sentiment": ["positive", "meh"]}).to_csv(bad, index=False)
    with pytest.raises(DataError, match="row 3"):
        text.read_imdb(bad)
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(DataError, match="train/pos"):
        text.read_imdb(tmp_path / "empty_dir")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, "datasets", None)  # "not installed"
    with pytest.raises(DataError, match="pip install datasets"):
        text.read_imdb("imdb")


# ------------------------------------------------------------------ AAN


def aan_lines(label: str, i: int) -> str:
    return f"{label}\tP{i}-1\tP{i}-2\tdoc {i} one\tsecond doc {i}, longer"


def write_aan(root: Path, header: bool) -> Path:
    root.mkdir(parents=True)
    for split, labels in (("train", ["1", "0.0", "1.0"]), ("eval", ["0"]), ("test", ["1", "0"])):
        lines = [aan_lines(lab, i) for i, lab in enumerate(labels)]
        if header:
            lines.insert(0, "label\tid1\tid2\ttext1\ttext2")
        (root / f"new_aan_pairs.{split}.tsv").write_bytes(("\r\n".join(lines) + "\r\n").encode())
    return root


@pytest.mark.parametrize("header", [False, True])
def test_aan(tmp_path: Path, header: bool) -> None:
    root = write_aan(tmp_path / "tsv_data", header)
    t1, t2, labels = retrieval.read_aan_tsv(root / "new_aan_pairs.train.tsv")
    assert labels.tolist() == [1, 0, 1]
    assert t1[2] == b"doc 2 one" and t2[0] == b"second doc 0, longer"
    task = retrieval.load_aan(root, max_len=12)
    assert (len(task.train), len(task.val), len(task.test)) == (3, 1, 2)
    assert (task.vocab_size, task.num_classes) == (257, 2)
    ids1, mask1, ids2, mask2, labels = task.collate([task.test[0], task.test[1]])
    assert ids1.shape == (2, 9) and ids2.shape == (2, 12)  # each side padded on its own
    assert decode(ids1[0]) == "doc 0 one" and decode(ids2[1]) == "second doc 1"
    assert mask1.all() and mask2.all() and labels.tolist() == [1, 0]


def test_aan_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        retrieval.load_aan(tmp_path / "none")
    root = write_aan(tmp_path / "d", header=False)
    (root / "new_aan_pairs.eval.tsv").unlink()
    with pytest.raises(DataError, match="eval"):
        retrieval.load_aan(root)
    (root / "x.dev.tsv").write_text(aan_lines("1", 0) + "\n")  # val/dev names are accepted
    assert len(retrieval.load_aan(root).val) == 1
    bad = tmp_path / "bad.tsv"
    bad.write_text(aan_lines("1", 0) + "\n1\tonly\tthree\n")
    with pytest.raises(DataError, match=":2: 3 TAB-separated fields"):
        retrieval.read_aan_tsv(bad)


# ------------------------------------------------------------------ CIFAR-10

# (R, G, B) -> grey with weights (0.2989, 0.5870, 0.1140), rounded
COLOURS = {
    (255, 0, 0): 76,
    (0, 255, 0): 150,
    (0, 0, 255): 29,
    (255, 255, 255): 255,
    (10, 20, 30): 18,
}


def cifar_batch(colours: list[tuple[int, int, int]], labels: list[int]) -> bytes:
    data = np.zeros((len(colours), 3072), dtype=np.uint8)
    for i, (r, g, b) in enumerate(colours):
        data[i, :1024], data[i, 1024:2048], data[i, 2048:] = r, g, b
    data[0, 5] = 200  # red plane, pixel (0, 5) of the batch's first image
    return pickle.dumps({b"data": data, b"labels": labels, b"batch_label": b"x"})


def write_cifar(root: Path) -> Path:
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    cols = list(COLOURS)
    for i in range(1, 6):
        (d / f"data_batch_{i}").write_bytes(cifar_batch([cols[i - 1], cols[i % 5]], [i, i + 1]))
    (d / "test_batch").write_bytes(cifar_batch([cols[4]], [7]))
    return root


def test_cifar10_folder(tmp_path: Path) -> None:
    raw = image.read_cifar10(write_cifar(tmp_path))
    images, labels = raw["train"]
    assert images.shape == (10, 32, 32) and images.dtype == np.uint8
    assert labels.tolist() == [1, 2, 2, 3, 3, 4, 4, 5, 5, 6]
    greys = list(COLOURS.values())
    assert images[0, 0, 5] == round(0.2989 * 200)  # the one odd pixel
    assert images[0, 10, 10] == greys[0] and images[1, 31, 31] == greys[1]
    assert (images[2, 1:] == greys[1]).all() and (images[9] == greys[0]).all()
    assert images[2, 0, 5] == 209  # 0.2989 * 200 + 0.5870 * 255 = 209.47
    assert raw["test"][1].tolist() == [7] and (raw["test"][0][0, 1:] == greys[4]).all()
    task = image.load_cifar10(tmp_path / "cifar-10-batches-py")
    assert (len(task.train), len(task.val), len(task.test)) == (9, 1, 1)
    ids, label = task.val[0]
    assert ids.shape == (1024,) and label == 6 and (ids == greys[0]).all()
    assert (task.vocab_size, task.num_classes) == (256, 10)


def test_cifar10_tarball_and_errors(tmp_path: Path) -> None:
    src = write_cifar(tmp_path / "src") / "cifar-10-batches-py"
    tgz = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(src, arcname="cifar-10-batches-py")
    from_tar = image.read_cifar10(tgz)
    from_dir = image.read_cifar10(src)
    assert np.array_equal(from_tar["train"][0], from_dir["train"][0])
    with pytest.raises(DataError, match="does not exist"):
        image.load_cifar10(tmp_path / "nope")
    (src / "data_batch_3").write_bytes(b"\x80\x04truncated")
    with pytest.raises(DataError, match="data_batch_3"):
        image.read_cifar10(src)
    (src / "test_batch").unlink()
    with pytest.raises(DataError, match="test_batch"):
        image.read_cifar10(src)


# ------------------------------------------------------------------ Fashion-MNIST


@pytest.mark.parametrize("gz", [False, True])
def test_fashion_mnist_idx(tmp_path: Path, gz: bool) -> None:
    rng = np.random.default_rng(0)
    data = {
        "train": (rng.integers(1, 256, (10, 28, 28)), np.arange(10) % 10),
        "t10k": (rng.integers(1, 256, (3, 28, 28)), np.array([3, 1, 4])),
    }
    write_idx_files(tmp_path, data, gz)
    raw = image.read_fashion_mnist(tmp_path)
    images, labels = raw["train"]
    assert images.shape == (10, 32, 32) and labels.tolist() == list(range(10))
    assert np.array_equal(images[:, 2:30, 2:30], data["train"][0])
    assert images[:, :2].max() == 0 and images[:, :, 30:].max() == 0  # zero padding
    task = image.load_fashion_mnist(tmp_path)
    assert (len(task.train), len(task.val), len(task.test)) == (9, 1, 3)
    ids, label = task.test[2]
    assert label == 4 and ids.reshape(32, 32)[2:30, 2:30].tolist() == data["t10k"][0][2].tolist()


def test_idx_errors(tmp_path: Path) -> None:
    bad = tmp_path / "x"
    bad.write_bytes(b"\x00\x00\x08\x01" + struct.pack(">I", 5) + b"abc")  # 3 of 5 bytes
    with pytest.raises(DataError, match="data bytes"):
        image.read_idx(bad)
    bad.write_bytes(b"PK\x03\x04")
    with pytest.raises(DataError, match="not an IDX"):
        image.read_idx(bad)
    with pytest.raises(DataError, match="train-images-idx3-ubyte"):
        image.read_fashion_mnist(tmp_path)
    arr = np.arange(6, dtype=np.uint8).reshape(2, 3)
    buf = io.BytesIO(idx_bytes(arr))
    (tmp_path / "ok").write_bytes(buf.getvalue())
    assert image.read_idx(tmp_path / "ok").tolist() == arr.tolist()
