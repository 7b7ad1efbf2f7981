"""``nys report`` across runs: the CSV where --out says, one comparison figure per command
(its lines checked against the runs' own numbers), and labels that survive rich markup."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from nyscli.errors import UserInputError
from nyscli.experiments.approx_error.summary import summarise
from nyscli.experiments.report import command as report
from nyscli.experiments.report.sweep_summary import write_summary
from nyscli.output import curves, plots
from nyscli.output.runs import find_run_folders, load_run


@pytest.fixture
def figures(monkeypatch):
    """Every figure saved: {file name: [(panel y label, {line label: (x, y)})]}."""
    saved: dict[str, list[tuple[str, dict[str, tuple[list, list]]]]] = {}
    original = plots.save_figure

    def capture(fig, path, dpi=120):
        saved[Path(path).name] = [
            (ax.get_ylabel(), {ln.get_label(): (list(ln.get_xdata()), list(ln.get_ydata()))
                               for ln in ax.get_lines() if not ln.get_label().startswith("_")})
            for ax in fig.axes
        ]  # fmt: skip
        return original(fig, path, dpi)

    monkeypatch.setattr(plots, "save_figure", capture)
    monkeypatch.setattr(curves, "save_figure", capture)
    return saved


def fake_run(folder: Path, command: str, overrides: list[str], results, metrics=None):
    """A run folder as a command leaves it: .hydra/, results.csv and metrics.csv."""
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "config.yaml").write_text(f"command: {command}\n")
    (folder / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    results = pd.DataFrame([results]) if isinstance(results, dict) else results
    results.to_csv(folder / "results.csv", index=False)
    if metrics is not None:
        metrics.to_csv(folder / "metrics.csv", index=False)
    return load_run(folder)


def pretrain_metrics(seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = [{"step": s, "split": "train", "loss": 5.0 - s / 100} for s in (50, 100)]
    rows += [
        {"step": s, "split": "dev", "loss": 4.0, "mlm_accuracy": a, "sop_accuracy": b}
        for s, a, b in zip((50, 100), rng.random(2), rng.random(2), strict=True)
    ]
    return pd.DataFrame(rows)


def test_pretrain_runs_overlay_their_dev_curves_per_attention_in_percent(tmp_path, figures):
    """Each panel also draws its baseline (the most frequent token, SOP's majority class)
    from the runs' results.csv, in percent like the curves."""
    results = {"task": "mlm", "most_frequent_token_accuracy": 0.0509, "sop_majority_rate": 0.5195}
    runs = [
        fake_run(tmp_path / name, "pretrain", [f"attention={name}", "threads=1"], results,
                 pretrain_metrics(seed))
        for seed, name in enumerate(("softmax", "nystrom"))
    ]  # fmt: skip
    [png] = report.pretrain_figure(runs, report.aggregate(runs), tmp_path / "r_pretrain")
    assert png == tmp_path / "r_pretrain.png" and png.read_bytes()[:4] == b"\x89PNG"
    [(mlm_label, mlm), (sop_label, sop)] = figures["r_pretrain.png"]
    assert mlm_label == "dev MLM accuracy (%)" and sop_label == "dev SOP accuracy (%)"
    assert sorted(mlm) == ["attention=nystrom", "attention=softmax", "most frequent token"]
    np.testing.assert_allclose(mlm["most frequent token"][1], [5.09, 5.09])
    np.testing.assert_allclose(sop["majority class"][1], [51.95, 51.95])
    for seed, name in enumerate(("softmax", "nystrom")):
        dev = pretrain_metrics(seed).query("split == 'dev'")
        assert mlm[f"attention={name}"] == (list(dev.step), list(100 * dev.mlm_accuracy))
        assert sop[f"attention={name}"] == (list(dev.step), list(100 * dev.sop_accuracy))


def test_finetune_curves_are_one_figure_per_task(tmp_path, figures):
    """Runs written before the dev split had that name (``val``, and finetune's final full-dev
    row ``dev``) still draw their dev curve, without the final row joining it."""

    def metrics(acc: float) -> pd.DataFrame:
        return pd.DataFrame(
            [
                {"step": 2, "split": "train", "loss": 2.0, "accuracy": 0.1},
                {"step": 2, "split": "val", "loss": 2.1, "accuracy": acc},
                {"step": 2, "split": "dev", "loss": 2.1, "accuracy": 0.7},
                {"step": 2, "split": "test", "loss": 2.1, "accuracy": 0.9},
            ]
        )

    runs = [
        fake_run(tmp_path / f"{task}-{att}", "finetune", [f"task={task}", f"attention={att}"],
                 {"task": task, "majority_rate": rate}, metrics(acc))
        for task, att, acc, rate in [("sst2", "softmax", 0.3, 0.509),
                                     ("sst2", "nystrom", 0.4, 0.509),
                                     ("mrpc", "softmax", 0.5, 0.684)]
    ]  # fmt: skip
    written = report.learning_curves_figure(runs, report.aggregate(runs), tmp_path / "s_ft")
    assert [p.name for p in written] == ["s_ft_sst2.png", "s_ft_mrpc.png"]
    [(dev_label, dev), (_, train)] = figures["s_ft_sst2.png"]
    assert dev_label == "dev accuracy (%)"
    # Labelled by what differs within the task's figure; in percent.
    majority = dev.pop("majority class")  # the task's own baseline, dashed
    np.testing.assert_allclose(majority[1], [50.9, 50.9])
    assert dev == {"attention=softmax": ([2], [100 * 0.3]), "attention=nystrom": ([2], [100 * 0.4])}
    np.testing.assert_allclose(figures["s_ft_mrpc.png"][0][1]["majority class"][1], [68.4, 68.4])
    assert all(y == [2.0] for _, y in train.values())


def test_report_of_an_approx_error_sweep_writes_csv_and_error_vs_budget(run_nys, tmp_path):
    """Two real runs at budgets 4 and 8 (one with baselines=[uniform]): the table keeps the
    bracketed label, the CSV lands where --out says (its folder made), the PNG beside it has
    one point per run."""
    tiny = ["seq_len=64", "heads=2", "methods=[nystrom]", "plots=false", "threads=1"]
    for m, baselines in ((4, "baselines=[uniform]"), (8, "baselines=[]")):
        done = run_nys(
            "approx-error", *tiny, f"attention.num_landmarks={m}", baselines, f"hydra.run.dir=m{m}"
        )
        assert done.returncode == 0, done.stdout + done.stderr
    # --out's folder is made (it used to be refused unless it existed), but not for a
    # report that is refused.
    refused = run_nys("report", "no_such_run", "--out", "nested/out/r.csv")
    assert refused.returncode == 2 and not (tmp_path / "nested").exists()
    done = run_nys("report", "m4", "m8", "--out", "nested/out/r.csv")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "baselines=[uniform]" in done.stdout  # was printed as "baselines=" (rich markup)
    assert "wrote nested/out/r.csv" in done.stdout
    assert "wrote nested/out/r_approx_error.png" in done.stdout
    combined = pd.read_csv(tmp_path / "nested" / "out" / "r.csv")
    assert set(combined.job) == {
        "attention.num_landmarks=4 baselines=[uniform]",
        "attention.num_landmarks=8 baselines=[]",
    }
    assert (tmp_path / "nested/out/r_approx_error.png").read_bytes()[:4] == b"\x89PNG"


def test_approx_error_figure_pools_the_jobs_into_one_line_per_method(tmp_path, figures):
    def results(m: int, errors: list[float]) -> pd.DataFrame:
        return pd.DataFrame(
            {"source": "smooth", "seq_len": 64, "method": "nystrom", "budget": m,
             "metric": "output_error", "value": errors, "head": range(len(errors))}
        )  # fmt: skip

    runs = [
        fake_run(tmp_path / f"m{m}", "approx_error", [f"attention.num_landmarks={m}"],
                 results(m, errors))
        for m, errors in ((4, [0.4, 0.2]), (8, [0.1, 0.05]))
    ]  # fmt: skip
    df = report.aggregate(runs)
    report.approx_error_figure(runs, df, tmp_path / "r_approx_error")
    [(label, lines)] = figures["r_approx_error.png"]
    assert label == "mean ‖SV−ŜV‖/‖SV‖"  # output error
    x, y = lines["nystrom"]
    assert x == [4, 8] and y == pytest.approx([0.3, 0.075])
    assert summarise(df.drop(columns=["job", "run_dir"])).output_error_mean.tolist() == y


def test_bench_runs_share_the_time_and_memory_axes(tmp_path, figures):
    def row(att: str, n: int, ms: float) -> dict:
        return {"attention": att, "seq_len": n, "time_ms": ms, "peak_mb": ms / 2, "status": "ok"}

    runs = [
        fake_run(tmp_path / name, "bench", [f"dtype={dtype}"],
                 pd.DataFrame([row("nystrom-64", n, scale * n / 100) for n in (512, 1024)]))
        for name, dtype, scale in (("a", "fp32", 1.0), ("b", "bf16", 2.0))
    ]  # fmt: skip
    report.bench_figure(runs, report.aggregate(runs), tmp_path / "r_bench")
    [(time_label, time), (memory_label, memory)] = figures["r_bench.png"]
    assert "time" in time_label and "memory" in memory_label
    assert time["nystrom-64 [dtype=fp32]"] == ([512, 1024], [5.12, 10.24])
    assert time["nystrom-64 [dtype=bf16]"] == ([512, 1024], [10.24, 20.48])
    assert memory["nystrom-64 [dtype=bf16]"] == ([512, 1024], [5.12, 10.24])


def test_a_results_table_missing_its_commands_columns_is_one_line(tmp_path):
    """A folder that says command: bench but holds another table is named, not a KeyError."""
    fake_run(tmp_path / "odd", "bench", [], {"attention": "nystrom-64", "time_ms": 1.0})
    with pytest.raises(UserInputError) as raised:
        report.show_report([tmp_path])
    message = str(raised.value)
    assert str(tmp_path / "odd") in message and "'scope'" in message and "bench" in message


def test_a_results_table_read_as_attributes_missing_a_column_is_one_line(tmp_path):
    """An lra folder whose results.csv lacks 'task' (its table reads rows as r.task): one line
    naming the folder, not an AttributeError traceback."""
    fake_run(tmp_path / "odd", "lra", [], {"status": "ok"})
    with pytest.raises(UserInputError) as raised:
        report.show_report([tmp_path])
    message = str(raised.value)
    assert str(tmp_path / "odd") in message and "'task'" in message and "lra" in message


def test_a_binary_results_file_is_a_failed_run_not_a_table(tmp_path):
    """pandas reads NUL bytes as a column name: the run would count with nonsense; it is
    listed as failed, naming the file."""
    run = fake_run(tmp_path / "bin", "lra", [], {"status": "ok"})
    (run.path / "results.csv").write_bytes(b"\x00\xff" * 50)
    loaded = load_run(run.path)
    assert not loaded.ok and loaded.error.startswith("unreadable results.csv (ValueError)")


def test_runs_are_listed_in_numeric_order_in_summary_and_report(tmp_path):
    """A sweep of 12 jobs and two single runs named by their budget: job 10 used to come
    before job 2 (and ``m128`` before ``m16``), so tables listed 88 and 96 before 16."""

    def bench_run(folder: Path, m: int) -> None:
        row = {"attention": f"nystrom-{m}", "seq_len": 64, "time_ms": 1.0, "status": "ok"}
        fake_run(folder, "bench", [f"attention.num_landmarks={m}"], row)

    sweep = tmp_path / "sweep"
    for k in range(12):
        bench_run(sweep / str(k), 8 * (k + 1))
    write_summary(sweep)
    summary = pd.read_csv(sweep / "summary.csv")
    assert list(summary.attention) == [f"nystrom-{8 * (k + 1)}" for k in range(12)]
    for m in (128, 16):
        bench_run(tmp_path / "single" / f"m{m}", m)
    runs = [load_run(p) for p in find_run_folders([tmp_path / "single"])]
    assert list(report.aggregate(runs).attention) == ["nystrom-16", "nystrom-128"]


def test_bench_at_one_length_draws_one_bar_per_method(tmp_path, monkeypatch):
    """At one n a log-log line is a single dot and every method's dot sat in one column; the
    panels are bars instead, one per method, its length the value (none for out of memory)."""
    bars = {}
    original = plots.save_figure

    def capture(fig, path, dpi=120):
        bars[Path(path).name] = [
            (ax.get_xlabel(), [t.get_text() for t in ax.get_yticklabels()],
             [p.get_width() for p in ax.patches])
            for ax in fig.axes
        ]  # fmt: skip
        return original(fig, path, dpi)

    monkeypatch.setattr(plots, "save_figure", capture)
    rows = [("softmax (SDPA)", 2.0, 8.0), ("nystrom-64", 1.5, 3.0), ("linformer-256", 3.0, None)]
    df = pd.DataFrame(
        [{"attention": a, "seq_len": 1024, "time_ms": t, "peak_mb": m, "status": "ok"}
         for a, t, m in rows]
    )  # fmt: skip
    [run] = [fake_run(tmp_path / "one", "bench", [], df)]
    png = report.bench_figure([run], report.aggregate([run]), tmp_path / "r_bench")
    [(time_label, names, times), (memory_label, _, memory)] = bars["r_bench.png"]
    assert png == [tmp_path / "r_bench.png"] and "time" in time_label and "memory" in memory_label
    assert names == [a for a, _, _ in rows]
    assert times == [2.0, 1.5, 3.0]
    assert memory[:2] == [8.0, 3.0] and np.isnan(memory[2])  # out of memory: no bar


def test_a_saved_log_scale_figure_frees_what_its_callers_held(tmp_path: Path) -> None:
    # Log-scale tick labels go through mathtext, whose parser leaves exceptions in reference
    # cycles with the frames on the stack: without a collection after saving, the caller's
    # locals (approx-error's n x n maps) live on until Python's collector happens to run.
    class Held:  # stands for a large tensor in the caller's frame
        pass

    def draw(held: Held) -> None:
        # A title never parsed before in this process, so mathtext parses (and caches) it now.
        title = f"$m = {id(held)}\\,{tmp_path.name.replace('_', '')}$"
        df = pd.DataFrame({"m": [8, 16, 32], "error": [0.3, 0.2, 0.1], "line": "a"})
        plots.loglog_panels(df, "m", [("error", "error")], "line", tmp_path / "f.png", title)

    held = Held()
    alive = weakref.ref(held)
    gc.disable()  # only reference counting may free it
    try:
        draw(held)
        del held
        assert alive() is None
    finally:
        gc.enable()
    assert (tmp_path / "f.png").stat().st_size > 0


def test_overlaid_curves_share_one_legend_and_keep_each_runs_colour(tmp_path, monkeypatch):
    """Labels wider than a panel (a run's differing overrides) went into a legend inside each
    panel and squeezed the plots; now one legend under them lists every run and baseline, and
    a run missing from a panel does not shift the others' colours."""
    seen = {}

    def capture(fig, path, dpi=120):
        seen["fig"] = fig
        return plots.save_figure(fig, path, dpi)

    monkeypatch.setattr(curves, "save_figure", capture)
    long = "softmax (SDPA)+drop0.1 trainer.planned_steps=1200 trainer.eval_every=100 " * 2
    dev_only = pd.DataFrame({"step": [10, 20], "split": "dev", "accuracy": [0.5, 0.6]})
    both = pd.concat(
        [dev_only, pd.DataFrame({"step": [10, 20], "split": "train", "loss": [0.7, 0.6]})]
    )
    panels = [("train", "loss", "train loss"), ("dev", "accuracy", "dev accuracy")]
    path = curves.overlaid_curves(
        {"a": dev_only, long: both}, panels, tmp_path / "c.png", "t", {"accuracy": (0.5, "rule")}
    )
    assert path.read_bytes()[:4] == b"\x89PNG"
    fig = seen["fig"]
    assert all(ax.get_legend() is None for ax in fig.axes)
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == [long, "a", "rule"]
    loss_ax, acc_ax = fig.axes
    colour = {ln.get_label(): ln.get_color() for ln in acc_ax.get_lines()}
    first, second = (plots.row_style(i)["color"] for i in range(2))
    assert colour == {"a": first, long: second, "rule": "grey"}
    assert [ln.get_color() for ln in loss_ax.get_lines()] == [second]


def test_an_approx_error_sweeps_jobs_are_listed_in_natural_order(tmp_path, capsys):
    """Jobs 0 and 1 of a sweep over m = 16, 128: the folders came in natural order, but the
    table's rows were sorted by their job text, "...=128" before "...=16"."""
    for job, m in enumerate((16, 128)):
        rows = pd.DataFrame(
            {"source": "smooth", "seq_len": 64, "head_dim": 64, "layer": 0, "sequence": 0,
             "head": [0, 1], "n": 64, "method": "nystrom", "budget": m,
             "metric": "output_error", "value": [0.2, 0.1], "scale": 1.0,
             "correlation_length": 64.0, "dtype": "fp64", "pinv": "iterative",
             "pinv_iterations": 6, "pinv_tolerance": None, "seed": 0,
             "budget_unit": "landmarks"}
        )  # fmt: skip
        fake_run(tmp_path / "sweep" / str(job), "approx_error",
                 [f"attention.num_landmarks={m}"], rows)  # fmt: skip
    runs = [load_run(p) for p in find_run_folders([tmp_path / "sweep"])]
    jobs = ["attention.num_landmarks=16", "attention.num_landmarks=128"]
    assert list(summarise(report.aggregate(runs)).job) == jobs
    capsys.readouterr()
    report.show_report([tmp_path / "sweep"])
    shown = capsys.readouterr().out
    assert jobs[0] in shown and shown.index(jobs[0]) < shown.index(jobs[1])


def test_a_binary_metrics_file_leaves_out_one_curve_not_the_report(tmp_path, figures, capsys):
    """Random bytes in one run's metrics.csv were a 110-line UnicodeDecodeError that hid
    every other run; now that run's curve is left out with one line naming the file."""
    metrics = pd.DataFrame(
        [
            {"step": 2, "split": "train", "loss": 2.0, "accuracy": 0.1},
            {"step": 2, "split": "dev", "loss": 2.1, "accuracy": 0.6},
        ]
    )
    runs = [
        fake_run(tmp_path / att, "finetune", ["task=sst2", f"attention={att}"],
                 {"task": "sst2", "majority_rate": 0.509}, metrics)
        for att in ("softmax", "nystrom")
    ]  # fmt: skip
    broken = runs[1].path / "metrics.csv"
    broken.write_bytes(bytes(range(128, 256)) * 3)
    written = report.learning_curves_figure(runs, report.aggregate(runs), tmp_path / "f")
    assert [p.name for p in written] == ["f_sst2.png"]
    [(_, dev), _] = figures["f_sst2.png"]
    assert [label for label in dev if label.startswith("attention=")] == ["attention=softmax"]
    said = capsys.readouterr().out
    assert f"warning: {broken} cannot be read (UnicodeDecodeError)" in " ".join(said.split())


def test_a_binary_error_file_still_names_a_failed_run(tmp_path):
    run = fake_run(tmp_path / "bin", "lra", [], {"status": "ok"})
    (run.path / "results.csv").unlink()
    (run.path / "error.txt").write_bytes(b"\xff\xfe boom\n")
    loaded = load_run(run.path)
    assert not loaded.ok and "boom" in loaded.error


def test_one_outlier_bar_runs_to_the_edge_and_a_long_title_is_wrapped(tmp_path, monkeypatch):
    # approx-error source=minilm at one budget: one head's exact pinv blew up (1.9e7) and the
    # linear axis made every other bar vanish; the two-line title was clipped.
    seen = {}
    original = plots.save_figure

    def capture(fig, path, dpi=120):
        (ax,) = fig.axes
        seen.update(
            xlim=ax.get_xlim(),
            widths=[p.get_width() for p in ax.patches],
            texts=[t.get_text() for t in ax.texts],
            title=fig._suptitle.get_text(),
        )
        return original(fig, path, dpi)

    monkeypatch.setattr(plots, "save_figure", capture)
    df = pd.DataFrame(
        {"budget": 64, "line": ["nystrom", "nystrom, exact pinv", "linformer"],
         "err": [0.12, 1.92e7, 0.3]}
    )  # fmt: skip
    title = "source: minilm, n=512\n" + "rivals run untrained (random projections); " * 4
    plots.bar_panels(df, "budget", [("err", "mean error")], "line", tmp_path / "e.png", title)
    assert seen["xlim"] == (0.0, pytest.approx(0.3 * 1.2))  # the others' scale
    assert seen["widths"] == [0.12, 0.3, 0.3]  # the outlier's bar to the edge
    assert "▶ 1.92e+07 " in seen["texts"] and " 0.12" in seen["texts"]
    assert max(len(line) for line in seen["title"].splitlines()) <= 11 * 5.5
    assert (tmp_path / "e.png").stat().st_size > 0
