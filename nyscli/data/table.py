"""Your own labelled texts: one table file with a text column, an optional second text column
(sentence pairs) and a label column, as Hugging Face's ``run_glue.py`` and ``datasets``' csv
and json loaders take them.

Formats, by the file's suffix: ``.csv`` (comma-separated, quoted as spreadsheets and pandas
write it), ``.tsv`` (the same with TABs), ``.jsonl`` (one JSON object per line), each also
gzipped (``.csv.gz``, ...), and ``.parquet`` (read by pandas where pyarrow or fastparquet is
installed). Text formats must be UTF-8 (a byte-order mark is allowed); a header line names
the columns of a CSV or TSV. Rows are counted from 1, after the header: ``row k`` in a message
is the file's k-th example.

Labels are strings or integers. The classes of the training file are sorted (integers by
value, so labels 0..k-1 keep their ids; strings alphabetically) and numbered from 0; dev and
test files are read with that mapping. Every problem of a file is one :class:`DataError` line:
a missing column (naming the columns found), an empty file, a single class, text that is not
UTF-8, an empty text or label (NaN).
"""

from __future__ import annotations

import gzip
import io
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from nyscli.data.common import DataError, reading
from nyscli.data.glue import TextExamples
from nyscli.data.subsets import subset_indices

FORMATS = (".csv", ".tsv", ".jsonl", ".parquet")
TEXT_FORMATS = (".csv", ".tsv", ".jsonl")  # the ones that may also be gzipped
EXPECTED = "a .csv, .tsv, .jsonl (each also .gz) or .parquet file"
# The config keys that name the columns (messages say which one to set).
TEXT_KEY, PAIR_KEY, LABEL_KEY = "task.text_column", "task.text_pair_column", "task.label_column"
# Cells that count as a missing label (pandas writes NaN as an empty cell, str(NaN) as "nan").
MISSING_LABELS = frozenset({"", "nan", "na", "n/a", "null", "none", "<na>", "#n/a"})
INTEGER = re.compile(r"[+-]?\d+")
CACHED = 4  # parsed files kept: a job's check and its run read the same file once


@dataclass(frozen=True)
class Columns:
    """The columns a labelled file is read by (``task.text_column`` and the others)."""

    text: str = "text"
    pair: str | None = None
    label: str = "label"


def table_format(path: Path) -> str | None:
    """The format suffix of ``path`` (``.csv``, ``.tsv``, ``.jsonl``, ``.parquet``; a
    trailing ``.gz`` of a text format is looked through), or None for any other file."""
    suffixes = [s.lower() for s in path.suffixes]
    if suffixes[-1:] == [".gz"]:
        suffixes = suffixes[:-1]
        return suffixes[-1] if suffixes[-1:] and suffixes[-1] in TEXT_FORMATS else None
    return suffixes[-1] if suffixes[-1:] and suffixes[-1] in FORMATS else None


def is_table(path: str | Path) -> bool:
    """Whether ``path`` names a table file (by its suffix), not a plain text file."""
    return table_format(Path(path)) is not None


def _decoded(raw: bytes, path: Path, option: str) -> str:
    """The UTF-8 text of a file's bytes; one line naming the first bad byte and its line."""
    if b"\x00" in raw:
        raise DataError(
            f"{option}={path} is not UTF-8 text (it holds NUL bytes: UTF-16 or a binary "
            "file); save it as UTF-8"
        )
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise DataError(
            f"{option}={path} is not UTF-8 text (byte 0x{raw[error.start]:02x} on line {line}); "
            "save it as UTF-8, e.g. iconv -f latin1 -t utf-8"
        ) from None


def _json_lines(text: str, path: Path, option: str) -> pd.DataFrame:
    """One row per non-blank line, each a JSON object; a bad line is named."""
    records: list[dict[str, Any]] = []
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        try:
            value = json.loads(line)
        except json.JSONDecodeError as error:
            raise DataError(
                f"{option}={path} line {number} is not JSON ({error.msg}); expected one JSON "
                "object per line"
            ) from None
        if not isinstance(value, dict):
            raise DataError(
                f"{option}={path} line {number} holds a JSON {type(value).__name__}, not an "
                "object; expected one JSON object per line"
            )
        records.append(value)
    return pd.DataFrame.from_records(records)


def _parse(path: Path, option: str, kind: str) -> pd.DataFrame:
    """The file's rows as a DataFrame (CSV/TSV cells as strings, JSON values as they are)."""
    if kind == ".parquet":
        with reading(path, option, EXPECTED):
            try:
                return pd.read_parquet(path)
            except ImportError:
                raise DataError(
                    f"{option}={path}: reading Parquet needs pyarrow (pip install pyarrow); "
                    "or save the table as .csv or .jsonl"
                ) from None
    with reading(path, option, EXPECTED):
        raw = path.read_bytes()
        if path.suffix.lower() == ".gz":
            raw = gzip.decompress(raw)
    text = _decoded(raw, path, option)
    if not text.strip():
        raise DataError(f"{option}={path} is empty; expected a header line and one row per example")
    if kind == ".jsonl":
        return _json_lines(text, path, option)
    with reading(path, option, EXPECTED):
        return pd.read_csv(io.StringIO(text), sep="\t" if kind == ".tsv" else ",", dtype=str,
                           keep_default_na=False)  # fmt: skip


_cache: dict[tuple[str, int, int], pd.DataFrame] = {}


def read_table(path: str | Path, option: str) -> pd.DataFrame:
    """Every row of a table file, column names stripped; one-line DataError if the file is
    missing, of another kind, not UTF-8, unparseable or without rows. Do not modify the
    frame: the last few files read are kept (keyed by path, size and modification time)."""
    path = Path(path).expanduser()
    kind = table_format(path)
    if kind is None:
        raise DataError(f"{option}={path} is not a table file; expected {EXPECTED}")
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise DataError(f"{option}={path} {what}; expected {EXPECTED}")
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _cache:
        frame = _parse(path, option, kind)
        frame.columns = [str(c).strip() for c in frame.columns]
        if frame.empty:
            raise DataError(
                f"{option}={path} is empty (no rows under its header); expected one row per example"
            )
        while len(_cache) >= CACHED:
            _cache.pop(next(iter(_cache)))
        _cache[key] = frame
    return _cache[key]


def _absent(value: Any) -> bool:
    """Whether a cell holds no value: None, NaN or pandas' NA (JSON null, Parquet null)."""
    return value is None or value is pd.NA or (isinstance(value, float) and math.isnan(value))


def _column(frame: pd.DataFrame, path: Path, option: str, name: str, key: str) -> pd.Series:
    if name not in frame.columns:
        found = ", ".join(map(str, frame.columns))
        raise DataError(
            f"{option}={path} has no column {name!r} (columns found: {found}); "
            f"name the column with {key}=<column>"
        )
    return frame[name]


def _first_missing(cells: np.ndarray, path: Path, option: str, what: str, name: str) -> None:
    """One line if any cell is missing: how many, and the first one's row."""
    if cells.any():
        count = int(cells.sum())
        raise DataError(
            f"{option}={path}: column {name!r} has {count:,} empty or NaN {what}"
            f"{'s' if count > 1 else ''}, first at row {int(np.argmax(cells)) + 1}; fill or drop "
            "those rows"
        )


def column_texts(
    frame: pd.DataFrame, path: Path, option: str, name: str, key: str = TEXT_KEY
) -> list[str]:
    """The column's texts as strings; one line if it is absent or a cell is empty or NaN."""
    series = _column(frame, path, option, name, key)
    missing = np.array([_absent(v) or not str(v).strip() for v in series], dtype=bool)
    _first_missing(missing, path, option, "text", name)
    return [str(v) for v in series]


def _label_key(value: Any, row: int, path: Path, option: str, name: str) -> str:
    """A label as its class name: integers (also JSON's 2.0) as digits, strings stripped."""
    if isinstance(value, bool | np.bool_):
        return str(bool(value))
    if isinstance(value, float | np.floating):
        if not float(value).is_integer():
            raise DataError(
                f"{option}={path}: column {name!r} row {row}: label {value} is a fraction; "
                "labels are classes, strings or integers"
            )
        return str(int(value))
    if isinstance(value, int | np.integer):
        return str(int(value))
    return str(value).strip()


def label_keys(frame: pd.DataFrame, path: Path, option: str, name: str) -> list[str]:
    """Each row's class name (see :func:`_label_key`); one line if the column is absent or a
    label is empty or NaN."""
    series = _column(frame, path, option, name, LABEL_KEY)
    missing = np.array(
        [_absent(v) or str(v).strip().lower() in MISSING_LABELS for v in series], dtype=bool
    )
    _first_missing(missing, path, option, "label", name)
    return [_label_key(v, i + 1, path, option, name) for i, v in enumerate(series)]


def class_order(keys: Sequence[str]) -> tuple[str, ...]:
    """The distinct class names in id order: by value if every one is an integer, else
    alphabetically."""
    distinct = set(keys)
    if all(INTEGER.fullmatch(k) for k in distinct):
        return tuple(sorted(distinct, key=lambda k: (int(k), k)))
    return tuple(sorted(distinct))


def read_labelled(
    path: str | Path, option: str, columns: Columns, classes: tuple[str, ...] | None = None
) -> TextExamples:
    """The examples of one labelled file, ``rows`` their row numbers (from 0).

    ``classes``: the label mapping to read it with (a dev or test file, a run's recorded
    mapping); None: this file's own classes (:func:`class_order`), which must be at least two.
    """
    path = Path(path).expanduser()
    frame = read_table(path, option)
    texts = column_texts(frame, path, option, columns.text)
    pairs = None
    if columns.pair is not None:
        pairs = column_texts(frame, path, option, columns.pair, PAIR_KEY)
    keys = label_keys(frame, path, option, columns.label)
    if classes is None:
        classes = class_order(keys)
        if len(classes) < 2:
            raise DataError(
                f"{option}={path}: column {columns.label!r} holds one class only "
                f"({classes[0]!r} in all {len(keys):,} rows); a classifier needs at least 2"
            )
    ids = {name: i for i, name in enumerate(classes)}
    unknown = [i for i, k in enumerate(keys) if k not in ids]
    if unknown:
        raise DataError(
            f"{option}={path}: row {unknown[0] + 1} has label {keys[unknown[0]]!r}, not one of "
            f"the training classes ({', '.join(classes)})"
        )
    labels = np.fromiter((ids[k] for k in keys), dtype=np.int64, count=len(keys))
    return TextExamples(texts, pairs, labels, classes, np.arange(len(keys), dtype=np.int64))


def read_texts(path: str | Path, option: str, column: str) -> list[str]:
    """The texts of one column of a table file (no labels needed)."""
    path = Path(path).expanduser()
    return column_texts(read_table(path, option), path, option, column)


def split_rows(labels: np.ndarray, dev: int, test: int) -> dict[str, np.ndarray]:
    """Row indices (sorted) of one file's train, dev and test parts: test a seeded draw of
    ``test`` rows stratified by label (:func:`~nyscli.data.subsets.subset_indices`, the fixed
    seed every evaluation subset uses, so every run of the file holds out the same rows), dev
    one of ``dev`` of the rest, train what remains. A size of 0 draws nothing."""
    rows = np.arange(len(labels), dtype=np.int64)
    parts: dict[str, np.ndarray] = {}
    for name, size in (("test", test), ("dev", dev)):
        parts[name] = rows[subset_indices(len(rows), size, labels[rows])] if size else rows[:0]
        rows = np.setdiff1d(rows, parts[name])
    parts["train"] = rows
    return parts
