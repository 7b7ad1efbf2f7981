"""Progress for a launcher phase that grows with a sweep's jobs (checking each job, reading an
earlier sweep's job folders): a bar on a terminal, lines on a console that is none (a log, CI,
a pipe, where rich's bar draws nothing), nothing for a few jobs. Checking 100,000 jobs takes
over an hour on 2 cores (30-60 ms a job): without it the launch would look hung."""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from typing import Any

from nyscli.console import console
from nyscli.data.common import progress_bar

SWEEP_BAR_JOBS = 20  # fewer jobs are checked in about a second: no bar
CHECK_LINE_EVERY_S = 10.0  # without a terminal: a progress line at most this often


@contextlib.contextmanager
def _no_bar(description: str, total: int) -> Iterator[Callable[[int], None]]:
    yield lambda k: None


@contextlib.contextmanager
def _lines(description: str, total: int, verb: str) -> Iterator[Callable[[int], None]]:
    """``<description>: 10 of 25 <verb>, 3 s, ~5 s left``, at most every CHECK_LINE_EVERY_S."""
    start = last = time.monotonic()
    done = 0

    def advance(k: int) -> None:
        nonlocal done, last
        done += k
        now = time.monotonic()
        if now - last < CHECK_LINE_EVERY_S or done >= total:
            return
        last = now
        left = (now - start) / done * (total - done)
        console.print(f"{description}: {done} of {total} {verb}, {now - start:.0f} s, "
                      f"~{left:.0f} s left", highlight=False, soft_wrap=True)  # fmt: skip

    yield advance


def job_bar(total: int, verb: str = "checked") -> Any:
    """The progress context for ``total`` jobs: called as ``bar(description, total)``, it
    yields ``advance(k)``."""
    if total < SWEEP_BAR_JOBS:
        return _no_bar
    return progress_bar if console.is_terminal else functools.partial(_lines, verb=verb)
