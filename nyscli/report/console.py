"""The one rich console every command prints to (tables, progress bars, log lines)."""

from rich.console import Console
from rich.logging import RichHandler

console = Console()


class ConsoleLogHandler(RichHandler):
    """Log records rendered on the shared console, so they interleave with progress bars."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(console=console, show_path=False, **kwargs)
