"""Helpers several test files share (fixtures live in conftest.py)."""

from __future__ import annotations

import gzip
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from nyscli.data.common import ClassificationCollate, RaggedSequences, SequenceClassificationDataset
from nyscli.experiments.lra.tasks import classification_objective
from nyscli.models.classifier import build_classifier
from nyscli.train.batches import ShuffledBatches, eval_batches
from nyscli.train.config import TrainerConfig
from nyscli.train.loop import Trainer
from nyscli.train.seed import seed_everything


def idx_bytes(array: np.ndarray) -> bytes:
    """``array`` (uint8 values) in the IDX format: magic, dimensions, data."""
    head = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
    head += struct.pack(f">{array.ndim}I", *array.shape)
    return head + array.astype(np.uint8).tobytes()


def write_idx_files(folder: Path, data: dict, gz: bool = False) -> Path:
    """``data``: {"train" | "t10k": (images (N, 28, 28), labels (N,))} as Fashion-MNIST's four
    IDX files in ``folder`` (gzip'd with ``gz``)."""
    folder.mkdir(parents=True, exist_ok=True)
    for prefix, (images, labels) in data.items():
        for kind, arr in (("images-idx3", images), ("labels-idx1", labels)):
            blob = idx_bytes(np.asarray(arr))
            name = f"{prefix}-{kind}-ubyte"
            if gz:
                (folder / f"{name}.gz").write_bytes(gzip.compress(blob))
            else:
                (folder / name).write_bytes(blob)
    return folder


def write_fashion_mnist(folder: Path, n_train: int, n_test: int, seed: int = 0) -> Path:
    """A small Fashion-MNIST in its real file format: random 28x28 images, labels 0..9."""
    rng = np.random.default_rng(seed)
    data = {
        "train": (rng.integers(0, 256, (n_train, 28, 28)), rng.integers(0, 10, n_train)),
        "t10k": (rng.integers(0, 256, (n_test, 28, 28)), rng.integers(0, 10, n_test)),
    }
    return write_idx_files(folder, data)


def smooth_qkv(b: int, h: int, n: int, d: int, seed: int = 0, dtype=torch.float64):
    """q, k, v (b, h, n, d) that vary smoothly along n (a random walk), so attention has the
    low-rank structure segment means exploit; i.i.d. noise would make every method look bad."""
    gen = torch.Generator().manual_seed(seed)
    steps = torch.randn(3, b, h, n, d, generator=gen, dtype=dtype) / n**0.5
    walk = steps.cumsum(dim=3) * 2.0
    return walk[0], walk[1], torch.randn(b, h, n, d, generator=gen, dtype=dtype)


# A ListOps run of a few seconds (nys lra overrides).
LRA_TINY = [
    "data.generate.n_train=48",
    "data.generate.n_val=16",
    "data.generate.n_test=16",
    "data.generate.min_len=10",
    "data.generate.max_len=40",
    "task.max_len=40",
    "trainer.eval_every=2",
    "trainer.warmup_steps=1",
    "trainer.log_every=1",
    "attention.num_landmarks=4",
    "model.dim=16",
    "model.ffn_dim=16",
    "threads=1",
    "--steps",
    "4",
    "--batch-size",
    "8",
]


def run_folders(root: Path) -> list[Path]:
    return sorted(p.parent.parent for p in root.rglob(".hydra/config.yaml"))


TINY_MODEL = {"dim": 16, "depth": 1, "num_heads": 2, "ffn_dim": 16, "dropout": 0.2}


def toy_dataset(n: int, seed: int) -> SequenceClassificationDataset:
    """Sequences of 3..12 tokens; label = whether token 1 occurs more often than token 2."""
    gen = torch.Generator().manual_seed(seed)
    seqs, labels = [], []
    for _ in range(n):
        length = int(torch.randint(3, 13, (1,), generator=gen))
        seq = torch.randint(1, 5, (length,), generator=gen)
        seqs.append(seq.numpy())
        labels.append(int((seq == 1).sum() > (seq == 2).sum()))
    return SequenceClassificationDataset(RaggedSequences.from_list(seqs), torch.tensor(labels))


def make_trainer(run_dir: Path, **overrides) -> tuple[Trainer, ShuffledBatches, object]:
    seed_everything(0)
    model = build_classifier(
        vocab_size=5, max_len=12, num_classes=2, model=TINY_MODEL, attention={"name": "softmax"}
    )
    values = dict(
        max_steps=8, batch_size=4, lr=3e-3, warmup_steps=2, eval_every=4, log_every=2,
        clip_grad_norm=1.0, progress=False,
    )  # fmt: skip
    config = TrainerConfig.from_mapping({**values, **overrides})
    collate = ClassificationCollate(12)
    train_set = toy_dataset(40, seed=1)
    train = ShuffledBatches(train_set, 4, collate, seed=0, lengths=train_set.seqs.lengths, bucket=2)
    dev = eval_batches(toy_dataset(12, seed=2), 8, collate)
    return Trainer(model, classification_objective, config, run_dir, "cpu"), train, dev


WORDS = [
    "alpha",
    "beta",
    "gamma",
    "delta",
    "epsilon",
    "zeta",
    "eta",
    "theta",
    "iota",
    "kappa",
    "lambda",
    "mu",
    "nu",
    "xi",
    "omicron",
]


def write_corpus(folder, n_docs: int = 30, seed: int = 0) -> list[str]:
    """``n_docs`` .txt documents of 2-4 paragraphs of random sentences; also returns them."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    docs = []
    for i in range(n_docs):
        paragraphs = []
        for _ in range(rng.integers(2, 5)):
            sents = [
                " ".join(rng.choice(WORDS, rng.integers(3, 9))).capitalize() + "."
                for _ in range(rng.integers(1, 4))
            ]
            paragraphs.append(" ".join(sents))
        docs.append(f"Document{i} " + "\n\n".join(paragraphs))
        (folder / f"doc{i:03d}.txt").write_text(docs[-1])
    return docs


def pretrain_tiny(corpus: Path, cache: Path) -> list[str]:
    return [
        "data=folder",
        f"data.path={corpus}",
        f"data_cache={cache}",
        "tokenizer.vocab_size=150",
        "tokenizer.min_frequency=1",
        "model.dim=16",
        "model.depth=1",
        "model.num_heads=2",
        "model.ffn_dim=32",
        "model.max_len=48",
        "attention.num_landmarks=4",
        "attention.conv_kernel_size=3",
        "trainer.eval_every=2",
        "trainer.log_every=1",
        "trainer.warmup_steps=1",
        "trainer.eval_examples=null",
        "trainer.progress=false",
        "threads=1",
    ]


def nys_subprocess(cwd: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """The real ``nys`` console entry point in a subprocess inside ``cwd``."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    return subprocess.run(
        [sys.executable, "-m", "nyscli.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )
