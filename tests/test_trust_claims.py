"""A run folder is claimed, not checked: of many launches into one folder exactly one runs,
and a folder that holds a run, lies inside one, holds anything else or cannot be a folder is
refused in one line, before anything is written."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nyscli.errors import UserInputError
from nyscli.launch import folders
from nyscli.launch.run import launch
from tests.test_bad_input import digest, fake_run, one_error

TINY = ["seq_len=16", "budgets=4", "heads=1", "threads=1", "plots=false", "methods=[nystrom]"]


def _claim(target: str, start, results) -> None:
    """One launch's claim of ``target``; the winner writes its own file into the folder."""
    start.wait()
    try:
        folders.check_new_folder("hydra.run.dir", Path(target))
    except UserInputError as error:
        results.put(("refused", str(error)))
        return
    Path(target, "owner").write_text(str(os.getpid()))
    results.put(("claimed", str(os.getpid())))


def test_eight_launches_into_one_folder_at_once_twenty_times_exactly_one_claims_it(tmp_path):
    context = multiprocessing.get_context("fork")  # the claim only: no torch op in children
    for round_ in range(20):
        target = tmp_path / f"round{round_}" / "run"
        if round_ % 2:  # half the rounds into a folder that exists and is empty
            target.mkdir(parents=True)
        start, results = context.Barrier(8), context.Queue()
        workers = [
            context.Process(target=_claim, args=(str(target), start, results)) for _ in range(8)
        ]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(60)
            assert worker.exitcode == 0
        outcomes = [results.get(timeout=5) for _ in workers]
        winners = [who for what, who in outcomes if what == "claimed"]
        assert len(winners) == 1, outcomes
        assert (target / "owner").read_text() == winners[0]  # nothing of the others in it
        assert sorted(p.name for p in target.iterdir()) == [folders.CLAIM_FILE, "owner"]
        for what, message in outcomes:
            assert what == "claimed" or message.startswith(f"hydra.run.dir={target} ")


def test_eight_real_launches_into_one_run_dir_one_runs_and_seven_are_refused(tmp_path):
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    command = [sys.executable, "-m", "nyscli.cli", "approx-error", *TINY, "hydra.run.dir=run"]
    launched = [
        subprocess.Popen(
            command,
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for _ in range(8)
    ]
    outputs = [(p.wait(240), p.stdout.read()) for p in launched]
    ran = [out for code, out in outputs if code == 0]
    refused = [out for code, out in outputs if code == 2]
    assert len(ran) == 1 and len(refused) == 7, outputs
    for out in refused:  # one line each, naming the folder; no traceback
        assert out.count("\n") == 1 and out.startswith("error: hydra.run.dir=run "), out
    results = (tmp_path / "run" / "results.csv").read_text().splitlines()
    log = (tmp_path / "run" / "approx_error.log").read_text()
    assert len(results) > 1 and log.count("results:") == 1  # one run's rows and log only


@pytest.mark.parametrize(
    "where, message",
    [
        ("done", "already holds a run"),
        ("done/inner", "lies inside the run"),
        ("done/.hydra/x", "lies inside the run"),
        ("mine", "is a folder that is not empty"),
        ("a_file/x", "a_file is a file, not a folder"),
        ("dangling/x", "dangling is a dangling link, not a folder"),
    ],
)
def test_a_folder_that_is_no_fresh_claim_is_refused_in_one_line(
    tmp_path, monkeypatch, capsys, where, message
):
    monkeypatch.chdir(tmp_path)
    fake_run(tmp_path / "done")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "env.json").write_text("{}")  # a user's own folder
    (tmp_path / "a_file").write_text("x")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    before = digest(tmp_path)
    assert launch("approx_error", [*TINY, f"hydra.run.dir={where}"]) == 2
    line = one_error(capsys)
    assert f"hydra.run.dir={where} " in line and message in line
    assert digest(tmp_path) == before  # byte-identical: the run, the user's files


def test_a_dangling_outputs_link_is_one_line_not_an_endless_loop(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs").symlink_to(tmp_path / "gone")
    assert launch("approx_error", TINY) == 2
    assert "outputs is a dangling link, not a folder" in one_error(capsys)
