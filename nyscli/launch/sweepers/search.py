"""The Optuna search of ``hparams_search=``, the parts that need no optuna: the rules of its
``hydra.sweeper`` keys (checked before any folder exists), where its study lives (so the same
command resumes it) and its ``trials.csv``. The sweeper itself is
:mod:`nyscli.launch.sweepers.optuna_search`; how a search runs and resumes:
docs/commands/tracking.md."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from nyscli.files import write_csv
from nyscli.output.runs import TRIALS_FILE
from nyscli.rules import Choice, Int, Rule
from nyscli.tracking.config import missing_extra

log = logging.getLogger(__name__)

STUDY_FILE = "optuna.db"  # the study, in the sweep folder (hparams_search presets)
RESULTS_FILE = "optimization_results.yaml"  # the best trial (hydra-optuna-sweeper's name)
SWEEPER = "hydra_plugins.nys_optuna_sweeper.nys_optuna_sweeper.NysOptunaSweeper"
SAMPLER_NAMES = ("tpe", "random")
# What the search's hydra.sweeper keys may hold (conf/hydra/sweeper/nys_optuna.yaml).
RULES: dict[str, Rule] = {
    "direction": Choice(("minimize", "maximize")),
    "n_trials": Int(low=1),
    "sampler.name": Choice(SAMPLER_NAMES),
    "sampler.seed": Int(low=0, null=True),
    "sampler.n_startup_trials": Int(low=0),
}
FOLDER_ATTR = "nys_job_folder"  # trial user attribute: the job folder that ran it


def resumable(folder: Path) -> bool:
    """True when ``folder`` is a search's sweep folder: the same command continues it."""
    return (Path(folder) / STUDY_FILE).is_file()


def is_search(hydra: DictConfig) -> bool:
    """True when the composed ``hydra`` node runs an Optuna search (``hparams_search=``)."""
    sweeper = hydra.get("sweeper")
    return sweeper is not None and sweeper.get("_target_") == SWEEPER


def check_sweeper(hydra: DictConfig) -> None:
    """A search's settings (``hydra.sweeper.*``) and optuna installed, before any folder
    exists: one-line errors. Other sweepers pass untouched."""
    if not is_search(hydra):
        return
    sweeper = hydra.sweeper
    for key, rule in RULES.items():
        value = OmegaConf.select(sweeper, key, default=None)
        rule.check(f"hydra.sweeper.{key}", value)
    if importlib.util.find_spec("optuna") is None:
        raise missing_extra("hparams_search= (optuna)")


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
    """``<sweep>/trials.csv`` from the study as it stands (rewritten after every trial)."""
    return write_csv(trials_frame(study), Path(sweep_dir) / TRIALS_FILE)
