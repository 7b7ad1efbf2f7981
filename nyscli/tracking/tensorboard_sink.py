"""TensorBoard: event files in the run folder (``<run>/tensorboard/``).

Scalars are tagged ``<split>/<metric>`` (``train/loss``, ``dev/accuracy``, ``train/lr``,
``train/tokens_per_s``, ``train/peak_mb``...) at the optimizer step. A resumed run starts a new
run folder (a continued sweep's job resumes in its own), so its event file first replays the
rows it carried over from the earlier run (the same rows ``metrics.csv`` keeps): one
continuous step axis, no step twice. At the end the
resolved config goes in as hparams with the final metrics (TensorBoard's HParams tab).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nyscli.tracking.config import missing_extra
from nyscli.tracking.sinks import Row, Sink


def _writer(log_dir: Path) -> Any:
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # torch's writer needs the tensorboard package
        raise missing_extra("logger=tensorboard") from None
    return SummaryWriter(str(log_dir))


class TensorBoardSink(Sink):
    name = "tensorboard"

    def __init__(self, log_dir: Path, in_place: bool = False) -> None:
        """``in_place``: a continued sweep's job resumes in its own folder; its new event file
        replays the rows kept (as ``metrics.csv`` does), so the old ones go first."""
        self.log_dir = Path(log_dir)
        if in_place:
            for old in self.log_dir.glob("events.out.tfevents.*"):
                old.unlink()
        self.writer = _writer(self.log_dir)

    def resume(self, rows: list[Row]) -> None:
        for row in rows:
            self._add(row)
        self.writer.flush()

    def row(self, row: Row) -> None:
        self._add(row)
        # Flushed row by row, like metrics.csv: a crash loses nothing already logged.
        self.writer.flush()

    def _add(self, row: Row) -> None:
        for key, value in row.values.items():
            self.writer.add_scalar(f"{row.split}/{key}", value, row.step)

    def close(self) -> None:
        self.writer.close()


def hparam_value(value: Any) -> Any:
    """TensorBoard's hparams take numbers, text and booleans: anything else as text."""
    if isinstance(value, bool | int | float | str):
        return value
    return "null" if value is None else str(value)


def write_hparams(
    log_dir: Path, params: dict[str, Any], metrics: dict[str, float], step: int
) -> None:
    """The resolved config as hparams with the final metrics (tagged ``final/<name>``, one
    group beside train/ and dev/), into ``log_dir``, the run's own event folder, so the
    HParams tab pairs them with its curves."""
    from torch.utils.tensorboard.summary import hparams

    writer = _writer(Path(log_dir))
    metrics = {f"final/{k}": v for k, v in metrics.items()}
    try:
        clean = {k: hparam_value(v) for k, v in params.items()}
        for summary in hparams(clean, metrics):
            writer.file_writer.add_summary(summary)
        for key, value in metrics.items():
            writer.add_scalar(key, value, step)
    finally:
        writer.close()
