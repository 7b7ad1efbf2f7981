"""Table 3 of the paper from ``nys lra`` result rows: tables, ``table3.csv`` and learning curves.

Rows are our runs (one per attention setting) under the paper's five rows; columns are the
tasks in LRA order, each labelled with the data set actually read (a substitute is marked
with a dagger and named under the table). Every cell is one run's test accuracy; a cell that
holds several runs of identical settings (seeds) shows mean ± std (ddof 1) and n. Rows that
differ in a swept setting other than task and attention (``job``) are separate rows.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from nyscli.experiments.lra.tasks import TASKS
from nyscli.files import write_csv
from nyscli.output.curves import overlaid_curves
from nyscli.train.metrics import METRICS_FILE
from nyscli.train.splits import DEV, TRAIN, curve_or_warning

TABLE3_FILE = "table3.csv"
CURVES_FILE = "curves_{task}.png"
SUBSTITUTE = "substitute"
# Table 3 of the paper (test accuracy %, LRA order), its own PyTorch runs on the real data.
PAPER_TABLE3: dict[str, tuple[float, ...]] = {
    "Transformer": (37.10, 65.02, 79.35, 38.20, 74.16),
    "Reformer": (19.05, 64.88, 78.64, 43.29, 69.36),
    "Linformer": (37.25, 55.91, 79.37, 37.84, 67.60),
    "Performer": (18.80, 63.81, 78.62, 37.07, 69.87),
    "Nyströmformer": (37.15, 65.52, 79.56, 41.58, 70.94),
}
PAPER_AVERAGE = {"Transformer": 58.77, "Reformer": 55.04, "Linformer": 55.59,
                 "Performer": 53.63, "Nyströmformer": 58.95}  # fmt: skip
# Our attention name (the label's first part) -> the paper row it reproduces.
PAPER_ROW = {
    "softmax": "Transformer",
    "softmax_naive": "Transformer",
    "reformer": "Reformer",
    "linformer": "Linformer",
    "performer": "Performer",
    "nystrom": "Nyströmformer",
}


def paper_value(attention: str, task: str) -> float:
    """The paper's test accuracy (%) for our attention label on ``task`` (NaN if no row)."""
    row = PAPER_ROW.get(attention.split("-")[0].split(" ")[0])
    return PAPER_TABLE3[row][TASKS.index(task)] if row else math.nan


def _columns(df: pd.DataFrame) -> list[tuple[str, str]]:
    """(task, dataset) pairs present, in LRA task order."""
    pairs = {(str(t), str(d)) for t, d in zip(df.task, df.dataset, strict=True)}
    return sorted(pairs, key=lambda p: (TASKS.index(p[0]) if p[0] in TASKS else 99, p[1]))


def _row_key(r: pd.Series) -> str:
    """The attention label, plus the swept settings other than task/attention that differ;
    the seed is no setting: a row's seeds share it (a cell's mean ± std, a curve's band)."""
    extra = [
        part
        for part in str(r.get("job", "") or "").split()
        if not part.lstrip("+").startswith(("task=", "attention=", "seed="))
    ]
    return " ".join([str(r.attention), *extra])


def table3_frame(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (our row, task, dataset): runs, mean test accuracy, baseline, tokens/s,
    peak MB, steps, the paper's value. ``runs`` > 1 only for runs of identical settings."""
    df = df.copy()
    if "dataset" not in df:
        df["dataset"] = ""
    df["dataset"] = df["dataset"].fillna("").astype(str)
    df["row"] = [_row_key(r) for _, r in df.iterrows()]
    for column in ("rule_accuracy", "tokens_per_s", "peak_mb", "steps"):
        if column not in df:
            df[column] = math.nan
    if "n" in df and "test_accuracy_std" in df:
        # Rows already pooled over seeds (nys report): each says its n and std.
        df["runs"], df["test_std"] = df["n"], df["test_accuracy_std"]
        counted = {"runs": ("runs", "sum"), "test_accuracy_std": ("test_std", "first")}
    else:
        counted = {
            "runs": ("test_accuracy", "size"),
            "test_accuracy_std": ("test_accuracy", lambda x: x.std(ddof=1)),
        }
    out = (
        df.groupby(["row", "task", "dataset"], sort=False)
        .agg(
            attention=("attention", "first"),
            **counted,
            test_accuracy=("test_accuracy", "mean"),
            rule_accuracy=("rule_accuracy", "mean"),
            tokens_per_s=("tokens_per_s", "mean"),
            peak_mb=("peak_mb", "mean"),
            steps=("steps", "mean"),
        )
        .reset_index()
    )
    pairs = zip(out.attention, out.task, strict=True)
    out["paper_accuracy"] = [paper_value(a, t) / 100 for a, t in pairs]
    return out


def _header(task: str, dataset: str) -> str:
    mark = "†" if SUBSTITUTE in dataset else ""
    return f"{task}{mark}\n{dataset.split(' (')[0]}" if dataset else task


def _cell(value: float, runs: int, fmt: str, scale: float, std: float = math.nan) -> str:
    """The value; over several runs their mean, ± their std (ddof 1) where it is known."""
    if pd.isna(value):
        return ""
    text = format(scale * value, fmt)
    if runs > 1 and pd.notna(std):
        return f"{text} ± {format(scale * std, fmt)} (n = {runs})"
    return f"{text} (mean of {runs})" if runs > 1 else text


def _layout(frame: pd.DataFrame, column: str, title: str, fmt: str, scale: float,
            paper: bool) -> Table:  # fmt: skip
    columns = _columns(frame)
    table = Table(title=title, title_justify="left")
    table.add_column("row", style="bold", no_wrap=True)
    for task, dataset in columns:
        table.add_column(_header(task, dataset), justify="right")
    if paper:
        table.add_column("avg", justify="right")
        for name, values in PAPER_TABLE3.items():
            cells = [f"{values[TASKS.index(t)]:.2f}" for t, _ in columns]
            table.add_row(Text(f"paper: {name}", style="dim"), *cells, f"{PAPER_AVERAGE[name]:.2f}",
                          style="dim")  # fmt: skip
        base = frame.groupby(["task", "dataset"]).rule_accuracy.mean()
        cells = [_cell(base.get((t, d), math.nan), 1, fmt, scale) for t, d in columns]
        table.add_row(Text("trivial rule / majority", style="italic"), *cells, "", end_section=True)
    for row, group in frame.groupby("row", sort=False):
        cells = {(r.task, r.dataset): (getattr(r, column), r.runs) for r in group.itertuples()}
        spread = {(r.task, r.dataset): getattr(r, f"{column}_std", math.nan)
                  for r in group.itertuples()}  # fmt: skip
        shown = [_cell(*cells.get(c, (math.nan, 1)), fmt, scale, spread.get(c, math.nan))
                 for c in columns]  # fmt: skip
        if paper:
            values = [cells[c][0] for c in columns if c in cells and pd.notna(cells[c][0])]
            note = "" if len(values) == len(columns) else "*"
            avg = _cell(sum(values) / len(values), 1, fmt, scale) + note if values else ""
            shown.append(avg)
        table.add_row(str(row), *shown)
    return table


def render_table3(df: pd.DataFrame) -> RenderableType:
    """Test accuracy (with the paper's rows and the baseline), training tokens/s, peak MB."""
    frame = table3_frame(df)
    notes = [
        f"† {d}" for _, d in _columns(frame) if SUBSTITUTE in d
    ]  # the paper's numbers are on the benchmark's own data
    notes.append("paper rows: the paper's Table 3 (its PyTorch runs, full schedules, real data); "
                 "* = average over the tasks present")  # fmt: skip
    return Group(
        _layout(frame, "test_accuracy", "Table 3 — test accuracy (%)", ".2f", 100.0, True),
        Text("\n".join(notes), style="dim"),
        _layout(frame, "tokens_per_s", "Training tokens/s", ",.0f", 1.0, False),
        _layout(frame, "peak_mb", "Peak memory (MB)", ",.0f", 1.0, False),
    )


def write_table3(df: pd.DataFrame, folder: Path) -> list[Path]:
    """``table3.csv`` and one ``curves_<task>.png`` per task (one line per row) in ``folder``."""
    written = [write_csv(table3_frame(df), folder / TABLE3_FILE)]
    if "run_dir" not in df:
        return written
    for task, group in df.groupby("task", sort=False):
        path = _task_curves(str(task), group, folder / CURVES_FILE.format(task=task))
        if path is not None:
            written.append(path)
    return written


def _task_curves(task: str, runs: pd.DataFrame, path: Path) -> Path | None:
    """Train loss and dev accuracy against step, one line per row (a row's seeds: their mean
    with a min-max band); the baseline dashed."""
    seeds: dict[str, list[pd.DataFrame]] = {}
    for r in runs.itertuples():
        metrics_file = Path(str(r.run_dir)) / METRICS_FILE
        if metrics_file.is_file() and (curve := curve_or_warning(metrics_file)) is not None:
            seeds.setdefault(_row_key(pd.Series(r._asdict())), []).append(curve)
    curves = {key: found if len(found) > 1 else found[0] for key, found in seeds.items()}
    baseline = runs["rule_accuracy"].dropna() if "rule_accuracy" in runs else []
    baselines = {"accuracy": (baseline.mean(), "trivial rule")} if len(baseline) else None
    dataset = str(runs["dataset"].iloc[0]) if "dataset" in runs else ""
    panels = [(TRAIN, "loss", f"{TRAIN} loss"), (DEV, "accuracy", f"{DEV} accuracy")]
    title = f"LRA {task}" + (f" — {dataset}" if dataset else "")
    return overlaid_curves(curves, panels, path, title, baselines)
