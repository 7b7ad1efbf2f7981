"""Atomic checkpoint files, and reading them back with a one-line error when they are bad."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from nyscli.train.errors import CheckpointError

FORMAT = "nys-trainer-v1"
CHECKPOINT_DIR = "checkpoints"
LAST = "last.pt"
BEST = "best.pt"


def save_checkpoint(state: dict[str, Any], path: Path) -> Path:
    """``torch.save`` into a temp file beside ``path``, fsync, then ``os.replace``.

    A crash mid-write leaves the previous checkpoint untouched: readers never see half a file.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            torch.save({"format": FORMAT, **state}, handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    return path


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The state saved by :func:`save_checkpoint`; CheckpointError (one line) if unreadable."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist; give a run folder with one")
    try:
        # weights_only=False: the state holds RNG states and python objects we wrote ourselves.
        state = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as error:  # torch raises many types for truncated or foreign files
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:120]
        raise CheckpointError(
            f"checkpoint {path} is corrupt or unreadable ({reason}); delete it, resume from "
            "another run folder, or start fresh with resume=false"
        ) from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(
            f"checkpoint {path} is not a nys trainer checkpoint (format {FORMAT} expected)"
        )
    return state
