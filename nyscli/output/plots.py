"""PNG plots (matplotlib, no display needed)."""

from __future__ import annotations

import functools
import gc
import textwrap
from collections.abc import Collection, Iterable
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import pandas as pd

if TYPE_CHECKING:
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
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


# Twenty colours told apart at a glance on white: matplotlib's ten, then ten hues unlike any
# of them. Up to 20 rows no colour repeats (the default cycle repeated after ten: naive
# attention and Nyström-64 both came out blue); a marker per row, 9 of them (coprime with 20,
# so colour and marker together repeat only after 180 rows), and dashes for rows 11-20 tell
# neighbours apart also in grey print.
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
    "#000000", "#000080", "#800000", "#f032e6", "#469990",
    "#9acd32", "#ffb000", "#6a3d9a", "#fb9a99", "#a6cee3",
)  # fmt: skip
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "h", "<")


def row_style(index: int) -> dict[str, str]:
    """Colour, marker and line style of a figure's ``index``-th row (its place in the whole
    figure, so it keeps them in every panel, also where another row is missing)."""
    return {
        "color": PALETTE[index % len(PALETTE)],
        "marker": MARKERS[index % len(MARKERS)],
        "linestyle": "-" if index % 20 < 10 else "--",
    }


def shared_legend(fig: Figure, axes: Iterable[Axes], fontsize: int = 8) -> None:
    """One legend for all ``axes``, under them and outside every panel (``fig`` needs the
    constrained layout, which makes room for it): a legend inside a panel covered its data
    (18 sweep rows hid the time panel) and the other panels had none. Entries are each label's
    first handle, in drawing order; as many columns as the labels' width allows, and the
    figure grows by the legend's height."""
    entries: dict[str, Artist] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            entries.setdefault(label, handle)
    if not entries:
        return
    width = fig.get_figwidth()
    # ~0.07 in per character at 8 pt, plus the handle's sample line.
    per_entry = 0.07 * fontsize / 8 * (max(map(len, entries)) + 6)
    columns = max(1, min(len(entries), int(width // per_entry)))
    # Taller by the legend's rows, so the panels keep their height.
    fig.set_figheight(fig.get_figheight() + 0.2 * fontsize / 8 * -(-len(entries) // columns))
    fig.legend(entries.values(), entries.keys(), loc="outside lower center", ncols=columns,
               fontsize=fontsize)  # fmt: skip


def loglog_panels(
    df: pd.DataFrame,
    x: str,
    panels: list[tuple[str, str]],
    line: str,
    path: Path,
    title: str = "",
    off_scale: Collection[str] = (),
) -> Path:
    """One log-log panel per (column, axis label) in ``panels``, one line per value of ``line``
    (a colour and marker each, one legend under the panels).

    Rows with a missing y value (e.g. out of memory) are left out of their line. Lines named in
    ``off_scale`` (a reference far from the rest, e.g. the exact SVD's 1e-15) do not set the
    y range: their points beyond it sit on the panel's edge as ▼/▲. With a single ``x`` value
    the panels are bars instead (:func:`bar_panels`).
    """
    if df[x].nunique() == 1:
        return bar_panels(df, x, panels, line, path, title)
    names = list(dict.fromkeys(df[line]))
    fig, axes = pyplot().subplots(
        1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False, layout="constrained"
    )
    for ax, (column, label) in zip(axes[0], panels, strict=True):
        points = df.dropna(subset=[column])
        lines = {name: points[points[line] == name].sort_values(x) for name in names}
        kept = [g[column] for name, g in lines.items() if name not in off_scale and len(g)]
        limits = _log_range(pd.concat(kept)) if kept and off_scale else None
        for index, (name, group) in enumerate(lines.items()):
            if group.empty:
                continue
            if name in off_scale and limits is not None:
                _clipped_line(ax, group[x], group[column], limits, str(name), row_style(index))
            else:
                ax.loglog(group[x], group[column], label=str(name), **row_style(index))
        ax.set_xscale("log")
        ax.set_yscale("log")
        if limits is not None:
            ax.set_ylim(*limits)
        ax.set_xlabel(x)
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
    shared_legend(fig, axes[0])
    if title:
        fig.suptitle(title)
    return save_figure(fig, path, dpi=120)


def _log_range(values: pd.Series) -> tuple[float, float]:
    """y limits around ``values`` on a log axis: a fifth of a decade of margin either side."""
    positive = values[values > 0]
    low, high = (float(positive.min()), float(positive.max())) if len(positive) else (1.0, 1.0)
    return low / 10**0.2, high * 10**0.2


def _clipped_line(
    ax: Axes, xs: pd.Series, ys: pd.Series, limits: tuple[float, float], label: str, style: dict
) -> None:
    """A line drawn inside ``limits``; each point beyond them sits on the edge as ▼ (below) or
    ▲ (above) in the line's colour, and the label says so."""
    low, high = limits
    below, above = ys < low, ys > high
    if below.any() or above.any():
        marks = "▼" * bool(below.any()) + "▲" * bool(above.any())
        label += f" ({marks}: {'below' if marks == '▼' else 'beyond'} the axis)"
    ax.loglog(xs, ys.clip(low, high), label=label, **style)
    for outside, marker, edge in ((below, "v", low), (above, "^", high)):
        if outside.any():
            ax.plot(xs[outside], [edge] * int(outside.sum()), linestyle="none", marker=marker,
                    markersize=9, color=style["color"], clip_on=False)  # fmt: skip


def bar_panels(
    df: pd.DataFrame,
    x: str,
    panels: list[tuple[str, str]],
    line: str,
    path: Path,
    title: str = "",
) -> Path:
    """One panel per (column, axis label), one horizontal bar per value of ``line`` with its
    number at the end: the figure for a single ``x`` value, where log-log lines would be one
    column of overlapping dots. The axis is linear from zero, so a bar's length is its value
    (on a log axis the bars started at an arbitrary floor and a 2x gap looked like 1.2x); the
    numbers keep the short bars readable. A missing value (out of memory) gets no bar; a value
    far beyond the others (over OUTLIER x their median: one blown-up pseudo-inverse in a
    hundred heads) would flatten every other bar to nothing, so its bar runs to the edge, ▶,
    with its number."""
    names = list(dict.fromkeys(df[line]))
    size = (5.5 * len(panels), 1.4 + 0.4 * len(names))
    fig, axes = pyplot().subplots(1, len(panels), figsize=size, squeeze=False, layout="constrained")
    for ax, (column, label) in zip(axes[0], panels, strict=True):
        values = df.groupby(line, sort=False)[column].first().reindex(names)
        rows = range(len(names))
        top = _bar_limit(values)
        ax.barh(rows, values.clip(upper=top), color=[row_style(i)["color"] for i in rows])
        for row, value in zip(rows, values, strict=True):
            if pd.notna(value) and value > top:
                ax.text(top, row, f"▶ {value:.3g} ", va="center", ha="right", fontsize=8)
            elif pd.notna(value):
                ax.text(value, row, f" {value:.3g}", va="center", fontsize=8)
        ax.set_xlim(0, top * 1.2)  # room for the number after the longest bar
        ax.set_yticks(list(rows), [str(n) for n in names], fontsize=8)
        ax.invert_yaxis()  # the first row on top, as in the tables
        ax.set_xlabel(label)
        ax.grid(True, axis="x", alpha=0.3)
    value = df[x].iloc[0]
    text = f"{title} ({x} = {value})" if title else f"{x} = {value}"
    # about 11 characters an inch at the title's size: wrapped, a long title is not clipped
    wrapped = [textwrap.fill(part, width=int(11 * size[0])) for part in text.split("\n")]
    fig.suptitle("\n".join(wrapped), fontsize=10)
    return save_figure(fig, path, dpi=120)


OUTLIER = 20.0  # a bar this many times the median of the others is drawn to the edge


def _bar_limit(values: pd.Series) -> float:
    """Where a bar panel's axis ends: at its largest value, unless that is an outlier (over
    OUTLIER x the median), then at the largest value that is not."""
    present = values.dropna()
    if present.empty:
        return 1.0
    median = float(present.median())
    kept = present[present <= OUTLIER * median] if median > 0 else present
    return float(kept.max() if len(kept) else present.max()) or 1.0


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
