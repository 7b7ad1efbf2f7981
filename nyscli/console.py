"""The one rich console every command prints to (tables, progress bars, log lines), and the one
function that prints an error line on it."""

import sys

from rich.console import Console
from rich.logging import RichHandler
from rich.markup import escape

# Piped into a file or a log, rich would assume 80 columns and fold the wide tables.
console = Console(width=None if sys.stdout.isatty() else 160)


class ConsoleLogHandler(RichHandler):
    """Log records rendered on the shared console, so they interleave with progress bars."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(console=console, show_path=False, **kwargs)


def say_error(message: str) -> None:
    """Print ``error: message`` as one line (the message is not read as markup): every error
    ``nys`` reports, from the CLI or the launcher, looks the same."""
    console.print(f"[red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
