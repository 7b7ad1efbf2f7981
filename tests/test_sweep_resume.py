"""A grid sweep continued where it stopped: the same ``-m`` command with
``hydra.sweep.dir=<sweep> --resume true`` keeps the finished jobs byte for byte, resumes the
interrupted one from its checkpoint in its own folder (its numbers equal an uninterrupted
sweep's), runs the jobs never started under their own numbers, and refuses a sweep whose
values changed, in one line."""

from __future__ import annotations

import csv
import fcntl
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from nyscli.experiments.report.command import show_report
from nyscli.launch.run import launch
from nyscli.launch.sweepers import resume
from nyscli.output.runs import ERROR_FILE, RESULTS_FILE
from nyscli.train.checkpoint import CHECKPOINT_DIR, LAST
from tests.helpers import LRA_TINY

# 2 attentions x 3 seeds of toy ListOps: jobs 0-2 softmax, 3-5 Nyström; a checkpoint each step.
GRID = ["task=listops", "attention=softmax,nystrom", "seed=0,1,2", "trainer.checkpoint_every=1",
        "trainer.progress=false", "trainer.max_steps=4", "trainer.batch_size=8"]  # fmt: skip
TINY = [o for o in LRA_TINY if "=" in o and not o.startswith(("-", "attention."))]
TIMING = ("tokens_per_s", "elapsed_s", "wall_s", "train_s", "peak_mb")  # never equal twice


def sweep(tmp_path: Path, folder: str, *extra: str) -> tuple[int, Path]:
    where = tmp_path / folder
    args = ["-m", *GRID, *TINY, f"data_cache={tmp_path / 'cache'}", f"hydra.sweep.dir={where}"]
    return launch("lra", [*args, *extra]), where


def ctrl_c_in_job_3(monkeypatch) -> None:
    """Ctrl-C inside job 3's training step 3 (its checkpoint of step 2 is on disk)."""
    from nyscli.train.loop import Trainer

    original = Trainer._update

    def interrupted(self, *args, **kwargs):
        if Path(self.run_dir).name == "3" and self.step == 2:
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, "_update", interrupted)


def files_of(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file below ``folder``: its bytes and its mtime in ns."""
    return {
        str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def rows(path: Path, drop: tuple[str, ...] = TIMING) -> list[dict[str, str]]:
    with open(path, newline="") as handle:
        return [{k: v for k, v in r.items() if k not in drop} for r in csv.DictReader(handle)]


def errors(capsys) -> list[str]:
    out = capsys.readouterr()
    return [line for line in (out.out + out.err).splitlines() if line.startswith("error:")]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    """The same sweep run without a stop: what a continued one must equal."""
    tmp = tmp_path_factory.mktemp("whole")
    code, where = sweep(tmp, "sweep")
    assert code == 0
    return where


@pytest.fixture
def stopped(tmp_path, monkeypatch, capsys) -> Path:
    """The sweep, stopped by Ctrl-C in job 3 (the fourth)."""
    monkeypatch.chdir(tmp_path)
    with monkeypatch.context() as patched:
        ctrl_c_in_job_3(patched)
        code, where = sweep(tmp_path, "sweep")
    assert code == 130
    [line] = errors(capsys)
    assert line.startswith(f"error: interrupted at step 2; last checkpoint {where / '3'}")
    assert line.endswith(f"hydra.sweep.dir={where} --resume true")  # the command that goes on
    assert (where / "3" / ERROR_FILE).read_text().strip() == line.removeprefix("error: ")
    assert [(where / str(j) / RESULTS_FILE).is_file() for j in range(4)] == [True] * 3 + [False]
    assert (where / "3" / CHECKPOINT_DIR / LAST).is_file() and not (where / "4").exists()
    return where


@pytest.mark.parametrize("cluster", ["local", "local_parallel"])
def test_a_stopped_sweep_continues_where_it_stopped(
    stopped, uninterrupted, cluster, tmp_path, capsys
):
    if cluster == "local_parallel":
        pytest.importorskip("hydra_plugins.hydra_joblib_launcher")
    kept = {j: files_of(stopped / str(j)) for j in range(3)}
    code, _ = sweep(tmp_path, "sweep", "resume=true", f"cluster={cluster}")
    out = capsys.readouterr().out
    assert code == 0, out
    assert (
        f"note: continuing the sweep in {stopped}: 3 of 6 jobs finished (kept); resumed from "
        "its checkpoint: job 3; never started, run now: job 4, 5"
    ) in " ".join(out.split())
    assert {j: files_of(stopped / str(j)) for j in range(3)} == kept  # same bytes and mtimes
    assert sorted(p.name for p in stopped.iterdir() if p.is_dir()) == list("012345")
    for job in range(6):  # the resumed job's numbers equal an uninterrupted run's, step by step
        folder = stopped / str(job)
        assert rows(folder / "metrics.csv") == rows(uninterrupted / str(job) / "metrics.csv")
        assert not (folder / ERROR_FILE).exists() and (folder / RESULTS_FILE).is_file()
    # summary.csv as if nothing had stopped, but for where the runs are and that job 3 resumed
    drop = (*TIMING, "run_dir", "resumed_from")
    assert rows(stopped / "summary.csv", drop) == rows(uninterrupted / "summary.csv", drop)
    assert rows(stopped / "summary.csv", ())[3]["resumed_from"] == str(
        stopped / "3" / CHECKPOINT_DIR / LAST
    )
    # nys report: the 2 attentions x 3 seeds as 2 rows of mean ± std (n = 3), resumed job or not
    show_report([stopped], tmp_path / "report.csv")
    seeds = pd.read_csv(tmp_path / "report_seeds.csv")
    accuracy = seeds[seeds.result == "test_accuracy"].set_index("group")
    assert list(accuracy.index) == ["attention=softmax", "attention=nystrom"]
    for first, group in ((0, "attention=softmax"), (3, "attention=nystrom")):
        jobs = range(first, first + 3)
        runs = [pd.read_csv(stopped / str(j) / RESULTS_FILE).test_accuracy[0] for j in jobs]
        assert accuracy.loc[group].n == 3 and accuracy.loc[group].seeds == "0 1 2"
        assert np.isclose(accuracy.loc[group]["mean"], np.mean(runs))
        assert np.isclose(accuracy.loc[group]["std"], np.std(runs, ddof=1))
    capsys.readouterr()
    # Run again: nothing left to do, nothing touched.
    before = files_of(stopped)
    assert sweep(tmp_path, "sweep", "resume=true")[0] == 0
    assert "every job of the sweep in" in capsys.readouterr().out
    assert files_of(stopped) == before


def test_a_continued_sweep_refuses_other_values_and_a_missing_resume(stopped, tmp_path, capsys):
    before = files_of(stopped)
    GRID[2] = "seed=0,1,5"
    try:
        code, _ = sweep(tmp_path, "sweep", "resume=true")
    finally:
        GRID[2] = "seed=0,1,2"
    assert code == 2
    assert errors(capsys) == [
        f"error: hydra.sweep.dir={stopped} holds a sweep of other values (seed: 0,1,2 there, "
        "0,1,5 here); a sweep continues with the values it started with: give them again, or "
        "a new hydra.sweep.dir"
    ]
    assert sweep(tmp_path, "sweep")[0] == 2  # job 3 has a checkpoint: --resume true is needed
    assert errors(capsys) == [
        f"error: job 3 of the sweep in {stopped} stopped at its checkpoint ({stopped / '3'}); "
        "add --resume true to continue it from there, or give a new hydra.sweep.dir"
    ]
    with open(stopped / resume.LOCK_FILE, "a") as lock:  # another launch runs it now
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert sweep(tmp_path, "sweep", "resume=true")[0] == 2
    assert errors(capsys) == [
        f"error: the sweep in {stopped} is running in another launch (it holds "
        f"{stopped / resume.LOCK_FILE}); wait for it to end, then continue it"
    ]
    assert files_of(stopped) == before


def test_a_continuation_while_another_runs_the_sweep_says_only_that(stopped, tmp_path, capsys):
    """Two identical continuations at once: the second printed "note: continuing the sweep
    ..." and then the refusal (issue 61.4); the lock is now taken before the note, so the
    loser prints the refusal alone and the winner's note is true. The other launch is a real
    process holding the lock."""
    import subprocess
    import sys

    before = files_of(stopped)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import fcntl, sys, time; f = open(sys.argv[1], 'a'); "
         "fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True); time.sleep(120)",
         str(stopped / resume.LOCK_FILE)], stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "held"
        capsys.readouterr()
        assert sweep(tmp_path, "sweep", "resume=true")[0] == 2
    finally:
        holder.kill()
        holder.wait()
    out = capsys.readouterr()
    assert [line for line in (out.out + out.err).splitlines() if line.strip()] == [
        f"error: the sweep in {stopped} is running in another launch (it holds "
        f"{stopped / resume.LOCK_FILE}); wait for it to end, then continue it"
    ]
    assert files_of(stopped) == before


def test_job_states_read_from_the_folders(tmp_path):
    """Finished, stopped at a checkpoint, failed, never started; a job that ran other
    overrides is a changed sweep."""

    def job(number: int, overrides: list[str], *files: str) -> None:
        folder = tmp_path / str(number)
        (folder / ".hydra").mkdir(parents=True)
        task = "".join(f"\n      - {o}" for o in overrides)
        (folder / ".hydra" / "hydra.yaml").write_text(
            f"hydra:\n  job:\n    num: {number}\n  overrides:\n    task:{task}\n"
        )
        for name in files:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text("status\nok\n" if name == RESULTS_FILE else "x")

    jobs = [[f"seed={s}", "threads=1"] for s in range(4)]
    job(0, ["seed=0", "threads=2"], RESULTS_FILE)  # threads says how it ran, not what
    job(1, ["seed=1"], f"{CHECKPOINT_DIR}/{LAST}", ERROR_FILE)
    job(2, ["seed=2"], ERROR_FILE)
    states = resume.job_states(tmp_path, jobs)
    assert [s.state for s in states] == [resume.DONE, resume.RESUME, resume.RERUN, resume.NEW]
    groups = resume.launch_groups(tmp_path, states, has_resume=True, batch=None)
    own = "hydra.sweep.subdir='{}'".format  # a job that ran before runs in its own folder
    assert groups == [(1, [["seed=1", "threads=1", f"resume='{tmp_path / '1'}'", own(1)],
                           ["seed=2", "threads=1", "resume=false", own(2)],
                           ["seed=3", "threads=1", "resume=false"]])]  # fmt: skip
    assert not (tmp_path / "2" / ERROR_FILE).exists()  # a job run again loses its old error
    assert resume.launch_groups(tmp_path, states, has_resume=False, batch=2)[1] == (3, [jobs[3]])
    with pytest.raises(resume.UserInputError, match="its job 2 ran 'seed=2', this command's "
                       "job 2 is 'seed=7'"):  # fmt: skip
        resume.job_states(tmp_path, [*jobs[:2], ["seed=7"], jobs[3]])
    with pytest.raises(resume.UserInputError, match="this command's job 2 is 'no such job'"):
        resume.job_states(tmp_path, jobs[:2])


def test_a_table3_recipe_sweep_continues_too(tmp_path, monkeypatch, capsys):
    """experiment=table3_cpu's grid lives in hydra.sweeper.params: its jobs are planned as the
    sweeper runs them, so a continuation matches them. Here 2 of its cells, stopped at step 2
    of 4 by trainer.stop_at_step (a key a continuation may drop), then continued."""
    monkeypatch.chdir(tmp_path)
    toy = [o for o in TINY if not o.startswith("attention")]
    args = ["experiment=table3_cpu", "task=listops", "attention=softmax,nystrom", *toy,
            "trainer.max_steps=4", "trainer.batch_size=8", "trainer.progress=false",
            f"data_cache={tmp_path / 'cache'}", f"hydra.sweep.dir={tmp_path / 't3'}"]  # fmt: skip
    assert launch("lra", [*args, "trainer.stop_at_step=2"]) == 0
    assert launch("lra", [*args, "resume=true"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "0 of 2 jobs finished (kept); resumed from its checkpoint: job 0, 1" in out
    for job, attention in enumerate(("softmax", "nystrom")):
        [row] = rows(tmp_path / "t3" / str(job) / RESULTS_FILE, ())
        assert row["attention"].startswith(attention) and row["status"] == "ok"
        assert row["steps"] == "4" and row["resumed_from"].endswith(f"t3/{job}/checkpoints/last.pt")


def test_a_preset_grid_changed_under_hydra_sweeper_params_names_the_key_itself(nys_here, tmp_path):
    done = nys_here(
        "lra", "experiment=table3_cpu", "hydra.sweeper.params.attention=softmax,nystrom"
    )
    assert done.returncode == 2 and done.stdout.strip().splitlines() == [
        "error: hydra.sweeper.params.attention=softmax,nystrom is not allowed: Hydra reads a "
        "sweep in a hydra.* key as a sweep of its own settings; give the key itself, which "
        "replaces the preset's values: 'attention=softmax,nystrom'"
    ]
    assert not (tmp_path / "outputs").exists()


def test_a_sweep_that_failed_before_its_first_job_leaves_no_folder(tmp_path):
    """Its claim and its lock are bookkeeping: nothing else in it, the folder goes."""
    from nyscli.launch.folders import CLAIM_FILE, discard_failed

    sweep_dir = tmp_path / "outputs" / "lra" / "multirun" / "x"
    sweep_dir.mkdir(parents=True)
    (sweep_dir / CLAIM_FILE).touch()
    (sweep_dir / resume.LOCK_FILE).touch()
    discard_failed(sweep_dir, [sweep_dir.parent, sweep_dir.parent.parent])
    assert not sweep_dir.parent.parent.exists() and (tmp_path / "outputs").is_dir()


def test_reading_a_big_sweeps_job_folders_without_a_terminal_prints_progress(
    tmp_path, monkeypatch, capsys
):
    """Reading 100,000 job records takes over a minute: like the check of the jobs, it says
    how far it is (lines at most every CHECK_LINE_EVERY_S seconds; 0 here: one a job)."""
    from nyscli.launch import progress

    monkeypatch.setattr(progress, "CHECK_LINE_EVERY_S", 0.0)
    jobs = [[f"seed={s}"] for s in range(25)]
    for number, job in enumerate(jobs):
        (tmp_path / str(number) / ".hydra").mkdir(parents=True)
        (tmp_path / str(number) / ".hydra" / "hydra.yaml").write_text(
            f"hydra:\n  job:\n    num: {number}\n  overrides:\n    task:\n      - {job[0]}\n"
        )
    assert [s.state for s in resume.job_states(tmp_path, jobs)] == [resume.RERUN] * 25
    lines = [line for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert len(lines) == 24 and lines[0].startswith(
        f"reading 25 job folders of {tmp_path}: 1 of 25 read, "
    )


def test_the_line_that_continues_a_sweep_asks_resume_only_of_a_training_grid(monkeypatch):
    """A training command's grid continues with --resume true; a search reruns a cut trial
    (its trials would look for runs to resume), and bench or approx-error have no resume."""
    from omegaconf import OmegaConf

    from nyscli.launch.sweepers.search import SWEEPER

    monkeypatch.setattr("sys.argv", ["nys", "lra", "-m", "seed=0,1", "hydra.sweep.dir=old"])
    grid = OmegaConf.create({"sweeper": {"_target_": "NysSweeper"}})
    searching = OmegaConf.create({"sweeper": {"_target_": SWEEPER}})
    line = "nys lra -m seed=0,1 hydra.sweep.dir=s"
    assert resume.again(Path("s"), grid, trains=True) == f"{line} --resume true"
    assert resume.again(Path("s"), searching, trains=True) == line
    assert resume.again(Path("s"), grid, trains=False) == line
