"""`nys bench` measurement: memory against known allocation sizes, OOM/timeout marking, table."""

from __future__ import annotations

import io

import pandas as pd
import pytest
import torch
from rich.console import Console

from nyscli.experiments.bench import worker as bench_worker
from nyscli.experiments.bench.command import render
from nyscli.experiments.bench.rounds import busy_hint, measure_interleaved
from nyscli.output.env import collect_env


def run_point(spec, timeout_s):
    """One point alone through the interleaved path (a one-row round robin)."""
    return measure_interleaved([spec], timeout_s, noise_threshold=10.0)[0]


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


FRAGMENTED_HEAP = """
import torch
from nyscli.experiments.bench.memory import warm_peak_mb

MIB = 2**18  # float32 elements in one MiB


def call():
    torch.empty(16 * MIB).fill_(1)  # freed at once
    first = torch.empty(8 * MIB).fill_(1)
    pin = torch.empty(256).fill_(1)  # a small block above it, so its hole is not trimmed
    del first
    second = torch.empty(12 * MIB).fill_(1)  # does not fit the 8 MiB hole
    return second, pin


print(warm_peak_mb(call, torch.device("cpu"), warmup=1))
"""


def test_cpu_peak_memory_counts_tensors_alive_together_not_heap_holes():
    """At most 16 MiB is alive at once. With glibc's default heap, which keeps freed blocks
    and hands them out again, the same call read 24 MiB (five runs out of five)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", FRAGMENTED_HEAP], capture_output=True, text=True, check=True
    )
    assert 15.5 <= float(out.stdout) <= 18.0


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


def test_several_scopes_get_ratios_within_their_scope_and_the_module_overhead_row():
    times = {  # (attention, scope) -> ms at n = 1024
        ("softmax (SDPA)", "module"): 120.0,
        ("softmax (SDPA)", "projections"): 40.0,
        ("softmax (SDPA)", "core"): 80.0,
        ("nystrom-64", "module"): 66.0,
        ("nystrom-64", "projections"): 40.0,
        ("nystrom-64", "core"): 20.0,
    }
    context = {k: v for k, v in SPEC.items() if k not in ("scope", "memory_limit_mb")}
    rows = [
        {
            **context,
            "attention": attention,
            "method": attention.split(" ")[0].split("-")[0],
            "scope": scope,
            "seq_len": 1024,
            "time_ms": ms,
            "peak_mb": 1.0,
            "status": "ok",
            "baseline": "softmax",
        }
        for (attention, scope), ms in times.items()
    ]
    console = Console(width=200, record=True, color_system=None)
    console.print(render(pd.DataFrame(rows)))
    lines = console.export_text().split("Time (ms")[1].splitlines()

    def line(start):
        [found] = [x for x in lines if x.strip("│ ").startswith(start)]
        return found

    assert "20.0 (0.25×)" in line("nystrom-64 [core]")  # 20 / softmax's core 80, not its module
    assert "66.0 (0.55×)" in line("nystrom-64 [module]")
    assert "40.0 (1×)" in line("nystrom-64 [projections]")
    assert "1.10×" in line("nystrom-64: module / (projections + core)")  # 66 / (40 + 20)
    assert "1.00×" in line("softmax (SDPA): module / (projections + core)")


class FakeWorker:
    """Stands in for a bench worker process: scripted times, and a shared log of call order."""

    def __init__(self, spec, timeout_s, log, times):
        self.name = spec["attention"]["name"]
        self.log = log
        self.times = iter(times[self.name])

    def ready(self):
        return {"peak_mb": 1.0, "first_ms": {"slow": 1000.0}.get(self.name, 100.0)}

    def time_one(self):
        self.log.append(self.name)
        return next(self.times)

    def close(self, kill=False):
        pass


def fake_specs(*names):
    return [
        {"attention": {"name": name}, "time_budget_s": 4.0, "repeats": 8, "min_repeats": 2}
        for name in names
    ]


def test_rows_are_timed_in_turn_and_a_slow_rows_calls_spread_over_the_rounds():
    log = []
    times = {"a": [10.0] * 8, "b": [20.0] * 8, "slow": [500.0] * 8}
    results = measure_interleaved(
        fake_specs("a", "b", "slow"),
        60,
        0.2,
        start=lambda spec, timeout: FakeWorker(spec, timeout, log, times),
    )
    # a and b: 4 s / 100 ms -> 8 calls (the cap); slow: 4 s / 1 s -> 4 calls, every other round.
    assert log == ["a", "b", "a", "b", "slow"] * 4
    assert [r["repeats"] for r in results] == [8, 8, 4]
    assert [r["time_ms"] for r in results] == [10.0, 20.0, 500.0]
    assert not any(r["noisy"] or r["remeasured"] for r in results)


def test_a_noisy_point_is_timed_again_and_marked_if_it_stays_noisy():
    log = []
    burst = [10.0, 10.0, 10.0, 40.0, 40.0, 10.0, 40.0, 10.0]  # IQR/median 3 on the first pass
    times = {"calm": burst + [10.0] * 8, "stormy": burst * 3}  # stormy stays noisy
    counted = []
    calm, stormy = measure_interleaved(
        fake_specs("calm", "stormy"),
        60,
        0.2,
        on_round=lambda r, total: counted.append((r, total)),
        start=lambda spec, timeout: FakeWorker(spec, timeout, log, times),
    )
    # The progress count never runs back: the retry's rounds follow the first pass's.
    assert [r for r, _ in counted] == list(range(1, len(counted) + 1))
    assert counted[0][1] < counted[-1][1] == counted[-1][0]
    assert calm["remeasured"] and not calm["noisy"] and calm["time_ms"] == 10.0
    assert stormy["remeasured"] and stormy["noisy"] and stormy["spread"] > 0.2
    assert log[16:18] == ["calm", "stormy"]  # the retry is interleaved too
    # calm settled on its first retry; stormy was timed again twice, then marked noisy
    assert log.count("calm") == 16 and log.count("stormy") == 24
    df = pd.DataFrame(
        [
            {**SPEC, **r, "attention": name, "seq_len": 64, "baseline": "calm", "hidden": 768}
            for name, r in (("calm", calm), ("stormy", stormy))
        ]
    )
    console = Console(width=200, record=True, color_system=None)
    console.print(render(df))
    text = console.export_text()
    assert "~ = noisy" in text and f"{stormy['time_ms']:.1f}~" in text
    time_rows = text.split("Time (ms")[1].splitlines()
    assert [line for line in time_rows if "calm" in line and "~" not in line]
    assert [line for line in time_rows if "stormy" in line and "10.0~" in line]


def test_busy_hint_names_threads_when_load_exceeds_free_cores(monkeypatch):
    monkeypatch.setattr("os.getloadavg", lambda: (7.5, 0.0, 0.0))
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1})
    hint = busy_hint(2)
    assert hint is not None and "7.5" in hint and "threads=1" in hint
    monkeypatch.setattr("os.getloadavg", lambda: (0.5, 0.0, 0.0))
    assert busy_hint(1) is None
    assert busy_hint(2) is None  # the decaying average of a job that just ended
    monkeypatch.setattr("os.getloadavg", lambda: (1.1, 0.0, 0.0))
    assert busy_hint(2) is not None and busy_hint(1) is None
    monkeypatch.setattr("os.getloadavg", lambda: (1.6, 0.0, 0.0))
    assert busy_hint(1) is not None


def test_real_workers_measure_two_rows_interleaved():
    specs = [
        {**SPEC, "attention": {"name": name}, "seq_len": 128, "time_budget_s": 0.2}
        for name in ("softmax", "softmax_naive")
    ]
    results = measure_interleaved(specs, 120, 0.5)
    for result in results:
        assert result["status"] == "ok" and result["time_ms"] > 0 and result["repeats"] == 2
    assert results[1]["peak_mb"] > results[0]["peak_mb"]  # naive writes the n x n matrices


def test_env_records_the_threads_and_device_used():
    env = collect_env("auto", 1)
    assert env["torch_threads"] == 1
    assert env["device"] == ("cuda" if env["cuda_available"] else "cpu")


@pytest.mark.parametrize(
    ("first_ms", "calls_per_sample"),
    [(bench_worker.REWARM_BELOW_MS / 2, 2), (bench_worker.REWARM_BELOW_MS * 2, 1)],
)
def test_short_calls_get_an_untimed_call_before_each_timed_one(
    monkeypatch, capsys, first_ms, calls_per_sample
):
    """serve(): under REWARM_BELOW_MS each sample runs the call twice (once untimed)."""
    calls = []
    ready = {"peak_mb": 1.0, "first_ms": first_ms, "cuda_graph": False}
    prepared = (lambda: calls.append(1), torch.device("cpu"), ready)
    monkeypatch.setattr(bench_worker, "prepare", lambda spec: prepared)
    monkeypatch.setattr(bench_worker.sys, "stdin", io.StringIO("time\ntime\ntime\nstop\n"))
    bench_worker.serve({})
    assert capsys.readouterr().out.count(bench_worker.TIME_PREFIX) == 3
    assert len(calls) == 3 * calls_per_sample


def test_train_mode_backpropagates_a_dense_upstream_gradient():
    """build_call(train): backward of <out, g> for one fixed random g, not of out.sum()
    (whose broadcast ones the kernels would first copy out)."""
    spec = {**SPEC, "mode": "train", "seq_len": 16, "attention": {"name": "softmax_naive"}}
    call = bench_worker.build_call(spec, torch.device("cpu"))
    upstream = []
    hook = torch.nn.modules.module.register_module_full_backward_hook(
        lambda module, grad_in, grad_out: upstream.append(grad_out[0].clone())
    )
    try:
        call()
        call()
    finally:
        hook.remove()
    assert len(upstream) == 2
    torch.testing.assert_close(upstream[0], upstream[1], rtol=0, atol=0)  # the same g
    assert upstream[0].std() > 0.5  # standard normal, not the ones of sum()


def test_a_row_whose_core_replays_a_cuda_graph_says_so():
    # The time of a graph's replay on the same inputs is not an eager call's: the row and
    # its log line say which it was (a CPU has no graphs, so the flag is set by hand here).
    from nyscli.experiments.bench.command import _describe

    spec = {**SPEC, "attention": {"name": "nystrom", "num_landmarks": 8}, "seq_len": 64}
    call = bench_worker.build_call(spec, torch.device("cpu"))
    assert not bench_worker.replays_graphs(call.model)
    call.model.graphs.graphs[("a layout",)] = (None, None)
    assert bench_worker.replays_graphs(call.model)
    module = bench_worker.build_call({**spec, "scope": "module"}, torch.device("cpu")).model
    assert not bench_worker.replays_graphs(module)
    result = {"status": "ok", "time_ms": 1.0, "repeats": 3, "spread": 0.01, "peak_mb": 2.0}
    assert "CUDA graph" not in _describe(result)
    assert "a CUDA graph replayed on the same inputs" in _describe({**result, "cuda_graph": True})
    (row,) = measure_interleaved([{**spec, "time_budget_s": 0.2}], 120, 9.0)
    assert row["status"] == "ok" and row["cuda_graph"] is False


@pytest.mark.parametrize(
    ("attention", "scope", "mode", "path"),
    [
        ({"name": "nystrom", "num_landmarks": 16}, "core", "forward", "head-groups"),
        ({"name": "nystrom", "num_landmarks": 16}, "core", "train", "fused-cpu"),
        (
            {"name": "nystrom", "num_landmarks": 16, "landmarks": "random"},
            "module",
            "train",
            "torch",
        ),
        ({"name": "nystrom", "num_landmarks": 128}, "core", "forward", "exact"),  # m >= n
        ({"name": "softmax"}, "module", "forward", "sdpa"),
        ({"name": "softmax_naive"}, "core", "forward", "torch"),
        ({"name": "softmax"}, "projections", "forward", ""),  # no core to ask
    ],
)
def test_each_row_names_the_path_its_core_took(attention, scope, mode, path):
    spec = {**SPEC, "attention": attention, "scope": scope, "mode": mode, "seq_len": 64}
    _, _, ready = bench_worker.prepare({**spec, "warmup": 1})
    assert ready["path"] == path
    env = collect_env("cpu")
    assert env["gates"]["checked"] == ["graph", "hybrid-16-bit", "hybrid-32-bit", "inference"]
    assert set(env["gates"]) == {"checked", "hybrid_launch", "products", "triton", "interpreting"}


@pytest.mark.parametrize(
    ("scope", "dtype", "handed"),
    [
        ("core", "bf16", "bfloat16"),  # q, k, v in the compute dtype, as projections hand them
        ("core", "fp32", "float32"),
        ("module", "bf16", "bfloat16"),  # the projections under autocast make bf16
    ],
)
def test_the_core_is_handed_q_k_v_in_the_compute_dtype(scope, dtype, handed):
    spec = {**SPEC, "attention": {"name": "softmax"}, "scope": scope, "dtype": dtype}
    _, _, ready = bench_worker.prepare({**spec, "seq_len": 32, "warmup": 1})
    assert ready["input_dtype"] == handed and ready["path"] == "sdpa"
    (row,) = measure_interleaved([{**spec, "seq_len": 32, "time_budget_s": 0.2}], 120, 9.0)
    assert row["status"] == "ok" and row["input_dtype"] == handed


def test_a_points_time_is_the_lower_quartile_with_the_median_and_spread_beside_it():
    stats = bench_worker.summarize([8.0, 1.0, 7.0, 2.0, 6.0, 3.0, 5.0, 4.0])
    assert stats == {
        "time_ms": 2.75,  # 1 + (8 - 1) / 4, numpy's default ("linear") quantile
        "time_ms_median": 4.5,
        "time_ms_min": 1.0,
        "time_ms_q3": 6.25,
        "time_ms_iqr": 3.5,
        "repeats": 8,
    }
    assert bench_worker.summarize([3.0])["time_ms"] == 3.0


@pytest.mark.parametrize(
    ("nystrom_quartiles", "shown"),
    [((9.0, 12.0), "(≈1×)"), ((4.0, 5.0), "(0.4×)"), ((10.5, 10.6), "(1.05×)")],
)
def test_a_ratio_whose_quartiles_straddle_one_is_labelled_so(nystrom_quartiles, shown):
    low, high = nystrom_quartiles
    base = {
        "seq_len": 512, "peak_mb": 1.0, "status": "ok", "baseline": "softmax (SDPA)",
        "scope": "core", "mode": "forward", "dtype": "fp32", "device": "cpu", "batch_size": 1,
        "hidden": 768, "num_heads": 12,
    }  # fmt: skip
    rows = [
        {**base, "attention": "softmax (SDPA)", "time_ms": 10.0, "time_ms_q3": 10.4},
        {**base, "attention": "nystrom-64", "time_ms": low, "time_ms_q3": high},
    ]
    console = Console(width=200, record=True, color_system=None)
    console.print(render(pd.DataFrame(rows)))
    (line,) = [x for x in console.export_text().split("Time (ms")[1].splitlines() if "nystrom" in x]
    assert shown in line and ("≈" in line) == (shown == "(≈1×)")
