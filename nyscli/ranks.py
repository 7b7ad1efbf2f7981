"""Running one command on several ranks, beside the launcher (its only caller).

Three ways a job gets several ranks, all ending in the same ``env://`` process group
(:func:`nyscli.train.distributed.process_group`):

- ``trainer.nproc_per_node=N`` on a plain job: :func:`run_on_ranks` starts N local ranks with
  PyTorch's elastic launcher (standalone rendezvous on localhost, a free port) and returns
  rank 0's result;
- torchrun (or any launcher exporting ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``),
  ``srun`` with ``SLURM_PROCID``/``SLURM_NTASKS`` and an exported ``MASTER_ADDR``/``MASTER_PORT``,
  or a submitit task (Hydra's submitit launcher with ``tasks_per_node`` > 1): every process
  is already one rank and joins the world from its environment.
"""

from __future__ import annotations

import logging
import logging.config
import multiprocessing
import os
import pickle
import tempfile
import traceback
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from nyscli.errors import UserInputError
from nyscli.train.distributed import process_group, world_from_env
from nyscli.train.resources import resolve_device

RunFn = Callable[[DictConfig, Path, Console], pd.DataFrame]
STANDARD_START_METHODS = ("fork", "spawn", "forkserver")


def shared_run_name() -> str | None:
    """The run folder name all ranks of a torchrun/srun world agree on; None outside one.

    Each rank runs the whole command, so a time stamp could differ between them; the
    launcher's run id (torchrun ``--rdzv-id``/``--standalone``) or SLURM job step cannot.
    """
    world = world_from_env()
    if world is None or world.size < 2:
        return None
    env = os.environ
    run_id = env.get("TORCHELASTIC_RUN_ID", "none")
    if run_id != "none":
        return f"torchrun-{run_id}"
    if "SLURM_JOB_ID" in env:
        return f"slurm-{env['SLURM_JOB_ID']}.{env.get('SLURM_STEP_ID', '0')}"
    raise UserInputError(
        f"this process is rank {world.rank} of {world.size} but its launcher names no run id "
        "(TORCHELASTIC_RUN_ID or SLURM_JOB_ID); give hydra.run.dir=<folder> so all ranks share it"
    )


def launched_rank() -> int:
    """This process's rank in a world started outside ``nys`` (0 when there is none)."""
    world = world_from_env()
    return world.rank if world is not None else 0


def run_on_ranks(
    run: RunFn, cfg: DictConfig, run_dir: Path, console: Console, nproc: int
) -> pd.DataFrame | None:
    """``run(cfg, run_dir, console)`` on every rank of the job; rank 0's DataFrame, else None.

    In a world launched outside (torchrun, srun, submitit tasks) this process is one rank;
    otherwise ``nproc`` > 1 starts that many local ranks, and 1 simply calls ``run``.
    """
    device = str(cfg.get("device", "cpu"))
    world = world_from_env()
    if world is not None and world.size > 1:
        if nproc > 1:
            raise UserInputError(
                f"trainer.nproc_per_node={nproc} is not allowed inside a world of {world.size} "
                "processes already started by torchrun/srun/submitit; keep it 1 there"
            )
        with process_group(world, device):
            df = run(cfg, run_dir, console)
        return df if world.rank == 0 else None
    if nproc == 1:
        return run(cfg, run_dir, console)
    return _launch_local(run, cfg, run_dir, nproc, device)


def _launch_local(
    run: RunFn, cfg: DictConfig, run_dir: Path, nproc: int, device: str
) -> pd.DataFrame:
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    if resolve_device(device).type == "cuda" and nproc > torch.cuda.device_count():
        raise UserInputError(
            f"trainer.nproc_per_node={nproc} is not allowed: only {torch.cuda.device_count()} "
            "CUDA device(s) here; use at most that many ranks (one per GPU)"
        )
    if multiprocessing.get_start_method(allow_none=True) not in (None, *STANDARD_START_METHODS):
        # A joblib (loky) worker set its own start method: spawned ranks could not look it up.
        multiprocessing.set_start_method("spawn", force=True)
    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="localhost:0",  # port 0: the rendezvous store takes a free port
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
    )
    elastic_log = logging.getLogger("torch.distributed.elastic")
    level = elastic_log.level
    # Its lines are launcher chatter; a failed rank comes back below as its own exception.
    elastic_log.setLevel(logging.CRITICAL)
    try:
        with tempfile.TemporaryDirectory(prefix="nys-ranks-") as errors:
            try:
                results = elastic_launch(config, _rank_main)(
                    run, cfg, run_dir, device, _job_logging(), errors
                )
            except ChildFailedError as failed:
                raise _rank_error(Path(errors), failed) from None
    finally:
        elastic_log.setLevel(level)
    return results[0]


def _job_logging() -> dict[str, Any] | None:
    """Hydra's job logging config (resolved), so rank 0 logs to the same console and file."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return OmegaConf.to_container(HydraConfig.get().job_logging, resolve=True)  # type: ignore[return-value]


def _rank_main(
    run: RunFn,
    cfg: DictConfig,
    run_dir: Path,
    device: str,
    job_logging: dict[str, Any] | None,
    errors: str,
) -> pd.DataFrame | None:
    """Entry point of one spawned rank (the elastic agent exported RANK, WORLD_SIZE, ...)."""
    from nyscli.console import console

    world = world_from_env()
    assert world is not None, "the elastic launcher exports RANK and WORLD_SIZE"
    if world.rank == 0 and job_logging is not None:
        # Hydra opened the log file in the parent; append to it rather than truncate.
        for handler in job_logging.get("handlers", {}).values():
            if "filename" in handler:
                handler["mode"] = "a"
        logging.config.dictConfig(job_logging)
    else:
        logging.basicConfig(level=logging.WARNING)
    # N ranks on one CPU share its cores (threads=... in the config still wins).
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world.local_size))
    try:
        with process_group(world, device):
            df = run(cfg, run_dir, console)
    except BaseException as error:
        _save_error(Path(errors), world.rank, error)
        raise SystemExit(1) from None  # the parent re-raises it: no traceback per rank here
    return df if world.rank == 0 else None


def _save_error(errors: Path, rank: int, error: BaseException) -> None:
    text = traceback.format_exc()
    try:
        payload = pickle.dumps((error, text))
    except Exception:  # an unpicklable exception still tells its story as text
        payload = pickle.dumps((RuntimeError(f"{type(error).__name__}: {error}"), text))
    (errors / f"rank{rank}.pkl").write_bytes(payload)


def _rank_error(errors: Path, failed: Any) -> BaseException:
    """The exception the first failing rank raised (else any rank's that was saved)."""
    first, failure = failed.get_first_failure()
    saved = sorted(int(p.stem.removeprefix("rank")) for p in errors.glob("rank*.pkl"))
    for candidate in sorted(saved, key=lambda r: r != first):
        path = errors / f"rank{candidate}.pkl"
        if path.exists():
            error, text = pickle.loads(path.read_bytes())
            if hasattr(error, "add_note"):
                error.add_note(f"raised on rank {candidate}:\n{text}")
            return error
    return RuntimeError(f"rank {first} died (exit code {failure.exitcode}) before reporting")
