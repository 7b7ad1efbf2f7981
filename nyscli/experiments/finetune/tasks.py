"""Fine-tuning task name -> its text examples (GLUE TSV/HF, IMDB) and its loss/metrics objective.

Every task yields ``{"train": ..., <dev splits>..., ["test"]}`` of
:class:`~nyscli.data.glue.TextExamples`: GLUE's dev splits are ``dev`` (MNLI: ``dev_matched``,
``dev_mismatched``); GLUE test files are unlabelled and left out. IMDB has a labelled test
set (the official 25k); its dev set is ``task.dev_examples`` reviews held out of train.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from nyscli.data.common import DataError, require_examples, seeded_permutation
from nyscli.data.glue import GLUE_TASKS, HF_PREFIXES, TextExamples, read_glue
from nyscli.data.subsets import subset_indices
from nyscli.errors import UserInputError
from nyscli.train import BatchResult

TASKS = (*GLUE_TASKS, "imdb")
F1_TASKS = ("mrpc", "qqp")  # GLUE reports F1 (of the positive class) besides accuracy
IMDB_LABELS = ("negative", "positive")  # class ids 0, 1 (as nyscli.data.text.SENTIMENTS)
IMDB_HF_NAMES = ("imdb", "hf:imdb")


def num_classes(task: str) -> int:
    return len(IMDB_LABELS) if task == "imdb" else len(GLUE_TASKS[task].labels)


def dev_splits(task: str) -> tuple[str, ...]:
    """The dev split names; the first one picks the best checkpoint during training."""
    return ("dev",) if task == "imdb" else GLUE_TASKS[task].dev_splits


def metric_names(task: str) -> tuple[str, ...]:
    return ("accuracy", "f1") if task in F1_TASKS else ("accuracy",)


def seeded_subset(examples: TextExamples, size: int | None) -> TextExamples:
    """``size`` examples by the shared evaluation sample (seeded, stratified by label:
    :func:`~nyscli.data.subsets.subset_indices`), or all of them if size is None.

    Drawn, not the first ``size``: IMDB files list all positive reviews before the negative.
    """
    if size is None or size >= len(examples):
        return examples
    return examples.subset(subset_indices(len(examples), size, examples.labels))


def _imdb(source: str, dev_examples: int, seed: int) -> dict[str, TextExamples]:
    from nyscli.data.text import read_imdb

    path = Path(source).expanduser()
    if not path.exists() and source not in IMDB_HF_NAMES:
        raise DataError(
            f"data.path={source} does not exist; expected an aclImdb folder or a CSV with columns "
            "review,sentiment[,split], or imdb (Hugging Face datasets, online)"
        )
    raw = read_imdb(source)

    def examples(part: tuple[list[bytes], np.ndarray]) -> TextExamples:
        # The reviews keep the site's <br /> tags; as text they would only waste tokens.
        texts = [t.decode("utf-8", "replace").replace("<br />", " ") for t in part[0]]
        return TextExamples(texts, None, part[1])

    train = examples(raw["train"])
    if not 0 < dev_examples < len(train):
        raise UserInputError(
            f"task.dev_examples={dev_examples} is not allowed; use 1..{len(train) - 1}"
        )
    order = seeded_permutation(len(train), seed)
    return {
        "train": train.subset(np.sort(order[dev_examples:])),
        "dev": train.subset(order[:dev_examples]),  # shuffled: a dev prefix mixes both classes
        "test": examples(raw["test"]),
    }


def load_examples(task: DictConfig, data_path: str | None, seed: int) -> dict[str, TextExamples]:
    """The task's labelled splits; data problems become one-line UserInputErrors."""
    name = str(task.name)
    if name not in TASKS:
        raise UserInputError(f"task={name} is not allowed; choose one of: {', '.join(TASKS)}")
    source = data_path or (IMDB_HF_NAMES[0] if name == "imdb" else HF_PREFIXES[1] + name)
    try:
        if name == "imdb":
            splits = _imdb(source, int(task.dev_examples), seed)
        else:
            splits = read_glue(source, name)
    except DataError as error:
        raise UserInputError(f"task={name}: {error}") from error
    labelled = {k: v for k, v in splits.items() if v.labels is not None and (v.labels >= 0).all()}
    require_examples({k: len(v.labels) for k, v in labelled.items()}, f"task={name}", source)
    return labelled


@dataclass(frozen=True)
class ClassificationObjective:
    """Cross-entropy of ``model(ids, mask, segments)`` (B, C) plus accuracy (and F1) counts.

    F1 is of class 1 and is kept as ``(2 TP, 2 TP + FP + FN)`` so that summing the counts over
    batches gives the exact F1 of the whole set.
    """

    f1: bool = False

    def __call__(self, model: nn.Module, batch: tuple[torch.Tensor, ...]) -> BatchResult:
        ids, mask, segments, labels = batch
        logits = model(ids, mask, segments)
        loss = F.cross_entropy(logits.float(), labels)
        predicted = logits.argmax(dim=-1)
        size = int(labels.shape[0])
        counts = {"accuracy": (float((predicted == labels).sum()), float(size))}
        if self.f1:
            tp = float(((predicted == 1) & (labels == 1)).sum())
            wrong = float((predicted != labels).sum())  # FP + FN for two classes
            counts["f1"] = (2 * tp, 2 * tp + wrong)
        return BatchResult(loss, size, int(mask.sum()), counts)
