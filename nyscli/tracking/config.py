"""The ``logger`` config group's rules, and where each logger writes by default.

One source for both: :func:`check` runs before any run folder exists (bad value or missing
optional extra: one line, exit code 2), and the sinks read their defaults from here.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nyscli.errors import UserInputError
from nyscli.paths import OUTPUT_ROOT
from nyscli.rules import Rule, Text

# Every logger the group offers; csv (metrics.csv, results.csv) is always written.
LOGGERS = ("csv", "tensorboard", "mlflow")
EXTRA = "tracking"  # pip install 'nyscli[tracking]'
# The Python module each optional logger needs (all come with the extra).
NEEDS = {"tensorboard": "tensorboard", "mlflow": "mlflow"}
# What each logger's keys may hold (conf/logger/<name>.yaml holds the defaults).
RULES: dict[str, dict[str, Rule]] = {
    "csv": {},
    "tensorboard": {"log_dir": Text()},
    "mlflow": {"tracking_uri": Text(null=True), "experiment": Text(null=True)},
}
# The default MLflow store: one SQLite file (and an artifact folder) under outputs/, so
# `mlflow ui --backend-store-uri sqlite:///outputs/mlflow.db` shows every run.
MLFLOW_DB = "mlflow.db"
MLFLOW_ARTIFACTS = "mlartifacts"


def missing_extra(what: str) -> UserInputError:
    """The one line for an optional package of the ``tracking`` extra that is not installed."""
    return UserInputError(
        f"{what} needs the optional extra {EXTRA}, which is not installed: "
        f"pip install 'nyscli[{EXTRA}]' (or scripts/setup --dev)"
    )


def chosen(logger: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """logger name -> its settings, for the loggers the config selects (csv excluded)."""
    if not logger:
        return {}
    return {name: dict(value or {}) for name, value in logger.items() if name != "csv"}


def check(logger: Mapping[str, Any] | None) -> None:
    """Every selected logger's keys against :data:`RULES`, and its package installed."""
    for name, settings in chosen(logger).items():
        if name not in RULES:
            raise UserInputError(
                f"logger={name} is not allowed; choose one or more of: {', '.join(LOGGERS)}"
            )
        for key, value in settings.items():
            rule = RULES[name].get(key)
            if rule is None:
                allowed = ", ".join(RULES[name]) or "none"
                raise UserInputError(f"logger.{name} has no key {key}; allowed: {allowed}")
            rule.check(f"logger.{name}.{key}", value)
        if importlib.util.find_spec(NEEDS[name]) is None:
            raise missing_extra(f"logger={name}")


def default_mlflow_uri() -> str:
    """``sqlite:///<current dir>/outputs/mlflow.db`` (absolute: sweeps and ranks agree)."""
    return f"sqlite:///{Path(OUTPUT_ROOT).resolve() / MLFLOW_DB}"


def default_artifact_root() -> str:
    return (Path(OUTPUT_ROOT).resolve() / MLFLOW_ARTIFACTS).as_uri()
