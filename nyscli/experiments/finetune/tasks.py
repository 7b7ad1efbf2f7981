"""Fine-tuning task name -> its text examples (GLUE TSV/HF, IMDB, a table file) and its
loss/metrics objective.

Every task yields ``{"train": ..., <dev splits>..., ["test"]}`` of
:class:`~nyscli.data.glue.TextExamples`: GLUE's dev splits are ``dev`` (MNLI: ``dev_matched``,
``dev_mismatched``); GLUE test files are unlabelled and left out. IMDB has a labelled test
set (the official 25k); its dev set is ``task.dev_examples`` reviews held out of train.
``csv`` reads the user's own table file (:mod:`nyscli.data.table`): dev and test are
``data.dev_path`` / ``data.test_path`` or seeded, stratified draws of ``task.dev_fraction`` /
``task.test_fraction`` of ``data.path``'s rows; its classes are the file's.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from omegaconf import DictConfig
from torch import nn

from nyscli.data import table
from nyscli.data.common import DataError, require_examples, seeded_permutation
from nyscli.data.glue import GLUE_TASKS, HF_PREFIXES, TextExamples, read_glue
from nyscli.data.subsets import subset_indices
from nyscli.errors import UserInputError
from nyscli.files import write_csv, write_text
from nyscli.train.metrics import BatchResult

CSV = "csv"  # the user's own table file (conf/finetune_task/csv.yaml)
TASKS = (*GLUE_TASKS, "imdb", CSV)
TEST_TASKS = ("imdb", CSV)  # a labelled test split: Table 2 reports its accuracy
F1_TASKS = ("mrpc", "qqp")  # GLUE reports F1 (of the positive class) besides accuracy
IMDB_LABELS = ("negative", "positive")  # class ids 0, 1 (as nyscli.data.text.SENTIMENTS)
IMDB_HF_NAMES = ("imdb", "hf:imdb")
# What a csv run writes beside its results: the label mapping and each example's row.
LABELS_FILE = "labels.json"
SPLIT_FILE = "split.csv"
FILE_KEYS = {"train": "data.path", "dev": "data.dev_path", "test": "data.test_path"}


def num_classes(task: str, examples: TextExamples | None = None) -> int:
    """The task's number of classes; a csv task's are its training file's (``examples``)."""
    if task == CSV:
        if examples is None or examples.classes is None:
            raise ValueError("task=csv: the number of classes comes from its examples")
        return len(examples.classes)
    return len(IMDB_LABELS) if task == "imdb" else len(GLUE_TASKS[task].labels)


def dev_splits(task: str) -> tuple[str, ...]:
    """The dev split names; the first one picks the best checkpoint during training."""
    return ("dev",) if task in TEST_TASKS else GLUE_TASKS[task].dev_splits


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


def held_out(rows: int, fraction: float) -> int:
    """Rows a ``task.<split>_fraction`` holds out of a file of ``rows``: at least one."""
    return max(1, round(fraction * rows))


def _csv(
    task: DictConfig, files: dict[str, str | None], classes: tuple[str, ...] | None
) -> dict[str, TextExamples]:
    """train, dev and test of a table file (``files``: split -> path, train's required),
    read by the task's columns; the classes are train's, or ``classes`` (a run's record)."""
    if not files.get("train"):
        raise DataError(f"data.path is not set; give data.path=<{table.EXPECTED}>")
    pair = task.get("text_pair_column")
    columns = table.Columns(str(task.text_column), None if pair is None else str(pair),
                            str(task.label_column))  # fmt: skip
    source = str(files["train"])
    main = table.read_labelled(source, FILE_KEYS["train"], columns, classes)
    given = {
        split: table.read_labelled(str(path), FILE_KEYS[split], columns, main.classes)
        for split, path in files.items()
        if split != "train" and path
    }
    sizes = {s: 0 if s in given else held_out(len(main), float(task[f"{s}_fraction"]))
             for s in ("dev", "test")}  # fmt: skip
    if sum(sizes.values()) >= len(main):
        drawn = " and ".join(f"{s} ({n})" for s, n in sizes.items() if n)
        raise DataError(
            f"data.path={source} has {len(main)} rows: too few to hold out {drawn} and train "
            "on the rest; give more rows, or data.dev_path and data.test_path"
        )
    parts = table.split_rows(main.labels, sizes["dev"], sizes["test"])
    return {s: given[s] if s in given else main.subset(parts[s]) for s in ("train", "dev", "test")}


def csv_files(cfg: DictConfig) -> dict[str, str | None]:
    """The files a csv task reads: split -> ``data.path`` / ``data.dev_path`` /
    ``data.test_path`` (None where not given)."""
    return {split: cfg.data.get(key.split(".", 1)[1]) for split, key in FILE_KEYS.items()}


def recorded_classes(run_dir: Path) -> tuple[str, ...] | None:
    """The label mapping a csv run recorded (its labels.json), in id order; None if none."""
    path = Path(run_dir) / LABELS_FILE
    if not path.is_file():
        return None
    mapping = json.loads(path.read_text())["labels"]
    return tuple(sorted(mapping, key=mapping.get))


def record_csv(
    run_dir: Path, label_column: str, splits: dict[str, TextExamples], files: dict[str, Any]
) -> None:
    """A csv run's ``labels.json`` (label -> class id) and ``split.csv``: every example the run
    used, its split, the file it came from (``data.path``, or ``data.dev_path`` /
    ``data.test_path`` where given: ``files``, as :func:`csv_files`), its row there (from 1, as
    in messages) and its label."""
    classes = splits["train"].classes or ()
    mapping = {"label_column": label_column, "labels": {c: i for i, c in enumerate(classes)}}
    write_text(json.dumps(mapping, indent=2) + "\n", run_dir / LABELS_FILE)  # in id order
    frames = []
    for split, examples in splits.items():
        rows = examples.rows if examples.rows is not None else np.arange(len(examples))
        source = FILE_KEYS[split] if files.get(split) else FILE_KEYS["train"]
        names = [classes[i] for i in examples.labels] if examples.labels is not None else None
        frames.append(pd.DataFrame({"split": split, "file": source, "row": rows + 1,
                                    "label": names}))  # fmt: skip
    write_csv(pd.concat(frames, ignore_index=True), run_dir / SPLIT_FILE)


def load_examples(
    task: DictConfig,
    data_path: str | None,
    seed: int,
    *,
    files: dict[str, str | None] | None = None,
    classes: tuple[str, ...] | None = None,
) -> dict[str, TextExamples]:
    """The task's labelled splits; data problems become one-line UserInputErrors. A csv
    task reads ``files`` (:func:`csv_files`; default: ``data_path`` alone) with ``classes``
    (default: its training file's)."""
    name = str(task.name)
    if name not in TASKS:
        raise UserInputError(f"task={name} is not allowed; choose one of: {', '.join(TASKS)}")
    source = data_path or (IMDB_HF_NAMES[0] if name == "imdb" else HF_PREFIXES[1] + name)
    try:
        if name == CSV:
            splits = _csv(task, files or {"train": data_path}, classes)
        elif name == "imdb":
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
