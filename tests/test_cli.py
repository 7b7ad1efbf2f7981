"""The real `nys` entry point end to end, in temporary folders: runs, sweeps, reports, errors."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from nyscli.cli import complete_overrides
from nyscli.launch.faults import one_line
from nyscli.launch.folders import claim_dir
from tests.helpers import LRA_TINY

TINY = ["hidden=32", "num_heads=2", "repeats=2", "min_repeats=1", "warmup=1"]


def run_dirs(root: Path) -> list[Path]:
    return sorted(p.parent.parent for p in root.rglob(".hydra/config.yaml"))


def test_help_lists_every_command(run_nys):
    done = run_nys("--help")
    assert done.returncode == 0
    for command in ("bench", "report"):
        assert command in done.stdout


def test_cfg_job_prints_composed_config(nys_here, tmp_path):
    done = nys_here("bench", "--cfg", "job", "attention=softmax", "--seq-len", "77")
    assert done.returncode == 0, done.stderr
    assert "name: softmax" in done.stdout and "- 77" in done.stdout
    assert not (tmp_path / "outputs").exists()


def test_single_bench_run_writes_a_complete_run_folder(run_nys, tmp_path):
    done = run_nys(
        "bench",
        "-n",
        "64",
        "-n",
        "96",
        "attention_set=none",
        "attention=nystrom",
        "attention.num_landmarks=16",
        *TINY,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = run_dirs(tmp_path / "outputs" / "bench")
    for name in ("results.csv", "env.json", "bench.log", "bench.png", ".hydra/overrides.yaml"):
        assert (run / name).exists(), name
    df = pd.read_csv(run / "results.csv")
    assert list(df.attention) == ["nystrom-16", "nystrom-16"]
    assert list(df.seq_len) == [64, 96]
    assert (df.status == "ok").all() and (df.time_ms > 0).all() and (df.peak_mb >= 0).all()
    assert "nystrom-16" in done.stdout and "n=96" in done.stdout
    # A second run in the same second gets its own folder.
    again = run_nys("bench", "-n", "64", "attention_set=none", "attention=softmax", *TINY)
    assert again.returncode == 0
    assert len(run_dirs(tmp_path / "outputs" / "bench")) == 2


def test_several_scopes_are_timed_side_by_side_in_one_run(run_nys, tmp_path):
    scopes = ["--scope", "module", "--scope", "projections", "--scope", "core"]
    done = run_nys("bench", "-n", "64", *scopes, "attention_set=none", "attention=softmax", *TINY)
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = run_dirs(tmp_path / "outputs" / "bench")
    df = pd.read_csv(run / "results.csv")
    assert list(df.scope) == ["module", "projections", "core"]
    assert (df.status == "ok").all() and (df.attention == "softmax (SDPA)").all()
    assert "softmax (SDPA): module / (projections + core)" in done.stdout


def test_multirun_sweep_writes_job_folders_summary_and_report_survives_a_failed_job(
    run_nys, tmp_path
):
    done = run_nys(
        "bench", "-m", "-n", "64", "attention_set=none", "attention.num_landmarks=8,16", *TINY
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [sweep] = list((tmp_path / "outputs" / "bench" / "multirun").iterdir())
    jobs = run_dirs(sweep)
    assert len(jobs) == 2
    summary = pd.read_csv(sweep / "summary.csv")
    assert sorted(summary.attention) == ["nystrom-16", "nystrom-8"]
    assert sorted(summary.job) == ["attention.num_landmarks=16", "attention.num_landmarks=8"]
    # Simulate a job that crashed: no results, an error file.
    (jobs[0] / "results.csv").unlink()
    (jobs[0] / "error.txt").write_text("boom: killed\n")
    report = run_nys("report", str(sweep))
    assert report.returncode == 0, report.stdout + report.stderr
    assert "1 of 2 runs have results" in report.stdout and "boom: killed" in report.stdout
    rebuilt = pd.read_csv(sweep / "summary.csv")
    assert len(rebuilt) == 1


def test_a_sweep_over_attentions_times_only_the_swept_rows_under_their_own_labels(
    run_nys, nys_here, tmp_path
):
    """Each job times its own attention alone (attention_set=none, said in one note line),
    so no row of the default set turns up under another job's label in the report."""
    done = run_nys(
        "bench", "-m", "-n", "64", "attention=nystrom,softmax",
        "attention.num_landmarks=8,16", *TINY,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    notes = [line for line in done.stdout.splitlines() if line.startswith("note:")]
    assert len(notes) == 1 and "attention_set=none" in notes[0], done.stdout
    [sweep] = list((tmp_path / "outputs" / "bench" / "multirun").iterdir())
    jobs = run_dirs(sweep)
    assert len(jobs) == 3
    assert [len(pd.read_csv(job / "results.csv")) for job in jobs] == [1, 1, 1]
    report = run_nys("report", str(sweep))
    assert report.returncode == 0, report.stdout + report.stderr
    summary = pd.read_csv(sweep / "summary.csv")
    assert sorted(zip(summary.attention, summary.job, strict=True)) == [
        ("nystrom-16", "attention=nystrom attention.num_landmarks=16"),
        ("nystrom-8", "attention=nystrom attention.num_landmarks=8"),
        ("softmax (SDPA)", "attention=softmax"),
    ]
    # A set the user names is kept, in every job.
    named = nys_here(
        "bench", "-m", "--cfg", "job", "--attention-set", "nystrom", "attention.num_landmarks=8,16"
    )
    assert named.returncode == 0, named.stdout + named.stderr
    assert "note:" not in named.stdout and named.stdout.count("name: softmax_naive") == 2


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["attention=nope"], "Could not find 'attention/nope'"),
        (["attention.num_landmarks=0"], "num_landmarks=0"),
        (["no_such_key=1"], "no_such_key is not a key of nys bench"),
        (["scope=everything"], "scope=everything"),
        (["-m", "attention.num_landmarks=8,0"], "num_landmarks=0"),
        # A refusal names the option as typed, not the config key it sets.
        (["--seq-len", "-5"], "--seq-len -5 is not allowed"),
        (["-n", "0", "-n", "512"], "--seq-len 0 --seq-len 512 is not allowed"),
        (["--scope", "core", "--scope", "core"], "--scope core --scope core is not allowed"),
        (["--mode", "fwd"], "--mode fwd is not allowed"),
        # A comma list without -m is a sweep, not a value of the wrong type.
        (["attention.num_landmarks=32,64"], "attention.num_landmarks=32,64 is a sweep: add -m"),
        # A misspelt name gets the nearest one.
        (["attention=nystorm"], "did you mean attention=nystrom?"),
        (["-m", "attention=nystrom,softmaxx"], "did you mean attention=softmax?"),
        (["attention.num_landmark=32"], "did you mean attention.num_landmarks?"),
        (["seq_len=512"], "seq_len is not a key of nys bench; did you mean seq_lens?"),
        (["--seq-lens", "512"], "no such option: --seq-lens; did you mean --seq-len?"),
    ],
)
def test_bad_bench_input_is_one_line_and_exit_code_2(nys_here, tmp_path, args, fragment):
    done = nys_here("bench", *args)
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 2, output
    assert fragment in output and "Traceback" not in output
    assert len(output.splitlines()) == 1
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    "arg,fragment",
    [
        # A config group typed as a key: the composed config holds it only as a choice.
        ("scheduler=cpu", "scheduler is not a key of nys lra; did you mean schedule?"),
        # Another tool's name for a key, which difflib does not find near.
        ("trainer.learning_rate=1e-3", "did you mean trainer.lr?"),
    ],
)
def test_group_and_other_tools_names_get_a_suggestion(nys_here, tmp_path, arg, fragment):
    done = nys_here("lra", arg)
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 2 and fragment in output and len(output.splitlines()) == 1
    assert not (tmp_path / "outputs").exists()


def test_report_of_missing_dir_is_one_line_exit_2(nys_here):
    done = nys_here("report", "/no/such/dir")
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 2 and len(output.splitlines()) == 1 and "/no/such/dir" in output


def test_claim_dir_never_reuses_a_folder(tmp_path):
    first = claim_dir(tmp_path / "2026-01-01_00-00-00")
    second = claim_dir(tmp_path / "2026-01-01_00-00-00")
    assert first != second and first.is_dir() and second.is_dir()


def test_one_line_joins_cause():
    try:
        try:
            raise RuntimeError("inner\ndetail")
        except RuntimeError as inner:
            raise ValueError("outer\n  message") from inner
    except ValueError as error:
        assert one_line(error) == "outer message (inner)"


def test_completion_offers_config_groups_and_keys():
    complete = complete_overrides("bench")
    assert "attention=nystrom" in complete("attention=")
    assert "attention_set=table1" in complete("attention_s")
    assert "seq_lens=" in complete("seq")
    assert "seed=" in complete("se") and "threads=" in complete("th")  # from conf/base/
    assert "experiment=table1" in complete("experiment=")


def test_a_heartbeat_logs_what_a_long_step_is_doing_while_it_lasts(monkeypatch, caplog):
    """One step longer than the heartbeat (one n of a bench, one SVD) still puts lines in
    the log, each saying the phase's latest state."""
    import logging
    import time

    from nyscli import console

    monkeypatch.setattr(console, "HEARTBEAT_S", 0.02)
    caplog.set_level(logging.INFO)
    with console.heartbeat(logging.getLogger("test"), "phase one") as beat:
        time.sleep(0.2)
        beat.say("phase two")
        time.sleep(0.2)
    lines = [r.getMessage() for r in caplog.records]
    assert any(line.startswith("phase one (") for line in lines), lines
    assert any(line.startswith("phase two (") for line in lines), lines
    after = len(caplog.records)
    time.sleep(0.1)
    assert len(caplog.records) == after  # the heartbeat stops with its phase


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["bench", "-n", "64", "attention_set=none", "attention=softmax", *TINY], "bench n=64"),
        (["approx-error", "--source", "gaussian", "-n", "64", "-b", "8", "plots=false"],
         "approx-error head 1/"),
        (["lra", *LRA_TINY], "train: step "),
    ],
)  # fmt: skip
def test_a_long_phase_logs_its_progress_into_the_runs_log(
    nys_here, tmp_path, monkeypatch, args, fragment
):
    """Without a terminal the bar shows nothing: the run's log gets a progress line at least
    every heartbeat (30 s; here a few milliseconds, so a toy run is a long one)."""
    from nyscli import console

    monkeypatch.setattr(console, "HEARTBEAT_S", 0.005, raising=False)
    done = nys_here(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    [log_file] = list((tmp_path / "outputs").rglob("*.log"))
    beats = [line for line in log_file.read_text().splitlines() if "s so far)" in line]
    assert any(fragment in line for line in beats), log_file.read_text()


# A child in which importing torch, pandas or matplotlib fails: what it refuses, it refused
# before any of them loaded (seconds on a quiet machine, tens beside busy ones).
_HEAVY_BLOCKED = (
    "import sys\n"
    "for name in ('torch', 'pandas', 'matplotlib'):\n"
    "    sys.modules[name] = None\n"
    "from nyscli.cli import _main\n"
    "sys.exit(_main(sys.argv[1:]))\n"
)


def _heavy_blocked(folder, *args: str) -> subprocess.CompletedProcess:
    """``nys *args`` in ``folder``, in a child that cannot import torch, pandas or matplotlib."""
    return subprocess.run(
        [sys.executable, "-c", _HEAVY_BLOCKED, *args],
        cwd=folder, capture_output=True, text=True, timeout=120,
        env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"},
    )  # fmt: skip


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["lra", "scheduler=cpu"], "scheduler is not a key of nys lra; did you mean schedule?"),
        (["bench", "attention=nystorm"], "did you mean attention=nystrom?"),
        (["finetune", "trainer.learning_rate=1e-3"], "did you mean trainer.lr?"),
        (["approx-error", "seq_len=(1"], "quote"),  # Hydra's grammar, with the quoting hint
        (["lra", "experiment=nope"], "experiment"),
    ],
)
def test_what_composing_refuses_is_refused_before_torch_loads(tmp_path, args, fragment):
    done = _heavy_blocked(tmp_path, *args)
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 2 and fragment in output and len(output.splitlines()) == 1, output
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["bench", "--seq-len", "-5"], "--seq-len -5 is not allowed"),  # a typed option
        (["bench", "dtype=fp8"], "dtype=fp8 is not allowed"),
        (["lra", "trainer.lr=abc"], "trainer.lr=abc is not allowed"),  # schema.TRAINING
        (["lra", "task=pathfinder", "data.difficulty=hardest"], "data.difficulty=hardest is not"),
        (["pretrain", "tokenizer.vocab_size=5"], "tokenizer.vocab_size=5 is not allowed"),
        (["finetune", "task.max_len=2"], "task.max_len=2 is not allowed"),
        (["approx-error", "budget_unit=pair"], "budget_unit=pair is not allowed"),
        (["lra", "fail_fast=maybe"], "fail_fast=maybe is not allowed"),  # the launcher's key
    ],
)
def test_a_bad_value_is_refused_before_torch_loads_in_the_full_checks_words(
    nys_here, tmp_path, monkeypatch, args, fragment
):
    """Each command's rules are torch-free (its ``rules.check``): the early refusal gives the
    line the full check gives when there is no early one."""
    done = _heavy_blocked(tmp_path, *args)
    early = (done.stdout + done.stderr).strip()
    assert done.returncode == 2 and fragment in early and len(early.splitlines()) == 1, early
    from nyscli.launch import compose

    monkeypatch.setattr(compose, "early_refusal", lambda *_: None)
    full = nys_here(*args)
    assert full.returncode == 2 and (full.stdout + full.stderr).strip() == early
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    "command,overrides",
    [
        ("lra", ["attention=nystrom", "attention.num_landmarks=0"]),
        ("bench", ["attention_rows=[{name:nystrom,num_landmarks:-1}]"]),
        ("approx_error", ["attention.conv_kernel_size=-3"]),
    ],
)
def test_a_bad_attention_option_is_refused_early_in_the_full_checks_words(
    nys_here, tmp_path, monkeypatch, command, overrides
):
    """An attention's options are checked last by the early refusal (they need torch, but
    not the launcher or the commands), with the line the full check gives."""
    from nyscli.launch import compose

    early = compose.early_refusal(command, overrides, {})
    assert early and "is not allowed" in early, early
    monkeypatch.setattr(compose, "early_refusal", lambda *_: None)
    full = nys_here(command.replace("_", "-"), *overrides)
    assert full.returncode == 2 and (full.stdout + full.stderr).strip() == f"error: {early}"


def test_the_early_refusal_leaves_alone_an_attention_the_run_would_not_build(tmp_path):
    # scratch.like takes the pretrained folder's attention: the full check never reads
    # cfg.attention there, so the early one must not refuse it either.
    from nyscli.launch import compose

    like = ["scratch.like=" + str(tmp_path), "attention=nystrom", "attention.num_landmarks=0"]
    assert compose.early_refusal("finetune", like, {}) is None
    assert "num_landmarks=0" in compose.early_refusal("finetune", like[1:], {})


@pytest.mark.parametrize("command", ["bench", "approx_error", "lra", "pretrain", "finetune"])
def test_every_commands_rules_load_without_torch(command):
    code = (
        "import sys\n"
        "for name in ('torch', 'pandas', 'numpy', 'matplotlib'):\n"
        "    sys.modules[name] = None\n"
        "from nyscli.experiments import value_rules\n"
        f"print(len(value_rules({command!r}).RULES))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and int(done.stdout) > 5, done.stderr[-500:]


def test_a_plain_run_that_composes_goes_on_to_the_full_launch(tmp_path):
    # The early check refuses nothing it cannot see is bad: here the launch goes on and
    # needs pandas and torch, which this child cannot import.
    done = _heavy_blocked(tmp_path, "bench", "--seq-len", "64")
    halted = "halted; None in sys.modules" in done.stderr
    assert done.returncode != 0 and halted, done.stderr[-500:]
