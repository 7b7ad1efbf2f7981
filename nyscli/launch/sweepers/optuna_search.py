"""The Optuna sweeper of ``hparams_search=``: each trial is one Hydra job whose
``optimized_metric`` is told to a study in SQLite, so an interrupted search resumes to its
``n_trials``. Imported only when a search runs (optuna is in the ``tracking`` extra), through
the shim in ``hydra_plugins/nys_optuna_sweeper/``; its space is Hydra's own sweep syntax, as
hydra-optuna-sweeper's (docs/commands/tracking.md)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ChoiceSweep, IntervalSweep, Override, RangeSweep
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)
from optuna.trial import TrialState

from nyscli.errors import UserInputError
from nyscli.launch.sweepers.search import (
    FOLDER_ATTR,
    RESULTS_FILE,
    SAMPLER_NAMES,
    next_job_number,
    write_trials,
)
from nyscli.train.errors import TrainingInterrupted
from nyscli.train.resume import sweep_command

log = logging.getLogger(__name__)

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
SAMPLERS = {"tpe": optuna.samplers.TPESampler, "random": optuna.samplers.RandomSampler}
assert tuple(SAMPLERS) == SAMPLER_NAMES  # search.RULES checks the name before a folder exists


def distribution(override: Override) -> BaseDistribution:
    """The Optuna distribution of one sweep override (``interval``, ``range``, ``choice``)."""
    sweep = override.value()
    if isinstance(sweep, IntervalSweep):
        log_scale = "log" in sweep.tags
        if isinstance(sweep.start, int) and isinstance(sweep.end, int):
            return IntDistribution(sweep.start, sweep.end, log=log_scale)
        return FloatDistribution(float(sweep.start), float(sweep.end), log=log_scale)
    if isinstance(sweep, RangeSweep):
        start, stop, step = sweep.start, sweep.stop, sweep.step
        if all(isinstance(v, int) for v in (start, stop, step)):
            # range() excludes its stop; one counting down holds the same values counted up
            # (empty ranges and step 0 are refused before the search starts).
            values = range(start, stop, step)
            low, high = min(values[0], values[-1]), max(values[0], values[-1])
            return IntDistribution(low, high, step=abs(step))
        return CategoricalDistribution(list(override.sweep_iterator()))
    if isinstance(sweep, ChoiceSweep):
        return CategoricalDistribution(list(override.sweep_iterator()))
    raise UserInputError(
        f"{override.input_line} is not allowed in a search; use interval(a, b), "
        "tag(log, interval(a, b)), range(a, b, step=s) or choice(x, y, ...)"
    )


def search_space(lines: Sequence[str]) -> tuple[dict[str, BaseDistribution], dict[str, str]]:
    """(key -> distribution, key -> fixed override line); a later line for a key wins, and a
    fixed value takes its key out of the space."""
    space: dict[str, BaseDistribution] = {}
    fixed: dict[str, str] = {}
    for override in OverridesParser.create().parse_overrides(list(lines)):
        key = override.get_key_element()
        if override.is_sweep_override():
            space[key] = distribution(override)
            fixed.pop(key, None)
        else:
            fixed[key] = override.input_line
            space.pop(key, None)
    return space, fixed


class OptunaSearch(Sweeper):
    """Trials from an Optuna study in SQLite, ``n_trials`` in all, resumable."""

    def __init__(
        self,
        direction: str,
        storage: str | None,
        study_name: str | None,
        n_trials: int,
        sampler: DictConfig | dict[str, Any],
        params: DictConfig | dict[str, str] | None = None,
    ) -> None:
        self.direction = str(direction)
        self.storage = storage
        self.study_name = study_name
        self.n_trials = int(n_trials)
        settings = dict(sampler)
        name = str(settings.pop("name", "tpe"))  # checked by search.check_sweeper
        if name == "random":
            settings = {"seed": settings.get("seed")}
        self.sampler = SAMPLERS[name](**settings)
        self.params = {str(k): str(v) for k, v in (params or {}).items()}
        self.job_idx = 0

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config = config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )

    def _study(self) -> Any:
        """The study, created or loaded; a user error (one line, exit 2) when its storage
        cannot be opened
        (a file that is not a database, a folder that does not exist), not SQLAlchemy's
        130-line traceback."""
        try:
            return optuna.create_study(
                study_name=self.study_name,
                storage=self.storage,
                sampler=self.sampler,
                direction=self.direction,
                load_if_exists=True,
            )
        except Exception as error:  # SQLAlchemy's and optuna's many types alike
            reason = str(getattr(error, "orig", None) or error).strip().splitlines()[0]
            raise UserInputError(
                f"the search's study {self.storage} cannot be opened ({reason}); give "
                "hydra.sweep.dir a new folder, or hydra.sweeper.storage another file"
            ) from error

    def sweep(self, arguments: list[str]) -> None:
        lines = [f"{k}={v}" for k, v in self.params.items()] + list(arguments)
        space, fixed = search_space(lines)
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        study = self._study()
        # Trials left RUNNING were cut short when the search was interrupted.
        stale = [t for t in study.trials if t.state == TrialState.RUNNING]
        done = sum(t.state in FINISHED for t in study.trials)
        log.info(
            "search %s: %d of %d trials done, %d interrupted to run again; study %s "
            "(if this is interrupted, the same command with hydra.sweep.dir=%s resumes it)",
            study.study_name,
            done,
            self.n_trials,
            len(stale),
            self.storage,
            sweep_dir,
        )
        self.job_idx = next_job_number(sweep_dir)
        if study.trials:  # a resumed search: a sampler seeded as before would redraw its trials
            study.sampler.reseed_rng()
        for frozen in stale:
            study._storage.set_trial_user_attr(frozen._trial_id, FOLDER_ATTR, self.job_idx)  # noqa: SLF001
            self._run_trial(study, frozen.number, frozen.params, fixed)
            write_trials(study, sweep_dir)
        while len(study.trials) < self.n_trials:
            trial = study.ask(space)
            trial.set_user_attr(FOLDER_ATTR, self.job_idx)
            self._run_trial(study, trial.number, trial.params, fixed)
            write_trials(study, sweep_dir)
        self._report(study, sweep_dir)

    def _run_trial(
        self, study: Any, number: int, params: dict[str, Any], fixed: dict[str, str]
    ) -> None:
        """One trial as one Hydra job; its value (the job's optimized_metric) told to the
        study, or FAIL when the job failed or returned none."""
        overrides = (*fixed.values(), *(f"{k}={v}" for k, v in params.items()))
        try:
            returns = self.launcher.launch([overrides], initial_job_idx=self.job_idx)
        except BaseException as stop:  # Ctrl-C in a trial: resume the search, not the job
            if isinstance(stop, TrainingInterrupted):  # its job's line names the search's folder
                where = stop.stopped.split(";")[0]
                again = sweep_command(Path(self.config.hydra.sweep.dir), training=False)
                stop.message = f"{where} in trial {number}; resume the search with: {again}"
            raise
        self.job_idx += len(returns)
        try:
            value = float(returns[0].return_value)  # re-raises the job's exception, if any
        except Exception as error:  # a failed job fails its trial; the search goes on
            log.warning("trial %d failed (%s); the search goes on", number, error)
            study.tell(number, state=TrialState.FAIL)
            return
        study.tell(number, value)

    def _report(self, study: Any, sweep_dir: Path) -> None:
        complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
        if not complete:
            log.warning("search %s: no trial finished", study.study_name)
            return
        best = study.best_trial
        log.info("best trial %d: value %s, parameters %s", best.number, best.value, best.params)
        results = {
            "best_trial": best.number,
            "best_value": best.value,
            "best_params": best.params,
            "best_job_folder": best.user_attrs.get(FOLDER_ATTR),
            "trials": len(study.trials),
            "complete": len(complete),
        }
        OmegaConf.save(OmegaConf.create(results), sweep_dir / RESULTS_FILE)
