"""The ``hydra/sweeper: nys`` sweeper: Hydra's basic grid, with attention options applied only
to the attentions that have them (:mod:`nyscli.launch.sweepers.grid`).

This module only satisfies Hydra's rule that plugins live under ``hydra_plugins``.
"""

from __future__ import annotations

from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper


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
