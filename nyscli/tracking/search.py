"""Hyperparameter search: hydra-optuna-sweeper's sweeper, resumable (``hparams_search=``).

The plugin's sweeper asks Optuna for trials and runs each as a Hydra job; its study lives in
a SQLite file in the sweep folder (``optuna.db``). Two things it does not do, added here:

- ``n_trials`` is the study's total, not "this many more": run the same command with
  ``hydra.sweep.dir=<sweep folder>`` and an interrupted search runs only the trials it lacks;
- a trial cut short by the interruption (left RUNNING in the study) is run again with the
  same parameters and told to the same trial, so the study ends with exactly ``n_trials``.

Job folders are numbered on after the ones already there (a run folder is never reused).
``trials.csv`` in the sweep folder lists every trial (number, state, value, parameters, job
folder, the best one marked) after each trial; ``optimization_results.yaml`` holds the best.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pandas as pd
from hydra.errors import MissingConfigException

from nyscli.files import write_csv
from nyscli.tracking.config import missing_extra

log = logging.getLogger(__name__)

STUDY_FILE = "optuna.db"  # the study, in the sweep folder (hparams_search presets)
TRIALS_FILE = "trials.csv"
FOLDER_ATTR = "nys_job_folder"  # trial user attribute: the job folder that ran it


def resumable(folder: Path) -> bool:
    """True when ``folder`` is a search's sweep folder: the same command continues it."""
    return (Path(folder) / STUDY_FILE).is_file()


def missing_sweeper(error: BaseException) -> str | None:
    """The one line for ``hparams_search=`` without the Optuna sweeper plugin installed."""
    if not isinstance(error, MissingConfigException):
        return None
    missing = str(error.missing_cfg_file or "")
    if not missing.startswith("hydra/sweeper"):
        return None
    return str(missing_extra("hparams_search= (hydra-optuna-sweeper)"))


def next_job_number(sweep_dir: Path) -> int:
    """The first job folder number above those already in ``sweep_dir``."""
    numbers = [int(p.name) for p in Path(sweep_dir).glob("*") if p.name.isdigit()]
    return max(numbers, default=-1) + 1


def trials_frame(study: Any) -> pd.DataFrame:
    """One row per trial: number, state, value, its parameters, job folder, ``best``."""
    rows = []
    try:
        best = study.best_trial.number
    except ValueError:  # no finished trial yet
        best = None
    for trial in study.trials:
        rows.append(
            {
                "trial": trial.number,
                "state": trial.state.name,
                "value": trial.value,
                **trial.params,
                "job_folder": trial.user_attrs.get(FOLDER_ATTR),
                "best": trial.number == best,
            }
        )
    return pd.DataFrame(rows)


def write_trials(study: Any, sweep_dir: Path) -> Path:
    return write_csv(trials_frame(study), Path(sweep_dir) / TRIALS_FILE)


def trials_table(sweep_dir: Path) -> Any:
    """A rich table of ``<sweep>/trials.csv`` with the best trial marked (``nys report``)."""
    from rich.table import Table

    df = pd.read_csv(Path(sweep_dir) / TRIALS_FILE)
    table = Table(title=f"search: {len(df)} trials in {sweep_dir}")
    shown = [c for c in df.columns if c != "best"]
    for column in shown:
        table.add_column(column, justify="left" if column in ("state", "job_folder") else "right")
    for _, row in df.iterrows():
        cells = [
            "" if pd.isna(row[c]) else f"{row[c]:.6g}" if isinstance(row[c], float) else str(row[c])
            for c in shown
        ]
        table.add_row(*cells, style="bold green" if bool(row["best"]) else None)
    return table


def make_sweeper(**kwargs: Any) -> Any:
    """The resumable sweeper (imports optuna and the plugin only when a search runs)."""
    from nyscli.tracking.optuna_search import ResumableOptunaSweeper

    return ResumableOptunaSweeper(**kwargs)
