"""Trainer errors that the CLI prints as one line (exit code 2), and the interruption."""

from nyscli.errors import UserInputError


class TrainingDiverged(UserInputError):
    """The loss became NaN or infinite; the run stopped and kept its last good checkpoint."""


class CheckpointError(UserInputError):
    """A checkpoint could not be read (corrupt, truncated, or not a nys checkpoint)."""


class TrainingInterrupted(BaseException):
    """Ctrl-C (SIGINT) or SIGTERM stopped training; ``message`` is the one line to print and
    ``code`` the exit status (128 + the signal number: 130 for SIGINT, 143 for SIGTERM).

    A BaseException, like the KeyboardInterrupt it replaces: handlers of ``Exception`` (Hydra's
    job runner among them) let it through to the CLI.
    """

    def __init__(self, stopped: str, code: int, resume: str | None = None) -> None:
        message = stopped + (f"; resume with: {resume}" if resume else "")
        super().__init__(message)
        self.stopped = stopped  # where training stood (and its last checkpoint)
        self.resume = resume  # the command that continues it; None without a checkpoint
        self.message = message
        self.code = code
