"""Evaluation subsets: seeded random samples, stratified by label, the same for every run.

Data files are often sorted (the IMDB CSV lists every positive review before the negative
ones), so "the first k examples" of a split can hold a single class and a constant predictor
then scores 100%. Every dev/test/validation subset of ``lra``, ``finetune`` and ``pretrain``
comes from :func:`subset_indices` with the fixed :data:`SUBSET_SEED`: every attention, every
training seed and every resumed run is evaluated on exactly the same examples.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from torch.utils.data import Dataset, Subset

# Fixed on purpose, independent of the run's ``seed``: runs that differ only in their seed
# (or attention) must be compared on the same examples.
SUBSET_SEED = 0


def subset_indices(
    n: int, size: int | None, labels: np.ndarray | None = None, seed: int = SUBSET_SEED
) -> np.ndarray:
    """(min(size, n),) sorted int64 indices of a seeded random sample of ``range(n)``.

    With ``labels`` ((n,) class ids) the sample is stratified: each class gets its share of
    ``size`` (largest remainders round), drawn at random within the class. ``size`` None or
    >= n: every index.
    """
    if size is None or size >= n:
        return np.arange(n, dtype=np.int64)
    rng = np.random.default_rng(seed)
    if labels is None:
        return np.sort(rng.permutation(n)[:size]).astype(np.int64)
    labels = np.asarray(labels)
    classes, counts = np.unique(labels, return_counts=True)
    exact = counts * size / n
    take = np.floor(exact).astype(np.int64)
    leftover = size - int(take.sum())
    take[np.argsort(-(exact - take), kind="stable")[:leftover]] += 1
    picks = [
        rng.permutation(np.flatnonzero(labels == c))[:k] for c, k in zip(classes, take, strict=True)
    ]
    return np.sort(np.concatenate(picks)).astype(np.int64)


def dataset_labels(dataset: Any) -> np.ndarray | None:
    """(n,) class ids of a labelled dataset (its ``labels`` array), else None."""
    labels = getattr(dataset, "labels", None)
    return None if labels is None else np.asarray(labels)


def evaluation_subset(dataset: Dataset, size: int | None) -> Dataset:
    """``size`` examples of ``dataset`` by :func:`subset_indices` (stratified if labelled)."""
    n = len(dataset)  # type: ignore[arg-type]
    if size is None or size >= n:
        return dataset
    index = subset_indices(n, size, dataset_labels(dataset))
    subset = Subset(dataset, index.tolist())
    labels = dataset_labels(dataset)
    if labels is not None:
        subset.labels = labels[index]  # type: ignore[attr-defined]
    return subset


def baseline_flag(
    accuracy: float | None, baseline: float, examples: int, name: str = "majority"
) -> str:
    """The one rule for every accuracy beside the rate of a trivial predictor (``baseline``,
    e.g. the majority class, on the same ``examples``): ``= name`` when it gets the same
    number of examples right, ``< name`` below it, ``≈ name`` when it is less than two
    standard errors above it (binomial, on this many examples): not shown to beat it. Empty
    when it is, or when either number is missing."""
    if accuracy is None or not np.isfinite(accuracy) or not np.isfinite(baseline) or not examples:
        return ""
    if abs(accuracy - baseline) * examples < 0.5:
        return f"= {name}"
    if accuracy < baseline:
        return f"< {name}"
    if accuracy - baseline < 2 * np.sqrt(baseline * (1 - baseline) / examples):
        return f"≈ {name}"
    return ""


@dataclass(frozen=True)
class ClassBalance:
    """How the labels of an evaluated set are spread, and what trivial predictors score.

    majority_rate: share of the most frequent class (a constant predictor's accuracy);
    chance_rate: 1 / number of classes of the task (a uniform random guess).
    """

    examples: int
    classes_present: int
    majority_rate: float
    chance_rate: float

    @classmethod
    def of(cls, labels: np.ndarray, num_classes: int) -> ClassBalance:
        labels = np.asarray(labels)
        counts = np.unique(labels, return_counts=True)[1] if labels.size else np.zeros(1)
        majority = float(counts.max() / labels.size) if labels.size else float("nan")
        return cls(int(labels.size), int((counts > 0).sum()), majority, 1.0 / num_classes)

    def flag(self, accuracy: float | None = None) -> str:
        """Why a result on this set is not to be trusted; empty when nothing is wrong.

        ``single class`` when the set holds one class only; ``= majority`` when ``accuracy``
        is the majority-class rate (the same number of correct examples: what a constant
        predictor scores); ``< majority`` below it; ``≈ majority`` when it is less than two
        standard errors above it (binomial, on this many examples): not shown to beat a
        constant predictor.
        """
        flags = ["single class"] if self.classes_present <= 1 else []
        flags.append(baseline_flag(accuracy, self.majority_rate, self.examples))
        return ", ".join(f for f in flags if f)

    def describe(self, name: str) -> str:
        """One log line: size, classes and the trivial rates of the set called ``name``."""
        return (
            f"{name}: {self.examples} examples, {self.classes_present} classes, "
            f"majority class {100 * self.majority_rate:.1f}%, chance {100 * self.chance_rate:.1f}%"
        )
