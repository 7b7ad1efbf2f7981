"""``nys report`` with seeds as a dimension: runs that differ only in their seed are one row of
means and one row of spread (mean ± std with ddof 1, n, the seeds), checked against NumPy;
``--per-run`` shows every run as before."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from nyscli.experiments.report.command import show_report

ACCURACY = {("softmax", 0): 0.31, ("softmax", 1): 0.35, ("softmax", 2): 0.40,
            ("nystrom", 0): 0.36, ("nystrom", 1): 0.33, ("nystrom", 2): 0.37}  # fmt: skip


def lra_run(folder: Path, attention: str, seed: int, threads: int) -> None:
    """A run folder of nys lra as far as the report reads it: config, overrides, results."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text(
        f"command: lra\nseed: {seed}\nthreads: {threads}\nattention:\n  name: {attention}\n"
        "trainer:\n  max_steps: 3\n"
    )
    overrides = [f"attention={attention}", f"seed={seed}", f"threads={threads}"]
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    results = {
        "task": "listops", "dataset": "ListOps", "attention": attention, "seed": seed,
        "test_accuracy": ACCURACY[attention, seed], "best_dev_accuracy": 0.3 + seed / 100,
        "rule_accuracy": 0.36, "trivial_rule": "outer operator", "test_loss": 2.0,
        "majority_rate": 0.175, "chance_rate": 0.1, "steps": 3, "max_steps": 3,
        "wall_s": 1.0 + seed, "tokens_per_s": 1000.0 * (seed + 1), "peak_mb": 500.0,
        "test_examples": 16, "max_len": 40, "status": "ok",
    }  # fmt: skip
    pd.DataFrame([results]).to_csv(folder / "results.csv", index=False)


def sweep(tmp_path: Path) -> Path:
    # threads differs too: it never changes a result, so it does not split a group.
    for job, (attention, seed) in enumerate(ACCURACY):
        lra_run(tmp_path / "sweep" / str(job), attention, seed, threads=1 + job % 2)
    return tmp_path / "sweep"


def test_seeds_pool_into_mean_and_std_equal_to_numpys(tmp_path, capsys):
    folder = sweep(tmp_path)
    out = tmp_path / "report.csv"
    show_report([folder], out)
    shown = " ".join(capsys.readouterr().out.split())
    seeds = pd.read_csv(tmp_path / "report_seeds.csv")
    accuracy = seeds[seeds.result == "test_accuracy"].set_index("group")
    assert list(accuracy.index) == ["attention=softmax", "attention=nystrom"]
    for attention in ("softmax", "nystrom"):
        values = np.array([ACCURACY[attention, s] for s in range(3)])
        row = accuracy.loc[f"attention={attention}"]
        assert row.n == 3 and row.seeds == "0 1 2"
        assert np.isclose(row["mean"], values.mean()) and np.isclose(row["std"], values.std(ddof=1))
        assert f"attention={attention}" in shown
        assert f"{values.mean():.4g} ± {values.std(ddof=1):.2g} (n = 3)" in shown
    assert "std with ddof = 1" in shown
    # Two rows of means in the command's own table, then the stacked per-run CSV as before.
    assert len(pd.read_csv(out)) == 6


def test_per_run_shows_every_run_and_writes_no_spread(tmp_path, capsys):
    folder = sweep(tmp_path)
    show_report([folder], tmp_path / "report.csv", per_run=True)
    shown = capsys.readouterr().out
    assert "mean ± std" not in shown and not (tmp_path / "report_seeds.csv").exists()


def test_one_run_per_setting_says_n_1_without_a_spread(tmp_path, capsys):
    lra_run(tmp_path / "a", "softmax", 0, 1)
    lra_run(tmp_path / "b", "softmax", 1, 1)
    lra_run(tmp_path / "c", "nystrom", 0, 1)
    show_report([tmp_path], tmp_path / "r.csv")
    shown = " ".join(capsys.readouterr().out.split())
    assert "0.36 (n = 1)" in shown and "0.36 ±" not in shown
    assert "0.33 ± 0.028 (n = 2)" in shown


def test_learning_curves_draw_each_settings_mean_with_a_min_max_band(tmp_path, monkeypatch):
    from nyscli.experiments.report import command as report
    from nyscli.output import curves
    from nyscli.output.runs import find_run_folders, load_run

    folder = sweep(tmp_path)
    for job, (attention, seed) in enumerate(ACCURACY):  # finetune-style curves per run
        rows = [{"step": s, "split": "dev", "accuracy": ACCURACY[attention, seed] + s / 100,
                 "loss": 1.0} for s in (1, 2)]  # fmt: skip
        rows += [{"step": s, "split": "train", "loss": 2.0 - s / 10 + seed / 100} for s in (1, 2)]
        pd.DataFrame(rows).to_csv(folder / str(job) / "metrics.csv", index=False)
    drawn = {}
    original = curves.save_figure

    def capture(fig, path, dpi=120):
        dev = fig.axes[0]
        drawn["lines"] = {ln.get_label(): list(ln.get_ydata()) for ln in dev.get_lines()}
        drawn["bands"] = [c.get_paths()[0].vertices[:, 1] for c in dev.collections]
        return original(fig, path, dpi)

    monkeypatch.setattr(curves, "save_figure", capture)
    runs = [load_run(p) for p in find_run_folders([folder])]
    report.learning_curves_figure(runs, report.aggregate(runs), tmp_path / "f")
    label = "attention=softmax (mean of 3 seeds; band: min-max)"
    softmax = np.array([ACCURACY["softmax", s] for s in range(3)])
    np.testing.assert_allclose(
        drawn["lines"][label], 100 * (softmax.mean() + np.array([0.01, 0.02]))
    )
    assert len(drawn["bands"]) == 2  # one band per setting
    band = drawn["bands"][0]
    assert np.isclose(band.min(), 100 * (softmax.min() + 0.01))
    assert np.isclose(band.max(), 100 * (softmax.max() + 0.02))
    report.learning_curves_figure(runs, report.aggregate(runs), tmp_path / "g", per_run=True)
    assert len(drawn["lines"]) >= 6 and not drawn["bands"]  # every run its own line


def test_table3_shows_mean_and_std_beside_the_papers_number(tmp_path, capsys):
    show_report([sweep(tmp_path)], tmp_path / "report.csv")
    shown = capsys.readouterr().out
    for attention in ("softmax", "nystrom"):
        values = 100 * np.array([ACCURACY[attention, s] for s in range(3)])
        assert f"{values.mean():.2f} ± {values.std(ddof=1):.2f} (n = 3)" in shown
    assert "paper: Transformer" in shown and "37.10" in shown


def test_table2_cells_of_pooled_seeds_show_mean_and_std():
    from rich.console import Console

    from nyscli.experiments.finetune.command import table2

    pooled = pd.DataFrame(
        [
            {"task": "sst2", "init": "minilm", "attention": "softmax", "max_len": 128,
             "dev_accuracy": 0.9, "dev_accuracy_std": 0.012, "n": 3},
            {"task": "mrpc", "init": "minilm", "attention": "softmax", "max_len": 128,
             "dev_f1": 0.85, "dev_f1_std": 0.02, "dev_accuracy": 0.8, "n": 3},
            {"task": "sst2", "init": "minilm", "attention": "nystrom", "max_len": 128,
             "dev_accuracy": 0.88, "dev_accuracy_std": float("nan"), "n": 1},
        ]
    )  # fmt: skip
    console = Console(width=250, record=True)
    console.print(table2(pooled))
    text = console.export_text()
    assert "90.00 ± 1.20 (n = 3)" in text and "85.00 ± 2.00 (n = 3)" in text
    assert "88.00" in text and "88.00 ±" not in text  # one run: no spread


def test_a_bench_sweep_over_seeds_keeps_how_it_ran_and_reports(nys_here, tmp_path):
    # threads and device are results.csv columns of nys bench: pooling two seeds kept them as
    # they were, not replaced by the seed list ("0 1"), which the bench's table then failed on.
    import warnings

    args = ["bench", "--seq-len", "16", "attention_set=none", "attention_rows=[{name:softmax}]"]
    args += ["repeats=1", "min_repeats=1", "warmup=0", "threads=1", "-m", "seed=0,1"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a callback's failure is a warning in Hydra
        done = nys_here(*args)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "cpu, batch 1" in " ".join(done.stdout.split()) and "1 thread(s)" in done.stdout
    (summary,) = (tmp_path / "outputs" / "bench" / "multirun").glob("*/summary.csv")
    assert set(pd.read_csv(summary).threads) == {1}


def test_a_stopped_run_continued_by_one_that_finished_is_not_failed(tmp_path, capsys):
    # nys lra ... interrupted, then `--resume true`: the continuation names its origin in
    # resumed_from.txt and has the results; `nys report outputs/` counted the origin failed.
    origin, continuation, broken = (tmp_path / "runs" / name for name in ("a", "b", "c"))
    lra_run(origin, "softmax", 0, threads=1)
    (origin / "results.csv").unlink()
    (origin / "error.txt").write_text("interrupted at step 900; resume with: nys lra ...\n")
    lra_run(continuation, "softmax", 0, threads=1)
    (continuation / "resumed_from.txt").write_text(f"{origin}\n")
    lra_run(broken, "nystrom", 0, threads=1)
    (broken / "results.csv").unlink()
    (broken / "error.txt").write_text("error: out of memory\n")
    show_report([tmp_path / "runs"])
    shown = capsys.readouterr().out
    assert "1 of 3 runs have results (1 stopped and continued by a run that finished)" in shown
    assert f"continued {origin}: finished as {continuation}" in " ".join(shown.split())
    failed = [line for line in shown.splitlines() if line.startswith("failed")]
    assert len(failed) == 1 and "out of memory" in failed[0]
