"""`nys bench` measurement: memory against known allocation sizes, OOM/timeout marking, table."""

from __future__ import annotations

import pandas as pd
from rich.console import Console

from nyscli.experiments.bench import render, run_point

SPEC = {
    "batch_size": 1,
    "hidden": 128,
    "num_heads": 8,
    "scope": "core",
    "mode": "forward",
    "dtype": "fp32",
    "device": "cpu",
    "warmup": 1,
    "repeats": 2,
    "min_repeats": 1,
    "time_budget_s": 1.0,
    "seed": 0,
    "threads": 1,
    "memory_limit_mb": None,
}


def test_cpu_peak_memory_matches_the_n_by_n_matrices_naive_softmax_allocates():
    """softmax_naive holds the scores and the probabilities, two (8, 1024, 1024) fp32 matrices
    (32 MiB each), at once; Nyström-32 never forms anything n x n."""
    n, heads = 1024, 8
    matrix_mb = heads * n * n * 4 / 2**20
    naive = run_point({**SPEC, "attention": {"name": "softmax_naive"}, "seq_len": n}, 120)
    nystrom = run_point(
        {**SPEC, "attention": {"name": "nystrom", "num_landmarks": 32}, "seq_len": n}, 120
    )
    assert naive["status"] == "ok" and nystrom["status"] == "ok"
    assert 2 * matrix_mb * 0.95 <= naive["peak_mb"] <= 3 * matrix_mb * 1.2
    assert nystrom["peak_mb"] < 0.1 * naive["peak_mb"]
    assert naive["time_ms"] > 0 and naive["repeats"] >= 1


def test_point_that_cannot_allocate_is_marked_oom():
    # 12 x 16384^2 fp32 scores need 12 GiB; the worker's address space is capped at 3 GiB.
    spec = {
        **SPEC,
        "num_heads": 12,
        "hidden": 768,
        "memory_limit_mb": 3000,
        "attention": {"name": "softmax_naive"},
        "seq_len": 16384,
    }
    assert run_point(spec, 120)["status"] == "oom"


def test_point_over_its_time_limit_is_marked_timeout():
    spec = {**SPEC, "attention": {"name": "softmax"}, "seq_len": 64}
    assert run_point(spec, 0.05)["status"] == "timeout"


def test_table_shows_values_and_ratios_to_the_baseline_row():
    rows = []
    for attention, times, mems in [
        ("softmax_naive", (10.0, 40.0), (100.0, 400.0)),
        ("nystrom-64", (5.0, 10.0), (10.0, 20.0)),
    ]:
        for n, t, m in zip((512, 1024), times, mems, strict=True):
            rows.append(
                {
                    "attention": attention,
                    "seq_len": n,
                    "time_ms": t,
                    "peak_mb": m,
                    "status": "ok",
                    "baseline": "softmax_naive",
                    "scope": "module",
                    "mode": "forward",
                    "dtype": "fp32",
                    "device": "cpu",
                    "batch_size": 1,
                    "hidden": 768,
                    "num_heads": 12,
                }
            )
    rows.append({**rows[-1], "attention": "softmax (SDPA)", "status": "oom", "time_ms": None})
    console = Console(width=200, record=True, color_system=None)
    console.print(render(pd.DataFrame(rows)))
    text = console.export_text()
    assert "20.0 (0.05×)" in text  # nystrom memory at n=1024: 20 / 400
    assert "10.0 (0.25×)" in text  # nystrom time at n=1024: 10 / 40
    assert "OOM" in text
