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

from nyscli.data.pathfinder import DIFFICULTY_CONTOUR_LENGTH
from nyscli.errors import UserInputError
from nyscli.experiments import schema
from nyscli.experiments.bench import row_label
from nyscli.experiments.lra_tasks import (
    DUAL_TASKS,
    IMAGE_SOURCES,
    TASKS,
    classification_objective,
    load_task,
)
from nyscli.experiments.training import (
    check_attention,
    check_device,
    check_values,
    run_context,
    start_run,
)
from nyscli.models import POOLINGS, build_classifier
from nyscli.report.curves import learning_curve
from nyscli.report.tables import pct, rows_table
from nyscli.train import (
    METRICS_FILE,
    ShuffledBatches,
    Trainer,
    TrainerConfig,
    distributed,
    eval_batches,
    peak_memory_mb,
)

log = logging.getLogger(__name__)

CURVE_FILE = "learning_curve.png"
PAPER_NYSTROM = {"listops": 37.15, "text": 65.52, "retrieval": 79.56, "image": 41.58,
                 "pathfinder": 70.94}  # fmt: skip


# The split sizes and seed of a generated task (ListOps: task.generate, Pathfinder:
# task.data.generate).
GENERATED: dict[str, schema.Rule] = {
    "n_train": schema.COUNT,
    "n_val": schema.COUNT,
    "n_test": schema.COUNT,
    "seed": schema.SEED,
}
# The keys of conf/task/*.yaml (each task has some of them) and the LRA model's pooling.
RULES: dict[str, schema.Rule] = {
    **schema.prefixed("task.generate", GENERATED),
    **schema.prefixed("task.data.generate", GENERATED),
    **schema.prefixed(
        "task",
        {
            "max_len": schema.COUNT,
            "batch_size": schema.COUNT,
            "warmup_steps": schema.Int(low=0),
            "steps": schema.COUNT,
            "eval_every": schema.COUNT,
            "eval_examples": schema.OPTIONAL_COUNT,
            "test_examples": schema.OPTIONAL_COUNT,
            "pooling": schema.Choice(values=POOLINGS),
            "data_dir": schema.Text(null=True),
            "generate.min_len": schema.COUNT,
            "generate.max_len": schema.COUNT,
            "generate.max_depth": schema.COUNT,
            "generate.max_args": schema.Int(low=2),
            "data.generate.image_size": schema.Int(low=8),
            "data.path": schema.Text(null=True),
            "data.source": schema.Choice(values=IMAGE_SOURCES),
            "data.val_fraction": schema.PROBABILITY,
            "data.test_fraction": schema.Float(low=0.0, high=1.0, low_open=True, high_open=True),
            "data.seed": schema.SEED,
            "data.difficulty": schema.Choice(values=tuple(DIFFICULTY_CONTOUR_LENGTH)),
            "data.workers": schema.OPTIONAL_COUNT,
        },
    ),
    "model.pooling": schema.Choice(values=POOLINGS),
}


def trainer_config(cfg: DictConfig) -> TrainerConfig:
    return TrainerConfig.from_mapping(OmegaConf.to_container(cfg.trainer, resolve=True))


def validate(cfg: DictConfig) -> None:
    """Cheap checks of every value (no data is read)."""
    if cfg.task.name not in TASKS:
        raise UserInputError(
            f"task={cfg.task.name} is not allowed; choose one of: {', '.join(TASKS)}"
        )
    check_values(cfg, RULES)
    check_device(cfg, trainer_config(cfg))
    check_attention(cfg)


def attention_label(cfg: DictConfig) -> str:
    return row_label(OmegaConf.to_container(cfg.attention, resolve=True))


def _same_setup(cfg: DictConfig):
    """Predicate on an earlier run's config: same command, task, model and attention."""
    keys = ("task", "model", "attention")
    mine = {k: OmegaConf.to_container(cfg[k], resolve=True) for k in keys}

    def matches(other: DictConfig) -> bool:
        if other.get("command") != "lra":
            return False
        try:
            return all(OmegaConf.to_container(other[k], resolve=True) == mine[k] for k in keys)
        except Exception:  # an old config that no longer resolves is simply not a match
            return False

    return matches


def run(cfg: DictConfig, run_dir: Path, console: Console) -> pd.DataFrame:
    started = time.perf_counter()
    settings = trainer_config(cfg)
    device, resume_from = start_run(cfg, "lra", run_dir, _same_setup(cfg))
    with distributed.main_first():  # one rank generates the cached data, the others read it
        data = load_task(cfg.task, cfg.data_cache)
    log.info(
        "task %s: %d train / %d dev / %d test examples",
        cfg.task.name,
        len(data.train),
        len(data.val),
        len(data.test),
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
        model, classification_objective, settings, run_dir, device, ("accuracy",), console
    )
    lengths = getattr(getattr(data.train, "seqs", None), "lengths", None)
    train = ShuffledBatches(
        data.train, settings.batch_size, data.collate, int(cfg.seed), lengths, settings.bucket
    )
    eval_size = settings.eval_batch_size or settings.batch_size
    dev = eval_batches(data.val, eval_size, data.collate, settings.eval_examples)
    fit = trainer.fit(train, dev, resume_from)
    test = {"accuracy": math.nan, "loss": math.nan}
    if fit.completed:
        test_set = eval_batches(data.test, eval_size, data.collate, cfg.task.test_examples)
        test = trainer.test(test_set)
        log.info("test accuracy %.4f (best dev step %s)", test["accuracy"], fit.best_step)
    if not distributed.is_main():
        return pd.DataFrame()  # rank 0 writes the results
    label = attention_label(cfg)
    metrics = pd.read_csv(run_dir / METRICS_FILE)
    learning_curve(metrics, run_dir / CURVE_FILE, f"LRA {cfg.task.name}, {label}")
    row: dict[str, Any] = {
        "task": cfg.task.name,
        "attention": label,
        "test_accuracy": test["accuracy"],
        "test_loss": test["loss"],
        "best_dev_accuracy": fit.best_value,
        "best_step": fit.best_step,
        "steps": fit.step,
        "max_steps": settings.max_steps,
        "status": "ok" if fit.completed else f"stopped at step {fit.step}",
        "wall_s": time.perf_counter() - started,
        "train_s": fit.train_seconds,
        "tokens_per_s": fit.tokens_per_s,
        "peak_mb": peak_memory_mb(device),
        "test_examples": min(len(data.test), cfg.task.test_examples or len(data.test)),
        "max_len": int(cfg.task.max_len),
        "batch_size": train.global_batch_size * settings.accumulate,  # examples per update
        **run_context(cfg, settings, device, resume_from),
    }
    return pd.DataFrame([row])


# --------------------------------------------------------------------------- rendering


def _runs_table(df: pd.DataFrame) -> Table:
    columns = [
        ("task", lambda r: str(r.task)),
        ("attention", lambda r: str(r.attention)),
        ("test %", lambda r: pct(r.test_accuracy)),
        ("dev %", lambda r: pct(r.best_dev_accuracy)),
        ("steps", lambda r: f"{r.steps}/{r.max_steps}"),
        ("min", lambda r: f"{r.wall_s / 60:.1f}"),
        ("tok/s", lambda r: f"{r.tokens_per_s:,.0f}"),
        ("peak MB", lambda r: f"{r.peak_mb:,.0f}"),
    ]
    return rows_table("LRA runs", df, columns, {"task", "attention"})


def _pivot_table(df: pd.DataFrame, column: str, title: str, scale: float, fmt: str) -> Table:
    """Attention rows x task columns (LRA order) of the mean of ``column``, plus an average."""
    tasks = [t for t in TASKS if t in set(df.task)]
    pivot = df.pivot_table(index="attention", columns="task", values=column, aggfunc="mean")
    table = Table(title=title, title_justify="left")
    table.add_column("attention", style="bold")
    for task in tasks:
        table.add_column(task, justify="right")
    table.add_column("avg", justify="right")
    for attention, values in pivot.iterrows():
        cells = [values.get(t) for t in tasks]
        present = [v for v in cells if pd.notna(v)]
        avg = sum(present) / len(present) if present else math.nan
        shown = [("" if pd.isna(v) else format(scale * v, fmt)) for v in cells]
        note = "" if len(present) == len(tasks) else "*"
        table.add_row(
            str(attention), *shown, ("" if pd.isna(avg) else format(scale * avg, fmt)) + note
        )
    return table


def render(df: pd.DataFrame) -> RenderableType:
    """One table of runs; with more than one run also the Table-3 layout (accuracy, tokens/s)."""
    parts: list[RenderableType] = [_runs_table(df)]
    if len(df) > 1:
        parts.append(
            _pivot_table(
                df,
                "test_accuracy",
                "Test accuracy (%) — Table 3 layout; * = average over the tasks present",
                100.0,
                ".2f",
            )
        )
        parts.append(_pivot_table(df, "tokens_per_s", "Training tokens/s", 1.0, ",.0f"))
    return Group(*parts)
