"""``nys report``: one table, one CSV and the figures that compare runs, from any set of run
folders (a sweep, a few single runs, or all of outputs/)."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
from rich.markup import escape

from nyscli.console import console
from nyscli.errors import UserInputError
from nyscli.experiments import COMMANDS, experiment_module
from nyscli.experiments.approx_error.plots import error_vs_budget
from nyscli.files import check_writable, write_csv
from nyscli.output.curves import overlaid_curves
from nyscli.output.plots import loglog_panels
from nyscli.output.runs import TRIALS_FILE, RunFolder, aggregate, find_run_folders, load_run
from nyscli.output.seeds import group_labels, mean_std, means_frame, seed_groups, spread_table
from nyscli.train.metrics import METRICS_FILE
from nyscli.train.resume import RESUMED_FROM_FILE
from nyscli.train.splits import DEV, TRAIN, curve_or_warning

# A figure: (the command's runs that have results, their stacked results, the path prefix
# "<folder>/<csv stem>_<command>") -> the PNGs written.
Figure = Callable[[list[RunFolder], pd.DataFrame, Path, bool], list[Path]]


def show_report(
    paths: list[Path],
    out: Path | None = None,
    figures: Path | None = None,
    per_run: bool = False,
) -> pd.DataFrame:
    """Print each command's table for the runs under ``paths``, list failed runs, and write
    the stacked results to ``out`` (if given) with each command's comparison figure beside it
    (``<out stem>_<command>*.png``). A command module with ``write_figures(df, folder)`` also
    writes its own files (plots, derived tables) into ``figures`` (if given). Returns the
    stacked results.

    Runs that differ only in their seed are shown as one row of means, then their spread
    (mean ± std, n, the seeds), written to ``<out stem>_seeds.csv``; ``per_run`` shows every
    run on its own instead."""
    runs = [load_run(p) for p in find_run_folders(paths)]
    if not runs:  # a typo'd or empty folder is a mistake to report, not an empty success
        raise UserInputError(
            f"no run folders (with .hydra/config.yaml) under {', '.join(map(str, paths))}; "
            "give run folders, sweep folders or outputs/"
        )
    if out is not None:
        # --out cmp/x.csv makes cmp/ (once there is something to write, so a refused report
        # leaves no folder); the figures beside it go there too.
        out.parent.mkdir(parents=True, exist_ok=True)
        check_writable(out)  # one line now, not after the tables
    by_command: dict[str, list[RunFolder]] = {}
    for run in runs:
        by_command.setdefault(run.command, []).append(run)
    frames, spreads = [], []
    for command, group in by_command.items():
        df = aggregate(group)
        frames.append(df.assign(command=command))
        seeds = [] if per_run else seed_groups(group)
        if not df.empty and command in COMMANDS:
            module = experiment_module(command)
            if any(g.n > 1 for g in seeds):
                console.print(_rendered(module.render, means_frame(seeds), command, group))
                spread = spread_table(seeds)
                console.print(_spread_table(command, spread))
                spreads.append(spread.assign(command=command))
            else:
                console.print(_rendered(module.render, df, command, group))
            if figures is not None and hasattr(module, "write_figures"):
                for path in module.write_figures(df, figures):
                    console.print(f"wrote {path}", markup=False, highlight=False)
        elif not df.empty:
            console.print(df.to_string(index=False), markup=False)
    finished_later = continued_runs(runs)
    failed = [run for run in runs if not run.ok and run.path.resolve() not in finished_later]
    ok = sum(run.ok for run in runs)
    tail = f" ({len(finished_later)} stopped and continued by a run that finished)"
    console.print(f"{ok} of {len(runs)} runs have results{tail if finished_later else ''}")
    for origin, continuation in finished_later.items():
        line = f"continued {origin}: finished as {continuation}"
        console.print(escape(line), markup=False, highlight=False)
    for run in failed:
        console.print(f"[red]failed[/] {escape(f'{run.path}: {run.error}')}", highlight=False)
    for sweep in (p for p in paths if (p / TRIALS_FILE).is_file()):  # an Optuna search
        console.print(trials_table(sweep))
    combined = pd.concat(frames, ignore_index=True)
    if out is not None:
        write_csv(combined, out)
        console.print(f"wrote {out}", markup=False, highlight=False)
        if spreads:
            seeds_csv = write_csv(pd.concat(spreads), out.with_name(f"{out.stem}_seeds.csv"))
            console.print(f"wrote {seeds_csv}", markup=False, highlight=False)
        for command, group in by_command.items():
            done = [run for run in group if run.ok]
            figure = FIGURES.get(command)
            if figure is None or not done:
                continue
            prefix = out.with_name(f"{out.stem}_{command}")
            for png in figure(done, aggregate(done), prefix, per_run):
                console.print(f"wrote {png}", markup=False, highlight=False)
    return combined


def continued_runs(runs: list[RunFolder]) -> dict[Path, Path]:
    """The runs without results that one of ``runs`` continued (``--resume true`` or
    ``resume=``: the continuation names its origin in resumed_from.txt) and finished: origin
    -> the continuation that has the results. Such a run is not a failure."""
    found = {}
    for run in runs:
        marker = run.path / RESUMED_FROM_FILE
        if not run.ok or not marker.is_file():
            continue
        with contextlib.suppress(OSError, UnicodeDecodeError):
            found[Path(marker.read_text().strip()).resolve()] = run.path
    stopped = {run.path.resolve() for run in runs if not run.ok}
    return {origin: done for origin, done in found.items() if origin in stopped}


def _rendered(
    render: Callable[[pd.DataFrame], object], df: pd.DataFrame, command: str, runs: list[RunFolder]
) -> object:
    """``render(df)``, or one line naming the runs whose results.csv lacks a column it needs."""
    try:
        return render(df)
    except (KeyError, AttributeError) as error:  # a missing column, by name or as r.<column>
        found = re.search(r"attribute '(\w+)'", str(error))
        column = found.group(1) if found else str(error.args[0]) if error.args else "?"
        lacking = [str(r.path) for r in runs if r.ok and column not in r.results.columns]
        raise UserInputError(
            f"{', '.join(lacking) or 'these runs'}: results.csv lacks the column '{column}' "
            f"that a {command} run writes; is it a {command} run folder?"
        ) from error


# The results a spread table shows first, when a command's rows have them; else every one.
HEADLINE = ("test_accuracy", "best_dev_accuracy", "score", "value", "time_ms", "peak_mb",
            "mlm_accuracy", "sop_accuracy", "tokens_per_s")  # fmt: skip
# Columns that say which row a result belongs to, as shown beside it.
ROW_KEYS = ("task", "attention", "method", "metric", "seq_len", "budget", "layer", "head")
SPREAD_ROWS = 40  # more are in <out>_seeds.csv


def _spread_table(command: str, spread: pd.DataFrame) -> Any:
    """Mean ± std (n) over the seeds of each group's headline results (a rich table)."""
    from rich.table import Table

    shown = (
        spread[spread["result"].isin(HEADLINE)] if spread["result"].isin(HEADLINE).any() else spread
    )
    keys = [k for k in ROW_KEYS if k in shown.columns and shown[k].nunique() > 1]
    title = f"{command}: mean ± std over seeds (std with ddof = 1)"
    table = Table(title=title)
    for column in ("runs", *keys, "result", "mean ± std (n)", "seeds"):
        table.add_column(column)
    for row in shown.head(SPREAD_ROWS).itertuples(index=False):
        cells = [str(row.group), *(str(getattr(row, k)) for k in keys), str(row.result)]
        table.add_row(*cells, mean_std(row.mean, row.std, row.n), str(row.seeds))
    if len(shown) > SPREAD_ROWS:
        table.caption = f"{len(shown) - SPREAD_ROWS} more rows in the report's _seeds.csv"
    return table


def run_labels(runs: list[RunFolder]) -> dict[Path, str]:
    """Each run's legend label: the overrides that differ between the runs (``attention=
    softmax``); the folder name where they say nothing or two runs would share a label."""
    jobs = aggregate(runs).drop_duplicates("run_dir").set_index("run_dir")["job"]
    labels = {run.path: str(jobs.get(str(run.path), "") or run.path.name) for run in runs}
    counts = pd.Series(list(labels.values())).value_counts()
    return {
        path: label if counts[label] == 1 or label == path.name else f"{label} ({path.name})"
        for path, label in labels.items()
    }


def _png(prefix: Path, part: str = "") -> Path:
    """``<prefix>.png``, or ``<prefix>_<part>.png``."""
    return prefix.with_name(f"{prefix.name}_{part}.png" if part else f"{prefix.name}.png")


def _curves(runs: list[RunFolder], per_run: bool = False) -> dict[str, Any]:
    """label -> metrics.csv of each run that has a readable one; unless ``per_run``, the
    seeds of one setting together under their group's label (a list: drawn as a band)."""
    labels = run_labels(runs)
    curves: dict[str, Any] = {}
    for run in runs:
        path = run.path / METRICS_FILE
        if path.exists() and (curve := curve_or_warning(path)) is not None:
            curves[labels[run.path]] = curve
    groups = [] if per_run else seed_groups(runs)
    if not any(g.n > 1 for g in groups):
        return curves
    pooled: dict[str, Any] = {}
    for group, label in zip(groups, group_labels(groups), strict=True):
        seeds = [curves[labels[r.path]] for r in group.runs if labels[r.path] in curves]
        if len(seeds) > 1:
            pooled[label] = seeds
        elif seeds:
            pooled[label] = seeds[0]
    return pooled


def _by_task(runs: list[RunFolder]) -> dict[str, list[RunFolder]]:
    tasks: dict[str, list[RunFolder]] = {}
    for run in runs:
        assert run.results is not None
        task = str(run.results["task"].iloc[0]) if "task" in run.results else ""
        tasks.setdefault(task, []).append(run)
    return tasks


def _shared_baseline(runs: list[RunFolder], column: str, label: str) -> tuple[float, str] | None:
    """(value, label) of a results.csv baseline ``column`` when every run that records it
    records the same value (runs on the same data); None otherwise (the table gives each)."""
    values = set()
    for run in runs:
        if run.results is not None and column in run.results:
            values |= {round(float(v), 6) for v in run.results[column].dropna()}
    return (values.pop(), label) if len(values) == 1 else None


def _baselines(runs: list[RunFolder], columns: dict[str, tuple[str, str]]) -> dict:
    """metric column -> (value, label) for :func:`overlaid_curves`, from ``columns``:
    metric column -> (results.csv baseline column, line label)."""
    found = {key: _shared_baseline(runs, *source) for key, source in columns.items()}
    return {key: line for key, line in found.items() if line is not None}


def pretrain_figure(
    runs: list[RunFolder], df: pd.DataFrame, prefix: Path, per_run: bool = False
) -> list[Path]:
    """Fig. 5: dev MLM and SOP accuracy against step, one line per run, each panel with its
    baseline (the most frequent token; SOP's majority class)."""
    panels = [
        (DEV, "mlm_accuracy", f"{DEV} MLM accuracy"),
        (DEV, "sop_accuracy", f"{DEV} SOP accuracy"),
    ]
    baselines = _baselines(
        runs,
        {
            "mlm_accuracy": ("most_frequent_token_accuracy", "most frequent token"),
            "sop_accuracy": ("sop_majority_rate", "majority class"),
        },
    )
    title = f"pre-training: masked LM and sentence order, {DEV}"
    path = overlaid_curves(_curves(runs, per_run), panels, _png(prefix), title, baselines)
    return [path] if path else []


def learning_curves_figure(
    runs: list[RunFolder], df: pd.DataFrame, prefix: Path, per_run: bool = False
) -> list[Path]:
    """Fine-tuning (LRA draws its own with Table 3, ``lra.write_figures``): dev accuracy and
    train loss against step, one line per run, one figure per task (tasks share no axes)."""
    panels = [(DEV, "accuracy", f"{DEV} accuracy"), (TRAIN, "loss", f"{TRAIN} loss")]
    written = []
    for task, group in _by_task(runs).items():
        title = f"{runs[0].command} {task}: learning curves".replace("  ", " ")
        baselines = _baselines(group, {"accuracy": ("majority_rate", "majority class")})
        curves = _curves(group, per_run)
        path = overlaid_curves(curves, panels, _png(prefix, task), title, baselines)
        written += [path] if path else []
    return written


def approx_error_figure(
    runs: list[RunFolder], df: pd.DataFrame, prefix: Path, per_run: bool = False
) -> list[Path]:
    """Error against budget m over all jobs (a sweep of attention.num_landmarks gives one
    point per job): one line per method, jobs pooled."""
    pooled = df.drop(columns=["job", "run_dir"], errors="ignore")
    path = error_vs_budget(pooled, _png(prefix))
    return [path] if path else []


def bench_figure(
    runs: list[RunFolder], df: pd.DataFrame, prefix: Path, per_run: bool = False
) -> list[Path]:
    """Time and peak memory against n, one line per (attention row, run)."""
    ok = df[df["status"] == "ok"].copy()
    if ok.empty:
        return []
    labels = run_labels(runs)
    several = len(runs) > 1
    ok["line"] = [
        f"{attention} [{labels[Path(run_dir)]}]" if several else str(attention)
        for attention, run_dir in zip(ok["attention"], ok["run_dir"], strict=True)
    ]
    panels = [("time_ms", "time (ms)"), ("peak_mb", "peak memory (MB)")]
    title = "bench: one self-attention module"
    return [loglog_panels(ok, "seq_len", panels, "line", _png(prefix), title)]


FIGURES: dict[str, Figure] = {
    "pretrain": pretrain_figure,
    "finetune": learning_curves_figure,
    "approx_error": approx_error_figure,
    "bench": bench_figure,
}


def trials_table(sweep_dir: Path) -> Any:
    """A rich table of ``<sweep>/trials.csv`` with the best trial marked (``nys report``)."""
    from rich.table import Table

    df = pd.read_csv(Path(sweep_dir) / TRIALS_FILE)
    table = Table(title=f"search: {len(df)} trials in {sweep_dir}")
    shown = [c for c in df.columns if c != "best"]
    for column in shown:
        table.add_column(column, justify="left" if column in ("state", "job_folder") else "right")
    table.add_column("best")  # a word, not only a colour: NO_COLOR and logs keep it
    for _, row in df.iterrows():
        cells = [
            "" if pd.isna(row[c]) else f"{row[c]:.6g}" if isinstance(row[c], float) else str(row[c])
            for c in shown
        ]
        cells.append("best" if bool(row["best"]) else "")
        table.add_row(*cells, style="bold green" if bool(row["best"]) else None)
    return table
