"""Atomic checkpoint files, and reading them back with a one-line error when they are bad."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import torch

from nyscli.files import atomic_writer
from nyscli.train.errors import CheckpointError

FORMAT = "nys-trainer-v1"
CHECKPOINT_DIR = "checkpoints"
LAST = "last.pt"
BEST = "best.pt"


def save_checkpoint(state: dict[str, Any], path: Path) -> Path:
    """``torch.save`` into a temp file beside ``path``, fsync, then ``os.replace``.

    A crash mid-write leaves the previous checkpoint untouched: readers never see half a file.
    """
    with atomic_writer(path, "wb") as handle:
        try:
            torch.save({"format": FORMAT, **state}, handle)
        except RuntimeError as error:
            # torch's zip writer turns a failed write (a full disk) into "unexpected pos":
            # the OSError behind it is what the one-line message needs.
            if isinstance(error.__context__, OSError):
                raise error.__context__ from None
            raise
    return Path(path)


def shape_mismatch(model: torch.nn.Module, state: dict[str, Any]) -> str | None:
    """What keeps ``state`` (a state_dict) from loading into ``model``, in one line: the
    tensors whose shapes differ (checkpoint vs model), then missing and unexpected names."""
    mine = model.state_dict()
    parts = [
        f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(mine[k].shape)}"
        for k, v in state.items()
        if k in mine and hasattr(v, "shape") and tuple(v.shape) != tuple(mine[k].shape)
    ]
    missing = [k for k in mine if k not in state]
    unexpected = [k for k in state if k not in mine]
    if missing:
        parts.append(f"missing {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}")
    if unexpected:
        more = " ..." if len(unexpected) > 3 else ""
        parts.append(f"unexpected {', '.join(unexpected[:3])}{more}")
    return "; ".join(parts[:4]) if parts else None


def _read(path: Path, map_location: str | torch.device, mmap: bool = False) -> Any:
    """``torch.load`` of ``path`` (``mmap``: tensors mapped, not read); CheckpointError (one
    line) if it cannot be read."""
    try:
        # weights_only=False: the state holds RNG states and python objects we wrote ourselves.
        return torch.load(path, map_location=map_location, mmap=mmap, weights_only=False)
    except Exception as error:  # torch raises many types for truncated or foreign files
        raise _unreadable(path, error) from None


def load_checkpoint(path: Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """The state saved by :func:`save_checkpoint`; CheckpointError (one line) if unreadable."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist; give a run folder with one")
    state = _read(path, map_location)
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise CheckpointError(
            f"checkpoint {path} is not a nys trainer checkpoint (format {FORMAT} expected)"
        )
    return state


def check_complete(path: Path) -> None:
    """CheckpointError (the line :func:`load_checkpoint` gives) unless ``path`` is a complete
    torch zip file. Reads only its directory at the end (milliseconds whatever the size), so a
    resume finds a truncated or foreign file before loading any data."""
    try:
        with zipfile.ZipFile(path) as archive:
            archive.infolist()
    except (zipfile.BadZipFile, OSError) as error:
        raise _unreadable(path, error) from None


def saved_architecture(path: Path) -> dict[str, Any] | None:
    """The settings that shaped the weights, as the run that saved ``path`` recorded them
    (None in a checkpoint from before they were recorded), read with its tensors mapped, so
    a resume compares them before loading any data."""
    state = _read(path, "cpu", mmap=True)
    found = state.get("architecture") if isinstance(state, dict) else None
    return dict(found) if isinstance(found, dict) else None


def _unreadable(path: Path, error: Exception) -> CheckpointError:
    """The one line for a checkpoint that cannot be read: the first line of the reason."""
    reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:120]
    return CheckpointError(
        f"checkpoint {path} is corrupt or unreadable ({reason}); resume from another "
        "run folder, or start fresh with resume=false"
    )


def load_best(model: torch.nn.Module, folder: Path, device: str | torch.device = "cpu") -> bool:
    """Load ``folder``'s best-dev checkpoint into ``model``: the model a run reports (its
    test, its final dev scores, ``pretrained/``). False, the model untouched, if there is none
    (no dev evaluation ran)."""
    best = Path(folder) / BEST
    if not best.exists():
        return False
    model.load_state_dict(load_checkpoint(best, device)["model"])
    return True
