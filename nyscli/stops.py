"""Ctrl-C and SIGTERM as one exception, wherever ``nys`` is (the ground floor: no torch).

SIGINT already raises KeyboardInterrupt in the main thread; :func:`sigterm_raises` makes SIGTERM
raise :class:`Terminated`, a KeyboardInterrupt, so a termination unwinds the same way: atomic
writes remove their temp files, worker pools are ended, and the CLI prints one line.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the main thread is, like Ctrl-C's KeyboardInterrupt."""


# The Terminated that sigterm_raises' handler raised and no one has reported yet (stopped()
# reports it). Typer turns a KeyboardInterrupt raised while it parses the command line into
# a silent Exit(130), so the CLI asks here whether a termination went unreported.
_unreported: list[Terminated] = []


def unreported() -> Terminated | None:
    """The termination raised by SIGTERM that no line has reported, if any: Typer swallowed
    it, or it was raised inside a weakref callback or ``__del__``, where Python prints
    "Exception ignored" and goes on."""
    return _unreported[-1] if _unreported else None


def reported(stop: KeyboardInterrupt) -> None:
    """``stop`` has been reported (its one line printed or raised as the run's error)."""
    _unreported.clear()


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block SIGTERM raises :class:`Terminated` (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        stop = Terminated()
        _unreported[:] = [stop]
        raise stop

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stopped(stop: KeyboardInterrupt) -> str:
    """``interrupted`` (Ctrl-C) or ``terminated (SIGTERM)``: the stop's one line, which
    reports it."""
    reported(stop)
    return "terminated (SIGTERM)" if isinstance(stop, Terminated) else "interrupted"


def stop_code(stop: KeyboardInterrupt) -> int:
    """The shell's exit code of the signal: 130 (SIGINT) or 143 (SIGTERM)."""
    return 128 + (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)
