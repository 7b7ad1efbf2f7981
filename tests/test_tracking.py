"""The ``logger`` group (TensorBoard, MLflow) read back with the libraries' own readers, a
resume that continues both, the missing extra and an unwritable store, and a resumable Optuna
search (``hparams_search=``)."""

from __future__ import annotations

import json
import math
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from nyscli.launch.run import launch
from nyscli.tracking import config as tracking_config
from tests.conftest import REPO
from tests.helpers import LRA_TINY, run_folders

pytest.importorskip("mlflow")
pytest.importorskip("tensorboard")
pytest.importorskip("optuna")

from mlflow.tracking import MlflowClient  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

# LRA_TINY without its step budget: each test sets its own.
TINY = LRA_TINY[: LRA_TINY.index("--steps")] + ["--batch-size", "8"]
VALUE_COLUMNS = ("loss", "accuracy", "lr", "tokens_per_s", "elapsed_s")


def expected_series(metrics: pd.DataFrame) -> dict[str, list[tuple[int, float]]]:
    """``<split>/<column>`` -> [(step, value)] of every finite cell of ``metrics.csv``."""
    out: dict[str, list[tuple[int, float]]] = {}
    for row in metrics.itertuples(index=False):
        for column in VALUE_COLUMNS:
            value = getattr(row, column)
            if isinstance(value, float) and math.isfinite(value):
                out.setdefault(f"{row.split}/{column}", []).append((int(row.step), value))
    return out


def tensorboard_series(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {
        tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]
    }


def wait_for_step(metrics: Path, step: int, process: subprocess.Popen, timeout: float = 120):
    """Block until ``metrics.csv`` has a train row past ``step`` (the run is still going)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()
        if metrics.exists():
            rows = pd.read_csv(metrics)
            if (rows.split == "train").any() and rows.step.max() > step:
                return
        time.sleep(0.05)
    raise AssertionError(f"{metrics} never passed step {step}")


def test_tensorboard_and_mlflow_hold_every_metrics_row_across_an_interrupt_and_resume(tmp_path):
    """Ctrl-C after step 30 (last checkpoint: step 25), resume to step 60: the resumed run's
    event file and the one MLflow run hold each step of its metrics.csv exactly once."""
    common = [*TINY, "--steps", "3000", "trainer.eval_every=25", "logger=many"]
    common.append(f"data_cache={tmp_path / 'cache'}")
    command = [sys.executable, "-m", "nyscli.cli", "lra", *common]
    # A pytest started in the background (CI's `.ci/run &`, nohup) ignores SIGINT and its
    # children inherit that: the run gets Ctrl-C's default back, as in a terminal.
    first = subprocess.Popen(
        command,
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while not (runs := run_folders(tmp_path / "outputs" / "lra")):
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.05)
    [run] = runs
    wait_for_step(run / "metrics.csv", 30, first)
    first.send_signal(signal.SIGINT)
    try:
        out, err = first.communicate(timeout=120)
    except subprocess.TimeoutExpired:  # Ctrl-C lost: show what the run printed
        first.kill()
        out, err = first.communicate()
        raise AssertionError(f"no exit after Ctrl-C:\n{out.decode()[-3000:]}") from None
    assert first.returncode == 130, out.decode() + err.decode()
    interrupted = pd.read_csv(run / "metrics.csv")
    assert interrupted.step.max() > 25  # rows past the checkpoint that the resume redoes

    resumed = subprocess.run(
        [*command, "--resume", "true", "trainer.stop_at_step=60"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    second = next(r for r in run_folders(tmp_path / "outputs" / "lra") if r != run)
    metrics = pd.read_csv(second / "metrics.csv")
    assert list(metrics[metrics.split == "train"].step) == list(range(1, 61))
    expected = expected_series(metrics)

    board = tensorboard_series(second / "tensorboard")
    for tag, points in expected.items():
        assert [s for s, _ in board[tag]] == [s for s, _ in points], tag  # each step once
        for (_, got), (_, want) in zip(board[tag], points, strict=True):
            assert got == pytest.approx(want, rel=1e-6, abs=1e-12), tag  # float32 events
    # Peak memory is the loggers' own (not in metrics.csv): the steps this process trained.
    assert [s for s, _ in board["train/peak_mb"]] == list(range(26, 61))
    hparams = EventAccumulator(str(second / "tensorboard"))
    hparams.Reload()
    assert hparams.PluginTagToContent("hparams")  # the config with the final metrics

    record = json.loads((second / "tracking.json").read_text())["mlflow"]
    assert record == json.loads((run / "tracking.json").read_text())["mlflow"]  # one run
    client = MlflowClient(record["tracking_uri"])
    assert record["tracking_uri"] == f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}"
    for key, points in expected.items():
        history = sorted(
            (m.step, m.value) for m in client.get_metric_history(record["run_id"], key)
        )
        assert history == points, key  # exact doubles, each step once
    logged = client.get_run(record["run_id"])
    results = pd.read_csv(second / "results.csv").iloc[0]
    assert logged.data.params["trainer.eval_every"] == "25"
    assert logged.data.metrics["best_dev_accuracy"] == results.best_dev_accuracy
    assert logged.info.status == "FINISHED"
    files = {a.path for a in client.list_artifacts(record["run_id"])}
    assert {"metrics.csv", "results.csv", "learning_curve.png", "hydra"} <= files


def test_a_missing_extra_is_one_line_before_any_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    real = tracking_config.importlib.util.find_spec
    monkeypatch.setattr(
        tracking_config.importlib.util,
        "find_spec",
        lambda name, *a: None if name in ("mlflow", "optuna") else real(name, *a),
    )
    for args, what in (
        (["logger=many"], "logger=mlflow"),
        (["hparams_search=lra_lr"], "hparams_search= (optuna)"),
    ):
        assert launch("lra", args) == 2
        out = capsys.readouterr().out
        assert f"{what} needs the optional extra tracking" in out, out
        assert "pip install 'nyscli[tracking]'" in out and "Traceback" not in out
        assert len(out.strip().splitlines()) == 1 and not (tmp_path / "outputs").exists()


def test_search_settings_are_checked_before_any_folder(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for bad, allowed in (
        ("hydra.sweeper.n_trials=0", "an integer >= 1"),
        ("hydra.sweeper.sampler.name=grid", "tpe"),
        ("trainer.lr=interval(0.0, 1e-3)", "trainer.lr=0.0 is not allowed"),
    ):
        assert launch("lra", ["hparams_search=lra_lr", bad]) == 2
        out = capsys.readouterr().out
        assert allowed in out and len(out.strip().splitlines()) == 1, out
        assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    ("space", "said"),
    [
        ("trainer.lr=interval(1e-3,1e-5)", "its lower bound 0.001 is above its upper bound "
         "1e-05; give interval(1e-05, 0.001)"),
        ("trainer.lr=tag(log, interval(1e-3,1e-5))", "give interval(1e-05, 0.001)"),
        ("trainer.warmup_steps=range(1000,0)", "it holds no value (it counts up from 1000 while "
         "below 0), so nothing would run; give range(0, 1000)"),
        ("trainer.lr=tag(log, interval(0, 1e-3))", "a log-scale interval needs a lower bound "
         "above 0, not 0"),
        ("trainer.warmup_steps=range(0,1000,step=0)", "its step is 0"),
    ],
)  # fmt: skip
def test_a_space_with_reversed_or_empty_bounds_is_one_line_and_no_folder(
    space, said, tmp_path, monkeypatch, capsys
):
    """The documented form with its bounds the wrong way round was a 76-line optuna traceback,
    exit 1, and an empty multirun folder (issue 61.4)."""
    monkeypatch.chdir(tmp_path)
    assert launch("lra", ["hparams_search=lra_lr", "task=listops", space]) == 2
    [line] = capsys.readouterr().out.strip().splitlines()
    assert line.startswith(f"error: {space} is not allowed: ") and said in line, line
    assert not (tmp_path / "outputs").exists()


def test_a_range_counting_down_is_the_same_space_counted_up():
    """``range(1000, 0, step=-100)`` holds 1000, 900, ..., 100: Optuna's distribution of those
    values, not its ``low <= high`` traceback."""
    from optuna.distributions import IntDistribution

    from nyscli.launch.sweepers.optuna_search import search_space

    space, _ = search_space(["a=range(1000,0,step=-100)", "b=range(0,1001,step=100)"])
    assert space["a"] == IntDistribution(100, 1000, step=100)
    assert space["b"] == IntDistribution(0, 1000, step=100)


def test_a_space_given_under_hydra_sweeper_params_names_the_override_that_works(
    tmp_path, monkeypatch, capsys
):
    """``hydra.sweeper.params.trainer.lr=interval(...)`` is a sweep of Hydra's own config to
    Hydra: the line says to give the key itself, and that form runs (lra_lr.yaml's comment)."""
    monkeypatch.chdir(tmp_path)
    for given in ("interval(1e-5,1e-3)", "tag(log,interval(1e-5,1e-3))"):
        wrong = f"hydra.sweeper.params.trainer.lr={given}"
        assert launch("lra", ["hparams_search=lra_lr", wrong]) == 2
        [line] = capsys.readouterr().out.strip().splitlines()
        assert line.startswith(f"error: hydra.sweeper.params.trainer.lr={given} is not allowed")
        assert line.endswith(f"'trainer.lr={given}'") and not (tmp_path / "outputs").exists()
        # the form it names passes every check (a bad value after it stops before any run)
        right = f"trainer.lr={given}"
        assert launch("lra", ["hparams_search=lra_lr", right, "hydra.sweeper.n_trials=0"]) == 2
        assert capsys.readouterr().out.startswith("error: hydra.sweeper.n_trials=0 is not")


def test_a_study_that_cannot_be_opened_is_one_line_and_no_folder(tmp_path, monkeypatch, capsys):
    """A corrupt optuna.db in the sweep folder, or a storage path in a missing folder: each was
    a 130-180-line SQLAlchemy traceback (the second leaving a sweep folder)."""
    monkeypatch.chdir(tmp_path)
    corrupt = tmp_path / "old-search"
    corrupt.mkdir()
    (corrupt / "optuna.db").write_bytes(b"\x13" * 2000)
    nowhere = f"hydra.sweeper.storage=sqlite:///{tmp_path / 'missing' / 'x.db'}"
    for given, reason in (
        (f"hydra.sweep.dir={corrupt}", "file is not a database"),
        (nowhere, "unable to open database file"),
    ):
        tiny = [o for o in TINY if not o.startswith("--") and o != "8"]  # launch() has no flags
        assert launch("lra", ["hparams_search=lra_lr", *tiny, given]) == 2
        said = capsys.readouterr().out.strip()
        assert len(said.splitlines()) == 1 and reason in said, said
        assert said.startswith("error: the search's study sqlite:///")
    assert not (tmp_path / "outputs").exists()
    assert [p.name for p in corrupt.iterdir()] == ["optuna.db"]  # the user's folder untouched


def test_a_store_sqlite_cannot_open_is_one_warning_at_once(run_nys, tmp_path):
    """A store SQLite cannot open (a folder here; a read-only disk does the same): MLflow
    retried its engine for ~2 minutes with a warning block each time before nys's warning."""
    (tmp_path / "a_folder").mkdir()
    started = time.monotonic()
    done = run_nys("lra", *TINY, "--steps", "2", f"data_cache={tmp_path / 'cache'}",
                   "logger=mlflow", f"logger.mlflow.tracking_uri=sqlite:///{tmp_path / 'a_folder'}",
                   timeout=90)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout + done.stderr
    assert text.count("logger=mlflow failed") == 1 and "cannot open the MLflow store" in text
    assert "mlflow.store.db.utils" not in text and time.monotonic() - started < 60


def test_an_unwritable_store_is_one_warning_and_the_run_goes_on(run_nys, tmp_path):
    blocker = tmp_path / "not_a_folder"
    blocker.write_text("a file where the store's folder should be")
    done = run_nys(
        "lra",
        *TINY,
        "--steps",
        "2",
        f"data_cache={tmp_path / 'cache'}",
        "logger=mlflow",
        f"logger.mlflow.tracking_uri=sqlite:///{blocker}/mlflow.db",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    text = done.stdout + done.stderr
    assert text.count("logger=mlflow failed") == 1 and "Traceback" not in text
    [run] = run_folders(tmp_path / "outputs" / "lra")
    assert pd.read_csv(run / "results.csv").iloc[0].status == "ok"
    assert len(pd.read_csv(run / "metrics.csv")) > 0


def test_an_interrupted_optuna_search_resumes_to_its_trial_count(run_nys, tmp_path):
    """2 trials, then a trial left RUNNING as Ctrl-C leaves it, then the same command in the
    same folder: 4 trials, the interrupted one run again with its own parameters. (The
    warm-up is fixed by TINY's trainer.warmup_steps=1: a fixed key leaves the search space.)"""
    import optuna

    sweep = tmp_path / "search"
    search = [
        "lra",
        "hparams_search=lra_lr",
        *TINY,
        "--steps",
        "3",
        f"data_cache={tmp_path / 'cache'}",
        "logger=mlflow",
        "hydra.sweeper.n_trials=4",
        f"hydra.sweep.dir={sweep}",
    ]
    first = run_nys(*search[:-2], "hydra.sweeper.n_trials=2", search[-1])
    assert first.returncode == 0, first.stdout + first.stderr
    storage = f"sqlite:///{sweep / 'optuna.db'}"
    study = optuna.load_study(study_name="lra_lr", storage=storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 2
    cut = study.ask()  # what an interrupted sweeper leaves: a RUNNING trial with parameters
    lr = cut.suggest_float("trainer.lr", 1e-5, 3e-3, log=True)
    cut.suggest_float("model.dropout", 0.0, 0.3)
    cut.set_user_attr("nys_job_folder", 2)
    (sweep / "2").mkdir()  # and its job folder, with the interrupted run's config and line
    shutil.copytree(sweep / "1" / ".hydra", sweep / "2" / ".hydra")
    (sweep / "2" / "error.txt").write_text("interrupted at step 2; no checkpoint was written yet")

    again = run_nys(*search)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "2 of 4 trials done, 1 interrupted to run again" in again.stdout + again.stderr
    study = optuna.load_study(study_name="lra_lr", storage=storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4
    assert study.trials[2].params["trainer.lr"] == lr
    trials = pd.read_csv(sweep / "trials.csv")
    assert list(trials.trial) == list(range(4)) and trials.best.sum() == 1
    best = trials[trials.best].iloc[0]
    assert best.value == max(trials.value) == study.best_value
    job = pd.read_csv(sweep / str(best.job_folder) / "results.csv").iloc[0]
    assert job.best_dev_accuracy == best.value  # each job returned its metric to Hydra
    assert sorted(trials.job_folder) == [0, 1, 3, 4]  # 2 stays the cut-short run's
    # MLflow: one child run per job folder, all under the sweep's parent run.
    client = MlflowClient(f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    parent = json.loads((sweep / "mlflow_parent.json").read_text())["run_id"]
    children = client.search_runs(
        [client.get_experiment_by_name("lra").experiment_id],
        f"tags.mlflow.parentRunId = '{parent}'",
    )
    assert sorted(r.info.run_name for r in children) == ["0", "1", "3", "4"]
    report = run_nys("report", str(sweep))
    assert report.returncode == 0 and "search: 4 trials" in report.stdout, report.stdout
    [marked] = [line for line in report.stdout.splitlines() if line.rstrip().endswith("│ best │")]
    assert marked.split("│")[1].strip() == str(best.trial)  # the best trial, in words


def test_hydra_plugin_shim_is_packaged():
    assert (REPO / "hydra_plugins" / "nys_optuna_sweeper" / "nys_optuna_sweeper.py").is_file()
    assert not (REPO / "hydra_plugins" / "__init__.py").exists()  # a namespace package


def test_a_job_resumed_in_its_own_folder_has_each_step_once_in_tensorboard(tmp_path):
    """A continued sweep's job resumes in its own folder: its old event file (steps past the
    checkpoint included) gives way to the new one, which replays the rows kept."""
    from nyscli.tracking.sinks import Row
    from nyscli.tracking.tensorboard_sink import TensorBoardSink

    first = TensorBoardSink(tmp_path / "tb")
    for step in (1, 2, 3):  # interrupted after step 3; its checkpoint holds step 2
        first.row(Row(step, "train", {"loss": float(step)}))
    first.close()
    again = TensorBoardSink(tmp_path / "tb", in_place=True)
    again.resume([Row(1, "train", {"loss": 1.0}), Row(2, "train", {"loss": 2.0})])
    again.row(Row(3, "train", {"loss": 2.5}))  # step 3 trained again from the checkpoint
    again.close()
    assert tensorboard_series(tmp_path / "tb") == {"train/loss": [(1, 1.0), (2, 2.0), (3, 2.5)]}
