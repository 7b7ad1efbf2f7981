"""The ``hydra/sweeper: nys`` sweeper: Hydra's basic grid, with attention options applied only
to the attentions that have them (:mod:`nyscli.launch.sweepers.grid`), and a sweep folder of
an earlier launch continued where it stopped (:mod:`nyscli.launch.sweepers.resume`).

This module only satisfies Hydra's rule that plugins live under ``hydra_plugins``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf


class NysSweeper(BasicSweeper):
    def split_arguments(self, overrides: Any, max_batch_size: int | None) -> Any:  # type: ignore[override]
        """Every job of the grid, then :func:`nyscli.launch.sweepers.grid.per_attention`, in
        batches."""
        from nyscli.launch.sweepers.grid import batches, per_attention

        grid = [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]
        assert self.hydra_context is not None and self.config is not None
        loader = self.hydra_context.config_loader

        def attention_keys(job: list[str]) -> set[str]:
            node = loader.load_sweep_config(self.config, job).get("attention")
            return set(node.keys()) if node is not None else set()

        return batches(per_attention(grid, attention_keys).jobs, max_batch_size)

    def sweep(self, arguments: list[str]) -> Any:
        """Hydra's grid sweep; in the folder of an earlier sweep, only the jobs it left, each
        under its own number (finished ones are not run again)."""
        from nyscli.launch.sweepers import resume

        assert self.config is not None and self.launcher is not None
        assert self.hydra_context is not None
        sweep_dir = Path(self.config.hydra.sweep.dir)
        if not resume.is_continued(sweep_dir):
            return super().sweep(arguments)
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        parsed = parser.parse_overrides([*self._parse_config(), *arguments])
        jobs = [job for batch in self.split_arguments(parsed, None) for job in batch]
        states = resume.job_states(sweep_dir, jobs)  # read again: the launch holds the sweep now
        OmegaConf.save(self.config, sweep_dir / resume.MULTIRUN_FILE)
        returns = []
        has_resume = "resume" in self.config
        groups = resume.launch_groups(sweep_dir, states, has_resume, self.max_batch_size)
        for first, batch in groups:
            self.validate_batch_is_legal(batch)
            results = self.launcher.launch(batch, initial_job_idx=first)
            for result in results:
                _ = result.return_value  # a failed job's exception, as Hydra's own sweep
            returns.append(results)
        return returns
