"""Multi-process training with torch.distributed: who am I, how to start or join the world,
and the few collectives the trainer needs.

Three ways a job gets several ranks, all ending in the same ``env://`` process group:

- ``trainer.nproc_per_node=N`` on a plain job: :func:`run_on_ranks` starts N local ranks with
  PyTorch's elastic launcher (standalone rendezvous on localhost, a free port) and returns
  rank 0's result;
- torchrun (or any launcher exporting ``RANK``/``WORLD_SIZE``/``MASTER_ADDR``/``MASTER_PORT``),
  ``srun`` with ``SLURM_PROCID``/``SLURM_NTASKS`` and an exported ``MASTER_ADDR``/``MASTER_PORT``,
  or a submitit task (Hydra's submitit launcher with ``tasks_per_node`` > 1): every process
  is already one rank and joins the world from its environment.

gloo on CPU, nccl on CUDA (each rank on its local GPU). Only rank 0 writes files and logs
at INFO; the trainer trains through DistributedDataParallel (:func:`data_parallel`) and sums
its metrics across ranks (see ``loop.py``).
"""

from __future__ import annotations

import contextlib
import logging
import logging.config
import multiprocessing
import os
import pickle
import tempfile
import traceback
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import torch
import torch.distributed as dist
from omegaconf import DictConfig, OmegaConf
from rich.console import Console

from nyscli.errors import UserInputError
from nyscli.train.metrics import Running
from nyscli.train.resources import resolve_device

RunFn = Callable[[DictConfig, Path, Console], pd.DataFrame]
STANDARD_START_METHODS = ("fork", "spawn", "forkserver")


@dataclass(frozen=True)
class World:
    """This process's place among ``size`` ranks (``local_*``: on this node)."""

    rank: int
    size: int
    local_rank: int = 0
    local_size: int = 1


# ---------------------------------------------------------------------------- where am I


def active() -> bool:
    """True inside a process group of more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def rank() -> int:
    return dist.get_rank() if active() else 0


def world_size() -> int:
    return dist.get_world_size() if active() else 1


def is_main() -> bool:
    """Rank 0 (or no process group): the one process that writes files and logs."""
    return rank() == 0


def world_from_env() -> World | None:
    """The world this process was started in by torchrun, submitit or srun; None if none."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:  # torchrun, elastic workers, user exports
        return World(
            int(env["RANK"]),
            int(env["WORLD_SIZE"]),
            int(env.get("LOCAL_RANK", 0)),
            int(env.get("LOCAL_WORLD_SIZE", 1)),
        )
    if env.get("SUBMITIT_EXECUTOR"):  # a task of Hydra's submitit launcher (local or slurm)
        import submitit
        from submitit.helpers import TorchDistributedEnvironment

        if submitit.JobEnvironment().num_tasks < 2:
            return None
        # Exports MASTER_ADDR (first host), MASTER_PORT (from the job id), RANK, WORLD_SIZE.
        job = TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        return World(job.rank, job.world_size, job.local_rank, job.local_world_size)
    # srun: SLURM_PROCID is set in every batch script too, so only an exported master counts.
    if "SLURM_PROCID" in env and "MASTER_ADDR" in env and "MASTER_PORT" in env:
        ntasks = int(env.get("SLURM_NTASKS", 1))
        nodes = int(env.get("SLURM_JOB_NUM_NODES", 1))
        return World(
            int(env["SLURM_PROCID"]), ntasks, int(env.get("SLURM_LOCALID", 0)), ntasks // nodes
        )
    return None


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


# ---------------------------------------------------------------------------- collectives


def _comm_device() -> torch.device:
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def barrier() -> None:
    if active():
        dist.barrier()


@contextlib.contextmanager
def main_first() -> Iterator[None]:
    """Rank 0 runs the block first (e.g. fills a shared data cache), then the other ranks."""
    if not is_main():
        barrier()
    yield
    if is_main():
        barrier()


def sum_across_ranks(values: list[float]) -> list[float]:
    """Element-wise sum over ranks, in float64 (counts stay exact)."""
    if not active():
        return list(values)
    tensor = torch.tensor(values, dtype=torch.float64, device=_comm_device())
    dist.all_reduce(tensor)
    return tensor.tolist()


def reduce_running(running: Running) -> Running:
    """``running``'s sums added over all ranks (its ``seconds`` stay this rank's)."""
    if not active():
        return running
    names = sorted(running.numerators)
    local = [running.loss_sum, running.size, running.tokens]
    local += [running.numerators[n] for n in names] + [running.denominators[n] for n in names]
    total = sum_across_ranks(local)
    k = len(names)
    return Running(
        loss_sum=total[0],
        size=round(total[1]),
        tokens=round(total[2]),
        seconds=running.seconds,
        numerators=dict(zip(names, total[3 : 3 + k], strict=True)),
        denominators=dict(zip(names, total[3 + k :], strict=True)),
    )


def data_parallel(module: torch.nn.Module) -> torch.nn.Module:
    """``module`` wrapped in PyTorch's DistributedDataParallel inside a world of several ranks
    (itself otherwise). The wrapper copies rank 0's weights and buffers to every rank, and
    averages the gradients over the ranks during ``backward`` (bucketed; overlapped with it on
    GPU); forward through the wrapper for that, ``.module`` is the model itself."""
    if not active():
        return module
    from torch.nn.parallel import DistributedDataParallel

    on_gpu = dist.get_backend() == "nccl"
    device_ids = [torch.cuda.current_device()] if on_gpu else None
    return DistributedDataParallel(module, device_ids=device_ids)


def no_sync(module: torch.nn.Module, sync: bool) -> contextlib.AbstractContextManager[Any]:
    """Skip DDP's gradient all-reduce in this forward+backward unless ``sync`` (the last
    micro-batch of an accumulated update); a plain module never syncs anything."""
    if sync or not hasattr(module, "no_sync"):
        return contextlib.nullcontext()
    return module.no_sync()


# ---------------------------------------------------------------------------- joining, launching


@contextlib.contextmanager
def process_group(world: World, device: str) -> Iterator[None]:
    """Join ``world`` (``env://``: MASTER_ADDR/MASTER_PORT) for the duration of the block."""
    cuda = resolve_device(device).type == "cuda"
    if cuda:
        torch.cuda.set_device(world.local_rank % torch.cuda.device_count())
    dist.init_process_group("nccl" if cuda else "gloo", rank=world.rank, world_size=world.size)
    try:
        yield
    finally:
        dist.destroy_process_group()


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
    from nyscli.report.console import console

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
