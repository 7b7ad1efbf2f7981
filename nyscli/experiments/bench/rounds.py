"""Interleaved timing for ``nys bench``: every row of one n timed in turn, noisy points retried.

Each (attention, n) point lives in its own ``bench_worker`` process (a fresh process,
so its peak-memory reading stays honest). Once every worker has warmed up and measured its
memory, the rows are timed round-robin, one call at a time, so a burst of load from another job
hits every row alike and the ratios between rows survive it. A point whose spread
(IQR / median) is above ``noise_threshold`` is timed again (interleaved with the other noisy
ones), up to RETRIES times; if it is still noisy it is marked ``noisy`` rather than printed as
if it were a result.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from nyscli.allocator import system_environ
from nyscli.experiments.bench.worker import READY_PREFIX, RESULT_PREFIX, TIME_PREFIX, summarize
from nyscli.train.resources import usable_cores

WORKER = [sys.executable, "-m", "nyscli.experiments.bench.worker"]


class WorkerFailed(Exception):
    """The worker ended or timed out; ``result`` is the row's status (oom/timeout/error)."""

    def __init__(self, result: dict[str, Any]) -> None:
        super().__init__(result.get("error", result["status"]))
        self.result = result


class PointWorker:
    """One ``bench_worker`` process measuring one attention at one n."""

    def __init__(self, spec: dict[str, Any], timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.stderr = tempfile.TemporaryFile()  # noqa: SIM115  (closed in close())
        self.process = subprocess.Popen(
            [*WORKER, json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            # Its memory rule (memory.py) is defined on glibc's malloc, not on tcmalloc.
            env=system_environ(os.environ),
        )
        self.buffer = b""

    def _line(self, prefix: str) -> str:
        """The rest of the next stdout line starting with ``prefix``, within the timeout."""
        deadline = time.monotonic() + self.timeout_s
        stdout = self.process.stdout
        assert stdout is not None
        with selectors.DefaultSelector() as selector:
            selector.register(stdout, selectors.EVENT_READ)
            while True:
                while b"\n" in self.buffer:
                    raw, self.buffer = self.buffer.split(b"\n", 1)
                    line = raw.decode(errors="replace")
                    if line.startswith(prefix):
                        return line[len(prefix) :]
                    if line.startswith(RESULT_PREFIX):  # the worker reports its own failure
                        raise WorkerFailed(json.loads(line[len(RESULT_PREFIX) :]))
                left = deadline - time.monotonic()
                if left <= 0 or not selector.select(left):
                    raise WorkerFailed(
                        {"status": "timeout", "error": f"over timeout_s={self.timeout_s}"}
                    )
                chunk = os.read(stdout.fileno(), 65536)
                if not chunk:
                    raise WorkerFailed(self._ended())
                self.buffer += chunk

    def _ended(self) -> dict[str, Any]:
        code = self.process.wait()
        if code < 0:  # killed by a signal: on Linux almost always the OOM killer
            return {"status": "oom", "error": f"worker killed by signal {-code}"}
        self.stderr.seek(0)
        lines = self.stderr.read().decode(errors="replace").strip().splitlines()
        return {"status": "error", "error": (lines or ["no output"])[-1][:300]}

    def ready(self) -> dict[str, float]:
        """Wait for warm-up and the memory call: {"peak_mb", "first_ms"}."""
        return json.loads(self._line(READY_PREFIX))

    def time_one(self) -> float:
        """Milliseconds of one timed call in the worker."""
        assert self.process.stdin is not None
        self.process.stdin.write(b"time\n")
        self.process.stdin.flush()
        return float(self._line(TIME_PREFIX))

    def close(self, kill: bool = False) -> None:
        """End the worker: it exits when its stdin closes; ``kill`` (the parent is being
        interrupted or terminated) does not wait for a call in progress."""
        if kill and self.process.poll() is None:
            self.process.kill()
        if self.process.poll() is None:
            try:
                assert self.process.stdin is not None
                self.process.stdin.close()
                self.process.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.process.kill()
                self.process.wait()
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        self.stderr.close()


@dataclass
class Point:
    """One row being measured at one n: its worker, samples and final status."""

    spec: dict[str, Any]
    worker: PointWorker | None = None
    result: dict[str, Any] = field(default_factory=dict)  # set when the point failed
    peak_mb: float = 0.0
    cuda_graph: bool = False  # its core replayed a CUDA graph (attention/gpu/graphs.py)
    path: str = ""  # the code its core took (``Core.path``)
    input_dtype: str = ""  # the dtype of the q its core was handed
    needed: int = 1
    times: list[float] = field(default_factory=list)

    def spread(self) -> float:
        """IQR / median of its timed calls."""
        stats = summarize(self.times)
        median = stats["time_ms_median"]
        return stats["time_ms_iqr"] / median if median > 0 else 0.0


# Passes that time the noisy points again, after the first, before they are marked noisy.
RETRIES = 2


def _round_robin(points: list[Point], on_round: Callable[[int, int], None]) -> None:
    """Time every point ``needed`` times, one call per point per round, in turn.

    A point that needs fewer calls than the longest has its calls spread evenly over the
    rounds (Bresenham), so a slow row's few samples still see the whole stretch of load.
    """
    rounds = max((p.needed for p in points), default=0)
    for r in range(rounds):
        on_round(r + 1, rounds)
        for point in points:
            due = (r + 1) * point.needed // rounds > r * point.needed // rounds
            if point.worker is None or not due:
                continue
            try:
                point.times.append(point.worker.time_one())
            except WorkerFailed as failed:
                point.result = failed.result
                point.worker.close()
                point.worker = None


def measure_interleaved(
    specs: list[dict[str, Any]],
    timeout_s: float,
    noise_threshold: float,
    on_round: Callable[[int, int], None] = lambda r, total: None,
    start: Callable[[dict[str, Any], float], PointWorker] = PointWorker,
) -> list[dict[str, Any]]:
    """Measure the points of one n interleaved; one result dict per spec, in order.

    Every spec carries the worker's fields plus ``time_budget_s``, ``repeats`` and
    ``min_repeats``, which set each point's number of timed calls from its first call's time.
    ``start`` makes a point's worker (a ``PointWorker`` process; tests pass a fake).
    """
    points = [Point(spec) for spec in specs]
    try:
        for point in points:  # one at a time: warm-up and the memory call see a quiet sibling set
            point.worker = start(point.spec, timeout_s)
            try:
                ready = point.worker.ready()
            except WorkerFailed as failed:
                point.result = failed.result
                point.worker.close()
                point.worker = None
                continue
            point.peak_mb = ready["peak_mb"]
            point.cuda_graph = bool(ready.get("cuda_graph", False))
            point.path = ready.get("path", "")
            point.input_dtype = ready.get("input_dtype", "")
            spec = point.spec
            budget = int(spec["time_budget_s"] * 1000.0 / max(ready["first_ms"], 1e-3))
            point.needed = max(spec["min_repeats"], min(spec["repeats"], budget))
        done = max((p.needed for p in points), default=0)
        _round_robin(points, on_round)
        retried: set[int] = set()
        for _ in range(RETRIES):  # measure again while noisy: samples taken under a burst
            noisy = [p for p in points if p.worker is not None and p.spread() > noise_threshold]
            if not noisy:
                break
            retried |= {id(p) for p in noisy}
            for point in noisy:
                point.times = []
            # the count goes on from the rounds before, to a total that grows by this pass's
            _round_robin(noisy, lambda r, total, before=done: on_round(before + r, before + total))
            done += max(p.needed for p in noisy)
    finally:
        stopping = sys.exc_info()[1] is not None  # e.g. Ctrl-C or SIGTERM: no waiting
        for point in points:
            if point.worker is not None:
                point.worker.close(kill=stopping)
    results = []
    for point in points:
        if point.result:
            results.append(point.result)
            continue
        spread = point.spread()
        results.append(
            {
                "status": "ok",
                **summarize(point.times),
                "peak_mb": point.peak_mb,
                "cuda_graph": point.cuda_graph,
                "path": point.path,
                "input_dtype": point.input_dtype,
                "spread": spread,
                "remeasured": id(point) in retried,
                "noisy": spread > noise_threshold,
            }
        )
    return results


def busy_hint(threads: int) -> str | None:
    """A one-line warning when other jobs already use the cores this bench needs."""
    cores = len(usable_cores())
    load = os.getloadavg()[0]
    # Half a core of slack: the 1-minute average decays slowly after a job ends (an idle
    # machine read 0.3 a minute later), while one more busy process adds about 1.
    if not cores or load <= cores - threads + 0.5:
        return None
    advice = "set threads=1 (fewer cores to share) and " if threads > 1 else ""
    return (
        f"machine busy: load average {load:.1f} on {cores} cores, and this bench uses "
        f"{threads} thread(s): timings will be noisy; {advice}compare rows of this run (they "
        f"are timed interleaved), or rerun when the machine is quiet."
    )
