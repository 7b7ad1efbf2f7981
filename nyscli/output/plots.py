"""PNG plots (matplotlib, no display needed)."""

from __future__ import annotations

import functools
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from matplotlib.figure import Figure


@functools.cache
def pyplot() -> ModuleType:
    """matplotlib.pyplot on the Agg backend (no display), imported and set up on first use
    only: the import costs ~0.5 s, which every ``nys`` start (and every one-line error) would
    otherwise pay."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot

    return matplotlib.pyplot


def loglog_panels(
    df: pd.DataFrame,
    x: str,
    panels: list[tuple[str, str]],
    line: str,
    path: Path,
    title: str = "",
) -> Path:
    """One log-log panel per (column, axis label) in ``panels``, one line per value of ``line``.

    Rows with a missing y value (e.g. out of memory) are left out of their line.
    """
    fig, axes = pyplot().subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, (column, label) in zip(axes[0], panels, strict=True):
        for name, group in df.dropna(subset=[column]).groupby(line, sort=False):
            group = group.sort_values(x)
            ax.loglog(group[x], group[column], marker="o", label=str(name))
        ax.set_xlabel(x)
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path, dpi=120)


def save_figure(fig: Figure, path: Path, dpi: int = 120) -> Path:
    """Lay out (unless ``fig`` has its own layout engine), write ``fig`` to a temp file beside
    ``path``, rename it, close the figure."""
    if fig.get_layout_engine() is None:
        fig.tight_layout()
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=dpi)
    pyplot().close(fig)
    tmp.replace(path)
    return path
