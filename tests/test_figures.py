"""Figures a person can read at a glance, checked on the drawn matplotlib artists: legends
outside the data, a colour of its own per row, the SVD reference not squashing the methods,
bars from zero, the reported model marked at its step beside the majority-class line."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from nyscli.data.subsets import ClassBalance
from nyscli.experiments.approx_error.plots import error_vs_budget
from nyscli.experiments.report import command as report
from nyscli.experiments.training import write_learning_curve
from nyscli.output import curves, plots
from nyscli.train.metrics import METRICS_FILE

from .test_report import fake_run

BENCH_ROWS = ("softmax_naive", "softmax (SDPA)", "linformer-256", "longformer-257",
              "nystrom-64", "nystrom-32")  # fmt: skip


@pytest.fixture
def drawn(monkeypatch):
    """Every figure as saved, laid out: {file name: figure} (closed after the test)."""
    figures = {}

    def keep(fig, path, dpi=120):
        fig.canvas.draw()  # lays it out as savefig would: legend and panels in place
        figures[Path(path).name] = fig
        return Path(path)

    for module in (plots, curves):
        monkeypatch.setattr(module, "save_figure", keep)
    yield figures
    for fig in figures.values():
        plots.pyplot().close(fig)


def labelled(ax) -> list:
    return [line for line in ax.get_lines() if not line.get_label().startswith("_")]


def legends(fig) -> list:
    return [*fig.legends, *(ax.get_legend() for ax in fig.axes if ax.get_legend())]


def test_a_bench_sweeps_report_has_its_legend_outside_the_panels_and_a_colour_per_row(
    tmp_path, drawn
):
    """Three sweep jobs of six Table-1 rows: 18 legend entries covered the time panel, the
    colour cycle repeated after ten (naive and Nyström-64 both blue) and the memory panel had
    no legend. Now one legend, clear of both panels, names every line of each, and no two of
    the 18 rows share a colour (nor a colour and marker)."""
    runs = []
    for job, m in enumerate((32, 64, 128)):
        rows = [{"attention": a, "seq_len": n, "time_ms": (i + 1) * n / 100,
                 "peak_mb": (i + 2) * n / 50, "status": "ok"}
                for i, a in enumerate(BENCH_ROWS) for n in (256, 512, 1024)]  # fmt: skip
        overrides = [f"attention.num_landmarks={m}"]
        runs.append(fake_run(tmp_path / str(job), "bench", overrides, pd.DataFrame(rows)))
    report.bench_figure(runs, report.aggregate(runs), tmp_path / "r_bench")
    fig = drawn["r_bench.png"]
    [legend] = legends(fig)
    box = legend.get_window_extent()
    panels = fig.axes
    assert len(panels) == 2
    for ax in panels:
        assert not box.overlaps(ax.get_window_extent()), "the legend covers a panel's data"
        lines = labelled(ax)
        assert len(lines) == 18
        assert {ln.get_label() for ln in lines} <= {t.get_text() for t in legend.get_texts()}
        assert len({ln.get_color() for ln in lines}) == 18, "two rows share a colour"
    # A row keeps its look in both panels.
    time, memory = ([(ln.get_label(), ln.get_color(), ln.get_marker()) for ln in labelled(ax)]
                    for ax in panels)  # fmt: skip
    assert time == memory


def test_row_styles_never_repeat_a_colour_up_to_twenty_rows_nor_a_pair_for_many_more():
    styles = [plots.row_style(i) for i in range(180)]
    assert len({s["color"] for s in styles[:20]}) == 20
    assert len({(s["color"], s["marker"]) for s in styles}) == 180


def approx_rows(method: str, errors: dict[int, float]) -> list[dict]:
    return [
        {"source": "smooth", "seq_len": 512, "method": method, "budget": m,
         "metric": "output_error", "value": e, "head": 0}
        for m, e in errors.items()
    ]  # fmt: skip


def test_the_svd_reference_does_not_squash_the_methods_of_the_approx_error_plot(tmp_path, drawn):
    """The exact SVD's error falls to rounding (1e-15) while the methods stay above 1e-5: on
    one range they were pressed into the top of the panel. The y axis now spans the methods
    (and uniform); the SVD's points below it sit on the bottom edge, and its label says so."""
    budgets = (8, 16, 32, 64)
    rows = approx_rows("nystrom", dict(zip(budgets, (3e-2, 1e-3, 1e-4, 2e-5), strict=True)))
    rows += approx_rows("linformer", dict(zip(budgets, (3.0, 2.0, 1.0, 0.5), strict=True)))
    rows += approx_rows("svd", dict(zip(budgets, (1e-2, 1e-4, 1e-15, 1e-15), strict=True)))
    rows += approx_rows("uniform", {b: 0.6 for b in budgets})
    error_vs_budget(pd.DataFrame(rows), tmp_path / "e.png")
    fig = drawn["e.png"]
    [ax] = fig.axes
    low, high = ax.get_ylim()
    # The methods' four decades (2e-5 .. 3) fill the axis, with a margin, not nineteen.
    assert 1e-6 < low < 2e-5 and 3 < high < 10
    [svd] = [ln for ln in labelled(ax) if ln.get_label().startswith("svd")]
    assert "below the axis" in svd.get_label()
    assert list(svd.get_ydata()) == pytest.approx([1e-2, 1e-4, low, low])
    assert not any(box.overlaps(ax.get_window_extent()) for box in
                   (legend.get_window_extent() for legend in legends(fig)))  # fmt: skip
    lines = labelled(ax)
    assert len({ln.get_color() for ln in lines}) == len(lines) == 4


def test_bars_at_one_length_start_at_zero_on_a_linear_axis(tmp_path, drawn):
    """Bars on a log axis began at an arbitrary floor: a bar twice another's value was not
    twice as long. Lengths are now values, from zero."""
    df = pd.DataFrame([
        {"attention": a, "seq_len": 1024, "time_ms": t, "peak_mb": t / 2, "status": "ok"}
        for a, t in (("naive", 216.0), ("nystrom-64", 64.0))
    ])  # fmt: skip
    [run] = [fake_run(tmp_path / "one", "bench", [], df)]
    report.bench_figure([run], report.aggregate([run]), tmp_path / "r_bench")
    for ax in drawn["r_bench.png"].axes:
        assert ax.get_xscale() == "linear" and ax.get_xlim()[0] == 0
        assert all(bar.get_x() == 0 for bar in ax.patches)
    widths = [bar.get_width() for bar in drawn["r_bench.png"].axes[0].patches]
    assert widths == [216.0, 64.0]


def test_a_training_runs_curve_marks_the_reported_model_at_its_best_step(tmp_path, drawn):
    """A fine-tune whose dev accuracy peaked at step 2 of 10: "dev (best)" and test (the
    best-dev checkpoint's scores, logged after training) were drawn at step 10, as if the last
    model were reported, and no majority-class line showed what the curve has to beat."""
    dev = {2: 0.71, 4: 0.66, 6: 0.64, 8: 0.65, 10: 0.63}
    rows = [{"step": s, "split": "train", "loss": 0.7 - 0.02 * s} for s in range(1, 11)]
    rows += [{"step": s, "split": "dev", "loss": 0.5, "accuracy": a} for s, a in dev.items()]
    rows += [{"step": 10, "split": "dev (best)", "loss": 0.5, "accuracy": 0.71},
             {"step": 10, "split": "test", "loss": 0.5, "accuracy": 0.69}]  # fmt: skip
    pd.DataFrame(rows).to_csv(tmp_path / METRICS_FILE, index=False)
    best = max(dev, key=dev.get)  # the trainer's best step: the dev accuracy's argmax
    fit = SimpleNamespace(best_step=best)
    balance = ClassBalance.of(np.array([0] * 6 + [1] * 4), 2)  # 60% majority
    write_learning_curve(tmp_path, "sst2", fit.best_step, balance)
    fig = drawn[curves.LEARNING_CURVE_FILE]
    accuracy = next(ax for ax in fig.axes if ax.get_ylabel().startswith("accuracy"))
    lines = {ln.get_label(): ln for ln in labelled(accuracy)}
    assert list(lines["dev (best)"].get_xdata()) == [2] and list(lines["test"].get_xdata()) == [2]
    assert list(lines["dev (best)"].get_ydata()) == pytest.approx([71.0])
    majority = lines["majority class (dev)"]
    assert list(majority.get_ydata()) == pytest.approx([60.0, 60.0])
    assert lines["dev"].get_color() == lines["dev (best)"].get_color()
    # Without a best step (nothing to move them to) the rows stay where they were logged.
    curves.learning_curve(pd.read_csv(tmp_path / METRICS_FILE), tmp_path / "plain.png")
    [plain_accuracy] = [ax for ax in drawn["plain.png"].axes if "accuracy" in ax.get_ylabel()]
    plain = {ln.get_label(): list(ln.get_xdata()) for ln in labelled(plain_accuracy)}
    assert plain["dev (best)"] == [10] and "majority class (dev)" not in plain
