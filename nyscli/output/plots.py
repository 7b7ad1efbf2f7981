"""PNG plots (matplotlib, no display needed)."""

from __future__ import annotations

import functools
import gc
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

    Rows with a missing y value (e.g. out of memory) are left out of their line. With a single
    ``x`` value the panels are bars instead (:func:`bar_panels`).
    """
    if df[x].nunique() == 1:
        return bar_panels(df, x, panels, line, path, title)
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


def bar_panels(
    df: pd.DataFrame,
    x: str,
    panels: list[tuple[str, str]],
    line: str,
    path: Path,
    title: str = "",
) -> Path:
    """One panel per (column, axis label), one horizontal bar per value of ``line`` with its
    number at the end, on a log axis: the figure for a single ``x`` value, where log-log lines
    would be one column of overlapping dots. A missing value (out of memory) gets no bar."""
    from matplotlib.ticker import NullFormatter  # matplotlib loads on first use (pyplot)

    names = list(dict.fromkeys(df[line]))
    size = (5.5 * len(panels), 1.4 + 0.4 * len(names))
    fig, axes = pyplot().subplots(1, len(panels), figsize=size, squeeze=False)
    for ax, (column, label) in zip(axes[0], panels, strict=True):
        values = df.groupby(line, sort=False)[column].first().reindex(names)
        rows = range(len(names))
        ax.barh(rows, values, color=[f"C{i % 10}" for i in rows], log=True)
        for row, value in zip(rows, values, strict=True):
            if pd.notna(value):
                ax.text(value, row, f" {value:.3g}", va="center", fontsize=8)
        if values.notna().any():  # room for the number after the longest bar
            ax.set_xlim(right=float(values.max()) * 2.5)
        ax.xaxis.set_minor_formatter(NullFormatter())  # minor labels collide on a short range
        ax.set_yticks(list(rows), [str(n) for n in names], fontsize=8)
        ax.invert_yaxis()  # the first row on top, as in the tables
        ax.set_xlabel(label)
        ax.grid(True, axis="x", which="both", alpha=0.3)
    value = df[x].iloc[0]
    fig.suptitle(f"{title} ({x} = {value})" if title else f"{x} = {value}")
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
    # Log-scale tick labels go through mathtext, whose parser (pyparsing) leaves exceptions in
    # reference cycles with their tracebacks, so every frame that was on the stack stays alive
    # until Python's collector happens to run, with whatever its locals hold: approx-error's
    # kept n x n maps (1 GB at the defaults) outlived their job and were freed in the middle of
    # the next sweep job's first head, 2-3 s later than needed. Collect now, while it is cheap.
    gc.collect()
    return path
