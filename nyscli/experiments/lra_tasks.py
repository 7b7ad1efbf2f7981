"""LRA task name -> its data (``nyscli.data``) and its batch -> loss/accuracy objective.

Every task's batch is ``(*inputs, labels)``: ``(ids, mask, labels)`` for one sequence and
``(ids0, mask0, ids1, mask1, labels)`` for retrieval; the model takes ``*inputs``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import nn

from nyscli.data.common import DataError, TaskData
from nyscli.errors import UserInputError
from nyscli.train import BatchResult

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


def _listops(task: DictConfig, cache_dir: Path | None) -> TaskData:
    from nyscli.data.listops import ListOpsConfig, load_listops

    return load_listops(
        task.data_dir,
        cache_dir=cache_dir,
        config=ListOpsConfig(**_plain(task.generate)),
        max_len=int(task.max_len),
    )


def _from_module(name: str) -> Callable[[DictConfig, Path | None], TaskData]:
    """Tasks whose reader takes ``load_<name>(**task.data, max_len=..., cache_dir=...)``."""

    def load(task: DictConfig, cache_dir: Path | None) -> TaskData:
        try:
            module = importlib.import_module(f"nyscli.data.{name}")
        except ModuleNotFoundError:
            raise UserInputError(
                f"task={name}: its data reader (nyscli.data.{name}) is not installed yet; "
                f"available now: listops"
            ) from None
        loader = getattr(module, f"load_{name}")
        return loader(**_plain(task.get("data")), max_len=int(task.max_len), cache_dir=cache_dir)

    return load


LOADERS: dict[str, Callable[[DictConfig, Path | None], TaskData]] = {
    "listops": _listops,
    **{name: _from_module(name) for name in TASKS if name != "listops"},
}


def load_task(task: DictConfig, cache_dir: str | None) -> TaskData:
    """The task's three splits and collate; data problems become one-line UserInputErrors."""
    if task.name not in LOADERS:
        raise UserInputError(f"task={task.name} is not allowed; choose one of: {', '.join(TASKS)}")
    try:
        return LOADERS[task.name](task, Path(cache_dir).expanduser() if cache_dir else None)
    except DataError as error:
        raise UserInputError(f"task={task.name}: {error}") from error
