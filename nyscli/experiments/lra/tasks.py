"""LRA task name -> its data (``nyscli.data``) and its batch -> loss/accuracy objective.

Every task's batch is ``(*inputs, labels)``: ``(ids, mask, labels)`` for one sequence and
``(ids0, mask0, ids1, mask1, labels)`` for retrieval; the model takes ``*inputs``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import nn

from nyscli.data.common import DataError, TaskData, require_examples
from nyscli.errors import UserInputError
from nyscli.train.metrics import BatchResult

TASKS = ("listops", "text", "retrieval", "image", "pathfinder")
DUAL_TASKS = ("retrieval",)


def classification_objective(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> BatchResult:
    """Cross-entropy and accuracy of ``model(*inputs)`` (B, C) against labels (B,)."""
    *inputs, labels = batch
    logits = model(*inputs)
    loss = F.cross_entropy(logits.float(), labels)
    correct = float((logits.argmax(dim=-1) == labels).sum())
    tokens = sum(int(t.sum()) for t in inputs if t.dtype == torch.bool)  # real tokens (masks)
    size = int(labels.shape[0])
    return BatchResult(loss, size, tokens, {"accuracy": (correct, size)})


def _plain(node: Any) -> dict[str, Any]:
    return OmegaConf.to_container(node, resolve=True) if node is not None else {}  # type: ignore[return-value]


def _settings(cls: type, node: Any, option: str) -> Any:
    """``cls(**node)`` for a generator-settings dataclass; unknown keys are a one-line error."""
    values = _plain(node)
    allowed = sorted(f.name for f in dataclasses.fields(cls))
    unknown = sorted(set(values) - set(allowed))
    if unknown:
        raise UserInputError(
            f"{option} has no option {', '.join(unknown)}; allowed: {', '.join(allowed)}"
        )
    return cls(**values)


# (task, data, cache folder, threads) -> the task's splits; data = the config's data node.
Loader = Callable[[DictConfig, DictConfig, Path | None, int | None], TaskData]


def _listops(
    task: DictConfig, data: DictConfig, cache_dir: Path | None, threads: int | None
) -> TaskData:
    from nyscli.data.listops import ListOpsConfig, load_listops

    return load_listops(
        data.path,
        cache_dir=cache_dir,
        config=_settings(ListOpsConfig, data.generate, "data.generate"),
        max_len=int(task.max_len),
    )


def _text(
    task: DictConfig, data: DictConfig, cache_dir: Path | None, threads: int | None
) -> TaskData:
    from nyscli.data.text import default_imdb_source, load_imdb

    return load_imdb(
        data.path or default_imdb_source(),  # ../shared's CSV, else HF "imdb" (online)
        max_len=int(task.max_len),
        val_fraction=float(data.val_fraction),
        test_fraction=float(data.test_fraction),
        seed=int(data.seed),
    )


def _source(data: DictConfig, real: str, substitute: str) -> str:
    """``data.source``, with ``auto`` = the real data when a path is given, else the
    offline substitute."""
    source = data.source
    if source == "auto":
        return real if data.path else substitute
    if source not in (real, substitute):
        allowed = ", ".join(("auto", real, substitute))
        raise UserInputError(f"data.source={source} is not allowed; choose one of: {allowed}")
    return source


SOURCES = {"retrieval": ("aan", "wiki_topic_pairs"), "image": ("cifar10", "fashion_mnist")}


def check_source(task: DictConfig, data: DictConfig) -> None:
    """A bad ``data.source`` of retrieval or image as a one-line error (no data read)."""
    if task.name in SOURCES:
        _source(data, *SOURCES[task.name])


def _retrieval(
    task: DictConfig, data: DictConfig, cache_dir: Path | None, threads: int | None
) -> TaskData:
    from nyscli.data.retrieval import load_aan, load_wiki_topic_pairs

    if _source(data, *SOURCES["retrieval"]) == "wiki_topic_pairs":
        return load_wiki_topic_pairs(
            max_len=int(task.max_len),
            pairs_per_document=int(data.pairs_per_document),
            seed=int(data.split_seed),
        )
    if not data.path:
        raise UserInputError(
            "data.source=aan needs data.path=<folder with new_aan_pairs.*.tsv> "
            "(the LRA release's AAN files)"
        )
    return load_aan(data.path, max_len=int(task.max_len))


def _image(
    task: DictConfig, data: DictConfig, cache_dir: Path | None, threads: int | None
) -> TaskData:
    from nyscli.data.image import load_cifar10, load_fashion_mnist

    if _source(data, *SOURCES["image"]) == "cifar10":
        if not data.path:
            raise UserInputError("data.source=cifar10 needs data.path=<cifar-10-batches-py>")
        return load_cifar10(data.path, val_fraction=float(data.val_fraction))
    kwargs = {"path": data.path} if data.path else {}  # default: the substitute's folder
    return load_fashion_mnist(**kwargs, val_fraction=float(data.val_fraction))


def _pathfinder(
    task: DictConfig, data: DictConfig, cache_dir: Path | None, threads: int | None
) -> TaskData:
    from nyscli.data.choices import DIFFICULTY_CONTOUR_LENGTH
    from nyscli.data.pathfinder import PathfinderConfig, load_pathfinder

    config = None
    if data.difficulty in DIFFICULTY_CONTOUR_LENGTH:
        config = _settings(PathfinderConfig, data.generate, "data.generate")
        config = dataclasses.replace(
            config, contour_length=DIFFICULTY_CONTOUR_LENGTH[data.difficulty]
        )
    return load_pathfinder(
        data.path,
        difficulty=str(data.difficulty),
        config=None if data.path else config,
        cache_dir=cache_dir,
        workers=data.workers or threads,  # threads=N caps the generator processes too
    )


LOADERS: dict[str, Loader] = {
    "listops": _listops,
    "text": _text,
    "retrieval": _retrieval,
    "image": _image,
    "pathfinder": _pathfinder,
}


def load_task(
    task: DictConfig, data: DictConfig, cache_dir: str | None, threads: int | None = None
) -> TaskData:
    """The task's three splits and collate; data problems become one-line UserInputErrors.

    ``threads`` (the run's ``threads``) caps the processes of a data generator.
    """
    if task.name not in LOADERS:
        raise UserInputError(f"task={task.name} is not allowed; choose one of: {', '.join(TASKS)}")
    try:
        cache = Path(cache_dir).expanduser() if cache_dir else None
        splits = LOADERS[task.name](task, data, cache, threads)
    except DataError as error:
        raise UserInputError(f"task={task.name}: {error}") from error
    sizes = {"train": len(splits.train), "dev": len(splits.val), "test": len(splits.test)}
    require_examples(sizes, f"task={task.name}", data.get("path") or "the generator")
    return splits


def _labels(dataset: Any) -> np.ndarray:
    return np.asarray(dataset.labels, dtype=np.int64)


def _rule_accuracy(train_keys: np.ndarray, train_labels: np.ndarray, test_keys: np.ndarray,
                   test_labels: np.ndarray) -> float:  # fmt: skip
    """Accuracy on test of predicting, for each key, its most common train label (ties: the
    smaller label; unseen keys: the overall most common)."""
    fallback = int(np.bincount(train_labels).argmax())
    rule = {
        int(k): int(np.bincount(train_labels[train_keys == k]).argmax())
        for k in np.unique(train_keys)
    }
    predicted = np.asarray([rule.get(int(k), fallback) for k in test_keys], dtype=np.int64)
    return float((predicted == test_labels).mean()) if len(test_labels) else math.nan


def trivial_baseline(task: str, data: TaskData) -> tuple[str, float]:
    """(name, test accuracy) of the best rule that needs no model, fitted on train.

    ListOps: the outer-operator rule (each first token -> its most common train label; 36%
    on the generated data, near the paper's 37%); every other task: the majority class.
    """
    train, test = _labels(data.train), _labels(data.test)
    if task == "listops":
        first = [ds.seqs.flat[ds.seqs.offsets[:-1]] for ds in (data.train, data.test)]
        return "outer-operator rule", _rule_accuracy(first[0], train, first[1], test)
    zeros = np.zeros
    return "majority class", _rule_accuracy(zeros(len(train)), train, zeros(len(test)), test)
