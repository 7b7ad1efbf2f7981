"""The one rich console every command prints to (tables, progress bars, log lines)."""

import sys

from rich.console import Console
from rich.logging import RichHandler

# Piped into a file or a log, rich would assume 80 columns and fold the wide tables.
console = Console(width=None if sys.stdout.isatty() else 160)


class ConsoleLogHandler(RichHandler):
    """Log records rendered on the shared console, so they interleave with progress bars."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(console=console, show_path=False, **kwargs)
