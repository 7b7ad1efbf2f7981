"""Learning curves from a trainer's ``metrics.csv``: loss and accuracy per split vs step, for
one run or several overlaid."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from nyscli.output.plots import PALETTE, pyplot, row_style, save_figure, shared_legend

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


# Each split's look in a run's learning curve, the same in both panels (the panels' own colour
# cycles gave dev orange beside the loss and blue beside the accuracy). The reported model's
# rows (the best-dev checkpoint on test and on all of dev) are markers alone.
SPLIT_STYLES = {
    "train": {"color": PALETTE[0], "marker": "o", "markersize": 3},
    "dev": {"color": PALETTE[1], "marker": "o", "markersize": 3},
    "test": {"color": PALETTE[3], "marker": "*", "markersize": 13, "linestyle": "none"},
}
REPORTED = {"marker": "D", "markersize": 8, "linestyle": "none"}
BASELINE_STYLE = {"color": "grey", "linestyle": "--", "linewidth": 1}


def _split_style(split: str, index: int) -> dict[str, Any]:
    """How ``split`` (the ``index``-th drawn) is drawn: its fixed style, the reported model's
    marker for ``<split> (best)`` (in its split's colour), else the figure's row style."""
    if split in SPLIT_STYLES:
        return SPLIT_STYLES[split]
    base = split.removesuffix(" (best)")
    if base != split:
        colour = SPLIT_STYLES.get(base, row_style(index))["color"]
        return {**REPORTED, "color": colour}
    return {**row_style(index), "markersize": 3}


def learning_curve(
    metrics: pd.DataFrame,
    path: Path,
    title: str = "",
    metric: str = "accuracy",
    best_step: int | None = None,
    baseline: tuple[float, str] | None = None,
) -> Path | None:
    """Two panels (loss, ``metric``) with one line per split (train, dev); test and
    ``<split> (best)`` as markers.

    ``metrics`` has columns step, split, loss, <metric>. The test and ``(best)`` rows are
    the best-dev checkpoint's scores, logged after training: drawn at ``best_step`` (the step
    that model comes from; at their logged step when None) they sit above the dev point they
    repeat, not at the end of the run. ``baseline`` (value, label) is drawn across the
    ``metric`` panel as a dashed line (e.g. the majority class). Returns None if there is
    nothing to draw.
    """
    if metrics.empty:
        return None
    reported = metrics["split"].isin(["test"]) | metrics["split"].str.endswith(" (best)")
    if best_step is not None:
        metrics = metrics.assign(step=metrics["step"].where(~reported, best_step))
    fig, axes = pyplot().subplots(1, 2, figsize=(11, 4.2), layout="constrained")
    splits = list(dict.fromkeys(metrics["split"]))
    for ax, column in zip(axes, ("loss", metric), strict=True):
        if column not in metrics:
            continue
        for split, group in metrics.dropna(subset=[column]).groupby("split", sort=False):
            style = _split_style(str(split), splits.index(split))
            ax.plot(group["step"], shown(column, group[column]), label=str(split), **style)
        if baseline is not None and column == metric:
            value, name = baseline
            ax.axhline(shown(column, value), label=name, **BASELINE_STYLE)
        ax.set_xlabel("step")
        ax.set_ylabel(axis_label(column, column))
        ax.grid(True, alpha=0.3)
    shared_legend(fig, axes)
    if title:
        fig.suptitle(title)
    return save_figure(fig, path, dpi=110)


def _points(metrics: pd.DataFrame | list[pd.DataFrame], split: str, column: str) -> pd.DataFrame:
    """(step, mean, low, high, n) of ``column`` on ``split``: one run's points (low = high =
    mean), or several seeds' pooled step by step (the band from their min to their max)."""
    runs = metrics if isinstance(metrics, list) else [metrics]
    parts = [m[m["split"] == split][["step", column]].dropna() for m in runs if column in m]
    if not parts:
        return pd.DataFrame(columns=["step", "mean", "low", "high", "n"])
    points = pd.concat(parts).groupby("step")[column]
    return pd.DataFrame(
        {"mean": points.mean(), "low": points.min(), "high": points.max(), "n": points.count()}
    ).reset_index()


def overlaid_curves(
    curves: Mapping[str, pd.DataFrame | list[pd.DataFrame]],
    panels: Sequence[tuple[str, str, str]],
    path: Path,
    title: str = "",
    baselines: Mapping[str, tuple[float, str]] | None = None,
) -> Path | None:
    """Several runs' learning curves on shared axes: one panel per (split, column, axis label),
    one line per run. ``curves``: label -> that run's metrics (columns step, split, <column>),
    or a list of them (the seeds of one setting: their mean, with a min-max band).
    ``baselines``: column -> (value, label), drawn as a dashed line across that panel (the
    trivial rule a curve has to leave).

    Returns None when no run has a point in any panel.
    """
    drawn = False
    fig, axes = pyplot().subplots(
        1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False, layout="constrained"
    )
    for ax, (split, column, label) in zip(axes[0], panels, strict=True):
        for index, (name, metrics) in enumerate(curves.items()):
            points = _points(metrics, split, column)
            if points.empty:
                continue
            # The run's look by its place, not the panel's cycle: a run missing from one
            # panel must not shift the others' colours away from the shared legend.
            style = row_style(index)
            if isinstance(metrics, list):
                name = f"{name} (mean of {len(metrics)} seeds; band: min-max)"
                ax.fill_between(points["step"], shown(column, points["low"]),
                                shown(column, points["high"]), color=style["color"],
                                alpha=0.2, linewidth=0)  # fmt: skip
            ax.plot(points["step"], shown(column, points["mean"]), markersize=3, label=name,
                    **style)  # fmt: skip
            drawn = True
        if baselines and column in baselines:
            value, name = baselines[column]
            ax.axhline(shown(column, value), label=name, **BASELINE_STYLE)
        ax.set_xlabel("step")
        ax.set_ylabel(axis_label(label, column))
        ax.grid(True, alpha=0.3)
    if not drawn:
        pyplot().close(fig)
        return None
    # One legend under the panels: runs' labels (their differing overrides) are often wider
    # than a panel, and a legend inside each one squeezed the plots to slivers.
    shared_legend(fig, axes[0])
    if title:
        fig.suptitle(title)
    return save_figure(fig, path, dpi=110)
