"""The one exception type the attention core raises for bad configuration or bad input."""


class AttentionConfigError(ValueError):
    """A user-facing problem with an attention configuration or its inputs.

    The message names the bad value and what is allowed; the CLI prints it as one line.
    """


def require_int(key: str, value: object, minimum: int | None) -> int:
    """``value`` if it is an integer (>= ``minimum`` unless None); else the one-line error.

    A bool is refused too: ``True`` is an ``int`` to Python but never a sensible size or seed.
    """
    too_small = minimum is not None and isinstance(value, int) and value < minimum
    if isinstance(value, bool) or not isinstance(value, int) or too_small:
        allowed = "an integer" if minimum is None else f"an integer >= {minimum}"
        raise AttentionConfigError(f"attention.{key}={value} is not allowed; it must be {allowed}")
    return value


def require_choice(key: str, value: object, allowed: tuple[str, ...]) -> str:
    """``value`` if it is one of ``allowed``; else the one-line error listing them."""
    if value not in allowed:
        raise AttentionConfigError(
            f"attention.{key}={value} is not allowed; choose one of: {', '.join(allowed)}"
        )
    return str(value)


def refuse_causal(name: str, why: str) -> None:
    """The one-line error for a core that cannot be causal; ``why`` says what looks ahead."""
    raise AttentionConfigError(f"{name} attention cannot be causal: {why}")
