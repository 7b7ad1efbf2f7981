"""The Hydra task function: one job of a command, from its composed config to ``results.csv``."""

from __future__ import annotations

import contextlib
import logging
import traceback
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from nyscli import ranks, tracking
from nyscli.console import console
from nyscli.errors import describe_os_error
from nyscli.experiments import experiment_module
from nyscli.files import write_csv, write_json, write_text
from nyscli.launch.faults import USER_ERRORS, Abort, JobFailed, fault_line, one_line
from nyscli.launch.folders import ENV_FILE
from nyscli.launch.plan import validated
from nyscli.launch.sweepers import resume
from nyscli.output.env import collect_env
from nyscli.output.runs import ERROR_FILE, RESULTS_FILE
from nyscli.train.errors import TrainingInterrupted
from nyscli.train.resources import resolve_threads
from nyscli.train.resume import release_run_locks

log = logging.getLogger("nys")


class Task:
    """The Hydra task function of ``command``: run the experiment, write results and env.

    A class, not a closure, so launchers that ship the task to other processes (joblib,
    submitit) pickle it by reference.
    """

    def __init__(self, command: str) -> None:
        self.command = command

    def __call__(self, cfg: DictConfig) -> float | None:
        """Run one job; returns the value a search optimises (``optimized_metric``) or None."""
        command = self.command
        hydra_cfg = HydraConfig.get()
        run_dir = Path(hydra_cfg.runtime.output_dir)
        multirun = hydra_cfg.mode == RunMode.MULTIRUN
        module = experiment_module(command)
        main = ranks.launched_rank() == 0  # torchrun/srun/submitit ranks > 0 write nothing
        # Every job picks its CPU threads here, before env.json records them: the run's
        # threads, or with threads=null torch's default less the cores busy right now.
        threads = resolve_threads(cfg.get("threads"))
        if main:
            allocator = getattr(module, "ALLOCATOR", None)
            env = collect_env(str(cfg.get("device", "cpu")), threads, allocator)
            try:
                write_json(env, run_dir / ENV_FILE)
            except OSError as error:
                raise Abort(describe_os_error(error), 2) from error
        else:
            logging.getLogger().setLevel(logging.WARNING)
        nproc = int(OmegaConf.select(cfg, "trainer.nproc_per_node", default=1))
        try:
            if not validated(cfg):  # checked before launch in this process: not again
                module.validate(cfg)
            try:
                df = ranks.run_on_ranks(module.run, cfg, run_dir, console, nproc)
            finally:  # the run it trained, and the one it continued, are no longer held
                release_run_locks()
        except TrainingInterrupted as stop:
            if multirun:  # the sweep goes on where it stopped, this job from its checkpoint
                again = resume.again(Path(hydra_cfg.sweep.dir), hydra_cfg, trains=True)
                stop = TrainingInterrupted(stop.stopped, stop.code, again)
            if main:  # the folder then tells `nys report` where it stopped and how to resume
                with contextlib.suppress(OSError):
                    write_text(stop.message + "\n", run_dir / ERROR_FILE)
            raise stop from None
        except (*USER_ERRORS, OSError) as error:
            message = fault_line(error)
            with contextlib.suppress(OSError):  # the disk may be the very thing that failed
                write_text(message + "\n", run_dir / ERROR_FILE)
            if not multirun:
                raise Abort(message, 2) from error
            self.failed(cfg, hydra_cfg.job.num, run_dir, message)
            log.error("job failed: %s", message)
            return
        except Exception as error:
            write_text(f"{one_line(error)}\n\n{traceback.format_exc()}", run_dir / ERROR_FILE)
            if not multirun:
                raise
            self.failed(cfg, hydra_cfg.job.num, run_dir, one_line(error))
            # One line: the sweep goes on and ends with the list of failed jobs; the traceback
            # is in the job's error.txt, not on the console between the other jobs.
            log.error("job failed: %s (traceback in %s)", one_line(error), run_dir / ERROR_FILE)
            return
        if df is None:
            return None
        write_csv(df, run_dir / RESULTS_FILE)
        console.print(module.render(df))
        log.info("results: %s", run_dir / RESULTS_FILE)
        tracking.finish(cfg, run_dir, df)  # final metrics and files to TensorBoard / MLflow
        return tracking.objective(cfg, df)

    @staticmethod
    def failed(cfg: DictConfig, job: int, run_dir: Path, message: str) -> None:
        """Under ``fail_fast`` a sweep's failed job stops the sweep (:class:`JobFailed`)."""
        if cfg.get("fail_fast"):
            raise JobFailed(message, job, str(run_dir))
