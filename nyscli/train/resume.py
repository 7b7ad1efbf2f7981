"""Find the checkpoint that ``resume=...`` means: a run folder, or the newest matching run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from nyscli.train.checkpoint import CHECKPOINT_DIR, LAST
from nyscli.train.errors import CheckpointError


def _last_checkpoint(run: Path) -> Path | None:
    path = run / CHECKPOINT_DIR / LAST
    return path if path.is_file() else None


def find_resume_checkpoint(
    resume: Any,
    runs_root: Path,
    current_run: Path,
    matches: Callable[[DictConfig], bool],
) -> Path | None:
    """The ``last.pt`` to continue from, or None for ``resume=false``.

    ``resume=true``: the newest run folder under ``runs_root`` (by name, i.e. time stamp)
    other than ``current_run`` whose saved config ``matches`` and that has a checkpoint.
    ``resume=<path>``: that run folder (or that checkpoint file).
    """
    if resume is None or resume is False or str(resume).lower() in ("false", "none", "null"):
        return None
    if resume is True or str(resume).lower() == "true":
        candidates = []
        for config in Path(runs_root).rglob(".hydra/config.yaml"):
            run = config.parent.parent
            if run.resolve() == Path(current_run).resolve():
                continue
            last = _last_checkpoint(run)
            if last is not None and matches(OmegaConf.load(config)):
                candidates.append((last.stat().st_mtime, last))
        if not candidates:
            raise CheckpointError(
                f"resume=true found no run with {CHECKPOINT_DIR}/{LAST} and the same task, "
                f"model and attention under {runs_root}; give resume=<run folder>"
            )
        return max(candidates)[1]
    path = Path(str(resume)).expanduser()
    if path.is_file():
        return path
    last = _last_checkpoint(path) if path.is_dir() else None
    if last is None:
        raise CheckpointError(
            f"resume={resume} is not a run folder with {CHECKPOINT_DIR}/{LAST}; "
            "give a run folder of an earlier run, true (newest matching run) or false"
        )
    return last
