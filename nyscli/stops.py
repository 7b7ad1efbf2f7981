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


@contextlib.contextmanager
def sigterm_raises() -> Iterator[None]:
    """Within the block SIGTERM raises :class:`Terminated` (main thread only)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def stopped(stop: KeyboardInterrupt) -> str:
    """``interrupted`` (Ctrl-C) or ``terminated (SIGTERM)``."""
    return "terminated (SIGTERM)" if isinstance(stop, Terminated) else "interrupted"


def stop_code(stop: KeyboardInterrupt) -> int:
    """The shell's exit code of the signal: 130 (SIGINT) or 143 (SIGTERM)."""
    return 128 + (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)
