"""Scaling out: cluster presets (joblib, submitit) through the real CLI, several torch.distributed
ranks per job (gloo on CPU) against one process, distributed batches, the sweep summary lock,
and reports of sweeps whose submitit jobs were killed."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import torch.multiprocessing as mp
from omegaconf import OmegaConf
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from nyscli.experiments.report.sweep_summary import LOCK_FILE, SUMMARY_FILE, write_summary
from nyscli.launch.plan import plan_launch
from nyscli.train import distributed
from nyscli.train.batches import ShuffledBatches

from .test_lra import TINY as LRA_TINY
from .test_lra import run_folders
from .test_train import make_trainer

# One approx-error job in well under a second: a 64-token smooth input, Nyström only.
APPROX_TINY = ["threads=1", "seq_len=64", "heads=1", "methods=[nystrom]", "baselines=[]"]
APPROX_TINY += ["plots=false"]


def has_plugin(name: str) -> bool:
    try:
        __import__(f"hydra_plugins.{name}")
    except ImportError:
        return False
    return True


# ------------------------------------------------------------------ several ranks per job


def test_two_gloo_ranks_train_exactly_like_one_process_with_the_global_batch(run_nys, tmp_path):
    """2 ranks x batch 4 == 1 process x batch 8 (dropout 0): same loss at every step, same
    accuracies, dev and test; an interrupted 2-rank run resumes (both ranks load last.pt).
    Only rank 0 logs: one MLflow run across the interrupt, each step logged once."""
    common = [*LRA_TINY[:-4], "--steps", "4", "model.dropout=0", f"data_cache={tmp_path / 'c'}"]
    one = run_nys("lra", *common, "--batch-size", "8", "hydra.run.dir=one")
    assert one.returncode == 0, one.stdout + one.stderr
    two = [*common, "--batch-size", "4", "--nproc-per-node", "2", "logger=mlflow"]
    first = run_nys("lra", *two, "trainer.stop_at_step=2", "hydra.run.dir=two")
    assert first.returncode == 0, first.stdout + first.stderr
    resumed = run_nys("lra", *two, "resume=two", "hydra.run.dir=two_resumed")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr

    single = pd.read_csv(tmp_path / "one" / "metrics.csv")
    ranks = pd.read_csv(tmp_path / "two_resumed" / "metrics.csv")
    assert list(ranks.step) == list(single.step) and list(ranks.split) == list(single.split)
    assert list(ranks[ranks.split == "train"].step) == [1, 2, 3, 4]  # 1-2 carried over
    np.testing.assert_allclose(ranks.loss, single.loss, rtol=1e-5)
    np.testing.assert_array_equal(ranks.accuracy, single.accuracy)
    np.testing.assert_array_equal(ranks.lr.fillna(-1), single.lr.fillna(-1))
    row = pd.read_csv(tmp_path / "two_resumed" / "results.csv").iloc[0]
    assert row.world_size == 2 and row.batch_size == 8 and row.status == "ok"
    assert row.test_accuracy == pd.read_csv(tmp_path / "one" / "results.csv").iloc[0].test_accuracy
    assert pd.read_csv(tmp_path / "one" / "results.csv").iloc[0].world_size == 1
    # Only rank 0 wrote: one metrics row per step and split, one results table printed.
    assert resumed.stdout.count("LRA runs") == 1
    from mlflow.tracking import MlflowClient

    record = json.loads((tmp_path / "two_resumed" / "tracking.json").read_text())["mlflow"]
    client = MlflowClient(record["tracking_uri"])
    [experiment] = [e for e in client.search_experiments() if e.name == "lra"]
    assert len(client.search_runs([experiment.experiment_id])) == 1
    history = client.get_metric_history(record["run_id"], "train/loss")
    assert sorted(m.step for m in history) == [1, 2, 3, 4]


def _ddp_rank(rank: int, world: int, port: int, run_dir: str) -> None:
    """One rank: 2 updates of 3 accumulated micro-batches, counting DDP's gradient syncs."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    with distributed.process_group(distributed.World(rank, world), "cpu"):
        trainer, train, dev = make_trainer(
            Path(run_dir), accumulate=3, max_steps=2, eval_every=2, log_every=1
        )
        assert isinstance(trainer.parallel, torch.nn.parallel.DistributedDataParallel)
        synced: list[int] = []  # bucket index of every all-reduce DDP runs

        def count(state, bucket):
            synced.append(bucket.index())
            return default_hooks.allreduce_hook(state, bucket)

        trainer.parallel.register_comm_hook(None, count)
        before = torch.cat([p.detach().flatten().clone() for p in trainer.model.parameters()])
        trainer.fit(train, dev)
        after = torch.cat([p.detach().flatten() for p in trainer.model.parameters()])
        torch.save({"synced": synced, "before": before, "after": after}, f"{run_dir}/r{rank}.pt")


def test_ddp_syncs_gradients_once_per_accumulated_update(tmp_path):
    """no_sync: 2 updates x 3 micro-batches all-reduce each bucket twice, not six times; the
    ranks (different data slices) end with identical weights, changed by training."""
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    mp.spawn(_ddp_rank, args=(2, port, str(tmp_path)), nprocs=2, join=True)
    ranks = [torch.load(tmp_path / f"r{r}.pt") for r in range(2)]
    for saved in ranks:
        buckets = set(saved["synced"])
        assert buckets and len(saved["synced"]) == 2 * len(buckets)
    torch.testing.assert_close(ranks[0]["after"], ranks[1]["after"], rtol=0, atol=0)
    assert not torch.allclose(ranks[0]["before"], ranks[0]["after"])
    # rank 0 alone wrote the metrics: 2 train rows, 1 dev row
    assert list(pd.read_csv(tmp_path / "metrics.csv").split) == ["train", "train", "dev"]


def test_an_error_on_the_ranks_is_one_line_with_exit_code_2(run_nys, tmp_path):
    done = run_nys("lra", *LRA_TINY, "--nproc-per-node", "2", f"resume={tmp_path / 'nope'}")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "is not a run folder with checkpoints/last.pt" in done.stdout
    assert "Traceback" not in done.stdout


def test_nproc_per_node_below_one_is_one_line(nys_here):
    done = nys_here("lra", "--nproc-per-node", "0")
    assert done.returncode == 2
    assert "--nproc-per-node 0 is not allowed" in done.stdout  # the option as typed


def test_ranks_slice_the_global_batches_of_one_process(monkeypatch):
    """Rank r of 2 with batch b sees the r-th half of each batch 2b of one process, also with
    length bucketing; the positions (and so resume) agree."""
    data = list(range(50))
    lengths = np.random.default_rng(0).integers(1, 100, size=50)

    def batches(size: int, rank: int, world: int, bucket: int) -> list[list[int]]:
        monkeypatch.setattr(distributed, "rank", lambda: rank)
        monkeypatch.setattr(distributed, "world_size", lambda: world)
        loader = ShuffledBatches(data, size, list, seed=3, lengths=lengths, bucket=bucket)
        it = iter(loader)
        return [next(it) for _ in range(7)]  # 7 > 50 // 8: crosses an epoch

    for bucket in (1, 3):
        whole = batches(8, 0, 1, bucket)
        halves = [batches(4, r, 2, bucket) for r in range(2)]
        assert [a + b for a, b in zip(*halves, strict=True)] == whole
        assert all(len(b) == 4 for half in halves for b in half)


@pytest.mark.parametrize(
    "env,world",
    [
        ({}, None),
        # torchrun / the elastic launcher
        (
            {"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"},
            distributed.World(3, 8, 1, 2),
        ),
        # a batch script's own SLURM variables are no world without an exported master ...
        ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, None),
        # ... srun tasks with one are
        (
            {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1",
             "SLURM_JOB_NUM_NODES": "2", "MASTER_ADDR": "node1", "MASTER_PORT": "29500"},
            distributed.World(5, 8, 1, 4),
        ),
    ],
)  # fmt: skip
def test_a_launched_world_is_read_from_the_environment(monkeypatch, env, world):
    for key in ("RANK", "WORLD_SIZE", "SUBMITIT_EXECUTOR", "SLURM_PROCID", "MASTER_ADDR"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    assert distributed.world_from_env() == world


# ------------------------------------------------------------------ cluster presets


def test_a_cluster_preset_means_multirun_and_local_does_not():
    pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    assert not plan_launch("approx_error", [], multirun=False).multirun
    assert not plan_launch("approx_error", ["cluster=local"], multirun=False).multirun
    preset = ["cluster=local_parallel", "seed=1,2"]
    assert plan_launch("approx_error", preset, multirun=False).multirun
    assert plan_launch("lra", ["hydra.mode=MULTIRUN"], multirun=False).multirun


@pytest.mark.parametrize(
    "cluster,plugin",
    [("local_parallel", "hydra_joblib_launcher"), ("submitit_local", "hydra_submitit_launcher")],
)
def test_a_two_job_sweep_on_a_launcher_writes_two_jobs_and_one_summary(
    run_nys, tmp_path, cluster, plugin
):
    if not has_plugin(plugin):
        pytest.skip(f"{plugin} not installed")
    # No -m: the preset itself puts Hydra in multirun mode.
    done = run_nys(
        "approx-error", f"cluster={cluster}", "attention.num_landmarks=8,16", *APPROX_TINY
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [sweep] = list((tmp_path / "outputs" / "approx_error" / "multirun").iterdir())
    jobs = run_folders(sweep)
    assert [j.name for j in jobs] == ["0", "1"]
    results = [pd.read_csv(j / "results.csv") for j in jobs]
    assert [set(r.budget) for r in results] == [{8}, {16}]
    summary = pd.read_csv(sweep / SUMMARY_FILE)
    assert sorted(set(summary.job)) == ["attention.num_landmarks=16", "attention.num_landmarks=8"]
    assert len(summary) == sum(len(r) for r in results)
    for job, result in zip(jobs, results, strict=True):
        rows = summary[summary.run_dir.map(lambda p, job=job: Path(p).name == job.name)]
        np.testing.assert_array_equal(rows.value.to_numpy(), result.value.to_numpy())
    if cluster == "submitit_local":
        assert (sweep / ".submitit").is_dir()
        # A job killed by its scheduler leaves no results and no error.txt: the report says
        # so and quotes the job's submitit log.
        (jobs[0] / "results.csv").unlink()
        job_id = OmegaConf.load(jobs[0] / ".hydra" / "hydra.yaml").hydra.job.id
        [log] = (sweep / ".submitit" / str(job_id)).glob("*_log.err")
        log.write_text("slurmstepd: error: *** JOB CANCELLED DUE TO TIME LIMIT ***\n")
        report = run_nys("report", str(sweep))
        assert report.returncode == 0, report.stdout + report.stderr
        assert "1 of 2 runs have results" in report.stdout
        assert "CANCELLED DUE TO TIME LIMIT" in report.stdout
        assert len(pd.read_csv(sweep / SUMMARY_FILE)) == len(results[1])


HIDE_PLUGINS = (
    "import sys\n"
    "try:\n"
    "    import hydra_plugins\n"
    "    hydra_plugins.__path__ = []  # Hydra finds no launcher plugin: as if not installed\n"
    "except ImportError:\n"
    "    pass\n"
    "from nyscli.cli import main\n"
    "sys.argv[0] = 'nys'\n"
    "main()\n"
)


@pytest.mark.parametrize(
    "cluster,package",
    [
        ("local_parallel", "hydra-joblib-launcher"),
        ("submitit_local", "hydra-submitit-launcher"),
        ("slurm", "hydra-submitit-launcher"),
    ],
)
def test_a_preset_without_its_plugin_is_one_line_with_the_install_hint(tmp_path, cluster, package):
    done = subprocess.run(
        [sys.executable, "-c", HIDE_PLUGINS, "approx-error", f"cluster={cluster}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    expected = f"cluster={cluster} needs the Hydra launcher plugin {package}"
    assert expected in done.stdout and f"pip install {package}" in done.stdout
    assert len(done.stdout.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "outputs").exists()


# ------------------------------------------------------------------ summary from other processes


def test_summary_rebuilds_wait_for_each_other(tmp_path):
    """Jobs ending at once in other processes take turns: a rebuild waits for the lock."""
    job = tmp_path / "0"
    (job / ".hydra").mkdir(parents=True)
    (job / ".hydra" / "config.yaml").write_text("command: bench\n")
    (job / ".hydra" / "overrides.yaml").write_text("- seed=1\n")
    (job / "results.csv").write_text("x\n1\n")
    with open(tmp_path / LOCK_FILE, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        writer = threading.Thread(target=write_summary, args=(tmp_path,))
        writer.start()
        writer.join(timeout=0.5)
        assert writer.is_alive() and not (tmp_path / SUMMARY_FILE).exists()
    writer.join(timeout=10)
    assert list(pd.read_csv(tmp_path / SUMMARY_FILE).x) == [1]


def test_checking_a_big_sweep_without_a_terminal_prints_progress_lines(monkeypatch, capsys):
    """rich's bar draws nothing on a console that is no terminal (a log, CI): a 100,000-job
    sweep was checked for over an hour in silence. Lines come at most every
    CHECK_LINE_EVERY_S seconds (0 here: one a job)."""
    from nyscli.console import console
    from nyscli.launch import progress

    monkeypatch.setattr(progress, "CHECK_LINE_EVERY_S", 0.0)
    assert not console.is_terminal
    plan_launch("approx_error", ["seed=range(0,25)", "seq_len=32"], True)
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert lines[0].startswith("checking 25 jobs: 1 of 25 checked, ") and lines[0].endswith("left")
    assert len(lines) == 24  # none for the last job: the launch goes on to say what it does
