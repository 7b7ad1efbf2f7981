"""LRA task name -> its data (``nyscli.data``) and its batch -> loss/accuracy objective.

Every task's batch is ``(*inputs, labels)``: ``(ids, mask, labels)`` for one sequence and
``(ids0, mask0, ids1, mask1, labels)`` for retrieval; the model takes ``*inputs``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import nn

from nyscli.data.common import DataError, TaskData, require_examples
from nyscli.errors import UserInputError
from nyscli.train import BatchResult

TASKS = ("listops", "text", "retrieval", "image", "pathfinder")
DUAL_TASKS = ("retrieval",)
IMAGE_SOURCES = ("cifar10", "fashion_mnist")  # task=image: task.data.source


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


def _listops(task: DictConfig, cache_dir: Path | None) -> TaskData:
    from nyscli.data.listops import ListOpsConfig, load_listops

    return load_listops(
        task.data_dir,
        cache_dir=cache_dir,
        config=_settings(ListOpsConfig, task.generate, "task.generate"),
        max_len=int(task.max_len),
    )


def _text(task: DictConfig, cache_dir: Path | None) -> TaskData:
    from nyscli.data.text import load_imdb

    data = task.data
    return load_imdb(
        data.path or "imdb",  # "imdb": HF datasets, when online
        max_len=int(task.max_len),
        val_fraction=float(data.val_fraction),
        test_fraction=float(data.test_fraction),
        seed=int(data.seed),
    )


def _retrieval(task: DictConfig, cache_dir: Path | None) -> TaskData:
    from nyscli.data.retrieval import load_aan

    if not task.data.path:
        raise UserInputError(
            "task=retrieval needs task.data.path=<folder with new_aan_pairs.*.tsv> "
            "(the LRA release's AAN files)"
        )
    return load_aan(task.data.path, max_len=int(task.max_len))


def _image(task: DictConfig, cache_dir: Path | None) -> TaskData:
    from nyscli.data.image import load_cifar10, load_fashion_mnist

    data = task.data
    if data.source == "cifar10":
        if not data.path:
            raise UserInputError(
                "task.data.source=cifar10 needs task.data.path=<cifar-10-batches-py>"
            )
        return load_cifar10(data.path, val_fraction=float(data.val_fraction))
    if data.source == "fashion_mnist":
        kwargs = {"path": data.path} if data.path else {}
        return load_fashion_mnist(**kwargs, val_fraction=float(data.val_fraction))
    raise UserInputError(
        f"task.data.source={data.source} is not allowed; choose one of: {', '.join(IMAGE_SOURCES)}"
    )


def _pathfinder(task: DictConfig, cache_dir: Path | None) -> TaskData:
    from nyscli.data.pathfinder import (
        DIFFICULTY_CONTOUR_LENGTH,
        PathfinderConfig,
        load_pathfinder,
    )

    data = task.data
    config = None
    if data.difficulty in DIFFICULTY_CONTOUR_LENGTH:
        config = _settings(PathfinderConfig, data.generate, "task.data.generate")
        config = dataclasses.replace(
            config, contour_length=DIFFICULTY_CONTOUR_LENGTH[data.difficulty]
        )
    return load_pathfinder(
        data.path,
        difficulty=str(data.difficulty),
        config=None if data.path else config,
        cache_dir=cache_dir,
        workers=data.workers,
    )


LOADERS: dict[str, Callable[[DictConfig, Path | None], TaskData]] = {
    "listops": _listops,
    "text": _text,
    "retrieval": _retrieval,
    "image": _image,
    "pathfinder": _pathfinder,
}


def load_task(task: DictConfig, cache_dir: str | None) -> TaskData:
    """The task's three splits and collate; data problems become one-line UserInputErrors."""
    if task.name not in LOADERS:
        raise UserInputError(f"task={task.name} is not allowed; choose one of: {', '.join(TASKS)}")
    try:
        data = LOADERS[task.name](task, Path(cache_dir).expanduser() if cache_dir else None)
    except DataError as error:
        raise UserInputError(f"task={task.name}: {error}") from error
    sizes = {"train": len(data.train), "dev": len(data.val), "test": len(data.test)}
    source = task.get("data_dir") or OmegaConf.select(task, "data.path") or "the generator"
    require_examples(sizes, f"task={task.name}", source)
    return data
