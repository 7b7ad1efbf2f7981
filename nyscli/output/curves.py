"""Learning curves from a trainer's ``metrics.csv``: loss and accuracy per split vs step, for
one run or several overlaid."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from nyscli.output.plots import pyplot, save_figure

# The learning-curve figure of a training run folder (lra, finetune).
LEARNING_CURVE_FILE = "learning_curve.png"


def is_rate(column: str) -> bool:
    """A metric kept as a fraction in metrics.csv and results.csv (accuracy, F1): every
    figure and table shows it as a percentage."""
    return column.endswith("accuracy") or column == "f1"


def shown(column: str, values: Any) -> Any:
    """``values`` of ``column`` as a figure draws them: rates in percent."""
    return 100 * values if is_rate(column) else values


def axis_label(label: str, column: str) -> str:
    """``label`` with the unit of a rate column, e.g. ``accuracy (%)``."""
    return f"{label} (%)" if is_rate(column) and "%" not in label else label


def learning_curve(
    metrics: pd.DataFrame, path: Path, title: str = "", metric: str = "accuracy"
) -> Path | None:
    """Two panels (loss, ``metric``) with one line per split (train, dev); test as a marker.

    ``metrics`` has columns step, split, loss, <metric>. Returns None if there is nothing
    to draw.
    """
    if metrics.empty:
        return None
    fig, axes = pyplot().subplots(1, 2, figsize=(11, 4.2))
    for ax, column in zip(axes, ("loss", metric), strict=True):
        if column not in metrics:
            continue
        for split, group in metrics.dropna(subset=[column]).groupby("split", sort=False):
            # A single dev point must still show: every split gets markers, test a star alone.
            style = (
                {"marker": "*", "markersize": 12, "linestyle": "none"}
                if split == "test"
                else {"marker": "o", "markersize": 3}
            )
            ax.plot(group["step"], shown(column, group[column]), label=str(split), **style)
        ax.set_xlabel("step")
        ax.set_ylabel(axis_label(column, column))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path, dpi=110)


def overlaid_curves(
    curves: Mapping[str, pd.DataFrame],
    panels: Sequence[tuple[str, str, str]],
    path: Path,
    title: str = "",
    baselines: Mapping[str, tuple[float, str]] | None = None,
) -> Path | None:
    """Several runs' learning curves on shared axes: one panel per (split, column, axis label),
    one line per run. ``curves``: label -> that run's metrics (columns step, split, <column>).
    ``baselines``: column -> (value, label), drawn as a dashed line across that panel (the
    trivial rule a curve has to leave).

    Returns None when no run has a point in any panel.
    """
    drawn = False
    fig, axes = pyplot().subplots(
        1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False, layout="constrained"
    )
    legend: dict[str, object] = {}  # label -> handle, over all panels (a run has one colour)
    for ax, (split, column, label) in zip(axes[0], panels, strict=True):
        for index, (name, metrics) in enumerate(curves.items()):
            if column not in metrics:
                continue
            points = metrics[metrics["split"] == split].dropna(subset=[column])
            if points.empty:
                continue
            points = points.sort_values("step")
            # The run's colour by its place, not the panel's cycle: a run missing from one
            # panel must not shift the others' colours away from the shared legend.
            ax.plot(points["step"], shown(column, points[column]), marker="o", markersize=3,
                    label=name, color=f"C{index % 10}")  # fmt: skip
            drawn = True
        if baselines and column in baselines:
            value, name = baselines[column]
            ax.axhline(shown(column, value), color="grey", linestyle="--", label=name)
        ax.set_xlabel("step")
        ax.set_ylabel(axis_label(label, column))
        ax.grid(True, alpha=0.3)
        for handle, name in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(name, handle)
    if not drawn:
        pyplot().close(fig)
        return None
    # One legend under the panels: runs' labels (their differing overrides) are often wider
    # than a panel, and a legend inside each one squeezed the plots to slivers.
    fig.legend(legend.values(), legend.keys(), loc="outside lower center", fontsize=8)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path, dpi=110)
