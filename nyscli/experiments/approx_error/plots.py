"""The two figures of ``nys approx-error``: error versus budget, and S next to Ŝ (Fig. 3)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import torch
from torch import Tensor

from nyscli.experiments.approx_error.methods import NOTES
from nyscli.experiments.approx_error.metrics import METRIC_LABELS
from nyscli.experiments.approx_error.summary import summarise
from nyscli.output.plots import loglog_panels, pyplot, row_style, save_figure, shared_legend

PLOTTED = ("output_error", "matrix_error")
MAX_PIXELS = 512  # larger matrices are block-averaged down to this many rows/columns
MAX_COLUMNS = 4  # panels per row of the S-next-to-Ŝ figure


def error_vs_budget(df: pd.DataFrame, path: Path) -> Path | None:
    """Log-log mean error versus budget m, one line per method (and source, if several); the
    y range is the methods', the SVD baseline's points below it sit on the edge (▼).

    Methods without a budget (uniform, linear) are drawn flat across the budgets present.
    Untrained or random rivals and the baselines say so in the legend; Nyström with an
    iterative pinv gets a second line, its output error with an exact pinv (the pinv floor is
    the gap). Returns None when there is nothing to plot.
    """
    summary = summarise(df)
    columns = [m for m in PLOTTED if f"{m}_mean" in summary]
    budgets = sorted(summary["budget"].dropna().unique())
    if not columns or not budgets:
        return None
    flat = summary[summary["budget"].isna()]
    summary = pd.concat(
        [summary.dropna(subset=["budget"]), *(flat.assign(budget=b) for b in budgets)]
    )
    # Last, so the lines of both panels come in the same order and keep their colours (the
    # exact-pinv lines have no matrix error).
    summary = with_exact_pinv_lines(summary)
    sources = list(df["source"].unique()) if "source" in df else []
    summary["line"] = [
        f"{method} ({NOTES[method]})" if method in NOTES else method for method in summary["method"]
    ]
    if "source" in summary:  # several sources: one line per (source, method)
        summary["line"] = summary["source"].astype(str) + ": " + summary["line"]
    panels = [(f"{m}_mean", f"mean {METRIC_LABELS[m]}") for m in columns]
    title = f"source: {', '.join(map(str, sources))}" if sources else ""
    if "seq_len" in df and df["seq_len"].nunique() == 1:
        title += f", n={df['seq_len'].iloc[0]}"
    title += "\n" + FOOTNOTE
    # The SVD's error falls to rounding (1e-15) while every method stays above ~1e-5: on one
    # range the methods were squashed into the top of the panel. It marks its points beyond
    # the methods' range on the edge instead.
    exact = set(summary.loc[summary["method"] == "svd", "line"])
    return loglog_panels(summary, "budget", panels, "line", path, title=title, off_scale=exact)


FOOTNOTE = (
    "rivals run untrained (random projections / features); uniform = mean of V; "
    "'exact pinv': Nyström with its pinv solved exactly"
)


def with_exact_pinv_lines(summary: pd.DataFrame) -> pd.DataFrame:
    """``summary`` plus a row ``<method>, exact pinv`` per row that measured its output error
    with an exact pinv (that error as its output error; no matrix error)."""
    if "exact_pinv_error_mean" not in summary:
        return summary
    measured = summary.dropna(subset=["exact_pinv_error_mean"])
    exact = measured.assign(
        method=measured["method"] + ", exact pinv",
        output_error_mean=measured["exact_pinv_error_mean"],
    )
    if "matrix_error_mean" in exact:
        exact["matrix_error_mean"] = float("nan")
    return pd.concat([summary, exact], ignore_index=True)


def error_per_layer(
    layers: pd.DataFrame, path: Path, title: str = "", symbol: str = "m"
) -> Path | None:
    """Mean output error against the layer, one line per method and budget (``per_layer``'s
    frame, budgets shown as ``<symbol>=``); None when there is nothing to plot (one layer)."""
    if layers.empty:
        return None
    keys = [k for k in layers.columns if isinstance(k, str)]
    columns = [k for k in layers.columns if not isinstance(k, str)]
    fig, ax = pyplot().subplots(figsize=(6.5, 4.2), layout="constrained")
    for index, row in enumerate(layers.itertuples(index=False, name=None)):
        label = ", ".join(
            f"{symbol}={v}" if k == "budget" else str(v)
            for k, v in zip(keys, row[: len(keys)], strict=True)
            if not pd.isna(v)
        )
        ax.plot(columns, row[len(keys) :], label=label, **row_style(index))
    ax.set_yscale("log")
    ax.set_xticks(columns)
    ax.set_xlabel("layer")
    ax.set_ylabel(f"mean {METRIC_LABELS['output_error']}")
    ax.grid(True, which="both", alpha=0.3)
    shared_legend(fig, [ax], fontsize=7)
    if title:
        ax.set_title(title)
    return save_figure(fig, path, dpi=120)


def _downsample(matrix: Tensor) -> Tensor:
    """Block-average an (r, c) matrix to at most ``MAX_PIXELS`` per side for display."""
    factor = -(-max(matrix.shape) // MAX_PIXELS)
    if factor == 1:
        return matrix
    pooled = torch.nn.functional.avg_pool2d(matrix[None, None], factor, ceil_mode=True)
    return pooled[0, 0]


def attention_maps(matrices: dict[str, Tensor], path: Path, title: str) -> Path:
    """S next to each method's Ŝ for one head (the paper's Fig. 3), on one colour scale.

    ``matrices``: label -> (n, n) matrix, the exact one under ``"exact"`` (uniform attention
    is left out: a flat square). The colour scale runs from 0 to the 99.5th percentile of S,
    so a few large entries do not wash it out; negative entries of Ŝ show as 0.
    """
    labels = ["exact", *(k for k in matrices if k not in ("exact", "uniform"))]
    exact = matrices["exact"].detach().double().cpu().flatten()
    sample = exact[:: -(-exact.numel() // 1_000_000)]  # torch.quantile caps its input size
    top = torch.quantile(sample, 0.995).item()
    cols = min(len(labels), MAX_COLUMNS)
    rows = -(-len(labels) // cols)
    fig, axes = pyplot().subplots(
        rows, cols, figsize=(2.6 * cols + 0.8, 2.8 * rows), squeeze=False, layout="constrained"
    )
    for ax in axes.flat:
        ax.set_axis_off()
    for ax, label in zip(axes.flat, labels, strict=False):
        shown = _downsample(matrices[label].detach().double().cpu())
        image = ax.imshow(shown.numpy(), cmap="viridis", vmin=0.0, vmax=top)
        ax.set_title("S (exact)" if label == "exact" else f"Ŝ {label}", fontsize=9)
    fig.colorbar(image, ax=axes, shrink=0.8)
    fig.suptitle(title, fontsize=10)
    return save_figure(fig, path, dpi=110)
