"""The one rich console every command prints to (tables, progress bars, log lines), the one
function that prints an error line on it, and the heartbeat that puts a long phase's progress
in the log."""

import contextlib
import logging
import sys
import threading
import time
from collections.abc import Iterator

from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

# Piped into a file or a log, rich would assume 80 columns and fold the wide tables.
console = Console(width=None if sys.stdout.isatty() else 160)


# A log record with this attribute set (``extra={FILE_ONLY: True}``) goes to the run's log
# file only: a note on how the run ran, which would stand between a refusal and its one line.
FILE_ONLY = "file_only"


class ConsoleLogHandler(RichHandler):
    """Log records rendered on the shared console, so they interleave with progress bars."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(console=console, show_path=False, **kwargs)

    def emit(self, record: logging.LogRecord) -> None:
        if not getattr(record, FILE_ONLY, False):
            super().emit(record)


def say_error(message: str) -> None:
    """Print ``error: message`` as one line (the message is not read as markup): every error
    ``nys`` reports, from the CLI or the launcher, looks the same."""
    console.print(f"[red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)


# A progress bar shows nothing without a terminal, and a phase may go minutes between log
# lines (one n of a bench, one SVD): a log file hears from a long phase at least this often.
HEARTBEAT_S = 30.0


class Heartbeat:
    """What a long phase is doing now; ``say`` it as the phase moves on."""

    def __init__(self, what: str) -> None:
        self.what = what

    def say(self, what: str) -> None:
        self.what = what


@contextlib.contextmanager
def heartbeat(logger: logging.Logger, what: str) -> Iterator[Heartbeat]:
    """While the block runs, log what it is doing (``Heartbeat.say``) and for how long, every
    ``HEARTBEAT_S`` seconds, from a thread: the log also hears from a single step that lasts
    minutes."""
    beat, stop, start = Heartbeat(what), threading.Event(), time.monotonic()

    def beating() -> None:
        while not stop.wait(HEARTBEAT_S):
            logger.info("%s (%.0f s so far)", beat.what, time.monotonic() - start)

    thread = threading.Thread(target=beating, name="heartbeat", daemon=True)
    thread.start()
    try:
        yield beat
    finally:
        stop.set()
        thread.join()
