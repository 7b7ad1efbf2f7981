"""``nys lra``: train and test one Long Range Arena task with any attention (Table 3).

One run = one (task, attention). The model is the paper's LRA encoder (``conf/model/lra``),
the loop the shared trainer (``nyscli.train``). The result row holds test accuracy (best-dev
checkpoint), best dev accuracy, steps, wall time, training tokens/s and peak memory; over a
sweep ``render`` lays the rows out as Table 3 (attention rows x task columns + average).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf
from rich.console import Console, Group, RenderableType
from rich.table import Table

from nyscli import attention
from nyscli.data.subsets import dataset_labels, evaluation_subset
from nyscli.errors import UserInputError
from nyscli.experiments import training
from nyscli.experiments.lra.rules import GENERATED, check
from nyscli.experiments.lra.table import render_table3, write_table3
from nyscli.experiments.lra.tasks import (
    DUAL_TASKS,
    TASKS,
    check_source,
    classification_objective,
    load_task,
    trivial_baseline,
)
from nyscli.experiments.training import preflight, resume_pins
from nyscli.models.classifier import build_classifier
from nyscli.output.tables import BASELINE_COLUMNS, pct, rows_table
from nyscli.train import distributed
from nyscli.train.batches import ShuffledBatches, eval_batches
from nyscli.train.config import TrainerConfig
from nyscli.train.loop import Trainer
from nyscli.train.resume import architecture

log = logging.getLogger(__name__)

__all__ = ["preflight", "render", "resume_pins", "run", "validate"]  # the launcher's resume hooks


def validate(cfg: DictConfig) -> None:
    """Cheap checks of every value (no data is read)."""
    if cfg.task.name not in TASKS:
        raise UserInputError(
            f"task={cfg.task.name} is not allowed; choose one of: {', '.join(TASKS)}"
        )
    check(cfg)
    check_source(cfg.task, cfg.data)
    training.check_device(cfg, training.trainer_config(cfg))
    training.check_attention(cfg)


def sized_data(data: DictConfig, settings: TrainerConfig) -> tuple[DictConfig, str | None]:
    """``data`` with a generated task's split sizes cut to what a capped run uses, and a line
    saying so (None when nothing was cut).

    A run capped below its planned budget (``--steps 30`` of ListOps' 5000) draws
    ``run_examples`` training examples and evaluates at most as many: generating all 96,000
    ListOps trees (or 160,000 Pathfinder images) for it would take longer than the run. The
    generators are seeded streams, so the first k examples are the same whatever the size.
    """
    generate = data.get("generate")
    if data.get("path") or generate is None or not settings.capped:
        return data, None
    cap = settings.run_examples
    sizes = {k: min(int(generate[k]), cap) for k in GENERATED if k.startswith("n_")}
    if all(sizes[k] == int(generate[k]) for k in sizes):
        return data, None
    counts = " / ".join(f"{sizes[k]} of {int(generate[k])} {k[2:]}" for k in sizes)
    note = (
        f"short run (trainer.max_steps={settings.max_steps} of {settings.planned_steps} "
        f"planned): generated {counts} examples, the first of each split's seeded stream "
        "(trainer.planned_steps=null generates them all)"
    )
    sized = OmegaConf.to_container(data, resolve=True)
    sized["generate"].update(sizes)
    return OmegaConf.create(sized), note


def attention_label(cfg: DictConfig) -> str:
    return attention.attention_label(OmegaConf.to_container(cfg.attention, resolve=True))


def run(cfg: DictConfig, run_dir: Path, console: Console) -> pd.DataFrame:
    started = time.perf_counter()
    device, plan = training.start_run(cfg, run_dir)
    planned = training.trainer_config(cfg)
    sized, note = sized_data(cfg.data, planned)
    with distributed.main_first():  # one rank generates the cached data, the others read it
        data = load_task(cfg.task, sized, cfg.data_cache, cfg.threads)
    # After the data: a bad data file is then the run's only output line.
    if note:
        log.info(note)
    settings = training.fit_schedule(planned, run_dir)
    baseline, rule_accuracy = trivial_baseline(cfg.task.name, data)
    log.info(
        "task %s on %s: %d train / %d dev / %d test examples; %s scores %.2f%% on test",
        cfg.task.name,
        data.dataset,
        len(data.train),
        len(data.val),
        len(data.test),
        baseline,
        100 * rule_accuracy,
    )
    model = build_classifier(
        vocab_size=data.vocab_size,
        max_len=int(cfg.task.max_len),
        num_classes=data.num_classes,
        model=OmegaConf.to_container(cfg.model, resolve=True),
        attention=OmegaConf.to_container(cfg.attention, resolve=True),
        dual=cfg.task.name in DUAL_TASKS,
    )
    trainer = Trainer(
        model, classification_objective, settings, run_dir, device, ("accuracy",), console,
        architecture(cfg),
    )  # fmt: skip
    lengths = getattr(getattr(data.train, "seqs", None), "lengths", None)
    train = ShuffledBatches(
        data.train, settings.batch_size, data.collate, int(cfg.seed), lengths, settings.bucket
    )
    eval_size = settings.eval_batch_size or settings.batch_size
    dev_set = evaluation_subset(data.val, settings.eval_examples)
    test_set = evaluation_subset(data.test, settings.held_out_size(cfg.task.test_examples))
    dev_balance = training.class_balance("dev set", dataset_labels(dev_set), data.num_classes)
    test_balance = training.class_balance("test set", dataset_labels(test_set), data.num_classes)
    dev = eval_batches(dev_set, eval_size, data.collate)
    fit = trainer.fit(train, dev, plan.checkpoint)
    test = {"accuracy": math.nan, "loss": math.nan}
    if fit.completed:
        test = trainer.test(eval_batches(test_set, eval_size, data.collate))
        log.info("test accuracy %.4f (best dev step %s)", test["accuracy"], fit.best_step)
    if not distributed.is_main():
        return pd.DataFrame()  # rank 0 writes the results
    label = attention_label(cfg)
    training.write_learning_curve(
        run_dir, f"LRA {cfg.task.name}, {label}", fit.best_step, dev_balance
    )
    fields: dict[str, Any] = {
        "task": cfg.task.name,
        "dataset": data.dataset,
        "attention": label,
        "test_accuracy": test["accuracy"],
        "trivial_rule": baseline,
        "rule_accuracy": rule_accuracy,
        "test_loss": test["loss"],
        "best_dev_accuracy": fit.best_value,
        **training.baseline_fields(test_balance, test["accuracy"], "test", dev_balance),
        "test_examples": len(test_set),
        "max_len": int(cfg.task.max_len),
    }
    row = training.result_row(fields, cfg=cfg, fit=fit, trainer=settings, train=train,
                              device=device, plan=plan, started=started)  # fmt: skip
    return pd.DataFrame([row])


# --------------------------------------------------------------------------- rendering


def _runs_table(df: pd.DataFrame) -> Table:
    columns = [
        ("task", lambda r: str(r.task)),
        ("data", lambda r: str(getattr(r, "dataset", "") or "")),
        ("attention", lambda r: str(r.attention)),
        ("test %", lambda r: pct(r.test_accuracy)),
        ("rule %", lambda r: pct(getattr(r, "rule_accuracy", math.nan))),
        ("dev %", lambda r: pct(r.best_dev_accuracy)),
        *BASELINE_COLUMNS,
        ("steps", lambda r: f"{r.steps}/{r.max_steps}"),
        ("min", lambda r: f"{r.wall_s / 60:.1f}"),
        ("tok/s", lambda r: f"{r.tokens_per_s:,.0f}"),
        ("peak MB", lambda r: f"{r.peak_mb:,.0f}"),
    ]
    return rows_table("LRA runs", df, columns, {"task", "data", "attention"})


def render(df: pd.DataFrame) -> RenderableType:
    """One table of runs; with more than one run also Table 3 (lra_table)."""
    parts: list[RenderableType] = [_runs_table(df)]
    if len(df) > 1:
        parts.append(render_table3(df))
    return Group(*parts)


def write_figures(df: pd.DataFrame, folder: Path) -> list[Path]:
    """``table3.csv`` and a learning-curve PNG per task, for a sweep or ``nys report``."""
    return write_table3(df, folder)
