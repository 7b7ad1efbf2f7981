"""Resume records what ran: a changed setting is refused (or, asked for, applied and recorded),
``--resume true`` only continues a run with identical settings, a finished run is left alone."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf

from nyscli.train.batches import ShuffledBatches
from nyscli.train.errors import CheckpointError
from nyscli.train.resume import RESUMED_FROM_FILE, Change, setup_changes
from tests.helpers import LRA_TINY as TINY
from tests.helpers import nys_subprocess, run_folders


def test_setup_changes_ignore_only_how_to_run():
    old = OmegaConf.create(
        {"seed": 0, "threads": 1, "resume": False, "task": {"steps": 4},
         "trainer": {"lr": 1e-4, "progress": True, "max_steps": "${task.steps}"}}
    )  # fmt: skip
    new = OmegaConf.create(
        {"seed": 3, "threads": 2, "resume": "x", "task": {"steps": 4},
         "trainer": {"lr": 5e-4, "progress": False, "max_steps": 4}}
    )  # fmt: skip
    assert setup_changes(old, new) == [Change("seed", 0, 3), Change("trainer.lr", 1e-4, 5e-4)]


@pytest.fixture(scope="module")
def stopped_template(tmp_path_factory):
    """An lra run stopped at step 2 of 4 (checkpoints/last.pt, status "stopped at step 2"),
    trained once for the tests below; each gets its own copy."""
    root = tmp_path_factory.mktemp("stopped")
    args = [*TINY, f"data_cache={root / 'cache'}"]
    first = nys_subprocess(root, "lra", *args, "trainer.stop_at_step=2")
    assert first.returncode == 0, first.stdout + first.stderr
    [run] = run_folders(root / "outputs" / "lra")
    return args, run


@pytest.fixture
def stopped_run(stopped_template, tmp_path):
    """The stopped run, copied to the same place under this test's outputs/ (the cache it
    names is shared: resuming only reads it)."""
    args, template = stopped_template
    run = tmp_path / "outputs" / "lra" / template.name
    shutil.copytree(template, run)
    return args, run


def test_changed_settings_are_refused_in_one_line_without_a_folder(run_nys, tmp_path, stopped_run):
    args, run = stopped_run
    refused = run_nys("lra", *args, f"resume={run}", "trainer.lr=5e-4", "seed=3")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    line = " ".join(refused.stdout.split())
    assert "seed (0 -> 3)" in line and "trainer.lr (0.0001 -> 0.0005)" in line
    assert "resume_changes=allow" in line and "Traceback" not in refused.stdout + refused.stderr
    picky = run_nys("lra", *args, "--resume", "true", "seed=99")
    assert picky.returncode == 2 and "exactly these settings" in picky.stdout
    assert run_folders(tmp_path / "outputs" / "lra") == [run]  # no new folder


def as_before_architecture(run) -> None:
    """A checkpoint written before checkpoints recorded the settings that shaped them."""
    last = run / "checkpoints" / "last.pt"
    state = torch.load(last, weights_only=False)
    del state["architecture"]
    torch.save(state, last)


@pytest.mark.parametrize(
    "value",
    ["plain", "it's", "back\\slash", "end\\", "a\\'b", "", "a=b,c", "null", 3, 1e-4, True, None],
)
def test_a_kept_value_reads_back_as_itself_in_hydras_override_grammar(value):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from nyscli.train.resume import pin_overrides

    [override] = pin_overrides([Change("k", value, "new")])
    assert OverridesParser.create().parse_override(override).value() == value


def test_a_default_changed_since_the_run_keeps_its_recorded_value(run_nys, tmp_path, stopped_run):
    """A code update between two chunks moved a default the run never set (here: its record
    says bucket 1, today's default is 8): the resume trains with the recorded 1, says so, and
    records no change; set on the command line, the new value is still refused."""
    args, run = stopped_run
    saved = run / ".hydra" / "config.yaml"
    recorded = OmegaConf.load(saved)
    assert recorded.trainer.bucket != 1 and not any("bucket" in a for a in args)
    recorded.trainer.bucket = 1
    OmegaConf.save(recorded, saved)
    asked = run_nys("lra", *args, f"resume={run}", "trainer.bucket=8")
    assert asked.returncode == 2 and "trainer.bucket (1 -> 8)" in " ".join(asked.stdout.split())
    done = run_nys("lra", *args, f"resume={run}")
    assert done.returncode == 0, done.stdout + done.stderr
    line = " ".join(done.stdout.split())
    assert "resume keeps that run's settings: trainer.bucket=1 (default now 8)" in line
    [resumed] = [r for r in run_folders(tmp_path / "outputs" / "lra") if r != run]
    assert OmegaConf.load(resumed / ".hydra" / "config.yaml").trainer.bucket == 1
    assert "trainer.bucket=1" in OmegaConf.load(resumed / ".hydra" / "overrides.yaml")
    row = pd.read_csv(resumed / "results.csv").iloc[0]
    assert row.status == "ok" and pd.isna(row.get("resume_changes"))


def test_a_run_recorded_before_model_init_resumes_with_the_init_it_ran(
    run_nys, tmp_path, stopped_run
):
    """lra's Linear layers now start as PyTorch makes them (model.init=torch, the paper's LRA
    code); a run recorded before the option ran N(0, 0.02) and resumes so, recording no
    change. Asking for torch on such a run is a change, refused."""
    args, run = stopped_run
    saved = run / ".hydra" / "config.yaml"
    recorded = OmegaConf.load(saved)
    assert recorded.model.init == "torch"
    del recorded.model["init"]
    OmegaConf.save(recorded, saved)
    as_before_architecture(run)
    asked = run_nys("lra", *args, f"resume={run}", "model.init=torch")
    assert asked.returncode == 2 and "model.init (normal -> torch)" in " ".join(
        asked.stdout.split()
    )
    done = run_nys("lra", *args, f"resume={run}")
    assert done.returncode == 0, done.stdout + done.stderr
    line = " ".join(done.stdout.split())
    assert "resume keeps that run's settings: model.init=normal (default now torch)" in line
    [resumed] = [r for r in run_folders(tmp_path / "outputs" / "lra") if r != run]
    assert OmegaConf.load(resumed / ".hydra" / "config.yaml").model.init == "normal"
    assert pd.read_csv(resumed / "results.csv").iloc[0].status == "ok"


def test_a_softmax_run_recorded_before_attention_dropout_resumes_without_it(run_nys, tmp_path):
    """lra's softmax now drops 10% of its attention probabilities (the paper's LRA code); a
    softmax run recorded before the option ran without and resumes so, and says so."""
    args = [a for a in TINY if not a.startswith("attention.")]
    args += ["attention=softmax", f"data_cache={tmp_path / 'cache'}"]
    first = run_nys("lra", *args, "trainer.stop_at_step=2")
    assert first.returncode == 0, first.stdout + first.stderr
    [run] = run_folders(tmp_path / "outputs" / "lra")
    saved = run / ".hydra" / "config.yaml"
    recorded = OmegaConf.load(saved)
    assert recorded.model.softmax_attention_dropout == 0.1 and "dropout" in recorded.attention
    del recorded.model["softmax_attention_dropout"]
    del recorded.attention["dropout"]
    OmegaConf.save(recorded, saved)
    as_before_architecture(run)
    done = run_nys("lra", *args, f"resume={run}")
    assert done.returncode == 0, done.stdout + done.stderr
    line = " ".join(done.stdout.split())
    assert "model.softmax_attention_dropout=0.0 (default now 0.1)" in line
    [resumed] = [r for r in run_folders(tmp_path / "outputs" / "lra") if r != run]
    config = OmegaConf.load(resumed / ".hydra" / "config.yaml")
    assert config.model.softmax_attention_dropout == 0.0 and config.attention.dropout == 0.0
    assert pd.read_csv(resumed / "results.csv").iloc[0].status == "ok"


def test_a_corrupt_recorded_config_is_one_line_naming_it(run_nys, tmp_path, stopped_run):
    args, run = stopped_run
    (run / ".hydra" / "config.yaml").write_text("trainer: [unclosed\n")
    refused = run_nys("lra", *args, f"resume={run}")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    line = " ".join(refused.stdout.split())
    assert "config.yaml cannot be read" in line and "line 2" in line
    assert "Traceback" not in refused.stdout + refused.stderr
    assert run_folders(tmp_path / "outputs" / "lra") == [run]  # no new folder


def test_allowed_changes_are_applied_and_both_values_recorded(run_nys, tmp_path, stopped_run):
    args, run = stopped_run
    done = run_nys("lra", *args, f"resume={run}", "trainer.lr=5e-4", "resume_changes=allow")
    assert done.returncode == 0, done.stdout + done.stderr
    [resumed] = [r for r in run_folders(tmp_path / "outputs" / "lra") if r != run]
    row = pd.read_csv(resumed / "results.csv").iloc[0]
    assert row.resume_changes == "trainer.lr (0.0001 -> 0.0005)" and row.status == "ok"
    assert OmegaConf.load(resumed / ".hydra" / "config.yaml").trainer.lr == 5e-4
    train = pd.read_csv(resumed / "metrics.csv").set_index("step")
    train = train[train.split == "train"]
    # Warm-up 1 of 4 steps: update k uses lr * (1 - (k - 2) / 3); the old lr up to step 2.
    assert train.lr[2] == 1e-4
    assert train.lr[3] == pytest.approx(5e-4 * 2 / 3, rel=1e-12)
    assert train.lr[4] == pytest.approx(5e-4 * 1 / 3, rel=1e-12)

    again = run_nys("lra", *args, f"resume={resumed}", "trainer.lr=5e-4", "resume_changes=allow")
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already finished" in again.stdout and "nothing to do" in again.stdout
    assert len(run_folders(tmp_path / "outputs" / "lra")) == 2  # no new folder


def test_resume_true_continues_the_identical_run_then_has_nothing_to_do(
    run_nys, tmp_path, stopped_run
):
    args, run = stopped_run
    done = run_nys("lra", *args, "--resume", "true")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "resume=true: continuing" in done.stdout  # says which run it continues
    [resumed] = [r for r in run_folders(tmp_path / "outputs" / "lra") if r != run]
    row = pd.read_csv(resumed / "results.csv").iloc[0]
    assert row.resumed_from.endswith(f"{run.name}/checkpoints/last.pt") and row.steps == 4
    assert pd.isna(row.resume_changes)
    finished = run_nys("lra", *args, "--resume", "true")
    assert finished.returncode == 0, finished.stdout + finished.stderr
    assert f"{resumed.name} already finished" in finished.stdout.replace("\n", "")
    assert len(run_folders(tmp_path / "outputs" / "lra")) == 2


def test_a_changed_seed_draws_the_remaining_batches_from_its_own_stream():
    old = ShuffledBatches(list(range(40)), 4, list, seed=0)
    old.position = 3
    new = ShuffledBatches(list(range(40)), 4, list, seed=3)
    new.load_state_dict(old.state_dict())
    assert (new.seed, new.position) == (3, 3)
    first = next(iter(new))
    assert first == ShuffledBatches(list(range(40)), 4, list, seed=3).epoch_batches(0)[3].tolist()
    assert first != old.epoch_batches(0)[3].tolist()


def test_resume_true_takes_the_newest_unfinished_run_no_run_has_continued(tmp_path):
    """Runs with identical settings: a (stopped), b (finished, newer); resume=true continues a,
    not 'nothing to do' because of b. Once c has continued a (and saved), a is c's past: c is
    taken; when c has finished too, there is nothing to do. A continuation that stopped before
    its first save does not count."""
    import os

    from nyscli.train.resume import RESUMED_FROM_FILE, plan_resume

    saved = {"seed": 0, "resume": False, "trainer": {"lr": 1e-4}}
    cfg = OmegaConf.create({**saved, "resume": True})

    def run(name: str, age: int, finished: bool, continues: str | None = None, saves=True):
        folder = tmp_path / name
        (folder / ".hydra").mkdir(parents=True)
        OmegaConf.save(OmegaConf.create(saved), folder / ".hydra" / "config.yaml")
        if saves:
            (folder / "checkpoints").mkdir()
            torch.save({}, folder / "checkpoints" / "last.pt")
            os.utime(folder / "checkpoints" / "last.pt", (1e9 + age, 1e9 + age))
        if finished:
            (folder / "results.csv").write_text("status\nok\n")
        if continues:
            (folder / RESUMED_FROM_FILE).write_text(f"{(tmp_path / continues).resolve()}\n")
        return folder

    def chosen():
        plan = plan_resume(cfg, tmp_path)
        return plan.run.name, plan.finished

    run("a", 1, finished=False)
    run("b", 2, finished=True)
    assert chosen() == ("a", False)
    run("d", 3, finished=False, continues="a", saves=False)  # crashed before saving
    assert chosen() == ("a", False)
    c = run("c", 4, finished=False, continues="a")
    assert chosen() == ("c", False)
    (c / "results.csv").write_text("status\nok\n")
    assert chosen() == ("c", True)  # the newest of b and c: both finished
    (c / "results.csv").unlink()
    (c / "checkpoints" / "last.pt").write_bytes(b"PK\x03\x04 cut short")  # a truncated save
    with pytest.raises(CheckpointError, match=r"c/checkpoints/last.pt is corrupt or unreadable"):
        chosen()  # before any data is loaded


def test_a_change_that_shapes_the_weights_is_refused_before_any_data(
    run_nys, tmp_path, stopped_run
):
    """resume_changes=allow with model.dim changed used to load the data first and then fail
    at the checkpoint; now one line before anything is logged or created."""
    from nyscli.train.resume import shapes_weights

    assert shapes_weights("model.dim") and shapes_weights("attention.num_landmarks")
    assert shapes_weights("task.max_len") and shapes_weights("init")
    assert not shapes_weights("model.dropout") and not shapes_weights("trainer.lr")
    args, run = stopped_run
    refused = run_nys("lra", *args, f"resume={run}", "model.dim=32", "resume_changes=allow")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    lines = refused.stdout.strip().splitlines()
    assert len(lines) == 1 and "model.dim (16 -> 32) would change the model" in lines[0]
    assert run_folders(tmp_path / "outputs" / "lra") == [run]


def test_a_checkpoint_of_other_weights_is_refused_before_any_data(run_nys, tmp_path, stopped_run):
    """A last.pt copied from a run of another model.dim used to fail after six lines of data
    preparation; each checkpoint now records the settings that shaped its weights."""
    args, run = stopped_run
    last = run / "checkpoints" / "last.pt"
    state = torch.load(last, weights_only=False)
    assert state["architecture"]["model.dim"] == 16 and "attention.name" in state["architecture"]
    state["architecture"]["model.dim"] = 32  # what a copied checkpoint would record
    torch.save(state, last)
    refused = run_nys("lra", *args, f"resume={run}")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    [line] = refused.stdout.strip().splitlines()
    assert line == (
        f"error: checkpoint {last} does not fit this model: its weights were shaped by other "
        "settings: model.dim (32 there, 16 here); resume from a checkpoint of this run's settings"
    )
    assert run_folders(tmp_path / "outputs" / "lra") == [run]


def long_stopped_run(run_nys, tmp_path) -> tuple[list[str], object]:
    """A run stopped at step 2 (last.pt) whose continuation trains until it is stopped: no
    further checkpoint before step 100,000."""
    args = [*TINY, f"data_cache={tmp_path / 'c'}", "trainer.checkpoint_every=100000"]
    args[args.index("--steps") + 1] = "100000"
    first = run_nys("lra", *args, "trainer.stop_at_step=2")
    assert first.returncode == 0, first.stdout + first.stderr
    [run] = run_folders(tmp_path / "outputs" / "lra")
    return args, run


def continuing(tmp_path, args: list[str], *resume: str) -> tuple[subprocess.Popen, object]:
    """A launch continuing the run, returned once it has claimed it (its resumed_from.txt is
    written just after the claim), before its first checkpoint; and its run folder."""
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1"}
    going = subprocess.Popen(
        [sys.executable, "-m", "nyscli.cli", "lra", *args, *resume], cwd=tmp_path,
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and going.poll() is None:
        found = list((tmp_path / "outputs").rglob(RESUMED_FROM_FILE))
        if found:
            return going, found[0].parent
        time.sleep(0.1)
    going.kill()
    raise AssertionError(going.communicate()[0])


@pytest.mark.parametrize(
    ("first", "second"), [("true", "true"), ("true", "run"), ("run", "true")]
)  # fmt: skip
def test_two_launches_at_once_continue_the_run_once(first, second, run_nys, tmp_path):
    """The first continuation has not saved a checkpoint yet (nothing on disk says the run is
    continued): a second launch is refused in one line instead of forking it, whichever form
    each uses. ``resume=<run>`` while a ``--resume true`` continuation ran used to wait ~12 s
    and continue the run a second time (issue 61.4)."""
    args, run = long_stopped_run(run_nys, tmp_path)
    form = {"true": ["--resume", "true"], "run": [f"resume={run}"]}
    going, continuing_dir = continuing(tmp_path, args, *form[first])
    try:
        second_launch = run_nys("lra", *args, *form[second], "trainer.stop_at_step=3")
    finally:
        going.send_signal(signal.SIGTERM)
        going.communicate(timeout=120)
    assert second_launch.returncode == 2, second_launch.stdout + second_launch.stderr
    lines = [line for line in second_launch.stdout.splitlines() if line.strip()]
    assert len(lines) == 1 and "is already being continued by" in lines[0], lines
    asked = "--resume true" if second == "true" else f"resume={run}"  # as typed
    assert lines[0].startswith(f"error: {asked}: the run ")
    assert str(continuing_dir.resolve()) in lines[0] and "its launch is running" in lines[0]
    assert len(run_folders(tmp_path / "outputs" / "lra")) == 2  # no third run


@pytest.mark.parametrize("form", ["true", "run"])
def test_a_run_that_still_trains_is_not_continued(form, run_nys, tmp_path):
    """A run that trains on past its first checkpoint holds its folder's training lock: a
    continuation beside it, in either form, is refused in one line (it would fork the run),
    and once that launch has stopped the run continues."""
    args = [*TINY, f"data_cache={tmp_path / 'c'}", "trainer.checkpoint_every=2"]
    args[args.index("--steps") + 1] = "100000"
    env = {**os.environ, "COLUMNS": "400", "NO_COLOR": "1"}
    going = subprocess.Popen(
        [sys.executable, "-m", "nyscli.cli", "lra", *args], cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not list((tmp_path / "outputs").rglob("last.pt")) and going.poll() is None:
            assert time.monotonic() < deadline, "no checkpoint in 120 s"
            time.sleep(0.1)
        [run] = run_folders(tmp_path / "outputs" / "lra")
        asked = {"true": ["--resume", "true"], "run": [f"resume={run}"]}[form]
        refused = run_nys("lra", *args, *asked, "trainer.stop_at_step=3")
    finally:
        going.send_signal(signal.SIGTERM)  # stops it with its checkpoint kept
        going.communicate(timeout=120)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    [line] = [line for line in refused.stdout.splitlines() if line.strip()]
    shown = "--resume true" if form == "true" else f"resume={run}"
    assert line.startswith(f"error: {shown}: the run ") and "is still training" in line, line
    assert run_folders(tmp_path / "outputs" / "lra") == [run]  # nothing left behind
    onward = run_nys("lra", *args, *asked, "trainer.stop_after_minutes=0.01")
    assert onward.returncode == 0, onward.stdout + onward.stderr
    [_, continued] = run_folders(tmp_path / "outputs" / "lra")
    assert (continued / RESUMED_FROM_FILE).read_text().strip() == str(run.resolve())


def test_a_continuation_killed_before_its_first_checkpoint_leaves_the_run_continuable(
    run_nys, tmp_path
):
    """``kill -9`` of a ``--resume true`` continuation before its first checkpoint left its
    claim in the run: every later ``--resume true`` was refused for good, and the refusal's
    ``resume=<that continuation>`` failed too (it has no checkpoint) (issue 61.4). A claim
    counts while its launch runs or once its holder saved: this one does not."""
    args, run = long_stopped_run(run_nys, tmp_path)
    going, killed = continuing(tmp_path, args, "--resume", "true")
    going.kill()  # SIGKILL: nothing of nys runs after it
    going.communicate(timeout=60)
    assert (killed / RESUMED_FROM_FILE).is_file() and not (killed / "checkpoints").exists()
    again = run_nys("lra", *args, "--resume", "true", "trainer.stop_at_step=3")
    assert again.returncode == 0, again.stdout + again.stderr
    flat = "".join(again.stdout.split())  # the log line may wrap
    assert "resume=true:continuing" in flat and f"{run.name}" in flat.split("continuing")[1]
    [third] = [r for r in run_folders(tmp_path / "outputs" / "lra") if r not in (run, killed)]
    assert (third / RESUMED_FROM_FILE).read_text().strip() == str(run.resolve())
    assert pd.read_csv(third / "results.csv").iloc[0].status == "stopped at step 3"
    # That continuation saved: the run is continued. resume=<run> names it, and what it says
    # to give works.
    refused = run_nys("lra", *args, f"resume={run}", "trainer.stop_at_step=4")
    assert refused.returncode == 2, refused.stdout + refused.stderr
    [line] = [line for line in refused.stdout.splitlines() if line.strip()]
    assert line.endswith(f"go on from there with resume={third.resolve()}"), line
    assert len(run_folders(tmp_path / "outputs" / "lra")) == 3
    onward = run_nys("lra", *args, f"resume={third.resolve()}", "trainer.stop_at_step=4")
    assert onward.returncode == 0, onward.stdout + onward.stderr
    assert len(run_folders(tmp_path / "outputs" / "lra")) == 4


def test_a_claim_ends_with_its_launch_not_with_a_child_it_forked(tmp_path):
    """A lock on a file is shared with forked children (a data generator's pool): the claim
    must not outlive a killed launch in an orphaned worker."""
    from nyscli.train.resume import _continuing

    run, here = tmp_path / "run", tmp_path / "continuing"
    (run / "checkpoints").mkdir(parents=True)
    (run / "checkpoints" / "last.pt").write_bytes(b"")
    here.mkdir()
    script = (
        "import os, sys, time\n"
        "from pathlib import Path\n"
        "from nyscli.train.resume import claim_continuation\n"
        f"claim_continuation(Path({str(here)!r}), Path({str(run)!r}) / 'checkpoints' / 'last.pt')\n"
        "child = os.fork()\n"
        "if child == 0:\n"
        "    time.sleep(120)\n"
        "    os._exit(0)\n"
        "print(child, flush=True)\n"
        "time.sleep(120)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    child = int(holder.stdout.readline())
    try:
        assert _continuing(run) == (here.resolve(), True)
        holder.kill()  # kill -9 of the launch; its forked child lives on
        holder.wait()
        os.kill(child, 0)  # still there
        assert _continuing(run) is None  # no checkpoint in the holder: the run is free again
    finally:
        os.kill(child, signal.SIGKILL)
