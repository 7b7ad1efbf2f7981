"""Command-line overrides as Hydra writes them: ``key=value``, ``+key=value`` (add a key) and
``~key`` (delete one). The one place nys reads an override's key and value."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any


def override_key(override: str) -> str:
    """``trainer.lr`` of ``trainer.lr=1e-3``, ``+trainer.lr=1e-3`` and ``~trainer.lr``."""
    return override.lstrip("+~").split("=", 1)[0]


def override_keys(overrides: Iterable[str]) -> set[str]:
    """The keys (:func:`override_key`) that ``overrides`` set or delete."""
    return {override_key(o) for o in overrides}


def override_value(override: str) -> str | None:
    """``1e-3`` of ``trainer.lr=1e-3``; None for a ``~key`` deletion without a value."""
    _, equals, value = override.partition("=")
    return value if equals else None


def as_override_value(value: Any) -> str:
    """``value`` as Hydra's override grammar reads it back."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (int, float)):
        return repr(value)
    # Hydra's quoted strings escape only quotes and the backslashes just before a quote (or
    # before the closing one); any other backslash is literal.
    text = re.sub(r"(\\*)'", lambda m: m[1] * 2 + "\\'", str(value))
    text = re.sub(r"(\\+)$", lambda m: m[1] * 2, text)
    return f"'{text}'"
