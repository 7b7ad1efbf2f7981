"""The one exception type the attention core raises, and the check of a core's options.

Each core declares its options once, as rules (``options = {"num_landmarks": Int(low=1)}``,
from the ground floor's :mod:`nyscli.rules`); its constructor checks every argument against
them with :func:`option`, and the CLI checks a config against the same rules before anything
is built (:func:`nyscli.attention.registry.check_config`).
"""

from __future__ import annotations

from typing import Any

from nyscli.errors import UserInputError
from nyscli.rules import Fixed


class AttentionConfigError(UserInputError):
    """A user-facing problem with an attention configuration or its inputs.

    The message names the bad value and what is allowed; the CLI prints it as one line.
    """


def option(core: object, key: str, value: Any) -> Any:
    """``value`` if it passes the rule ``type(core).options[key]``; else the one-line error
    ``attention.<key>=<value> is not allowed; it must be ...``."""
    type(core).options[key].check(f"attention.{key}", value, AttentionConfigError)
    return value


def not_causal(name: str, why: str) -> Fixed:
    """The rule of ``causal`` for a core that cannot be causal; ``why`` says what looks ahead."""
    return Fixed(value=False, why=f"{name} attention cannot be causal: {why}")
