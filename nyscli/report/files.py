"""Atomic file writing: a crash never leaves a half-written results file behind."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pandas as pd

from nyscli.errors import naming


def write_atomic(path: Path, write: Callable[[IO[str]], None]) -> Path:
    """Write a text file by ``write(handle)`` into a temp file beside ``path``, then rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as error:
        Path(tmp).unlink(missing_ok=True)
        raise naming(error, path) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def write_csv(df: pd.DataFrame, path: Path) -> Path:
    """Full-precision CSV (floats round-trip exactly)."""
    return write_atomic(path, lambda h: df.to_csv(h, index=False, float_format="%.17g"))


def write_json(data: Any, path: Path) -> Path:
    return write_atomic(path, lambda h: json.dump(data, h, indent=2, sort_keys=True, default=str))


def write_text(text: str, path: Path) -> Path:
    return write_atomic(path, lambda h: h.write(text))
