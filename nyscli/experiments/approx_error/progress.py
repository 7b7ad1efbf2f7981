"""Progress of ``nys approx-error`` that also reaches the run's log file.

A default job (n = 4096) spends minutes per head forming implied n x n matrices: the console's
bar alone leaves the log file silent. Each finished (head, method, budget) advances the bar; a
log line (head, method, budget, elapsed, estimated time left) is written at most every
``LOG_EVERY_S`` seconds, so a slow job logs every step and a fast one only a few lines.

The time left is reckoned in heads, not steps: a head's steps cost very different times (a
cheap low budget first, Linformer's or the exact pseudo-inverse's large ones last), so a
count of steps promised 2 minutes in a MiniLM job's first head and 16 at its end. Once the
first head is done, the share of a head's time each step ends at is known, and every head
after it is assumed to repeat it.
"""

from __future__ import annotations

import io
import logging
import time

from rich.console import Console, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

log = logging.getLogger(__name__)

LOG_EVERY_S = 10.0


class ProgressLog:
    """A transient console bar over ``total`` steps, with throttled log lines."""

    def __init__(self, total: int, heads: int, console: Console) -> None:
        self.total, self.heads, self.done = total, heads, 0
        self.start = self.last_log = time.monotonic()
        self.first_head: list[float] = []  # seconds since the start at each step of head 1
        self.bar = Progress(
            TextColumn("approx-error {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self.task = self.bar.add_task("", total=total)

    def __enter__(self) -> ProgressLog:
        self.bar.__enter__()
        log.info(
            "approx-error: %d steps (heads x methods x budgets) over %d heads",
            self.total,
            self.heads,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.__exit__(*exc)

    def step(self, head: int, label: str, budget: int | None) -> None:
        """One (method, budget) of head number ``head`` (0-based) is done."""
        self.done += 1
        what = label if budget is None else f"{label} m={budget}"
        self.bar.update(self.task, advance=1, description=f"head {head + 1}/{self.heads} {what}")
        now = time.monotonic()
        if self.done <= self.steps_per_head:
            self.first_head.append(now - self.start)
        if now - self.last_log < LOG_EVERY_S and self.done < self.total:
            return
        self.last_log = now
        elapsed = now - self.start
        left = self.left(elapsed)
        log.info(
            "approx-error %d/%d: head %d/%d %s done, %.0f s elapsed, ~%.0f s left",
            self.done, self.total, head + 1, self.heads, what, elapsed, left,
        )  # fmt: skip

    @property
    def steps_per_head(self) -> int:
        return max(1, self.total // max(1, self.heads))

    def left(self, elapsed: float) -> float:
        """Seconds left after ``elapsed`` seconds and ``done`` steps: by steps within the first
        head, then by heads done, each step's share of a head taken from the first head."""
        per_head = self.steps_per_head
        if self.done < per_head or not self.first_head or self.first_head[-1] <= 0:
            return elapsed / max(1, self.done) * (self.total - self.done)
        heads_done, step = divmod(self.done, per_head)
        share = self.first_head[step - 1] / self.first_head[-1] if step else 0.0
        progress = heads_done + share  # in heads
        return elapsed / progress * (self.heads - progress)


def log_to_file(renderable: RenderableType) -> None:
    """Write a rendered table to the log files only: the console shows it already (the launcher
    prints ``render(df)``), but a log file should hold the results without the console."""
    buffer = io.StringIO()
    Console(file=buffer, width=200, color_system=None).print(renderable)
    record = log.makeRecord(log.name, logging.INFO, __file__, 0, "\n" + buffer.getvalue(), (), None)
    for handler in logging.getLogger().handlers + log.handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)
