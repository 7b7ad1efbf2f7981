"""What each logger costs per training step (docs/results/tracking.md).

Runs ``nys lra`` on a small generated ListOps as one sweep in this process: ``logger=csv``,
``tensorboard`` and ``mlflow`` interleaved, twice (seeds 0 and 1), one thread, a train row
every step (``trainer.log_every=1``: the most a logger is asked to do). Two measures per job:
``Trainer.fit`` timed from outside (tokens/s including the loggers' work, which the run's own
``tokens_per_s``, update time only, leaves out), and the seconds spent inside the loggers'
calls themselves (rows, checkpoints), per step; the second is what a logger adds, free of the
machine's noise. Prints one JSON line per job.

    .venv/bin/python scripts/tracking_overhead.py [OUT_DIR]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from nyscli import cli
from nyscli.tracking import sinks
from nyscli.train import loop

OUT = Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/tracking_overhead")
ARGS = [
    "lra",
    "seed=0,1",
    "logger=csv,tensorboard,mlflow",
    "data.generate.n_train=2000",
    "data.generate.n_val=200",
    "data.generate.n_test=200",
    "data.generate.min_len=20",
    "data.generate.max_len=100",
    "task.max_len=100",
    "model.dim=32",
    "model.ffn_dim=32",
    "threads=1",
    "--steps",
    "300",
    "--batch-size",
    "16",
    "trainer.log_every=1",
    "trainer.eval_every=100",
    "trainer.progress=false",
    f"data_cache={OUT / 'cache'}",
    f"hydra.sweep.dir={OUT / 'sweep'}",
    "-m",
]
fit = loop.Trainer.fit
spent = {"s": 0.0}  # seconds inside the loggers' calls during the current fit


def timing(method):  # noqa: ANN001, ANN201 - a plain wrapper
    def timed(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        start = time.perf_counter()
        try:
            return method(self, *args, **kwargs)
        finally:
            spent["s"] += time.perf_counter() - start

    return timed


for name in ("row", "checkpoint", "resume"):
    setattr(sinks.Fanout, name, timing(getattr(sinks.Fanout, name)))


def timed_fit(self: loop.Trainer, *args: object, **kwargs: object) -> loop.FitResult:
    spent["s"] = 0.0
    start = time.perf_counter()
    result = fit(self, *args, **kwargs)
    wall = time.perf_counter() - start
    logger = ",".join(self.metrics.sink.names()) if self.metrics.sink else "csv"
    row = {
        "logger": logger,
        "steps": result.step,
        "fit_s": round(wall, 3),
        "tokens_per_s_wall": round(result.train_tokens / wall, 1),
        "ms_per_step_outside_updates": round(1000 * (wall - result.train_seconds) / result.step, 3),
        "update_ms_per_step": round(1000 * result.train_seconds / result.step, 3),
        "logger_ms_per_step": round(1000 * spent["s"] / result.step, 3),
    }
    print(json.dumps(row), flush=True)
    return result


loop.Trainer.fit = timed_fit
sys.argv = ["nys", *ARGS]
cli.main()
