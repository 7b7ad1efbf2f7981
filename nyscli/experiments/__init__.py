"""One folder per command (``bench``, ``approx_error``, ``lra``, ``pretrain``, ``finetune``,
``report``), each with ``command.py`` and its own helper modules; commands do not import each
other (``report`` reads the others' results and figures). Each command but ``report``
also has ``rules``: its keys' rules, ``check(cfg)`` and ``attentions(cfg)``, torch-free.
``validate`` runs them, and so does the command line before torch is imported
(``nyscli.launch.compose.early_refusal``), so a bad value is refused in a fraction of a second
with the same line. Shared by the training commands:
``training`` (what lra/pretrain/finetune check and do before training) and ``schema`` (the
config keys' rules). Each ``command`` exposes ``validate(cfg)``, ``run(cfg, run_dir, console)``
and ``render(df)``, and may set ``ALLOCATOR`` (what env.json records as the allocator when the
command measures in worker processes of its own); the launcher (``nyscli.launch``) does the
rest (run folder, CSV, env.json)."""

from __future__ import annotations

import importlib
from types import ModuleType

# command name -> (module, primary config name in conf/)
COMMANDS: dict[str, str] = {
    "bench": "nyscli.experiments.bench.command",
    "approx_error": "nyscli.experiments.approx_error.command",
    "lra": "nyscli.experiments.lra.command",
    "pretrain": "nyscli.experiments.pretrain.command",
    "finetune": "nyscli.experiments.finetune.command",
}


def experiment_module(command: str) -> ModuleType:
    return importlib.import_module(COMMANDS[command])


def value_rules(command: str) -> ModuleType:
    """The command's torch-free ``rules`` module: ``check(cfg)`` refuses a bad value in one
    line, the check its ``validate`` starts with."""
    return importlib.import_module(COMMANDS[command].rpartition(".")[0] + ".rules")
