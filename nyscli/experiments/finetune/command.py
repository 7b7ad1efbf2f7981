"""``nys finetune``: fine-tune a BERT on a GLUE task or IMDB (the paper's Table 2).

One run = one (task, init). ``init`` is a ``nys pretrain`` checkpoint or ``scratch``; the
model is :class:`~nyscli.models.bert_classifier.BertClassifier`, the loop the shared trainer.
The schedule is in epochs (paper: 4, AdamW 3e-5, batch 32, linear decay after
``warmup_ratio`` of the steps); ``trainer.max_steps`` caps it (CPU runs).

Reported: the final model's dev accuracy (and F1 for MRPC/QQP; MNLI matched and
mismatched), as the paper ("fine-tune ..., report the results on the validation set"); for
IMDB, whose dev set is held out of train, the official test set's accuracy with the best-dev
checkpoint. Over a sweep ``render`` lays the rows out as Table 2 (best run per cell, as the
paper's MRPC grid search).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig
from rich.console import Console, Group, RenderableType
from rich.table import Table

from nyscli.attention import attention_label
from nyscli.checkpoints.capture import names_attention
from nyscli.checkpoints.hf_import import is_checkpoint_spec
from nyscli.checkpoints.pretrained import resolve_pretrained
from nyscli.data.glue import GLUE_TASKS
from nyscli.data.pairs import PairCollate, encode_examples
from nyscli.data.subsets import dataset_labels
from nyscli.errors import UserInputError
from nyscli.experiments import training
from nyscli.experiments.finetune.evaluate import (
    DEPLOYMENT_PLOT,
    by_length,
    check_evaluated_data,
    deployment_plot,
    deployment_table,
    evaluate_only,
)
from nyscli.experiments.finetune.model import (
    SCRATCH,
    StartingPoint,
    check_conv_fit,
    check_init,
    current_overrides,
    fit_conv_skip,
    pretrained_folder,
    selected_attention,
    starting_point,
)
from nyscli.experiments.finetune.rules import builds_attention, check
from nyscli.experiments.finetune.tasks import (
    CSV,
    TASKS,
    TEST_TASKS,
    ClassificationObjective,
    csv_files,
    dev_splits,
    load_examples,
    metric_names,
    num_classes,
    record_csv,
    seeded_subset,
)
from nyscli.experiments.training import preflight, resume_pins
from nyscli.models.bert_classifier import BertClassifier
from nyscli.output.paper import TABLE2
from nyscli.output.tables import BASELINE_COLUMNS, pct, rows_table, whole
from nyscli.train import distributed
from nyscli.train.batches import ShuffledBatches, eval_batches
from nyscli.train.checkpoint import load_best
from nyscli.train.config import TrainerConfig
from nyscli.train.loop import Trainer
from nyscli.train.resume import architecture

log = logging.getLogger(__name__)

__all__ = ["preflight", "render", "resume_pins", "run", "validate"]  # the launcher's resume hooks


def validate(cfg: DictConfig) -> None:
    """Cheap checks of every value (no weights are read; of the data only a csv task's table
    files, which are read and checked whole: a bad file is refused before any folder exists)."""
    if cfg.task.name not in TASKS:
        raise UserInputError(
            f"task={cfg.task.name} is not allowed; choose one of: {', '.join(TASKS)}"
        )
    check(cfg)
    # trainer.max_steps=null: the epochs decide, once the data is read.
    training.check_device(cfg, training.trainer_config(cfg, max_steps=cfg.trainer.max_steps or 1))
    check_conv_fit(cfg, names_attention(current_overrides()))
    if builds_attention(cfg):
        training.check_attention(cfg)
    if cfg.get("eval_only"):
        check_evaluated_data(cfg)
        return
    if str(cfg.init) != SCRATCH:
        check_init(str(cfg.init))
    elif cfg.scratch.like:
        pretrained_folder(str(cfg.scratch.like), "scratch.like")
    if cfg.task.name == CSV:
        check_csv(cfg)


def check_csv(cfg: DictConfig) -> None:
    """A csv task's files read and checked (columns, rows, classes, encoding, empty labels;
    the split's sizes): each problem one line, before the run folder exists."""
    files = csv_files(cfg)
    drawn = [s for s in ("dev", "test") if not files[s]]
    total = sum(float(cfg.task[f"{s}_fraction"]) for s in drawn)
    if len(drawn) == 2 and total >= 1:
        raise UserInputError(
            f"task.dev_fraction={cfg.task.dev_fraction} and task.test_fraction="
            f"{cfg.task.test_fraction} leave nothing to train on; their sum must be below 1"
        )
    load_examples(cfg.task, cfg.data.path, int(cfg.seed), files=files)


def planned_steps(cfg: DictConfig, train_examples: int, batch_size: int) -> int:
    """The updates of ``epochs`` of full batches (before any trainer.max_steps cap)."""
    return max(1, round(float(cfg.epochs) * (train_examples // batch_size or 1)))


def schedule(cfg: DictConfig, train_examples: int, batch_size: int) -> tuple[int, int]:
    """(updates, warm-up updates): ``epochs`` of full batches, capped by trainer.max_steps;
    warm-up ``warmup_ratio`` of them (null: trainer.warmup_steps)."""
    steps = planned_steps(cfg, train_examples, batch_size)
    cap = cfg.trainer.max_steps
    steps = min(steps, int(cap)) if cap else steps
    if cfg.warmup_ratio is None:
        warmup = int(cfg.trainer.warmup_steps)
    else:
        warmup = round(float(cfg.warmup_ratio) * steps)
    return steps, min(warmup, steps - 1)  # a capped run still gets updates at a real lr


def init_label(source: str) -> str:
    """``scratch``, or the checkpoint's folder as ``<run folder>/pretrained``-style short name."""
    if source == SCRATCH or is_checkpoint_spec(source):
        return source
    parts = resolve_pretrained(Path(source)).resolve().parts
    return "/".join(parts[-2:]) if parts[-1] == "pretrained" else parts[-1]


def start_model(cfg: DictConfig, classes: int) -> tuple[StartingPoint, BertClassifier]:
    """The encoder the run starts from (logged) and the classifier around it (``classes``
    outputs)."""
    start: StartingPoint = starting_point(
        cfg, selected_attention(cfg, names_attention(current_overrides()))
    )
    if start.source != SCRATCH:
        label = attention_label(start.encoder.config.attention)
        log.info("init=%s: attention %s", start.source, label)
    if start.extended_from:
        log.info("positions %d..%d copied from 0..%d", start.extended_from,
                 int(cfg.task.max_len) - 1, start.extended_from - 1)  # fmt: skip
    model = BertClassifier(start.encoder, classes, start.encoder.config.dropout)
    if start.pooler is not None:  # an imported checkpoint's pooler; the classifier is new
        model.pooler.load_state_dict(start.pooler)
    return start, model


def load_splits(cfg: DictConfig) -> dict[str, Any]:
    """The task's examples (train and test as seeded subsets where asked)."""
    files = csv_files(cfg) if cfg.task.name == CSV else None
    examples = load_examples(cfg.task, cfg.data.path, int(cfg.seed), files=files)
    if "test" in examples:
        examples["test"] = seeded_subset(examples["test"], cfg.task.get("test_examples"))
    examples["train"] = seeded_subset(examples["train"], cfg.task.get("train_examples"))
    return examples


def encode_splits(
    cfg: DictConfig, start: StartingPoint, examples: dict[str, Any]
) -> dict[str, Any]:
    """The examples' tokens, in the starting point's vocabulary."""
    max_len = int(cfg.task.max_len)
    encoded = {k: encode_examples(v, start.tokenizer, max_len) for k, v in examples.items()}
    counts = ", ".join(f"{len(v)} {k}" for k, v in encoded.items())
    log.info("task %s: %s examples", cfg.task.name, counts)
    return encoded


def final_scores(
    trainer: Trainer, fit: Any, encoded: dict[str, Any], devs: tuple[str, ...], batches: Any
) -> tuple[dict[str, dict[str, float]], dict[str, float]]:
    """The reported model, the best-dev checkpoint (as for test), on all of each dev set
    (logged to metrics.csv as ``<split> (best)``, apart from the periodic dev rows) and on
    test; NaN when the run stopped early or the task has no test split."""
    final: dict[str, dict[str, float]] = {}
    test = {"accuracy": math.nan}
    if not fit.completed:
        return final, test
    distributed.barrier()  # rank 0 has written best.pt
    load_best(trainer.model, trainer.checkpoints, trainer.device)
    for split in devs:
        final[split] = trainer.evaluate(batches(encoded[split]))
        final[split].pop("tokens_per_s", None)
        trainer.metrics.append(fit.step, f"{split} (best)", final[split])
        log.info("%s (best, step %s)", best_headline(split, final[split]), fit.best_step)
    if "test" in encoded:
        test = trainer.test(batches(encoded["test"]))
        log.info("test accuracy %.2f%% (best dev step %s)", 100 * test["accuracy"], fit.best_step)
    return final, test


def best_headline(split: str, scores: dict[str, float]) -> str:
    """``dev accuracy 65.37%`` (and F1): a dev set's score of the reported model."""
    shown = [f"{name} {100 * scores[name]:.2f}%" for name in ("accuracy", "f1") if name in scores]
    return f"{split} {', '.join(shown)}"


def trainer_settings(
    cfg: DictConfig, run_dir: Path, train_examples: int, per_update: int
) -> TrainerConfig:
    """The trainer's settings for ``epochs`` over ``train_examples`` (capped by
    trainer.max_steps), with the warm-up of ``warmup_ratio`` and the eval interval fitted."""
    steps, warmup = schedule(cfg, train_examples, per_update)
    planned = planned_steps(cfg, train_examples, per_update)
    settings = training.trainer_config(
        cfg, max_steps=steps, warmup_steps=warmup, planned_steps=planned
    )
    # warmup_ratio already scales the warm-up with the cap; only the eval interval may not.
    return training.fit_schedule(
        settings, run_dir, () if cfg.warmup_ratio is None else ("warmup_steps",)
    )


def run(cfg: DictConfig, run_dir: Path, console: Console) -> pd.DataFrame:
    if cfg.get("eval_only"):
        return evaluate_only(cfg, run_dir)
    started = time.perf_counter()
    task = str(cfg.task.name)
    device, plan = training.start_run(cfg, run_dir)
    # The data is read before the model is loaded, so a bad data.path is refused alone, before
    # the init= line and the seconds a pretrained model takes to load.
    examples = load_splits(cfg)
    classes = num_classes(task, examples["train"])
    if task == CSV and distributed.is_main():
        record_csv(run_dir, str(cfg.task.label_column), examples, csv_files(cfg))
    start, model = start_model(cfg, classes)
    max_len = int(cfg.task.max_len)
    encoded = encode_splits(cfg, start, examples)
    collate = PairCollate(max_len, start.tokenizer.pad_id)

    batch_size = int(cfg.trainer.batch_size)  # per rank
    train = ShuffledBatches(encoded["train"], batch_size, collate, int(cfg.seed),
                            encoded["train"].seqs.lengths, int(cfg.trainer.bucket))  # fmt: skip
    per_update = train.global_batch_size * int(cfg.trainer.accumulate)  # examples per update
    if cfg.conv_fit_examples and plan.checkpoint is None:  # a resumed run has its filters
        fit_conv_skip(start.encoder, examples["train"], int(cfg.conv_fit_examples),
                      start.tokenizer, max_len, batch_size)  # fmt: skip
    settings = trainer_settings(cfg, run_dir, len(encoded["train"]), per_update)
    metrics = metric_names(task)
    objective = ClassificationObjective(f1="f1" in metrics)
    trainer = Trainer(
        model, objective, settings, run_dir, device, metrics, console, architecture(cfg)
    )
    eval_size = settings.eval_batch_size or batch_size
    devs = dev_splits(task)
    dev = eval_batches(by_length(encoded[devs[0]], settings.eval_examples), eval_size, collate)
    dev_balance = training.class_balance("dev subset", dataset_labels(dev.dataset), classes)
    reported = "test" if "test" in encoded else devs[0]  # the split Table 2 reports
    balance = training.class_balance(f"{reported} set", encoded[reported].labels, classes)
    fit = trainer.fit(train, dev, plan.checkpoint)
    # A capped run's final dev and test evaluations see at most the examples it trained on.
    final, test = final_scores(trainer, fit, encoded, devs, lambda d: eval_batches(
        by_length(d, settings.held_out_size(None)), eval_size, collate))  # fmt: skip
    if not distributed.is_main():
        return pd.DataFrame()  # rank 0 writes the results
    attention = attention_label(dict(start.encoder.config.attention))
    training.write_learning_curve(run_dir, f"{task}, init {init_label(start.source)}, {attention}",
                                  fit.best_step, dev_balance)  # fmt: skip
    first = final.get(devs[0], {})
    score = (test if reported == "test" else first).get("accuracy", math.nan)
    fields: dict[str, Any] = {
        "task": task,
        "init": init_label(start.source),
        "attention": attention,
        "conv_fit_examples": int(cfg.conv_fit_examples),
        "max_len": max_len,
        "dev_accuracy": first.get("accuracy", math.nan),
        "dev_f1": first.get("f1", math.nan),
        "dev_mm_accuracy": final.get("dev_mismatched", {}).get("accuracy", math.nan),
        "test_accuracy": test["accuracy"],
        "best_dev_accuracy": fit.best_value,
        "epochs": fit.step * per_update / len(encoded["train"]),
        "train_examples": len(encoded["train"]),
        "dev_examples": len(encoded[devs[0]]),
        "test_examples": len(encoded["test"]) if "test" in encoded else 0,
        "lr": settings.lr,
        "positions_extended_from": start.extended_from,
        "init_path": (
            start.source
            if start.source == SCRATCH or is_checkpoint_spec(start.source)
            else str(resolve_pretrained(Path(start.source)).resolve())
        ),
        **training.baseline_fields(balance, score, reported, dev_balance),
    }
    row = training.result_row(fields, cfg=cfg, fit=fit, trainer=settings, train=train,
                              device=device, plan=plan, started=started)  # fmt: skip
    return pd.DataFrame([row])


# --------------------------------------------------------------------------- rendering


def _column(r: Any) -> str:
    """Table-2 column of a row: the task, with IMDB's length when it is not 512."""
    return f"{r.task}@{r.max_len}" if r.task == "imdb" and r.max_len != 512 else str(r.task)


def _score(r: Any) -> float:
    """The number Table 2 reports: F1 for MRPC/QQP, IMDB test accuracy, else dev accuracy."""
    return getattr(r, _score_column(r))


def _score_column(r: Any) -> str:
    """The results column :func:`_score` reads for row ``r``."""
    if r.task in ("mrpc", "qqp"):
        return "dev_f1"
    return "test_accuracy" if r.task in TEST_TASKS else "dev_accuracy"


def _cell(r: Any) -> str:
    """A Table-2 cell; a row pooled over seeds (nys report) shows mean ± std (n)."""
    n = int(getattr(r, "n", 1) or 1)
    seeds = f" (n = {n})" if n > 1 else ""
    if r.task == "mnli":
        return f"{pct(r.dev_accuracy)}/{pct(r.dev_mm_accuracy)}{seeds}"
    std = getattr(r, f"{_score_column(r)}_std", math.nan)
    spread = f" ± {pct(std)}" if n > 1 and pd.notna(std) else ""
    return f"{pct(_score(r))}{spread}{seeds}"


def _runs_table(df: pd.DataFrame) -> Table:
    columns = [
        ("task", lambda r: _column(r)),
        ("init", lambda r: str(r.init)),
        ("attention", lambda r: str(r.attention)),
        ("best step", lambda r: whole(getattr(r, "best_step", None))),
        ("dev acc %", lambda r: pct(r.dev_accuracy)),
        ("dev F1 / mm %", lambda r: pct(r.dev_f1) or pct(r.dev_mm_accuracy)),
        ("test acc %", lambda r: pct(r.test_accuracy)),
        *BASELINE_COLUMNS,
        ("steps", lambda r: f"{r.steps}/{r.max_steps}"),
        ("epochs", lambda r: f"{r.epochs:.2f}"),
        ("batch", lambda r: str(r.batch_size)),
        ("lr", lambda r: f"{r.lr:g}"),
        ("min", lambda r: f"{r.wall_s / 60:.1f}"),
        ("tok/s", lambda r: f"{r.tokens_per_s:,.0f}"),
        ("peak MB", lambda r: f"{r.peak_mb:,.0f}"),
    ]
    title = "Fine-tuning runs: the best-dev checkpoint (best step) on all of dev and test"
    return rows_table(title, df, columns, {"task", "init", "attention"})


def table2(df: pd.DataFrame) -> Table:
    """Rows (init, attention) x task columns (paper order); a cell is the best run's score."""
    order = [*GLUE_TASKS, "imdb", "imdb@1024", CSV]
    best: dict[tuple[str, str], dict[str, Any]] = {}
    for r in df.itertuples():
        score = _score(r)
        if pd.isna(score):
            continue
        cells = best.setdefault((str(r.init), str(r.attention)), {})
        column = _column(r)
        if column not in cells or score > _score(cells[column]):
            cells[column] = r
    columns = [c for c in order if any(c in cells for cells in best.values())]
    columns += sorted({c for cells in best.values() for c in cells} - set(columns))
    table = Table(
        title="Table 2 layout (%), best run per cell (a setting's seeds: mean ± std, n)",
        caption="the best-dev checkpoint's F1 for MRPC/QQP, IMDB and csv test accuracy, dev "
        "accuracy otherwise; MNLI m/mm",
        title_justify="left",
        caption_justify="left",
    )
    table.add_column("init / attention", style="bold", no_wrap=True)
    for column in columns:
        table.add_column(column, justify="right")
    for (init, attention), cells in best.items():
        table.add_row(
            f"{init} / {attention}", *(_cell(cells[c]) if c in cells else "" for c in columns)
        )
    for name, values in TABLE2.items():
        table.add_row(name, *(values.get(c, "") for c in columns), style="dim")
    return table


def render(df: pd.DataFrame) -> RenderableType:
    """The training runs and their Table-2 layout; evaluate-only rows as their own table."""
    evaluated = df["mode"] == "eval_only" if "mode" in df else pd.Series(False, index=df.index)
    parts: list[RenderableType] = []
    if (~evaluated).any():
        trained = df[~evaluated]
        parts += [_runs_table(trained), table2(trained)]
    if evaluated.any():
        parts.append(deployment_table(df[evaluated]))
    return Group(*parts)


def write_figures(df: pd.DataFrame, folder: Path) -> list[Path]:
    """``deployment.png`` in ``folder`` when the rows include evaluate-only runs."""
    if "mode" not in df or not (df["mode"] == "eval_only").any():
        return []
    path = deployment_plot(df, folder / DEPLOYMENT_PLOT)
    return [path] if path else []
