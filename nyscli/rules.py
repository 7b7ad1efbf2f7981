"""What a value may be, as data: ``Int(low=1)``, ``Choice(("a", "b"))``, ... (the ground floor).

A rule checks one value and says in words what is allowed, so every refusal reads
``<key>=<value> is not allowed; it must be <allowed>``. Rules are declared once, beside what they
govern (an attention core's options, the trainer's settings, a command's keys), and read by
whoever checks them (``nyscli.experiments.schema`` checks a whole config against them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from nyscli.errors import UserInputError

# Every integer a config holds ends up in torch or numpy (a seed, a count, a size): beyond 64
# bits they overflow, so that is the ceiling of every Int without a tighter one.
INT64_MAX = 2**63 - 1


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_int(value) or isinstance(value, float)


def _is_finite(value: Any) -> bool:
    """A finite number, also as a float (an int beyond ~1.8e308 is none: float() overflows)."""
    try:
        return _is_number(value) and math.isfinite(float(value))
    except OverflowError:
        return False


@dataclass(frozen=True)
class Rule:
    """Base: ``null`` allows None; subclasses say what else is allowed (their own fields come
    first, so ``Choice(("a", "b"))`` reads as it should; ``null`` is keyword-only)."""

    null: bool = field(default=False, kw_only=True)

    def ok(self, value: Any) -> bool:
        raise NotImplementedError

    def allowed(self) -> str:
        raise NotImplementedError

    def check(self, key: str, value: Any, error: type[ValueError] = UserInputError) -> None:
        """Raise ``error`` (one line naming ``key``, ``value`` and what is allowed) unless
        ``value`` passes."""
        if value is None and self.null:
            return
        if value is None or not self.ok(value):
            allowed = self.allowed() + (" or null" if self.null else "")
            raise error(f"{key}={show(value)} is not allowed; it must be {allowed}")


@dataclass(frozen=True)
class Int(Rule):
    """An integer in [low, high] (either bound optional; no ``high`` means 64-bit, like
    :data:`INT64_MAX`); ``odd``: odd ones only."""

    low: int | None = None
    high: int | None = None
    odd: bool = False

    def ok(self, value: Any) -> bool:
        return (
            _is_int(value)
            and (self.low is None or value >= self.low)
            and value <= (INT64_MAX if self.high is None else self.high)
            and value >= -INT64_MAX - 1
            and (not self.odd or value % 2 == 1)
        )

    def allowed(self) -> str:
        kind = "an odd integer" if self.odd else "an integer"
        if self.high is not None and self.low is not None:
            return f"{kind} from {self.low} to {self.high}"
        return kind + (f" >= {self.low}" if self.low is not None else "") + " (64-bit)"


@dataclass(frozen=True)
class Float(Rule):
    """A number (int or float) between ``low`` and ``high``; ``*_open`` excludes the bound."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def ok(self, value: Any) -> bool:
        if not _is_finite(value):  # NaN and inf are never a setting (lr=inf diverges)
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def allowed(self) -> str:
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        return "a finite number" + (" " + " and ".join(parts) if parts else "")


@dataclass(frozen=True)
class Bool(Rule):
    def ok(self, value: Any) -> bool:
        return isinstance(value, bool)

    def allowed(self) -> str:
        return "true or false"


@dataclass(frozen=True)
class Choice(Rule):
    values: tuple[str, ...] = ()

    def ok(self, value: Any) -> bool:
        return isinstance(value, str) and value in self.values

    def allowed(self) -> str:
        return "one of: " + ", ".join(self.values)


@dataclass(frozen=True)
class ChoiceList(Rule):
    """A non-empty list of distinct ``values`` (a single value also passes)."""

    values: tuple[str, ...] = ()

    def ok(self, value: Any) -> bool:
        items = list(value) if isinstance(value, list | tuple) else [value]
        return (
            bool(items)
            and all(isinstance(v, str) and v in self.values for v in items)
            and len(set(items)) == len(items)
        )

    def allowed(self) -> str:
        return "one or a list of distinct: " + ", ".join(self.values)


@dataclass(frozen=True)
class Text(Rule):
    """A non-empty string (a path, a name)."""

    def ok(self, value: Any) -> bool:
        return isinstance(value, str) and value.strip() != ""

    def allowed(self) -> str:
        return "a non-empty text"


@dataclass(frozen=True)
class IntList(Rule):
    """A non-empty list of integers >= ``low`` (a single integer also passes)."""

    low: int = 1

    def ok(self, value: Any) -> bool:
        items = list(value) if isinstance(value, list | tuple) else [value]
        return bool(items) and all(_is_int(v) and self.low <= v <= INT64_MAX for v in items)

    def allowed(self) -> str:
        return f"a non-empty list of 64-bit integers >= {self.low}, e.g. [64,128]"


# A value longer than this is shown by its start and length: an error line stays a line.
SHOWN_CHARACTERS = 60


def show(value: Any) -> str:
    """A value as the user would type it on the command line (a long one cut short)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    text = "[" + ",".join(show(v) for v in value) + "]" if isinstance(value, list) else str(value)
    if len(text) > SHOWN_CHARACTERS:
        return f"{text[:24]}... ({len(text):,} characters)"
    return text


@dataclass(frozen=True)
class Fixed(Rule):
    """Exactly ``value``; ``why`` says why nothing else is (e.g. a core that cannot be causal)."""

    value: Any = None
    why: str = ""

    def ok(self, value: Any) -> bool:
        return type(value) is type(self.value) and value == self.value

    def allowed(self) -> str:
        return show(self.value) + (f" ({self.why})" if self.why else "")


# A probability that may be 0 but not 1 (dropout: 1 would drop everything; Adam's betas).
PROBABILITY = Float(low=0.0, high=1.0, high_open=True)
