"""Multi-process training with torch.distributed: who am I, joining the world, and the few
collectives the trainer needs.

gloo on CPU, nccl on CUDA (each rank on its local GPU). Only rank 0 writes files and logs
at INFO; the trainer trains through DistributedDataParallel (:func:`data_parallel`) and sums
its metrics across ranks (see ``loop.py``). Starting ranks is :mod:`nyscli.ranks`'s job.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from nyscli.train.metrics import Running
from nyscli.train.resources import resolve_device


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


# ---------------------------------------------------------------------------- joining


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
