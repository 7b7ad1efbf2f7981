"""The resumable Optuna sweeper (see :mod:`nyscli.tracking.search`); imported only when a
search runs, since it needs optuna and hydra-optuna-sweeper (the ``tracking`` extra)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
from hydra_plugins.hydra_optuna_sweeper._impl import (
    OptunaSweeperImpl,
    create_params_from_overrides,
)
from omegaconf import OmegaConf
from optuna.trial import TrialState

from nyscli.tracking.search import FOLDER_ATTR, next_job_number, write_trials

log = logging.getLogger(__name__)

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


class ResumableOptunaSweeper(OptunaSweeperImpl):
    """hydra-optuna-sweeper's sweeper with ``n_trials`` as the study's total and interrupted
    trials run again (one process works on a study at a time)."""

    def sweep(self, arguments: list[str]) -> None:
        self._process_searchspace_config()
        space, fixed = create_params_from_overrides(
            self._parse_sweeper_params_config() + list(arguments)
        )
        space = {**(self.search_space_distributions or {}), **space}
        for name in fixed:
            space.pop(name, None)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        study = optuna.create_study(
            study_name=self.study_name,
            storage=self.storage,
            sampler=self.sampler,
            directions=self._get_directions(),
            load_if_exists=True,
        )
        # Trials left RUNNING were cut short when the search was interrupted.
        stale = [t for t in study.trials if t.state == TrialState.RUNNING]
        done = sum(t.state in FINISHED for t in study.trials)
        log.info(
            "search %s: %d of %d trials done, %d interrupted to run again; study %s",
            study.study_name,
            done,
            self.n_trials,
            len(stale),
            self.storage,
        )
        self.job_idx = next_job_number(sweep_dir)
        if study.trials:  # a resumed search: a sampler seeded as before would redraw its trials
            study.sampler.reseed_rng()
        for frozen in stale:
            params = {**frozen.params, **fixed}
            study._storage.set_trial_user_attr(frozen._trial_id, FOLDER_ATTR, str(self.job_idx))  # noqa: SLF001
            self._run_trial(study, frozen.number, [f"{k}={v}" for k, v in params.items()])
            write_trials(study, sweep_dir)
        while len(study.trials) < self.n_trials:
            trial = study.ask()
            overrides = self._configure_trials([trial], space, fixed)[0]
            trial.set_user_attr(FOLDER_ATTR, str(self.job_idx))
            self._run_trial(study, trial.number, list(overrides))
            write_trials(study, sweep_dir)
        self._report(study, sweep_dir)

    def _run_trial(self, study: Any, number: int, overrides: Sequence[str]) -> None:
        """One trial as one Hydra job; its value (the job's optimized_metric) told to the
        study, or FAIL when the job failed or returned none."""
        returns = self.launcher.launch([tuple(overrides)], initial_job_idx=self.job_idx)
        self.job_idx += len(returns)
        try:
            value = returns[0].return_value  # re-raises the job's exception, if any
            values = [float(v) for v in (value if isinstance(value, list | tuple) else [value])]
        except Exception as error:  # a failed job fails its trial; the search goes on
            log.warning("trial %d failed: %s", number, error)
            study.tell(number, state=TrialState.FAIL)
            return
        study.tell(number, values=values)

    def _report(self, study: Any, sweep_dir: Path) -> None:
        complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
        if not complete:
            log.warning("search %s: no trial finished", study.study_name)
            return
        best = study.best_trial
        log.info("best trial %d: value %s, parameters %s", best.number, best.value, best.params)
        results = {
            "name": "optuna",
            "best_trial": best.number,
            "best_params": best.params,
            "best_value": best.value,
            "best_job_folder": best.user_attrs.get(FOLDER_ATTR),
            "trials": len(study.trials),
            "complete": len(complete),
        }
        OmegaConf.save(OmegaConf.create(results), sweep_dir / "optimization_results.yaml")
