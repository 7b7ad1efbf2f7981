"""The trainer's settings, read from the ``trainer`` config group with one-line errors."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from nyscli.errors import UserInputError
from nyscli.train.schedule import DECAYS

PRECISIONS = ("fp32", "bf16", "fp16")
MONITOR_MODES = ("max", "min")


@dataclass(frozen=True)
class TrainerConfig:
    """How to train. One optimizer update sees ``batch_size * accumulate * ranks`` examples."""

    max_steps: int
    batch_size: int
    # The budget warmup_steps and eval_every were chosen for (a task's paper schedule); a
    # max_steps below them scales both (fit_budget). null = max_steps.
    planned_steps: int | None = None
    lr: float = 1e-4
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    warmup_steps: int = 0
    decay: str = "linear"  # linear | constant
    min_lr_ratio: float = 0.0
    accumulate: int = 1  # micro-batches per optimizer update
    clip_grad_norm: float | None = None  # max global L2 norm; null = no clipping
    precision: str = "fp32"  # fp32 | bf16 | fp16 (autocast; fp16 adds a GradScaler, CUDA only)
    eval_every: int = 500  # evaluate on dev every k updates (and at the end)
    eval_examples: int | None = None  # dev subset for periodic evals; null = all of dev
    eval_batch_size: int | None = None  # null = batch_size
    log_every: int = 50  # a train row in metrics.csv every k updates
    checkpoint_every: int | None = None  # null = eval_every
    monitor: str = "accuracy"  # dev metric that picks the best checkpoint
    monitor_mode: str = "max"  # max | min
    bucket: int = 1  # >1: length-bucketed batches (windows of this many batches)
    stop_at_step: int | None = None  # stop early (checkpoint kept) to resume later
    progress: bool = True  # rich progress bar
    # Ranks started inside the job (torch elastic launcher); batch_size is then per rank.
    nproc_per_node: int = 1

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> TrainerConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - names)
        if unknown:
            raise UserInputError(
                f"trainer has no option {', '.join(unknown)}; allowed: {', '.join(sorted(names))}"
            )
        cfg = cls(**dict(values))
        cfg.check()
        return cfg

    def check(self) -> None:
        positive = ("max_steps", "batch_size", "accumulate", "eval_every", "log_every", "bucket")
        for key in (*positive, "nproc_per_node"):
            _at_least(getattr(self, key), f"trainer.{key}", 1)
        optional = ("eval_examples", "eval_batch_size", "checkpoint_every", "stop_at_step")
        for key in (*optional, "planned_steps"):
            if getattr(self, key) is not None:
                _at_least(getattr(self, key), f"trainer.{key}", 1)
        _at_least(self.warmup_steps, "trainer.warmup_steps", 0)
        if not self.lr > 0:
            raise UserInputError(f"trainer.lr={self.lr} is not allowed; it must be > 0")
        if self.clip_grad_norm is not None and not self.clip_grad_norm > 0:
            raise UserInputError(
                f"trainer.clip_grad_norm={self.clip_grad_norm} is not allowed; use > 0 or null"
            )
        _one_of(self.precision, "trainer.precision", PRECISIONS)
        _one_of(self.decay, "trainer.decay", DECAYS)
        _one_of(self.monitor_mode, "trainer.monitor_mode", MONITOR_MODES)

    @property
    def save_every(self) -> int:
        return self.checkpoint_every or self.eval_every

    def fit_budget(self, fixed: Collection[str] = ()) -> tuple[TrainerConfig, str | None]:
        """The schedule for a ``max_steps`` cap below ``planned_steps``, and a note if changed.

        When the cap is shorter than the warm-up or the eval interval (``--steps 100`` on LRA
        Text: warm-up 8000, eval every 1000), the lr would never reach its peak and dev would
        be seen once: warm-up, eval interval (and checkpoint interval) keep their ratio to the
        budget instead, ``round(value * max_steps / planned_steps)``. Keys in ``fixed`` (the
        ones the user set explicitly) are kept as given.
        """
        planned, cap = self.planned_steps, self.max_steps
        if planned is None or cap >= planned or cap >= max(self.warmup_steps, self.eval_every):
            return self, None
        ratio = cap / planned
        changes: dict[str, int] = {}
        if "warmup_steps" not in fixed and self.warmup_steps > 0:
            changes["warmup_steps"] = min(max(1, round(self.warmup_steps * ratio)), cap - 1)
        for key in ("eval_every", "checkpoint_every"):
            value = getattr(self, key)
            if key not in fixed and value is not None and value > 1:
                changes[key] = max(1, round(value * ratio))
        changes = {k: v for k, v in changes.items() if v != getattr(self, k)}
        if not changes:
            return self, None
        scaled = ", ".join(f"{k} {getattr(self, k)} -> {v}" for k, v in changes.items())
        note = (
            f"trainer.max_steps={cap} is below the schedule planned for {planned} steps: "
            f"{scaled} (scaled by {cap}/{planned}; set trainer.{'/'.join(changes)} to override)"
        )
        return dataclasses.replace(self, **changes), note


def _at_least(value: Any, key: str, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise UserInputError(f"{key}={value} is not allowed; it must be an integer >= {low}")


def _one_of(value: Any, key: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise UserInputError(f"{key}={value} is not allowed; choose one of: {', '.join(allowed)}")
