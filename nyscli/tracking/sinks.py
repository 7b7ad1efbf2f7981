"""What a logger receives from the trainer, and the fan-out that keeps a broken one harmless.

The trainer's ``metrics.csv`` stays the record: every row it writes is also handed to each
selected logger (:class:`Sink`). A logger that fails (an unwritable store, a full disk) is
reported in one warning and switched off for the rest of the run; the run goes on.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Row:
    """One row of ``metrics.csv``: the optimizer step, the split and its finite values."""

    step: int
    split: str
    values: dict[str, float] = field(default_factory=dict)

    @classmethod
    def of(cls, step: Any, split: Any, values: dict[str, Any]) -> Row:
        """From a row as written or as read back from the CSV (text cells, blanks)."""
        clean = {}
        for key, value in values.items():
            if key in ("step", "split") or value is None or value == "":
                continue
            try:
                number = float(value)
            except (TypeError, ValueError):  # a text column is no metric (and no reason to fail)
                continue
            if math.isfinite(number):
                clean[key] = number
        return cls(int(step), str(split), clean)


class Sink:
    """A logger. ``resume`` gets the rows a resumed run carried over from the earlier one
    (steps up to its checkpoint); ``row`` each new row; ``checkpoint`` the step of each
    ``last.pt`` written (everything up to it is safe from being logged twice)."""

    name = "sink"

    def resume(self, rows: list[Row]) -> None:
        for row in rows:
            self.row(row)

    def row(self, row: Row) -> None:
        raise NotImplementedError

    def checkpoint(self, step: int) -> None:
        pass

    def close(self) -> None:
        pass


class Fanout:
    """The selected sinks, each call guarded: the first failure of a sink is one warning and
    that sink is dropped. ``extra`` adds values to train rows (peak memory) for the loggers
    only, so ``metrics.csv`` keeps its columns."""

    def __init__(self, sinks: Iterable[Sink], extra: Callable[[], dict[str, float]] | None) -> None:
        self.sinks = list(sinks)
        self.extra = extra
        self.failed: list[str] = []

    def names(self) -> list[str]:
        """The loggers still on."""
        return [sink.name for sink in self.sinks]

    def _each(self, method: str, *args: Any) -> None:
        for sink in list(self.sinks):
            try:
                getattr(sink, method)(*args)
            except Exception as error:  # logging never fails a run
                self.drop(sink, error)

    def drop(self, sink: Sink, error: BaseException) -> None:
        warn_off(sink.name, error)
        self.sinks.remove(sink)
        self.failed.append(sink.name)

    def resume(self, rows: list[Row]) -> None:
        self._each("resume", rows)

    def row(self, step: int, split: str, values: dict[str, Any]) -> None:
        row = Row.of(step, split, values)
        if split == "train" and self.extra is not None:
            row = Row(row.step, row.split, {**row.values, **self.extra()})
        self._each("row", row)

    def checkpoint(self, step: int) -> None:
        self._each("checkpoint", step)

    def close(self) -> None:
        self._each("close")
        self.sinks = []


def warn_off(name: str, error: BaseException) -> None:
    """The one warning for a logger that failed: the run goes on without it."""
    first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
    log.warning(
        "logger=%s failed (%s: %s); it is off for this run, metrics.csv and results.csv "
        "stay the record",
        name,
        type(error).__name__,
        first,
    )
