"""Endless, seeded, resumable training batches, and plain sequential evaluation batches.

The trainer saves where :class:`ShuffledBatches` stands (epoch, batch index) in every
checkpoint; a resumed run therefore sees exactly the batches the interrupted one would have.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, Dataset

from nyscli.data.subsets import evaluation_subset
from nyscli.train import distributed

Collate = Callable[[Sequence[Any]], Any]


class ShuffledBatches:
    """Batches of ``dataset`` in a fresh permutation per epoch, forever.

    Epoch e's order comes from ``np.random.default_rng([seed, e])`` only, so it does not
    depend on anything else the run draws. With ``lengths`` and ``bucket`` > 1, each window
    of ``bucket`` batches of the permutation is sorted by length before it is cut into
    batches, and the window's batches are shuffled: far less padding on variable-length
    data (ListOps: 500..2000 tokens), while every batch still mixes examples at random.

    With several ranks (torch.distributed), ``batch_size`` is per rank: every rank draws the
    same permutation of global batches of ``batch_size * world_size`` examples and takes its
    own slice of each, so 2 ranks x batch b see exactly what 1 process x batch 2b sees.
    ``drop_last=False`` keeps a last short batch only in one process.
    """

    def __init__(
        self,
        dataset: Dataset,
        batch_size: int,
        collate: Collate,
        seed: int,
        lengths: np.ndarray | None = None,
        bucket: int = 1,
        drop_last: bool = True,
    ) -> None:
        n = len(dataset)  # type: ignore[arg-type]
        if n == 0:
            raise ValueError("the training set is empty")
        self.rank, self.world_size = distributed.rank(), distributed.world_size()
        if n < self.world_size:
            raise ValueError(f"{n} training examples cannot feed {self.world_size} ranks")
        self.dataset = dataset
        self.batch_size = min(batch_size, n // self.world_size)  # per rank
        self.global_batch_size = self.batch_size * self.world_size
        self.collate = collate
        self.seed = seed
        self.lengths = None if lengths is None else np.asarray(lengths)
        self.bucket = max(1, bucket)
        self.drop_last = drop_last
        self.epoch = 0
        self.position = 0  # batches of the current epoch already handed out

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """The global index arrays (each (global_batch_size,) or shorter) of epoch ``epoch``."""
        rng = np.random.default_rng([self.seed, epoch])
        order = rng.permutation(len(self.dataset))  # type: ignore[arg-type]
        size = self.global_batch_size
        if self.lengths is not None and self.bucket > 1:
            window = size * self.bucket
            chunks = []
            for start in range(0, order.size, window):
                part = order[start : start + window]
                chunks.append(part[np.argsort(self.lengths[part], kind="stable")])
            order = np.concatenate(chunks)
        keep_short = not self.drop_last and self.world_size == 1
        stop = order.size if keep_short else order.size - order.size % size
        batches = [order[i : i + size] for i in range(0, stop, size)]
        if self.lengths is not None and self.bucket > 1:
            batches = [batches[i] for i in rng.permutation(len(batches))]
        return batches

    def __iter__(self) -> Iterator[Any]:
        while True:
            batches = self.epoch_batches(self.epoch)
            while self.position < len(batches):
                start = self.rank * self.batch_size
                index = batches[self.position][start : start + self.batch_size]
                self.position += 1  # counted before the yield: the batch is now consumed
                yield self.collate([self.dataset[int(i)] for i in index])
            self.epoch += 1
            self.position = 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Continue at the saved position; the seed stays this run's (the same unless the
        resume changed it on purpose: ``resume_changes=allow``)."""
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])


def eval_batches(
    dataset: Dataset, batch_size: int, collate: Collate, limit: int | None = None
) -> DataLoader:
    """Sequential batches over ``dataset``, or over a seeded, label-stratified sample of
    ``limit`` of its examples (:func:`~nyscli.data.subsets.evaluation_subset`); re-iterable."""
    subset = evaluation_subset(dataset, limit)
    return DataLoader(subset, batch_size=batch_size, shuffle=False, collate_fn=collate)
