"""approx-error's tables: the summary (mean ± sd over heads per method and budget, a note per
row and its footnote) and, for a real model's several layers, the output error per layer.
Formatting only; the numbers are ``summary``'s."""

from __future__ import annotations

import math

import pandas as pd
from rich.console import Group, RenderableType
from rich.markup import escape
from rich.table import Table

from nyscli.experiments.approx_error import methods as approx_methods
from nyscli.experiments.approx_error.metrics import METRIC_LABELS
from nyscli.experiments.approx_error.summary import per_layer, row_note, summarise


def budget_symbol(df: pd.DataFrame) -> str:
    """How the budget column is headed: ``m`` (Nyström's landmarks, the default unit) or
    ``pairs`` (scored query-key pairs per query, ``budget_unit=pairs``)."""
    units = set(df["budget_unit"]) if "budget_unit" in df else set()
    return "pairs" if units == {"pairs"} else "m"


def _cell(mean: float, std: float) -> str:
    if pd.isna(mean):
        return ""
    if pd.isna(std):
        return f"{mean:.3g}"
    return f"{mean:.3g} ± {std:.2g}"


def render(df: pd.DataFrame) -> RenderableType:
    """Summary table: one row per method and budget, each metric as mean ± sd over heads;
    for a real model (several layers) a second table gives the output error per layer."""
    table = summary_table(df)
    layers = per_layer(df)
    return table if layers.empty else Group(table, layer_table(layers, budget_symbol(df)))


def layer_table(layers: pd.DataFrame, symbol: str = "m") -> Table:
    """``per_layer``'s frame as a table: one row per method and budget, one column per layer."""
    keys = [k for k in layers.columns if isinstance(k, str)]
    table = Table(title=f"mean {METRIC_LABELS['output_error']} per layer (over heads)")
    for key in keys:
        table.add_column(
            symbol if key == "budget" else key, justify="left" if key != "budget" else "right"
        )
    for layer in layers.columns[len(keys) :]:
        table.add_column(f"layer {layer}", justify="right")
    for row in layers.itertuples(index=False, name=None):
        labels = ["—" if pd.isna(v) else escape(str(v)) for v in row[: len(keys)]]
        table.add_row(*labels, *(_cell(v, math.nan) for v in row[len(keys) :]))
    return table


def summary_table(df: pd.DataFrame) -> Table:
    """One row per method and budget, each metric as mean ± sd over heads, a note saying what
    a row is (untrained rival, trivial baseline, pinv floor) and a footnote per note shown."""
    summary = summarise(df)
    metrics = [m for m in METRIC_LABELS if f"{m}_mean" in summary]
    run_keys = [k for k in summary.columns if k in ("job", "source", "seq_len")]
    notes = [row_note(row) for _, row in summary.iterrows()]
    off = pairs_off(df)
    table = Table(
        title="approx-error: approximation vs exact softmax attention (mean ± sd over heads)",
        caption="\n".join([_caption(df), *_footnotes(notes)]),
    )
    for key in run_keys:
        table.add_column(key, no_wrap=key == "job")  # the swept key=value, never cut
    table.add_column("method", no_wrap=True)
    table.add_column(budget_symbol(df), justify="right")
    table.add_column("heads", justify="right")
    for metric in metrics:
        table.add_column(METRIC_LABELS[metric], justify="right")
    table.add_column("note")
    for (_, row), note in zip(summary.iterrows(), notes, strict=True):
        budget = "—" if pd.isna(row["budget"]) else str(int(row["budget"]))
        used = off.get((row["method"], row["budget"]))
        if used is not None:  # the row's core scores another count than its budget says
            note = f"{note}; scores {used} pairs" if note else f"scores {used} pairs"
        cells = [_cell(row[f"{m}_mean"], row[f"{m}_std"]) for m in metrics]
        table.add_row(
            *(escape(str(row[k])) for k in run_keys),  # labels are data: "[...]" is no markup
            escape(str(row["method"])),
            budget,
            str(row["heads"]),
            *cells,
            escape(note),
        )
    return table


def pairs_off(df: pd.DataFrame) -> dict[tuple[str, int], int]:
    """(method, budget) -> the pairs a query its core scores, for the rows whose core cannot
    meet the budget exactly (``pairs_frame``); empty for results without those columns."""
    if "pairs_used" not in df:
        return {}
    rows = df.dropna(subset=["pairs_used"])
    rows = rows[rows.pairs_used != rows.pairs_asked].drop_duplicates(["method", "budget"])
    return {(r.method, r.budget): int(r.pairs_used) for r in rows.itertuples()}


def _caption(df: pd.DataFrame) -> str:
    """``source=..., n=..., d=...`` when the rows come from one source."""
    if "source" not in df or df["source"].nunique() != 1:
        return ""
    caption = f"source={df['source'].iloc[0]}"
    if "seq_len" in df:
        caption += f", n={df['seq_len'].iloc[0]}"
    if "head_dim" in df:
        caption += f", d={df['head_dim'].iloc[0]}"
    return caption


def _footnotes(notes: list[str]) -> list[str]:
    """One line explaining each note that appears, in order of first appearance."""
    return [
        escape(approx_methods.FOOTNOTES[n])
        for n in dict.fromkeys(notes)
        if n in approx_methods.FOOTNOTES
    ]
