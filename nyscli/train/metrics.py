"""What one batch reports, running averages of it, and the append-only ``metrics.csv``."""

from __future__ import annotations

import csv
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import Tensor

from nyscli import tracking
from nyscli.files import write_atomic
from nyscli.tracking import Row
from nyscli.train.splits import renamed_splits

METRICS_FILE = "metrics.csv"


@dataclass
class BatchResult:
    """One (micro-)batch through the objective.

    loss: scalar tensor, the mean over the batch (what is back-propagated).
    size: examples in the batch (weights the loss in averages).
    tokens: real (non-padding) tokens processed, for throughput.
    counts: metric -> (numerator, denominator), e.g. ``{"accuracy": (correct, size)}``.
    """

    loss: Tensor
    size: int
    tokens: int
    counts: dict[str, tuple[float, float]] = field(default_factory=dict)


@dataclass
class Running:
    """Sums over many batches; ``summary()`` gives the averages."""

    loss_sum: float = 0.0
    size: int = 0
    tokens: int = 0
    seconds: float = 0.0
    numerators: dict[str, float] = field(default_factory=dict)
    denominators: dict[str, float] = field(default_factory=dict)

    def add(self, result: BatchResult, loss: float) -> None:
        self.loss_sum += loss * result.size
        self.size += result.size
        self.tokens += result.tokens
        for name, (num, den) in result.counts.items():
            self.numerators[name] = self.numerators.get(name, 0.0) + float(num)
            self.denominators[name] = self.denominators.get(name, 0.0) + float(den)

    def summary(self) -> dict[str, float]:
        """loss, each metric, and tokens/s (when time was recorded)."""
        out = {"loss": self.loss_sum / self.size if self.size else math.nan}
        for name, num in self.numerators.items():
            den = self.denominators[name]
            out[name] = num / den if den else math.nan
        if self.seconds > 0:
            out["tokens_per_s"] = self.tokens / self.seconds
        return out

    def state_dict(self) -> dict[str, Any]:
        return dict(vars(self))

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Running:
        return cls(**state)


class MetricsLog:
    """``metrics.csv``: one row per logged step and split, appended and flushed row by row.

    Columns: step, split, loss, <metric names>, lr, tokens_per_s, elapsed_s. A crash leaves
    every row written so far intact (each row is one write of a whole line + fsync).
    ``write=False`` (ranks other than 0 of a distributed run) writes nothing. Each row also goes
    to the run's loggers (:func:`nyscli.tracking.active`: TensorBoard, MLflow), and so do the
    rows a resumed run carries over and the step of each checkpoint.
    """

    def __init__(self, path: Path, metric_names: tuple[str, ...], write: bool = True) -> None:
        self.path = Path(path)
        self.write = write
        self.columns = ["step", "split", "loss", *metric_names, "lr", "tokens_per_s", "elapsed_s"]
        self.sink = tracking.active() if write else None

    def start(self, keep_until: int | None = None, source: Path | None = None) -> None:
        """Create the file with its header; on resume copy ``source``'s rows up to a step."""
        if not self.write:
            return
        rows: list[dict[str, str]] = []
        if source is not None and source.exists():
            with open(source, newline="") as handle:
                rows = [r for r in csv.DictReader(handle) if int(r["step"]) <= (keep_until or 0)]
            # A run written before the dev split had that name continues under today's names.
            renamed = renamed_splits(r["split"] for r in rows)
            rows = [{**r, "split": renamed.get(r["split"], r["split"])} for r in rows]

        def write(handle: Any) -> None:
            writer = csv.DictWriter(handle, self.columns, extrasaction="ignore")
            writer.writeheader()
            writer.writerows(rows)

        write_atomic(self.path, write)
        if self.sink is not None and rows:
            self.sink.resume([Row.of(r["step"], r["split"], r) for r in rows])

    def append(self, step: int, split: str, values: dict[str, float]) -> None:
        if not self.write:
            return
        row = {"step": step, "split": split, **values}
        line = ",".join(_cell(row.get(column)) for column in self.columns) + "\n"
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
        if self.sink is not None:  # the loggers get metrics.csv's columns, nothing else
            self.sink.row(step, split, {c: row[c] for c in self.columns[2:] if c in row})

    def checkpointed(self, step: int) -> None:
        """``last.pt`` now holds ``step``: the loggers may send what they held back."""
        if self.sink is not None:
            self.sink.checkpoint(step)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return repr(value)  # round-trips exactly
    return str(value)
