"""One entry module per command (``approx_error``, ``bench``, ``lra``, ``pretrain``, ``finetune``,
``report``), each with its own helper modules (``bench_*``, ``lra_*``, ``pretrain_*``,
``finetune_*``, ``timing``, ``memory``); commands do not import each other. Shared: ``schema``
(value rules) and ``training`` (what lra/pretrain/finetune check and do before training); the
sweep summary callback sits above, beside the bridge (``nyscli.sweep_summary``). Each command
exposes ``validate(cfg)``, ``run(cfg, run_dir, console)`` and ``render(df)``; the CLI bridge
(``nyscli.bridge``) does the rest (run folder, CSV, env.json)."""

from __future__ import annotations

import importlib
from types import ModuleType

# command name -> (module, primary config name in conf/)
COMMANDS: dict[str, str] = {
    "bench": "nyscli.experiments.bench",
    "approx_error": "nyscli.experiments.approx_error",
    "lra": "nyscli.experiments.lra",
    "pretrain": "nyscli.experiments.pretrain",
    "finetune": "nyscli.experiments.finetune",
}


def experiment_module(command: str) -> ModuleType:
    return importlib.import_module(COMMANDS[command])
