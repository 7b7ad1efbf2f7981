"""The ``hydra/sweeper: nys_optuna`` sweeper: Optuna trials as Hydra jobs, resumable.

The logic lives in :mod:`nyscli.launch.sweepers.optuna_search`; this module only satisfies
Hydra's rule that plugins live under ``hydra_plugins`` and imports nothing heavy (Hydra imports
every plugin module at start-up, also when no search runs).
"""

from __future__ import annotations

from typing import Any

from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig


class NysOptunaSweeper(Sweeper):
    def __init__(self, **kwargs: Any) -> None:
        # Here, not at the top: optuna loads only when a search runs.
        from nyscli.launch.sweepers.optuna_search import OptunaSearch

        self.sweeper = OptunaSearch(**kwargs)

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.sweeper.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        return self.sweeper.sweep(arguments)
