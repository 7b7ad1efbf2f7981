"""Atomic file writing: a crash never leaves a half-written results file behind."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import pandas as pd

from nyscli.atomic import atomic_writer


def write_atomic(path: Path, write: Callable[[IO[str]], None]) -> Path:
    """Write a text file by ``write(handle)`` through :func:`nyscli.atomic.atomic_writer`."""
    with atomic_writer(path, "w") as handle:
        write(handle)
    return Path(path)


def write_csv(df: pd.DataFrame, path: Path) -> Path:
    """Full-precision CSV (floats round-trip exactly)."""
    return write_atomic(path, lambda h: df.to_csv(h, index=False, float_format="%.17g"))


def write_json(data: Any, path: Path) -> Path:
    return write_atomic(path, lambda h: json.dump(data, h, indent=2, sort_keys=True, default=str))


def write_text(text: str, path: Path) -> Path:
    return write_atomic(path, lambda h: h.write(text))
