"""The text a real model reads: ``data.path`` and ``fidelity.path`` are UTF-8 text files or
table files (``.csv``, ``.tsv``, ``.jsonl``, each also ``.gz``, ``.parquet``: the formats of
``nys finetune task=csv``, :mod:`nyscli.data.table`), of which the column
``task.text_column`` is read. A file is told apart by its suffix."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from nyscli.data.common import read_text_file
from nyscli.data.table import is_table, read_texts

SEPARATOR = "\n\n"  # between a table's texts, as between the paragraphs of a text file


def text_column(cfg: DictConfig) -> str:
    """The column of a table file that holds the texts (``task.text_column``)."""
    return str(OmegaConf.select(cfg, "task.text_column", default="text"))


def file_text(cfg: DictConfig, path: str, option: str, limit_bytes: int) -> str:
    """A text file's content, or a table's texts joined by blank lines, read only as far as
    about ``limit_bytes`` need; one-line errors for a file that cannot be read."""
    if not is_table(path):
        return read_text_file(Path(path), option, limit_bytes=limit_bytes)
    kept: list[str] = []
    size = 0
    for text in read_texts(path, option, text_column(cfg)):
        kept.append(text)
        size += len(text) + len(SEPARATOR)
        if size >= limit_bytes:
            break
    return SEPARATOR.join(kept)[:limit_bytes]


def table_texts(cfg: DictConfig, path: str, option: str, count: int, chars: int) -> list[str]:
    """The first ``count`` texts of a table file, each cut at ``chars`` characters."""
    return [text[:chars] for text in read_texts(path, option, text_column(cfg))[:count]]
