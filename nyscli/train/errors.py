"""Trainer errors that the CLI prints as one line (exit code 2)."""

from nyscli.errors import UserInputError


class TrainingDiverged(UserInputError):
    """The loss became NaN or infinite; the run stopped and kept its last good checkpoint."""


class CheckpointError(UserInputError):
    """A checkpoint could not be read (corrupt, truncated, or not a nys checkpoint)."""
