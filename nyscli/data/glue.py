"""GLUE readers: the official TSV folder layout (and Hugging Face ``datasets`` when online).

A task folder (``data.path=…/glue/SST-2``) holds ``train.tsv`` and ``dev.tsv`` (MNLI:
``dev_matched.tsv`` and ``dev_mismatched.tsv``) and optionally unlabelled test files. Columns
are found by their header names, as laid out by GLUE's ``download_glue_data.py``:

========  ==============================  ==============  ==========================================
task      text column(s)                  label column    labels (id order)
========  ==============================  ==============  ==========================================
sst2      sentence                        label           0, 1
mrpc      #1 String, #2 String            Quality         0, 1 (1 = paraphrase)
qnli      question, sentence              label           entailment, not_entailment
qqp       question1, question2            is_duplicate    0, 1 (1 = duplicate)
mnli      sentence1, sentence2            gold_label      entailment, neutral, contradiction
========  ==============================  ==============  ==========================================

The label order is Hugging Face ``glue``'s, so ids agree with models trained there.

Files are read as UTF-8 with an optional byte-order mark (MRPC's header starts with one) and
split on TAB only: GLUE files are not CSV-quoted, and MRPC/QQP sentences hold literal ``"``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from nyscli.data.common import DataError


@dataclass(frozen=True)
class TextExamples:
    """One split of a text classification task.

    text_a: first texts (n,); text_b: second texts (n,) for sentence pairs, else None;
    labels: (n,) int64 class ids, or None for an unlabelled split (GLUE test files);
    classes: the label names in id order where the data brings them (a table file's,
    :mod:`nyscli.data.table`), else None (the task's own); rows: (n,) int64 each example's
    row in the file it was read from (from 0), where known.
    """

    text_a: list[str]
    text_b: list[str] | None
    labels: np.ndarray | None
    classes: tuple[str, ...] | None = None
    rows: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.text_a)

    def subset(self, index: np.ndarray) -> TextExamples:
        """The examples at ``index`` (int array), in that order."""
        pick = [int(i) for i in index]
        return TextExamples(
            [self.text_a[i] for i in pick],
            None if self.text_b is None else [self.text_b[i] for i in pick],
            None if self.labels is None else self.labels[pick],
            self.classes,
            None if self.rows is None else self.rows[pick],
        )


@dataclass(frozen=True)
class GlueTask:
    """Where a GLUE task's texts and labels are, in the TSV files and in HF ``glue``."""

    name: str
    folder: str  # the folder name in GLUE's download (documentation and error messages)
    text_columns: tuple[str, ...]  # one (single sentence) or two (pair) header names
    label_column: str
    labels: tuple[str, ...]  # label strings in id order
    hf_columns: tuple[str, ...]
    dev_splits: tuple[str, ...] = ("dev",)
    test_splits: tuple[str, ...] = ("test",)
    hf_splits: dict[str, str] = field(default_factory=lambda: {"dev": "validation"})

    @property
    def label_ids(self) -> dict[str, int]:
        """Label string -> class id."""
        return {label: i for i, label in enumerate(self.labels)}

    @property
    def is_pair(self) -> bool:
        return len(self.text_columns) == 2


GLUE_TASKS: dict[str, GlueTask] = {
    "sst2": GlueTask("sst2", "SST-2", ("sentence",), "label", ("0", "1"), ("sentence",)),
    "mrpc": GlueTask(
        "mrpc", "MRPC", ("#1 String", "#2 String"), "Quality", ("0", "1"),
        ("sentence1", "sentence2"),
    ),
    "qnli": GlueTask(
        "qnli", "QNLI", ("question", "sentence"), "label", ("entailment", "not_entailment"),
        ("question", "sentence"),
    ),
    "qqp": GlueTask(
        "qqp", "QQP", ("question1", "question2"), "is_duplicate", ("0", "1"),
        ("question1", "question2"),
    ),
    "mnli": GlueTask(
        "mnli", "MNLI", ("sentence1", "sentence2"), "gold_label",
        ("entailment", "neutral", "contradiction"), ("premise", "hypothesis"),
        dev_splits=("dev_matched", "dev_mismatched"),
        test_splits=("test_matched", "test_mismatched"),
        hf_splits={"dev_matched": "validation_matched", "dev_mismatched": "validation_mismatched"},
    ),
}  # fmt: skip

HF_PREFIXES = ("hf:glue/", "glue/")


def read_tsv(path: Path) -> tuple[list[str], list[list[str]]]:
    """(header fields, rows of fields) of a GLUE TSV: no BOM, no quoting, no blank lines."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        raise DataError(f"data.path: cannot read {path} ({exc})") from None
    # split("\n") rather than splitlines(): the latter also breaks at \x1c, \u2028, ... in text.
    lines = [line.rstrip("\r") for line in text.split("\n")]
    lines = [line for line in lines if line]
    if not lines:
        raise DataError(f"data.path: {path} is empty; expected a header line")
    return lines[0].split("\t"), [line.split("\t") for line in lines[1:]]


def read_glue_file(path: Path, task: GlueTask) -> TextExamples:
    """One TSV of ``task``; labelled when its header has the label column (test files do not)."""
    header, rows = read_tsv(path)
    missing = [c for c in task.text_columns if c not in header]
    if missing:
        raise DataError(
            f"data.path: {path} has no column(s) {', '.join(missing)} (header: "
            f"{', '.join(header)}); expected GLUE {task.folder} with {', '.join(task.text_columns)}"
        )
    text_at = [header.index(c) for c in task.text_columns]
    label_at = header.index(task.label_column) if task.label_column in header else None
    needed = max(text_at + ([label_at] if label_at is not None else []))
    label_ids = task.label_ids
    columns: list[list[str]] = [[] for _ in text_at]
    labels: list[int] = []
    for line, row in enumerate(rows, start=2):
        if len(row) <= needed:
            raise DataError(
                f"data.path: {path} line {line} has {len(row)} fields; expected {len(header)}"
            )
        for column, at in zip(columns, text_at, strict=True):
            column.append(row[at].strip())
        if label_at is not None:
            value = row[label_at].strip()
            if value not in label_ids:
                raise DataError(
                    f"data.path: {path} line {line}: label {value!r}; expected one of "
                    f"{', '.join(task.labels)}"
                )
            labels.append(label_ids[value])
    return TextExamples(
        columns[0],
        columns[1] if task.is_pair else None,
        np.asarray(labels, dtype=np.int64) if label_at is not None else None,
    )


def read_glue_folder(folder: Path, task: GlueTask) -> dict[str, TextExamples]:
    """``{"train", <dev splits>, <test splits present>}`` of a GLUE task folder."""
    out = {}
    for split in ("train", *task.dev_splits, *task.test_splits):
        path = folder / f"{split}.tsv"
        if not path.is_file():
            if split in task.test_splits:
                continue  # GLUE test files are optional (and unlabelled)
            raise DataError(
                f"data.path={folder} has no {split}.tsv; expected the GLUE {task.folder} folder "
                f"(train.tsv, {', '.join(s + '.tsv' for s in task.dev_splits)})"
            )
        out[split] = read_glue_file(path, task)
    return out


def read_glue_hf(task: GlueTask) -> dict[str, TextExamples]:
    """The same splits from Hugging Face ``datasets`` (``glue/<task>``; online use)."""
    try:
        import datasets  # lazy: optional dependency, and slow to import
    except ImportError:
        raise DataError(
            f"data.path=glue/{task.name} means the Hugging Face dataset, which needs `pip install "
            f"datasets` and network access; offline, pass the GLUE {task.folder} folder"
        ) from None
    try:
        ds = datasets.load_dataset("glue", task.name)
    except Exception as exc:  # network, hub and cache errors come in many types
        where = f"data.path=glue/{task.name}"
        raise DataError(f"{where}: loading from the hub failed ({exc})") from None
    out = {}
    for split, hf_split in {"train": "train", **task.hf_splits}.items():
        part = ds[hf_split]
        texts = [list(map(str, part[c])) for c in task.hf_columns]
        # HF glue's label ids follow the same order as GlueTask.labels; test labels are -1.
        out[split] = TextExamples(
            texts[0], texts[1] if task.is_pair else None, np.asarray(part["label"], np.int64)
        )
    return out


def read_glue(source: str | os.PathLike[str], task_name: str) -> dict[str, TextExamples]:
    """A GLUE task's splits from a TSV folder, or from HF ``glue/<task>`` when no such path."""
    task = GLUE_TASKS[task_name]
    path = Path(source).expanduser()
    if path.is_dir():
        return read_glue_folder(path, task)
    if not path.exists() and str(source) in {p + task.name for p in HF_PREFIXES}:
        return read_glue_hf(task)
    raise DataError(
        f"data.path={source} is not a folder; expected the GLUE {task.folder} folder "
        f"(train.tsv, {', '.join(s + '.tsv' for s in task.dev_splits)}) or glue/{task.name} "
        "(Hugging Face datasets, online)"
    )
