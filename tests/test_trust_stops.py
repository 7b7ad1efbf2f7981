"""Runs that stop early stop cleanly: a non-finite dev loss or weights never become a
checkpoint, and Ctrl-C/SIGTERM end in one line with the last checkpoint intact."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch

from nyscli.experiments.lra.tasks import classification_objective
from nyscli.train.checkpoint import BEST, LAST, load_checkpoint
from nyscli.train.errors import TrainingDiverged
from tests.helpers import LRA_TINY as TINY
from tests.helpers import make_trainer, run_folders


def test_nan_dev_loss_is_never_best_and_names_the_last_finite_checkpoint(tmp_path):
    trainer, train, dev = make_trainer(tmp_path, eval_every=2, checkpoint_every=1)

    def poisoned(model, batch):
        result = classification_objective(model, batch)
        if not model.training and trainer.step >= 4:  # the second evaluation
            result.loss = result.loss * float("nan")  # the accuracy stays finite
        return result

    trainer.objective = poisoned
    last = tmp_path / "checkpoints" / LAST
    with pytest.raises(TrainingDiverged) as stopped:
        trainer.fit(train, dev)
    assert str(stopped.value).startswith(
        f"dev loss became nan at step 4; training stopped, last finite checkpoint: {last} (step 3)"
    )
    # fp32 with clipping already on: the advice names only what is left to try
    assert str(stopped.value).endswith("(step 3); lower trainer.lr")
    assert load_checkpoint(last)["step"] == 3
    assert load_checkpoint(tmp_path / "checkpoints" / BEST)["step"] == 2  # the finite one


def test_non_finite_weights_never_replace_the_last_checkpoint(tmp_path):
    trainer, train, dev = make_trainer(tmp_path, checkpoint_every=1)

    def poison(optimizer, args, kwargs):
        if trainer.step == 2:  # the third update ends with a NaN weight, its loss was finite
            next(trainer.model.parameters()).data.fill_(float("nan"))

    trainer.optimizer.register_step_post_hook(poison)
    with pytest.raises(TrainingDiverged, match=r"weights became non-finite at step 3; .*step 2\)"):
        trainer.fit(train, dev)
    state = load_checkpoint(tmp_path / "checkpoints" / LAST)
    assert state["step"] == 2 and all(torch.isfinite(p).all() for p in state["model"].values())


def test_the_issues_nan_run_stops_in_one_line_without_best(run_nys, tmp_path):
    done = run_nys(
        "lra", *TINY, f"data_cache={tmp_path / 'c'}", "trainer.lr=1e6", "trainer.eval_every=1"
    )
    assert done.returncode == 2, done.stdout + done.stderr
    errors = [line for line in done.stdout.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "dev loss became nan at step 1" in errors[0]
    assert "Traceback" not in done.stdout + done.stderr
    assert not list((tmp_path / "outputs").rglob(BEST))


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_run_says_where_to_resume_and_leaves_its_checkpoint_intact(
    run_nys, tmp_path, signum, code
):
    args = [*TINY, f"data_cache={tmp_path / 'c'}", "trainer.checkpoint_every=1"]
    args[args.index("--steps") + 1] = "100000"
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1"}
    command = [sys.executable, "-m", "nyscli.cli", "lra", *args, "trainer.progress=false"]
    # A pytest started in the background (`pytest &`) ignores SIGINT, and a child inherits that:
    # give the run the default disposition a user's terminal gives it.
    process = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not list((tmp_path / "outputs").rglob(LAST)) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(1.0)  # checkpoints are being written every step now
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == code, stdout + stderr
    [line] = [line for line in stdout.splitlines() if "interrupted" in line]
    assert line.startswith("error: interrupted at step ") and "Traceback" not in stdout + stderr
    [run] = run_folders(tmp_path / "outputs" / "lra")
    step = load_checkpoint(run / "checkpoints" / LAST)["step"]  # intact and readable
    assert f"(step {step})" in line and step >= 1
    assert not [p for p in run.rglob("*") if p.name.endswith(".tmp")]
    assert (run / "error.txt").read_text().strip() == line.removeprefix("error: ")
    if signum == signal.SIGINT:  # the printed command continues the run
        resume = shlex.split(line.split("resume with: ", 1)[1])
        assert resume[0] == "nys" and resume[-1] == f"resume={run}"
        again = run_nys(*resume[1:], f"trainer.stop_at_step={step + 1}")
        assert again.returncode == 0, again.stdout + again.stderr
        [second] = [r for r in run_folders(tmp_path / "outputs" / "lra") if r != run]
        row = pd.read_csv(second / "results.csv").iloc[0]
        assert row.resumed_from == str(run / "checkpoints" / LAST) and row.steps == step + 1


def test_ctrl_c_outside_the_training_loop_is_one_line_and_leaves_no_folder(
    tmp_path, monkeypatch, capsys
):
    """Ctrl-C while data is prepared (before any checkpoint): exit 130, one line, no folder."""
    from nyscli.experiments.lra import command as lra
    from nyscli.launch.run import launch

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(lra, "load_task", interrupted)
    overrides = [a for a in TINY if "=" in a and not a.startswith("-")]
    assert launch("lra", ["task=listops", "threads=1", *overrides]) == 130
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if line.strip()]
    assert lines == ["error: interrupted; no run folder is left"]
    assert not (tmp_path / "outputs").exists()


def _children(pid: int) -> set[int]:
    """The live child processes of ``pid`` (Linux /proc)."""
    found: set[int] = set()
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as handle:
            found |= {int(c) for c in handle.read().split()}
    return found


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().split(") ")[1][0] != "Z"  # a zombie has ended
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(
    ("args", "phase"),
    [
        (["lra", "task=pathfinder", "data.workers=2", "data.generate.n_train=40000"], "cache"),
        (["bench", "seq_lens=[8192]", "attention_set=nystrom", "warmup=50"], "worker"),
    ],
)
def test_sigterm_outside_the_training_loop_is_one_line_no_temp_files_no_workers(
    tmp_path, args, phase
):
    """SIGTERM while pathfinder's generator workers fill the data cache, or while a bench
    worker measures: exit 143, one line, the workers gone, no temporary file, no folder."""
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1",
           "NYSCLI_DATA_CACHE": str(tmp_path / "cache")}  # fmt: skip
    run = subprocess.Popen(
        [sys.executable, "-m", "nyscli.cli", *args, "threads=1"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while not _children(run.pid) and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # until the generator / bench worker processes run
    workers = _children(run.pid)
    assert workers, f"no {phase} process started: {run.communicate()[0]}"
    time.sleep(1.0)
    run.send_signal(signal.SIGTERM)
    out = run.communicate(timeout=60)[0]
    assert run.returncode == 143, out
    lines = out.strip().splitlines()  # bench may first warn that the machine is busy
    assert lines[-1] == "error: terminated (SIGTERM); no run folder is left", out
    assert "Traceback" not in out and "error" not in "".join(lines[:-1]), out
    assert not [pid for pid in workers if _alive(pid)]
    assert not [p for p in tmp_path.rglob("*") if ".tmp" in p.name]
    assert not (tmp_path / "outputs").exists()


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler installed for ``signum`` (/proc SigCgt mask)."""
    with open(f"/proc/{pid}/status") as handle:
        mask = next(line.split()[1] for line in handle if line.startswith("SigCgt:"))
    return bool(int(mask, 16) >> (signum - 1) & 1)


def test_sigterm_while_torch_is_still_loading_is_one_line(tmp_path):
    """The moment nys's entry point takes SIGTERM (before torch and Hydra have loaded), a
    termination is one line and exit 143; Typer used to turn it into a silent exit 130."""
    run = subprocess.Popen(
        [sys.executable, "-m", "nyscli.cli", "approx-error", "seq_len=64"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not _catches(run.pid, signal.SIGTERM) and time.monotonic() < deadline:
        time.sleep(0.01)
    run.send_signal(signal.SIGTERM)
    out = run.communicate(timeout=60)[0]
    assert run.returncode == 143, out
    assert out.strip().splitlines()[-1].startswith("error: terminated (SIGTERM)"), out
    assert "Traceback" not in out and not (tmp_path / "outputs").exists()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # the point
def test_a_sigterm_swallowed_by_a_callback_is_kept_until_reported():
    """A SIGTERM that lands inside a weakref callback raises Terminated there, and Python only
    prints "Exception ignored": the termination is kept (unreported) for the next check, and
    the line that reports it clears it."""
    import gc
    import weakref

    from nyscli.stops import Terminated, sigterm_raises, stopped, unreported

    class Thing:
        pass

    def signal_inside(_ref):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.5)  # the handler runs here, inside the callback

    thing = Thing()
    with sigterm_raises():
        ref = weakref.ref(thing, signal_inside)
        del thing
        gc.collect()
    assert ref() is None
    lost = unreported()
    assert isinstance(lost, Terminated)
    assert stopped(lost) == "terminated (SIGTERM)" and unreported() is None


def test_training_raises_a_swallowed_sigterm_at_its_next_step(tmp_path):
    """The trainer checks for a lost termination before each update: the run stops with its
    one interruption line (exit 143) instead of training on."""
    from nyscli.stops import Terminated, _unreported, unreported
    from nyscli.train.errors import TrainingInterrupted

    trainer, train, dev = make_trainer(tmp_path, eval_every=2)
    _unreported[:] = [Terminated()]
    with pytest.raises(TrainingInterrupted) as info:
        trainer.fit(train, dev)
    assert info.value.code == 143 and "interrupted at step 0" in info.value.message
    assert unreported() is None


def _ctrl_c_in(monkeypatch, method: str, when) -> None:
    """Ctrl-C inside ``Trainer.<method>`` once ``when(trainer, args)`` holds."""
    from nyscli.train.loop import Trainer

    original = getattr(Trainer, method)

    def interrupted(self, *args, **kwargs):
        if when(self, args):
            raise KeyboardInterrupt
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Trainer, method, interrupted)


def _launch_lra(tmp_path, monkeypatch, capsys) -> tuple[int, list[str]]:
    from nyscli.launch.run import launch

    monkeypatch.chdir(tmp_path)
    overrides = [a for a in TINY if "=" in a and not a.startswith("-")]
    code = launch("lra", ["task=listops", "trainer.max_steps=2", "trainer.progress=false",
                          f"data_cache={tmp_path / 'c'}", *overrides])  # fmt: skip
    out = capsys.readouterr()
    errors = [line for line in (out.out + out.err).splitlines() if line.startswith("error:")]
    return code, errors


def test_ctrl_c_in_the_final_test_leaves_error_txt_and_says_how_to_resume(
    tmp_path, monkeypatch, capsys
):
    """Training finished and saved last.pt; the test evaluation after it is interrupted."""
    from nyscli.train.splits import TEST

    # the evaluation's bar starts inside evaluate(), as its batches would run
    _ctrl_c_in(monkeypatch, "_eval_bar", lambda trainer, args: args[0] == TEST)
    code, errors = _launch_lra(tmp_path, monkeypatch, capsys)
    assert code == 130
    [run] = run_folders(tmp_path / "outputs" / "lra")
    [line] = errors
    assert line.startswith("error: interrupted at step 2; last checkpoint ")
    assert "; resume with: " in line and line.endswith(f" resume={run}")
    assert (run / "error.txt").read_text().strip() == line.removeprefix("error: ")
    assert not (run / "results.csv").exists() and (run / "checkpoints" / LAST).exists()


def test_ctrl_c_before_the_first_step_leaves_no_run_folder(tmp_path, monkeypatch, capsys):
    """Nothing was produced (metrics.csv holds its header alone): no folder is left."""
    _ctrl_c_in(monkeypatch, "_update", lambda trainer, args: trainer.step == 0)
    code, errors = _launch_lra(tmp_path, monkeypatch, capsys)
    assert code == 130
    assert errors == ["error: interrupted at step 0; no checkpoint was written yet; "
                      "no run folder is left"]  # fmt: skip
    assert not (tmp_path / "outputs").exists()
