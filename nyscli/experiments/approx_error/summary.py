"""Aggregation of the long-format results: one row per (method, budget) with mean and spread."""

from __future__ import annotations

import pandas as pd

from nyscli.experiments.approx_error.methods import NOTES
from nyscli.experiments.approx_error.metrics import METRICS, PINV_FLOOR, PINV_UNSTABLE

# Columns that tell runs apart when several are stacked (``nys report``); kept when they vary.
RUN_KEYS = ("job", "source", "seq_len")


def group_keys(df: pd.DataFrame) -> list[str]:
    """Run-level columns that vary in ``df``, then method and budget."""
    varying = [key for key in RUN_KEYS if key in df and df[key].nunique(dropna=False) > 1]
    return [*varying, "method", "budget"]


def summarise(df: pd.DataFrame) -> pd.DataFrame:
    """Mean, standard deviation, min, max and count of each metric per (method, budget).

    Input: long format (method, budget, metric, value, ...). Output: one row per group with
    columns ``<metric>_mean``, ``<metric>_std``, ... for the metrics present, and ``heads``
    (how many heads were averaged), in the order methods first appear, budgets ascending.
    """
    keys = group_keys(df)
    stats = (
        df.groupby([*keys, "metric"], dropna=False, sort=False)["value"]
        .agg(["mean", "std", "min", "max", "count"])
        .unstack("metric")
    )
    metrics = [m for m in METRICS if m in stats.columns.get_level_values(1)]
    wide = pd.DataFrame(index=stats.index)
    for metric in metrics:
        for stat in ("mean", "std", "min", "max"):
            wide[f"{metric}_{stat}"] = stats[(stat, metric)]
    wide["heads"] = stats["count"].max(axis=1).astype(int)
    wide = wide.reset_index()
    # Text keys (job, source) and methods in the order their rows come: runs arrive in natural
    # order (``nys report``: job 16 before job 128), which sorting the text undid ("...=128"
    # before "...=16"). Numbers (seq_len, budget) sort as numbers.
    order = []
    for key in [*keys[:-2], "method"]:
        if pd.api.types.is_numeric_dtype(wide[key]):
            order.append(key)
            continue
        first = {value: i for i, value in enumerate(dict.fromkeys(df[key]))}
        wide[f"_{key}"] = wide[key].map(first)
        order.append(f"_{key}")
    ordered = wide.sort_values([*order, "budget"], na_position="first", kind="stable")
    return ordered.drop(columns=[c for c in order if c.startswith("_")])


def per_layer(df: pd.DataFrame, metric: str = "output_error") -> pd.DataFrame:
    """Mean ``metric`` over the heads (and sequences) of each layer: one row per (method,
    budget) in ``summarise``'s order, one column per layer (ints, ascending).

    Empty when ``df`` has no such metric or only one layer (synthetic sources)."""
    rows = df[df["metric"] == metric]
    if rows.empty or rows["layer"].nunique() < 2:
        return pd.DataFrame()
    keys = group_keys(rows)
    means = rows.groupby([*keys, "layer"], dropna=False, sort=False)["value"].mean()
    wide = means.unstack("layer").reset_index()
    wide.columns = [*keys, *(int(layer) for layer in wide.columns[len(keys) :])]
    order = summarise(rows)[keys]  # methods as first seen, budgets ascending
    return order.merge(wide, on=keys, how="left")[[*keys, *sorted(wide.columns[len(keys) :])]]


def pinv_floor(row: pd.Series) -> bool:
    """Whether an exact pinv would more than halve this (Nyström) row's mean output error."""
    exact = row.get("exact_pinv_error_mean")
    if exact is None or pd.isna(exact):
        return False
    return bool(row["output_error_mean"] > PINV_FLOOR * exact)


def exact_pinv_unstable(row: pd.Series) -> bool:
    """Whether the exact pinv's output error is over PINV_UNSTABLE x the row's own: the
    landmark kernel is near-singular in some heads, and the exact pinv's inverted tiny
    singular values swamp their output (its mean is those heads')."""
    exact = row.get("exact_pinv_error_mean")
    if exact is None or pd.isna(exact):
        return False
    return bool(exact > PINV_UNSTABLE * row["output_error_mean"])


def row_note(row: pd.Series) -> str:
    """What a summary row is (untrained rival, trivial baseline, ...), ``pinv floor`` or
    ``exact pinv unstable``."""
    if pinv_floor(row):
        return "pinv floor"
    if exact_pinv_unstable(row):
        return "exact pinv unstable"
    return NOTES.get(str(row["method"]).split(" (")[0], "")
