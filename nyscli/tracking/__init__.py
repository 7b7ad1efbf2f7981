"""Experiment tracking: the ``logger`` config group (csv, tensorboard, mlflow, combined).

``metrics.csv`` and ``results.csv`` are always written and stay the record; the loggers get
the same rows. How a run uses this package:

- before any folder exists, :func:`check` (bad keys, the ``tracking`` extra missing: one line);
- a training command's ``start_run`` calls :func:`activate` on every rank: rank 0 opens the
  selected loggers (a resumed run continues the earlier run's MLflow run and replays the rows
  it carried over into TensorBoard); the trainer's ``MetricsLog`` sends each row to
  :func:`active` and tells it each checkpoint;
- after ``results.csv``, the launcher calls :func:`finish` (final metrics, hparams, artifacts).

A logger that fails is one warning and is off for the rest of the run: logging never fails a
run. Only rank 0 logs.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from omegaconf import DictConfig, OmegaConf

from nyscli.tracking.config import LOGGERS, check, chosen
from nyscli.tracking.sinks import Fanout, Row, Sink, warn_off

__all__ = ["LOGGERS", "Fanout", "Row", "Sink", "activate", "active", "check", "finish"]

log = logging.getLogger(__name__)

_active: tuple[Path, Fanout] | None = None  # (run folder, its loggers) in this process


def flat_params(cfg: DictConfig) -> dict[str, Any]:
    """The resolved config as ``dotted.key -> value`` (lists kept whole, as text)."""
    out: dict[str, Any] = {}

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(f"{prefix}.{key}" if prefix else str(key), value)
        else:
            out[prefix] = node

    walk("", OmegaConf.to_container(cfg, resolve=True))
    return out


def sweep_dir() -> Path | None:
    """The sweep folder when this job is one of a sweep (its MLflow run gets a parent)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if not HydraConfig.initialized() or HydraConfig.get().mode != RunMode.MULTIRUN:
        return None
    return Path(HydraConfig.get().sweep.dir)


def activate(
    cfg: DictConfig,
    run_dir: Path,
    previous_dir: Path | None = None,
    main: bool = True,
    extra: Callable[[], dict[str, float]] | None = None,
) -> Fanout | None:
    """Open the loggers ``cfg.logger`` selects for a training run (rank 0 only, ``main``).

    ``previous_dir``: the run folder a resumed run continues; ``extra``: values the loggers
    add to each train row (peak memory).
    """
    global _active
    _active = None
    selected = chosen(cfg.get("logger"))
    if not main or not selected:
        return None
    fan = Fanout([], extra)
    run_dir = Path(run_dir)
    for name, settings in selected.items():
        try:
            fan.sinks.append(_open(name, settings, cfg, run_dir, previous_dir))
        except Exception as error:  # an unwritable store: one warning, the run goes on
            warn_off(name, error)
            fan.failed.append(name)
    _active = (run_dir, fan)
    return fan


def _open(
    name: str, settings: dict[str, Any], cfg: DictConfig, run_dir: Path, previous: Path | None
) -> Sink:
    if name == "tensorboard":
        from nyscli.tracking.tensorboard_sink import TensorBoardSink

        in_place = previous is not None and Path(previous).resolve() == Path(run_dir).resolve()
        return TensorBoardSink(run_dir / str(settings["log_dir"]), in_place)
    from nyscli.tracking.mlflow_sink import MlflowSink, open_run

    command = str(cfg.get("command", "nys"))
    client, run_id, continued = open_run(
        settings, run_dir, command, flat_params(cfg), previous, sweep_dir()
    )
    return MlflowSink(client, run_id, continued)


def active() -> Fanout | None:
    """The loggers of the run being trained in this process (None: csv only, or rank > 0)."""
    return _active[1] if _active is not None else None


def final_metrics(df: pd.DataFrame | None) -> tuple[dict[str, float], int]:
    """A one-row result's finite numbers (and its step count): the run's final metrics.
    Results of several rows (bench, approx-error) are logged as files only."""
    if df is None or len(df) != 1:
        return {}, 0
    row = df.iloc[0]
    metrics = {}
    for key, value in row.items():
        # numpy's int64 is no int, but a numbers.Real; a bool is one too and no metric.
        number = isinstance(value, numbers.Real) and not isinstance(value, bool | np.bool_)
        if number and math.isfinite(float(value)):
            metrics[str(key)] = float(value)
    return metrics, int(metrics.get("steps", 0))


def finish(cfg: DictConfig, run_dir: Path, df: pd.DataFrame | None) -> None:
    """After ``results.csv``: flush and close this run's loggers, then the resolved config as
    TensorBoard hparams with the final metrics, and the MLflow run's final metrics and
    artifacts. Never raises: a failing logger is one warning."""
    global _active
    run_dir = Path(run_dir)
    failed: list[str] = []
    if _active is not None and _active[0] == run_dir:
        _active[1].close()
        failed = _active[1].failed
    _active = None
    metrics, step = final_metrics(df)
    for name, settings in chosen(cfg.get("logger")).items():
        if name in failed:
            continue
        try:
            _finish(name, settings, cfg, run_dir, metrics, step)
        except Exception as error:
            warn_off(name, error)


def _finish(
    name: str,
    settings: dict[str, Any],
    cfg: DictConfig,
    run_dir: Path,
    metrics: dict[str, float],
    step: int,
) -> None:
    if name == "tensorboard":
        from nyscli.tracking.tensorboard_sink import write_hparams

        write_hparams(run_dir / str(settings["log_dir"]), flat_params(cfg), metrics, step)
        return
    from nyscli.tracking.mlflow_sink import finish_run, open_run

    command = str(cfg.get("command", "nys"))
    client, run_id, _ = open_run(settings, run_dir, command, flat_params(cfg), None, sweep_dir())
    finish_run(client, run_id, run_dir, metrics, step)


def objective(cfg: DictConfig, df: pd.DataFrame | None) -> float | None:
    """The value a search optimises (``optimized_metric``, a results column), returned to
    Hydra's sweeper; None when the run sets none or has no such value."""
    name = cfg.get("optimized_metric")
    if not name:
        return None
    if df is None or len(df) != 1 or name not in df.columns:
        columns = ", ".join(map(str, df.columns)) if df is not None else "none"
        log.error("optimized_metric=%s is not a column of this run's results (%s)", name, columns)
        return None
    value = float(df[name].iloc[0])
    return value if math.isfinite(value) else None
