"""What every training command (lra, pretrain, finetune) checks and does before it trains, and
the settings and result row they all build the same way."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from nyscli import tracking
from nyscli.attention import check_width
from nyscli.data.subsets import ClassBalance
from nyscli.errors import UserInputError
from nyscli.experiments import schema
from nyscli.experiments.renamed import upgrade_recorded
from nyscli.models.bert import BertConfig
from nyscli.output.curves import LEARNING_CURVE_FILE, learning_curve
from nyscli.overrides import override_keys
from nyscli.paths import OUTPUT_ROOT
from nyscli.train import distributed
from nyscli.train.batches import ShuffledBatches
from nyscli.train.config import TrainerConfig
from nyscli.train.loop import FitResult
from nyscli.train.metrics import METRICS_FILE
from nyscli.train.resources import peak_memory_mb, reset_peak_memory, resolve_device
from nyscli.train.resume import (
    Change,
    ResumePlan,
    claim_continuation,
    default_pins,
    hold_training,
    named_run,
    plan_resume,
    record_resume,
    recorded_overrides,
    saved_config,
)
from nyscli.train.seed import seed_everything
from nyscli.train.splits import read_metrics

log = logging.getLogger(__name__)
# Command-line keys that set the schedule explicitly: kept as given when --steps scales it.
SCHEDULE_KEYS = {
    "warmup_steps": ("trainer.warmup_steps",),
    "eval_every": ("trainer.eval_every",),
    "checkpoint_every": ("trainer.checkpoint_every",),
    "log_every": ("trainer.log_every",),
    "eval_examples": ("trainer.eval_examples",),
}


def trainer_config(cfg: DictConfig, **fields: Any) -> TrainerConfig:
    """The ``trainer`` group as checked settings; ``fields`` replace what the run computed
    itself (finetune's schedule in epochs)."""
    values = {**OmegaConf.to_container(cfg.trainer, resolve=True), **fields}
    return TrainerConfig.from_mapping(values)


def check_device(cfg: DictConfig, trainer: TrainerConfig) -> torch.device:
    """The device ``cfg.device`` names; fp16 without CUDA is a one-line error."""
    device = resolve_device(str(cfg.device))
    if trainer.precision == "fp16" and device.type != "cuda":
        raise UserInputError("trainer.precision=fp16 needs CUDA; use bf16 or fp32 on CPU")
    return device


def check_attention(cfg: DictConfig) -> None:
    """The attention's options against its core's rules, and the model's width against its
    heads: one-line errors, nothing built."""
    schema.check_attentions(schema.attentions_of(cfg))
    check_width(cfg.model.dim, cfg.model.num_heads)


def resume_plan(cfg: DictConfig, run_dir: Path | None = None) -> ResumePlan:
    """What ``cfg.resume`` continues (see :mod:`nyscli.train.resume`); ``run_dir``: this run's
    folder, never a candidate for ``resume=true``."""
    command = str(cfg.command)
    return plan_resume(
        cfg, Path(OUTPUT_ROOT) / command, run_dir, lambda saved: upgrade_recorded(saved, command)
    )


def resume_pins(
    cfg: DictConfig, given: set[str], compose: Callable[[list[str]], DictConfig]
) -> list[Change]:
    """For ``resume=<run folder>``: the settings whose default changed since that run, each
    to be kept at its recorded value (see :func:`nyscli.train.resume.default_pins`).
    ``compose`` builds today's config from a list of overrides (that run's own)."""
    run = named_run(cfg.get("resume"))
    if run is None:
        return []
    command = str(cfg.command)
    saved = upgrade_recorded(saved_config(run), command)
    try:
        today = compose(recorded_overrides(run))
    except Exception:  # its overrides no longer compose: plan_resume names the differences
        return []
    return default_pins(saved, today, cfg, given)


def preflight(cfg: DictConfig) -> str | None:
    """Before a run folder exists: a line saying there is nothing to do (``resume=`` names a
    finished run), or None. A refused resume raises its one-line error here."""
    return resume_plan(cfg).nothing_to_do()


def start_run(cfg: DictConfig, run_dir: Path) -> tuple[torch.device, ResumePlan]:
    """Device, a fresh peak-memory count, the run to resume from (``cfg.resume``) and the
    seed (the job's threads are set by its launch, ``launch/task.py``).

    Returns (device, resume plan: its ``checkpoint`` is the last.pt to continue or None).
    """
    device = resolve_device(str(cfg.device))
    reset_peak_memory(device)  # jobs of a sweep share one process: each reports its own peak
    plan = resume_plan(cfg, run_dir)
    if plan.finished:
        raise UserInputError(plan.nothing_to_do() or "")
    for change in plan.changes:
        log.warning("resume_changes=allow: %s", change)
    asked = "true" if str(cfg.resume).lower() == "true" else str(cfg.resume)  # a path as typed
    if distributed.is_main():
        hold_training(run_dir, asked)  # not continued by another launch while it trains
        if plan.checkpoint is not None:
            claim_continuation(run_dir, plan.checkpoint, asked)  # either form: continued once
            record_resume(run_dir, plan.checkpoint)  # resume=true never continues it again
            log.info("resume=%s: continuing %s", asked, plan.run)
    seed_everything(int(cfg.seed))
    # The loggers (logger=tensorboard/mlflow) of rank 0; a resume continues the earlier run's.
    previous = plan.checkpoint.parent.parent if plan.checkpoint else None

    def peak() -> dict[str, float]:
        return {"peak_mb": peak_memory_mb(device)}

    tracking.activate(cfg, run_dir, previous, distributed.is_main(), peak)
    return device, plan


def _explicit_keys(run_dir: Path) -> set[str]:
    """The schedule fields the command line set explicitly (kept as given by fit_budget).

    Read from the run's ``.hydra/overrides.yaml``: the ranks of a multi-process job have no
    Hydra context of their own, but all see the run folder.
    """
    recorded = run_dir / ".hydra" / "overrides.yaml"
    if recorded.is_file():
        overrides = [str(o) for o in OmegaConf.load(recorded)]
    elif HydraConfig.initialized():
        overrides = list(HydraConfig.get().overrides.task)
    else:
        return set()
    given = override_keys(overrides)
    return {field for field, keys in SCHEDULE_KEYS.items() if given & set(keys)}


def fit_schedule(
    settings: TrainerConfig, run_dir: Path, fixed: tuple[str, ...] = ()
) -> TrainerConfig:
    """``settings`` with warm-up and eval interval scaled to a ``--steps`` cap below them (see
    :meth:`TrainerConfig.fit_budget`), said in one log line; ``fixed`` fields are kept, as are
    those the command line set."""
    settings, note = settings.fit_budget(_explicit_keys(Path(run_dir)) | set(fixed))
    if note:
        log.warning(note)
    elif settings.warmup_steps >= settings.max_steps:
        log.warning(
            "trainer.warmup_steps=%d >= trainer.max_steps=%d: the lr never reaches its peak",
            settings.warmup_steps,
            settings.max_steps,
        )
    return settings


def class_balance(name: str, labels: np.ndarray | None, num_classes: int) -> ClassBalance | None:
    """The label spread of an evaluated set, logged in one line (a warning if single-class)."""
    if labels is None:
        return None
    balance = ClassBalance.of(labels, num_classes)
    if balance.classes_present <= 1:
        log.warning("%s holds a single class: its accuracy says nothing", balance.describe(name))
    else:
        log.info(balance.describe(name))
    return balance


def write_learning_curve(
    run_dir: Path, title: str, best_step: int | None, dev: ClassBalance | None
) -> Path | None:
    """The run's ``learning_curve.png`` from its metrics.csv: the reported model's scores (test,
    ``<split> (best)``) at ``best_step``, where that checkpoint comes from (they were drawn at
    the last step, as if the last model were the one reported), and the dev set's
    majority-class rate as the line a dev curve has to leave."""
    baseline = None if dev is None else (dev.majority_rate, "majority class (dev)")
    metrics = read_metrics(run_dir / METRICS_FILE)
    path = run_dir / LEARNING_CURVE_FILE
    return learning_curve(metrics, path, title, best_step=best_step, baseline=baseline)


def baseline_fields(
    balance: ClassBalance | None,
    accuracy: float,
    name: str,
    dev: ClassBalance | None = None,
    prefix: str = "",
) -> dict[str, Any]:
    """majority_rate, chance_rate and flag (each named ``<prefix><field>``) of a result on a
    set, for the results row: every command's accuracies are flagged by this one rule
    (:func:`~nyscli.data.subsets.baseline_flag`). The flag (also a single-class ``dev`` set,
    which picked the best checkpoint) is logged as a warning."""
    flags = [balance.flag(accuracy)] if balance is not None else []
    if dev is not None and dev.classes_present <= 1:
        flags.append("dev single class")
    flag = ", ".join(f for f in flags if f)
    if flag:
        log.warning("%s accuracy %.2f%% is flagged: %s", name, 100 * accuracy, flag)
    return {
        f"{prefix}majority_rate": None if balance is None else balance.majority_rate,
        f"{prefix}chance_rate": None if balance is None else balance.chance_rate,
        f"{prefix}flag": flag or None,
    }


def result_row(
    fields: dict[str, Any],
    *,
    cfg: DictConfig,
    fit: FitResult,
    trainer: TrainerConfig,
    train: ShuffledBatches,
    device: torch.device,
    plan: ResumePlan,
    started: float,
) -> dict[str, Any]:
    """A training run's ``results.csv`` row: the command's own ``fields`` (what it measured),
    then the columns every training command reports alike: how far it got and how fast, and
    how it ran (ranks, precision, schedule, device, resume and the settings it changed)."""
    return {
        **fields,
        "best_step": fit.best_step,
        "steps": fit.step,
        "max_steps": trainer.max_steps,
        "status": "ok" if fit.completed else f"stopped at step {fit.step}",
        "wall_s": time.perf_counter() - started,
        "train_s": fit.train_seconds,
        "tokens_per_s": fit.tokens_per_s,
        "peak_mb": peak_memory_mb(device),
        "batch_size": train.global_batch_size * trainer.accumulate,  # examples per update
        "world_size": distributed.world_size(),
        "precision": trainer.precision,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "seed": int(cfg.seed),
        "warmup_steps": trainer.warmup_steps,
        "eval_every": trainer.eval_every,
        "resumed_from": str(plan.checkpoint) if plan.checkpoint else None,
        "resume_changes": plan.changes_text(),
    }


def bert_config(cfg: DictConfig, vocab_size: int) -> BertConfig:
    """The encoder the ``model`` and ``attention`` groups describe (pretrain, finetune from
    scratch)."""
    model = cfg.model
    return BertConfig.create(
        vocab_size=vocab_size,
        max_len=int(model.max_len),
        dim=int(model.dim),
        depth=int(model.depth),
        num_heads=int(model.num_heads),
        ffn_dim=int(model.ffn_dim),
        dropout=float(model.dropout),
        attention=OmegaConf.to_container(cfg.attention, resolve=True),
    )
