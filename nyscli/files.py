"""Writing files: one atomic writer, and the CSV, JSON and text writers built on it.

A crash never leaves a half-written file behind.

Readers (and a crashed or concurrent writer) never see a partial file, so a cache may trust
"file exists" to mean "file is complete", and a crash mid-save leaves the previous checkpoint
or results file untouched.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import pandas as pd

from nyscli.errors import naming


def current_umask() -> int:
    """The process's umask, read without changing it where Linux shows it
    (``/proc/self/status``); elsewhere set and restored at once (the only portable way)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive advisory lock on ``path`` (created if missing) for the block:
    processes (the jobs of a parallel sweep) that lock the same path run their blocks one at
    a time. Released when the block ends, also by an error or a killed process."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def _temp_beside(path: Path) -> tuple[int, str]:
    """A new temp file beside ``path`` (fd, name); an OSError names ``path``, the file the
    user asked for, not the temp name."""
    try:
        return tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as error:
        raise type(error)(error.errno, error.strerror, str(path)) from None


def check_writable(path: str | os.PathLike[str]) -> None:
    """Raise the OSError :func:`atomic_writer` would, naming ``path``, when a file cannot be
    written there (a read-only or full folder): checked before the work that ends in it."""
    fd, tmp = _temp_beside(Path(path))
    os.close(fd)
    os.remove(tmp)


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike[str], mode: str = "wb") -> Iterator[IO[Any]]:
    """A handle on a temp file beside ``path``; on success fsync and ``os.replace`` it onto
    ``path``. On any failure the temp file is removed; an OSError (a full disk, a read-only
    folder) is re-raised naming ``path`` so the one-line error says which file.

    Text modes write UTF-8 with ``newline=""`` (the csv module does its own line endings).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _temp_beside(path)
    # mkstemp makes the temp file 0600 whatever the umask; the file it becomes should be
    # readable as any file the user creates (0644 under the usual umask 022), like open() does.
    os.fchmod(fd, 0o666 & ~current_umask())
    text: dict[str, Any] = {} if "b" in mode else {"encoding": "utf-8", "newline": ""}
    try:
        with os.fdopen(fd, mode, **text) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as error:
        # What a full disk needed: at least what was written, or the file it would replace.
        sizes = [os.path.getsize(p) for p in (tmp, path) if os.path.isfile(p)]
        Path(tmp).unlink(missing_ok=True)
        named = naming(error, path)
        named.needed = max(sizes, default=0) or None  # type: ignore[attr-defined]
        raise named from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(path: Path, write: Callable[[IO[str]], None]) -> Path:
    """Write a text file by ``write(handle)`` through :func:`atomic_writer`."""
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
