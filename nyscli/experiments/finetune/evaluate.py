"""``nys finetune eval_only=<finetune run folder>``: direct deployment, no training.

The fine-tuned classifier of that run (its ``checkpoints/best.pt``, else ``last.pt``) is
rebuilt from the run's own config (init, task, max_len, seed, data) and evaluated with the
attention the command line selects swapped in (none selected: the attention it was trained
with). Only ``task.test_examples``, ``data.path``, ``threads``, ``device`` and
``trainer.eval_batch_size`` may differ from the run; IMDB reports the (seeded) test subset,
GLUE its dev splits. A sweep such as
``nys finetune -m eval_only=<run> attention=nystrom attention.num_landmarks=16,32,64``
gives one row per attention; ``nys report <sweep>`` draws ``deployment.png`` (accuracy vs
budget per attention, with the run's own attention as the reference line). Each job writes its
predictions, and the report's table gives each row's share of predictions equal to those of
the run's own attention where that evaluation is among the runs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from rich.table import Table
from torch.utils.data import Subset

from nyscli.attention import attention_label, pairs_per_query
from nyscli.checkpoints.capture import names_attention
from nyscli.data.glue import TextExamples
from nyscli.data.pairs import EncodedExamples, PairCollate, encode_examples
from nyscli.data.subsets import ClassBalance, subset_indices
from nyscli.errors import UserInputError
from nyscli.experiments.finetune.model import (
    current_overrides,
    fit_conv_skip,
    selected_attention,
    starting_point,
)
from nyscli.experiments.finetune.tasks import (
    CSV,
    ClassificationObjective,
    csv_files,
    dev_splits,
    load_examples,
    metric_names,
    num_classes,
    record_csv,
    recorded_classes,
    seeded_subset,
)
from nyscli.experiments.renamed import upgrade_recorded
from nyscli.experiments.training import baseline_fields, class_balance
from nyscli.files import atomic_writer
from nyscli.models.bert import load_across_attention
from nyscli.models.bert_classifier import BertClassifier
from nyscli.output.plots import pyplot, save_figure
from nyscli.output.tables import flag_text, pct, rows_table
from nyscli.overrides import override_keys
from nyscli.train.batches import eval_batches
from nyscli.train.checkpoint import BEST, CHECKPOINT_DIR, LAST, load_checkpoint
from nyscli.train.config import TrainerConfig
from nyscli.train.loop import Trainer
from nyscli.train.resources import peak_memory_mb, reset_peak_memory, resolve_device

DEPLOYMENT_PLOT = "deployment.png"
PREDICTIONS = "predictions.csv"
# Keys of the current command line that may differ from the evaluated run's config.
OWN_KEYS = ("task.test_examples", "data.path", "data.dev_path", "data.test_path")


def run_config(folder: Path) -> tuple[DictConfig, list[str]]:
    """The config and overrides of the finetune run in ``folder``; one-line errors if none."""
    folder = Path(folder).expanduser()
    config_file = folder / ".hydra" / "config.yaml"
    if not config_file.is_file():
        raise UserInputError(
            f"eval_only={folder} is not a run folder; expected a nys finetune run (.hydra/)"
        )
    cfg = upgrade_recorded(OmegaConf.load(config_file), "finetune")  # type: ignore[arg-type]
    if cfg.get("command") != "finetune":
        raise UserInputError(
            f"eval_only={folder} is a {cfg.get('command')} run; expected a nys finetune run"
        )
    if not any((folder / CHECKPOINT_DIR / name).is_file() for name in (BEST, LAST)):
        raise UserInputError(f"eval_only={folder} has no {CHECKPOINT_DIR}/{BEST} or {LAST}")
    overrides_file = folder / ".hydra" / "overrides.yaml"
    overrides = [str(o) for o in OmegaConf.load(overrides_file)] if overrides_file.exists() else []
    return cfg, overrides  # type: ignore[return-value]


def evaluated_examples(
    cfg: DictConfig, folder: Path
) -> tuple[dict[str, TextExamples], DictConfig, list[str]]:
    """The examples ``eval_only=<folder>`` evaluates (a csv run's files read with the label
    mapping it recorded), the run's config with this command line's own keys, and the run's
    overrides; one-line errors for a folder or data that cannot be evaluated."""
    trained, overrides = run_config(folder)
    merged = _merged(cfg, trained)
    csv = str(merged.task.name) == CSV
    examples = load_examples(merged.task, merged.data.path, int(merged.seed),
                             files=csv_files(merged) if csv else None,
                             classes=recorded_classes(folder) if csv else None)  # fmt: skip
    return examples, merged, overrides


def check_evaluated_data(cfg: DictConfig) -> None:
    """``eval_only``'s run folder checked, and a csv run's files read as the evaluation will
    read them, before any folder exists (other tasks' data is read by the run)."""
    folder = Path(str(cfg.eval_only)).expanduser()
    trained, _ = run_config(folder)
    if str(trained.task.get("name")) == CSV:
        evaluated_examples(cfg, folder)


def _merged(cfg: DictConfig, trained: DictConfig) -> DictConfig:
    """The run's config with the few keys this command line set itself (OWN_KEYS)."""
    merged = OmegaConf.create(OmegaConf.to_container(trained, resolve=True))
    given = override_keys(current_overrides())
    for key in OWN_KEYS:
        if key in given:
            OmegaConf.update(merged, key, OmegaConf.select(cfg, key), force_add=True)
    return merged


def _evaluate(trainer: Trainer, batches: Iterable[Any]) -> tuple[dict[str, float], np.ndarray]:
    """The evaluation's summary and each example's predicted class, in the batches' order."""
    started = time.perf_counter()
    predicted: list[torch.Tensor] = []
    hook = trainer.model.register_forward_hook(
        lambda _module, _args, logits: predicted.append(logits.detach().argmax(-1).cpu())
    )
    try:
        summary = trainer.evaluate(batches)
    finally:
        hook.remove()
    summary["eval_s"] = time.perf_counter() - started
    return summary, torch.cat(predicted).numpy() if predicted else np.zeros(0, dtype=int)


def write_predictions(path: Path, ordered: Subset, predicted: np.ndarray) -> None:
    """``predictions.csv``: each evaluated example (its place in the evaluated set, which the
    same seed and subset size give every evaluation of the run), its label and the class
    predicted, so evaluations with different attentions compare example by example."""
    frame = pd.DataFrame(
        {"example": ordered.indices, "label": ordered.labels, "predicted": predicted}
    ).sort_values("example")
    with atomic_writer(path, "w") as handle:
        frame.to_csv(handle, index=False)


def agreement(df: pd.DataFrame) -> pd.Series:
    """For evaluate-only rows with run folders (``run_dir``, as ``nys report`` gives them): the
    share of examples whose prediction equals that of the evaluation of the same run, split
    and examples with the attention it was trained with; NaN where there is none to compare
    with (or a predictions file is missing)."""
    shares = pd.Series(math.nan, index=df.index)
    if "run_dir" not in df:
        return shares

    def predicted(run_dir: Any) -> pd.Series | None:
        path = Path(str(run_dir)) / PREDICTIONS
        try:
            return pd.read_csv(path).set_index("example")["predicted"]
        except (OSError, ValueError, KeyError, pd.errors.ParserError):
            return None

    keys = ["eval_of", "split", "examples"]
    for _, group in df.groupby(keys):
        own = group[group.attention == group.trained_attention]
        reference = predicted(own.run_dir.iloc[0]) if len(own) else None
        if reference is None:
            continue
        for index, run_dir in group.run_dir.items():
            mine = predicted(run_dir)
            if mine is not None and mine.index.equals(reference.index):
                shares[index] = float((mine == reference).mean())
    return shares


def by_length(dataset: EncodedExamples, limit: int | None = None) -> Subset:
    """The same examples (or the seeded, stratified sample of ``limit`` of them that
    :func:`~nyscli.data.subsets.evaluation_subset` draws), shortest first: an evaluation then
    pads each batch far less (IMDB at 512 tokens: random batches pad to ~512, sorted ones to
    about each review's own length), and the accuracy does not depend on the order."""
    index = subset_indices(len(dataset), limit, dataset.labels)
    index = index[np.argsort(dataset.seqs.lengths[index], kind="stable")]
    ordered = Subset(dataset, index.tolist())
    ordered.labels = dataset.labels[index]  # type: ignore[attr-defined]  # dataset_labels
    return ordered


def evaluate_only(cfg: DictConfig, run_dir: Path) -> pd.DataFrame:
    """One row: the run's model with the selected attention, on its test (IMDB) or dev sets."""
    started = time.perf_counter()
    device = resolve_device(str(cfg.device))
    reset_peak_memory(device)  # jobs of a sweep share one process: each reports its own peak
    source = Path(str(cfg.eval_only)).expanduser()
    examples, merged, trained_overrides = evaluated_examples(cfg, source)
    task = str(merged.task.name)
    classes = num_classes(task, examples["train"])
    swap = selected_attention(cfg, names_attention(current_overrides()))
    own = selected_attention(merged, names_attention(trained_overrides))
    start = starting_point(merged, swap or own)
    model = BertClassifier(start.encoder, classes, start.encoder.config.dropout)
    checkpoint = next(p for p in (source / CHECKPOINT_DIR / n for n in (BEST, LAST)) if p.is_file())
    try:
        load_across_attention(model, load_checkpoint(checkpoint)["model"])
    except ValueError as error:
        raise UserInputError(f"{checkpoint}: {error}") from None

    max_len = int(merged.task.max_len)
    if cfg.conv_fit_examples:
        fit_conv_skip(start.encoder, examples["train"], int(cfg.conv_fit_examples),
                      start.tokenizer, max_len, int(merged.trainer.batch_size))  # fmt: skip
    splits = ("test",) if "test" in examples else dev_splits(task)
    if "test" in examples:
        examples["test"] = seeded_subset(examples["test"], merged.task.get("test_examples"))
    if task == CSV:  # the mapping and rows evaluated, beside the predictions
        record_csv(run_dir, str(merged.task.label_column), examples, csv_files(merged))
    collate = PairCollate(max_len, start.tokenizer.pad_id)
    settings = TrainerConfig.from_mapping(
        {**OmegaConf.to_container(cfg.trainer, resolve=True), "max_steps": 1, "progress": False}
    )
    size = settings.eval_batch_size or int(merged.trainer.batch_size)
    objective = ClassificationObjective(f1="f1" in metric_names(task))
    trainer = Trainer(model, objective, settings, run_dir, device, metric_names(task))
    trainer.metrics.start()  # its header: the rows below were headerless (nys report failed)
    results: dict[str, dict[str, float]] = {}
    balances: dict[str, ClassBalance | None] = {}
    for split in splits:
        encoded = encode_examples(examples[split], start.tokenizer, max_len)
        ordered = by_length(encoded)
        results[split], predicted = _evaluate(trainer, eval_batches(ordered, size, collate))
        if split == splits[0]:
            write_predictions(run_dir / PREDICTIONS, ordered, predicted)
        results[split]["examples"] = len(encoded)
        balances[split] = class_balance(f"{split} set", encoded.labels, classes)
        trainer.metrics.append(0, split, {k: results[split][k] for k in metric_names(task)})
    first = results[splits[0]]
    attention = dict(start.encoder.config.attention)
    trained_label = attention_label(own) if own else "checkpoint's own"
    row = {
        "task": task,
        "mode": "eval_only",
        "eval_of": str(source.resolve()),
        "trained_attention": trained_label,
        "attention": attention_label(attention),
        "conv_fit_examples": int(cfg.conv_fit_examples),
        "attention_name": attention["name"],
        "budget": _budget(attention),
        "landmarks": attention.get("landmarks", ""),
        "max_len": max_len,
        "split": splits[0],
        "accuracy": first["accuracy"],
        "f1": first.get("f1", math.nan),
        **baseline_fields(balances[splits[0]], first["accuracy"], splits[0]),
        "examples": first["examples"],
        "eval_tokens_per_s": first["tokens_per_s"],
        "eval_s": first["eval_s"],
        "peak_mb": peak_memory_mb(device),
        "wall_s": time.perf_counter() - started,
        "threads": cfg.threads,
        "device": str(device),
    }
    return pd.DataFrame([row])


def _budget(attention: dict[str, Any]) -> float:
    """The core's budget in scored query-key pairs per query (the one rule of
    ``nyscli.attention.core``: Nyström-m 2m, window w - 1, the hybrid w - 1 + 2m + g, ...), so
    methods sit at equal cost on one axis; NaN for exact attention."""
    value = pairs_per_query(attention)
    return math.nan if value is None else float(value)


def deployment_plot(df: pd.DataFrame, path: Path) -> Path | None:
    """Accuracy vs budget per attention (lines), exact attention as a dashed reference line."""
    rows = df[df["mode"] == "eval_only"] if "mode" in df else df.iloc[:0]
    if rows.empty:
        return None
    fig, ax = pyplot().subplots(figsize=(6.4, 4.2))
    exact = rows[rows.budget.isna()]
    budgeted = rows[rows.budget.notna()].fillna({"landmarks": ""})
    for label, group in budgeted.groupby(["attention_name", "landmarks"]):
        name = label[0] if not label[1] else f"{label[0]} ({label[1]})"
        group = group.sort_values("budget")
        ax.plot(group.budget, 100 * group.accuracy, marker="o", label=name)
    for r in exact.itertuples():
        ax.axhline(100 * r.accuracy, ls="--", color="black", label=f"{r.attention} (exact)")
    majority = rows.majority_rate.iloc[0]
    ax.axhline(100 * majority, ls=":", color="grey", label="majority class")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("budget (scored query-key pairs per query)")
    ax.set_ylabel(f"{rows.split.iloc[0]} accuracy (%)")
    ax.set_title(f"Direct deployment: {rows.task.iloc[0]}, attention swapped, no retraining")
    ax.legend(fontsize=8)
    path.parent.mkdir(parents=True, exist_ok=True)
    return save_figure(fig, path)


def deployment_table(df: pd.DataFrame) -> Table:
    """Evaluate-only rows: accuracy per swapped-in attention beside the majority-class rate."""
    columns = [
        ("task", lambda r: str(r.task)),
        ("trained with", lambda r: str(r.trained_attention)),
        ("evaluated with", lambda r: str(r.attention)),
        ("split", lambda r: f"{r.split} ({r.examples})"),
        ("accuracy %", lambda r: pct(r.accuracy)),
        ("majority %", lambda r: pct(r.majority_rate)),
        ("same as trained %", lambda r: "—" if math.isnan(r.agreement) else pct(r.agreement)),
        ("flag", lambda r: flag_text(getattr(r, "flag", None))),
        ("eval tok/s", lambda r: f"{r.eval_tokens_per_s:,.0f}"),
        ("peak MB", lambda r: f"{r.peak_mb:,.0f}"),
    ]
    df = df.assign(agreement=agreement(df))
    if df.agreement.isna().all():  # one job's own table, or runs from before predictions.csv
        columns = [c for c in columns if c[0] != "same as trained %"]
    df = df.sort_values(["attention_name", "landmarks", "budget"], na_position="first")
    return rows_table("Direct deployment (no retraining)", df, columns, {"task", "attention"})
