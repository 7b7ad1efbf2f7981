"""The trainer's settings, read from the ``trainer`` config group with one-line errors.

Torch-free (as is the package's ``__init__``): the command line checks a config against these
rules before torch is imported (``nyscli.launch.compose.early_refusal``), so a bad value is
refused in a fraction of a second even on a busy machine."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from nyscli.errors import UserInputError
from nyscli.rules import PROBABILITY, Bool, Choice, Float, Int, Rule, Text

PRECISIONS = ("fp32", "bf16", "fp16")
DECAYS = ("linear", "constant")  # after the warm-up (nyscli.train.schedule)
# device=: where a run computes, for every command (nyscli.train.resources.resolve_device).
DEVICES = ("auto", "cpu", "cuda")
MONITOR_MODES = ("max", "min")
_COUNT = Int(low=1)
_OPTIONAL_COUNT = Int(low=1, null=True)
# Examples in one batch: more is no batch any machine nys runs on holds in memory.
BATCH = Int(low=1, high=2**16)
MAX_MINUTES = 60.0 * 24 * 366  # a year: a time limit beyond it is a typo

# What each trainer setting may hold, the one source: TrainerConfig.check and the CLI's config
# check (nyscli.experiments.schema) both read it.
TRAINER: dict[str, Rule] = {
    # planned_steps first: a task's max_steps is ${.planned_steps}, so a bad planned_steps
    # shows in both and the error should name the key the user gave.
    "planned_steps": _OPTIONAL_COUNT,
    "max_steps": _COUNT,
    "batch_size": BATCH,
    "accumulate": _COUNT,
    "lr": Float(low=0.0, low_open=True),
    "weight_decay": Float(low=0.0),
    "beta1": PROBABILITY,
    "beta2": PROBABILITY,
    "eps": Float(low=0.0, low_open=True),
    "warmup_steps": Int(low=0),
    "decay": Choice(DECAYS),
    "min_lr_ratio": Float(low=0.0, high=1.0),
    "clip_grad_norm": Float(low=0.0, low_open=True, null=True),
    "precision": Choice(PRECISIONS),
    "eval_every": _COUNT,
    "eval_examples": _OPTIONAL_COUNT,
    "eval_batch_size": Int(low=1, high=BATCH.high, null=True),
    "log_every": _COUNT,
    "checkpoint_every": _OPTIONAL_COUNT,
    "monitor": Text(),
    "monitor_mode": Choice(MONITOR_MODES),
    "bucket": _COUNT,
    "stop_at_step": _OPTIONAL_COUNT,
    "stop_after_minutes": Float(low=0.0, low_open=True, high=MAX_MINUTES, null=True),
    "progress": Bool(),
    "compile": Bool(),
    "nproc_per_node": _COUNT,
}


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
    # Stop (checkpoint kept) after this many minutes of this process's training: resumable
    # chunks that fit a time-limited job (a lent GPU, a SLURM slot); null = no limit.
    stop_after_minutes: float | None = None
    progress: bool = True  # rich progress bar
    # torch.compile the training forward (evaluation, checkpoints and the optimizer use the
    # model itself): measured no faster on a 2-core CPU for the LRA model, so off by default.
    compile: bool = False
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
        """Every setting against :data:`TRAINER`; one-line errors naming ``trainer.<key>``."""
        for key, rule in TRAINER.items():
            rule.check(f"trainer.{key}", getattr(self, key))

    @property
    def save_every(self) -> int:
        return self.checkpoint_every or self.eval_every

    @property
    def examples_per_update(self) -> int:
        """Examples one optimizer update sees (all ranks, all micro-batches)."""
        return self.batch_size * self.accumulate * self.nproc_per_node

    @property
    def capped(self) -> bool:
        """True when ``max_steps`` cuts the budget the schedule was planned for (a short run:
        its evaluation subsets and data are sized to it, see :meth:`fit_budget`)."""
        return self.planned_steps is not None and self.max_steps < self.planned_steps

    @property
    def run_examples(self) -> int:
        """Training examples the whole run draws (``max_steps`` updates)."""
        return self.max_steps * self.examples_per_update

    def held_out_size(self, size: int | None) -> int | None:
        """A final test/dev set size for this run: ``size`` (None = all), and for a capped run
        at most :attr:`run_examples`, so a short run spends most of its time training."""
        if not self.capped:
            return size
        return self.run_examples if size is None else min(size, self.run_examples)

    def fit_budget(self, fixed: Collection[str] = ()) -> tuple[TrainerConfig, str | None]:
        """The schedule for a ``max_steps`` cap below ``planned_steps``, and a note if changed.

        When the cap is shorter than the warm-up or the eval interval (``--steps 100`` on LRA
        Text: warm-up 8000, eval every 1000), the lr would never reach its peak and dev would
        be seen once: warm-up, eval, checkpoint and log intervals keep their ratio to the
        budget instead, ``round(value * max_steps / planned_steps)``, and each periodic dev
        evaluation sees at most as many examples as the run trains on between two of them
        (``--steps 30`` on ListOps would otherwise evaluate 2,000 dev examples every 3 steps:
        nine tenths of the run). Keys in ``fixed`` (the ones the user set explicitly) are kept
        as given.
        """
        planned, cap = self.planned_steps, self.max_steps
        if planned is None or cap >= planned or cap >= max(self.warmup_steps, self.eval_every):
            return self, None
        ratio = cap / planned
        changes: dict[str, int | None] = {}
        if "warmup_steps" not in fixed and self.warmup_steps > 0:
            changes["warmup_steps"] = min(max(1, round(self.warmup_steps * ratio)), cap - 1)
        for key in ("eval_every", "checkpoint_every", "log_every"):
            value = getattr(self, key)
            if key not in fixed and value is not None and value > 1:
                changes[key] = max(1, round(value * ratio))
        shorter = changes.get("eval_every", self.eval_every) != self.eval_every
        if "checkpoint_every" not in fixed and self.checkpoint_every is None and shorter:
            # Checkpoints keep the planned cadence in steps (a short run saves at its end):
            # saving MiniLM's weights and optimizer state every 2 steps cost more than training.
            changes["checkpoint_every"] = self.eval_every
        if "eval_examples" not in fixed:
            between = changes.get("eval_every", self.eval_every) * self.examples_per_update
            if self.eval_examples is None or self.eval_examples > between:
                changes["eval_examples"] = between
        changes = {k: v for k, v in changes.items() if v != getattr(self, k)}
        if not changes:
            return self, None
        unset = {"eval_examples": "all", "checkpoint_every": "at evaluations"}
        scaled = ", ".join(
            f"{k} {unset[k] if getattr(self, k) is None else getattr(self, k)} -> {v}"
            for k, v in changes.items()
        )
        note = (
            f"trainer.max_steps={cap} is below the schedule planned for {planned} steps: "
            f"{scaled} (scaled by {cap}/{planned}; eval_examples = the examples trained between "
            f"two evaluations; the final test sees at most the {self.run_examples} the run "
            f"trains on; set trainer.{'/'.join(changes)} to override one, "
            f"trainer.planned_steps=null for none)"
        )
        return dataclasses.replace(self, **changes), note
