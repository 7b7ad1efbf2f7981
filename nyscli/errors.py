"""User-facing errors: the CLI prints their message as one line and exits with code 2."""


class UserInputError(ValueError):
    """Bad input from the user (a value, a path, a missing optional package).

    The message names the bad value and what is allowed.
    """
