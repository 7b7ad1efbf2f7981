"""nys approx-error sweeps over the Nyström settings (issue 29, item 2): each job computes
something of its own, or the sweep is refused in one line before anything runs, and the
swept key=value shows in the job's rows and in the figure's legend."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from nyscli.errors import UserInputError
from nyscli.experiments.approx_error import command as approx_error
from nyscli.experiments.approx_error import plots
from nyscli.experiments.approx_error.summary import summarise
from tests.test_approx_error import config, run, value

TINY = ["seq_len=64", "heads=1", "baselines=[uniform]", "plots=false", "threads=1", "budgets=[8]"]


def test_landmark_sweep_with_the_landmark_variants_is_refused_before_anything_runs(
    run_nys, tmp_path: Path
) -> None:
    # Before: three jobs, each computing nystrom_random and nystrom_kmeans again (exit 0).
    done = run_nys("approx-error", "-m", "attention.landmarks=segment_means,random,kmeans", *TINY)
    assert done.returncode == 2, done.stdout + done.stderr
    line = done.stderr.strip() or done.stdout.strip()
    assert "\n" not in line and "Traceback" not in line
    assert "attention.landmarks=random" in line and "methods=[nystrom,linformer" in line
    assert not (tmp_path / "outputs").exists()


@pytest.mark.parametrize(
    ("overrides", "pair"),
    [
        (["attention.landmarks=kmeans"], "methods=nystrom and methods=nystrom_kmeans"),
        (["methods=[nystrom,nystrom_segment_means]"], "methods=nystrom and methods=nystrom_seg"),
    ],
)
def test_two_methods_computing_the_same_rows_are_refused(overrides, pair) -> None:
    with pytest.raises(UserInputError, match=pair) as error:
        approx_error.validate(config(*overrides))
    assert "\n" not in str(error.value)


def test_landmark_sweep_of_nystrom_alone_gives_each_job_its_own_rows(tmp_path: Path) -> None:
    jobs = {
        s: run(tmp_path, "budgets=[8]", "methods=[nystrom]", f"attention.landmarks={s}")
        for s in ("segment_means", "random", "kmeans")
    }
    labels = {s: sorted(set(df.method) - {"uniform", "svd"}) for s, df in jobs.items()}
    assert labels == {
        "segment_means": ["nystrom"],
        "random": ["nystrom_random"],
        "kmeans": ["nystrom_kmeans"],
    }
    errors = {s: value(df, labels[s][0], "output_error")[0] for s, df in jobs.items()}
    assert len(set(errors.values())) == 3  # three different computations


def test_a_swept_nystrom_setting_shows_in_the_rows_and_the_figure_legend(
    tmp_path: Path, monkeypatch
) -> None:
    # Before: both jobs' rows were "nystrom", and the report's figure (jobs pooled) drew one
    # line averaging 1 and 8 pinv iterations.
    frames = [
        run(tmp_path, "budgets=[8]", "methods=[nystrom]", f"attention.pinv_iterations={k}").assign(
            job=f"attention.pinv_iterations={k}"
        )
        for k in (1, 8)
    ]
    few, many = (set(df.method) - {"uniform", "svd"} for df in frames)
    assert few == {"nystrom (pinv_iterations=1)"} and many == {"nystrom (pinv_iterations=8)"}
    pooled = pd.concat(frames).drop(columns="job")  # as nys report pools a sweep's jobs
    rows = summarise(pooled)
    nystrom = rows[rows.method.str.startswith("nystrom")]
    assert len(nystrom) == 2 and nystrom["output_error_mean"].nunique() == 2
    drawn = {}

    def capture(frame, x, panels, line, path, **kwargs):
        drawn["lines"] = set(frame[line])
        return path

    monkeypatch.setattr(plots, "loglog_panels", capture)
    plots.error_vs_budget(pooled, tmp_path / "e.png")
    assert {"nystrom (pinv_iterations=1)", "nystrom (pinv_iterations=8)"} <= drawn["lines"]


def test_default_settings_keep_the_plain_labels(tmp_path: Path) -> None:
    df = run(tmp_path, "budgets=[8]", "methods=[nystrom,nystrom_random,linformer]")
    assert set(df.method) == {"nystrom", "nystrom_random", "linformer", "uniform", "svd"}
