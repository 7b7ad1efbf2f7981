"""Hydra callback that keeps ``summary.csv`` of a sweep up to date, job by job.

It is rebuilt from the job folders on disk (never from memory) after every job, so a sweep
whose later jobs fail or that is interrupted still has a summary of what finished; the end of
the sweep rebuilds it once more and prints the table.

Jobs of the joblib and submitit launchers end in other processes, possibly at the same time:
a lock file serialises the rebuilds, so the last one written has seen every finished job.
The sweep's end also removes the work its jobs shared (``<sweep>/.cache``).
"""

from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path
from typing import Any

import yaml
from hydra.core.utils import JobReturn
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig
from omegaconf.errors import OmegaConfBaseException

from nyscli.experiments.report.command import show_report
from nyscli.files import exclusive_lock, write_csv
from nyscli.output.runs import aggregate, find_run_folders, load_run
from nyscli.paths import SWEEP_CACHE

log = logging.getLogger(__name__)

SUMMARY_FILE = "summary.csv"
LOCK_FILE = ".summary.lock"


def write_summary(sweep_dir: Path) -> Path | None:
    """Rebuild ``summary.csv`` from the job folders under ``sweep_dir`` (None if none yet)."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(sweep_dir / LOCK_FILE):
        runs = []
        for path in find_run_folders([sweep_dir]):
            # A job starting right now may still be writing its .hydra/config.yaml.
            with contextlib.suppress(OSError, ValueError, yaml.YAMLError, OmegaConfBaseException):
                runs.append(load_run(path))
        if not runs:
            return None
        return write_csv(aggregate(runs), sweep_dir / SUMMARY_FILE)


class SweepSummary(Callback):
    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if config.hydra.mode == RunMode.MULTIRUN:
            write_summary(Path(config.hydra.sweep.dir))

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        # Work the jobs shared (approx-error: S and its SVD, 3 n^2 numbers a head, ~1.5 GB at
        # the defaults) serves no one once they are done; the results never need it.
        shutil.rmtree(sweep_dir / SWEEP_CACHE, ignore_errors=True)
        path = write_summary(sweep_dir)
        if path is not None:
            show_report([sweep_dir], figures=sweep_dir)
            log.info("sweep summary: %s", path)
