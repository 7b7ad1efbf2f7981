"""``nys report``: one table and one CSV from any set of run folders (a sweep, or all outputs/)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from nyscli.experiments import COMMANDS, experiment_module
from nyscli.report.console import console
from nyscli.report.files import write_csv
from nyscli.report.runs import RunFolder, aggregate, find_run_folders, load_run


def show_report(
    paths: list[Path], out: Path | None = None, figures: Path | None = None
) -> pd.DataFrame:
    """Print each command's table for the runs under ``paths``, list failed runs, and write
    the stacked results to ``out`` (if given). A command module with ``write_figures(df,
    folder)`` also writes its files (plots, derived tables) into ``figures`` (if given).
    Returns the stacked results."""
    runs = [load_run(p) for p in find_run_folders(paths)]
    if not runs:
        console.print(
            f"no run folders (with .hydra/config.yaml) under {', '.join(map(str, paths))}"
        )
        return pd.DataFrame()
    by_command: dict[str, list[RunFolder]] = {}
    for run in runs:
        by_command.setdefault(run.command, []).append(run)
    frames = []
    for command, group in by_command.items():
        df = aggregate(group)
        frames.append(df.assign(command=command))
        if not df.empty and command in COMMANDS:
            module = experiment_module(command)
            console.print(module.render(df))
            if figures is not None and hasattr(module, "write_figures"):
                for path in module.write_figures(df, figures):
                    console.print(f"wrote {path}")
        elif not df.empty:
            console.print(df.to_string(index=False))
    failed = [run for run in runs if not run.ok]
    ok = len(runs) - len(failed)
    console.print(f"{ok} of {len(runs)} runs have results")
    for run in failed:
        console.print(f"[red]failed[/] {run.path}: {run.error}")
    combined = pd.concat(frames, ignore_index=True)
    if out is not None:
        write_csv(combined, out)
        console.print(f"wrote {out}")
    return combined
