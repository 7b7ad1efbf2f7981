"""The one exception type the attention core raises for bad configuration or bad input."""


class AttentionConfigError(ValueError):
    """A user-facing problem with an attention configuration or its inputs.

    The message names the bad value and what is allowed; the CLI prints it as one line.
    """
