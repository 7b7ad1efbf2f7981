"""The split names of ``metrics.csv`` and the one reader that also reads older files.

The trainer's periodic held-out evaluation (the one that picks ``best.pt``) is the ``dev``
split everywhere: in metrics.csv, figures, tables and logs. Files written before it had that
name called it ``val``; :func:`read_metrics` (and a resumed run copying rows) rename it, so a
run folder of any age reads the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pandas as pd
from rich.markup import escape

from nyscli.console import console

TRAIN = "train"
DEV = "dev"
TEST = "test"
# The dev split's name in metrics.csv files written before it was called dev.
LEGACY_DEV = "val"


def renamed_splits(splits: Iterable[str]) -> dict[str, str]:
    """Old name -> today's for a metrics.csv holding ``splits``; empty for a current file.

    In an old file, a split other than train/val/test is a command's own evaluation of the
    final model (``nys finetune`` wrote its full dev sets as ``dev``, ``dev_matched``...):
    it becomes ``<split> (final)``, so it does not join the renamed dev curve.
    """
    present = set(splits)
    if LEGACY_DEV not in present:
        return {}
    renamed = {s: f"{s} (final)" for s in present if s not in (TRAIN, LEGACY_DEV, TEST)}
    renamed[LEGACY_DEV] = DEV
    return renamed


def curve_or_warning(path: Path) -> pd.DataFrame | None:
    """``read_metrics(path)`` for a figure; a file that cannot be read (binary, truncated, no
    split column) gives None and one line naming it, so one bad run never hides the others'
    curves."""
    try:
        return read_metrics(path)
    except (OSError, ValueError, KeyError, pd.errors.ParserError) as error:
        # UnicodeDecodeError is a ValueError; KeyError: a CSV without the split column.
        console.print(
            f"warning: {escape(str(path))} cannot be read ({type(error).__name__}); its "
            "curve is left out",
            highlight=False,
            soft_wrap=True,
        )
        return None


def read_metrics(path: Path) -> pd.DataFrame:
    """A run's metrics.csv with today's split names."""
    metrics = pd.read_csv(path)
    renamed = renamed_splits(metrics["split"].astype(str))
    if renamed:
        metrics["split"] = metrics["split"].astype(str).replace(renamed)
    return metrics
