"""``nys pretrain``: BERT MLM + SOP pre-training with any attention (the paper's Fig. 5/6).

One run = one (model, attention) on one corpus. Documents are split train/validation, a
WordPiece tokenizer is trained on the training documents (or a vocab.txt is used), and the
shared trainer optimises MLM + SOP loss (``pretrain_objectives``). The run folder gets
``metrics.csv`` (dev MLM/SOP loss and accuracy every ``trainer.eval_every`` steps),
``pretraining_curves.png``, and ``pretrained/`` (encoder weights of the best dev MLM
accuracy, config, tokenizer) for ``nys finetune init=<run folder>``. ``objective=distill``
continues an imported checkpoint with another attention by hidden-state distillation from
the same checkpoint with its softmax attention instead (best = lowest dev loss).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from rich.console import Console, RenderableType
from torch import nn

from nyscli.attention import attention_label
from nyscli.checkpoints.hf_import import (
    ImportedBert,
    check_checkpoint_spec,
    import_bert,
    is_checkpoint_spec,
)
from nyscli.checkpoints.pretrained import PRETRAINED_DIR, save_pretrained
from nyscli.data.choices import CORPUS_SOURCES
from nyscli.data.common import DataError
from nyscli.data.pretraining import PretrainingData, prepare_pretraining
from nyscli.data.subsets import SUBSET_SEED, ClassBalance
from nyscli.errors import UserInputError
from nyscli.experiments.pretrain.objectives import (
    DISTILL_METRICS,
    IGNORE,
    METRICS,
    Batch,
    HiddenStateDistillation,
    PretrainCollate,
    frozen_batches,
    most_frequent_token_accuracy,
    pretraining_objective,
)
from nyscli.experiments.pretrain.rules import check
from nyscli.experiments.training import (
    baseline_fields,
    bert_config,
    check_attention,
    check_device,
    fit_schedule,
    preflight,
    result_row,
    resume_pins,
    start_run,
    trainer_config,
)
from nyscli.models.bert import BertEncoder, BertForPretraining, BlockOutputs, with_attention
from nyscli.output.curves import axis_label, shown
from nyscli.output.plots import pyplot, save_figure
from nyscli.output.tables import flag_text, pct, rows_table, whole
from nyscli.train import distributed
from nyscli.train.batches import ShuffledBatches
from nyscli.train.checkpoint import CHECKPOINT_DIR, load_best
from nyscli.train.config import TrainerConfig
from nyscli.train.loop import Objective, Trainer
from nyscli.train.metrics import METRICS_FILE
from nyscli.train.resume import architecture
from nyscli.train.splits import DEV, read_metrics

log = logging.getLogger(__name__)

CURVE_FILE = "pretraining_curves.png"
TEACHER_ATTENTION = {"name": "softmax"}  # an imported BERT checkpoint's own attention
__all__ = ["preflight", "render", "resume_pins", "run", "validate"]  # the launcher's resume hooks


def validate(cfg: DictConfig) -> None:
    """Cheap checks of every value (the corpus is not read)."""
    check(cfg)
    source = cfg.data.get("source")
    if source not in CORPUS_SOURCES:
        raise UserInputError(
            f"data.source={source} is not allowed; choose one of: {', '.join(CORPUS_SOURCES)}"
        )
    if source == "folder":
        path = cfg.data.get("path")
        if not path or not Path(str(path)).expanduser().exists():
            raise UserInputError(
                f"data.path={path} does not exist; expected a folder of .txt/.jsonl documents"
            )
    init = str(cfg.get("init", "scratch"))
    if cfg.get("objective") == "distill" and init == "scratch":
        raise UserInputError(
            "objective=distill needs init=minilm or init=hf:<folder or hub id>: the teacher "
            "is that checkpoint with its own softmax attention"
        )
    if init != "scratch":
        if not is_checkpoint_spec(init):
            raise UserInputError(
                f"init={init} is not allowed; use scratch, minilm or hf:<folder or hub id>"
            )
        check_checkpoint_spec(init)
    check_device(cfg, trainer_config(cfg))
    check_attention(cfg)


def model_name() -> str:
    """The ``model`` config group option of this run (e.g. bert_mini)."""
    try:
        return str(HydraConfig.get().runtime.choices.get("model", "custom"))
    except ValueError:  # not inside a Hydra run (a direct call from Python)
        return "custom"


def _load_data(cfg: DictConfig, imported: ImportedBert | None) -> PretrainingData:
    """The corpus as pairs; an imported checkpoint brings its vocab.txt and position count."""
    tokenizer, max_len = cfg.tokenizer, int(cfg.model.max_len)
    if imported is not None:
        tokenizer = OmegaConf.create(
            {"kind": "vocab_file", "path": str(imported.folder / "vocab.txt")}
        )
        max_len = imported.encoder.config.max_len
    try:
        data = prepare_pretraining(cfg.data, tokenizer, max_len, cfg.data_cache)
    except DataError as error:
        raise UserInputError(str(error)) from error
    log.info(
        "corpus: %d train / %d dev documents -> %d / %d pairs (%.0f tokens on average); "
        "vocabulary %d",
        len(data.train_docs),
        len(data.val_docs),
        len(data.train),
        len(data.val),
        float(data.train.lengths.mean()),
        data.tokenizer.vocab_size,
    )
    return data


def pretraining_model(imported: ImportedBert) -> BertForPretraining:
    """MLM + SOP model on an imported encoder: its MLM head and pooler (SOP's dense layer)
    when the checkpoint has them, else fresh ones (the MLM decoder is always tied to the
    token embeddings)."""
    model = BertForPretraining(imported.encoder.config)
    model.bert.load_state_dict(imported.encoder.state_dict())
    if imported.mlm is not None:
        model.mlm.load_state_dict(imported.mlm)
    if imported.pooler is not None:
        model.sop.pooler.load_state_dict(imported.pooler)
    return model.train()


def _most_frequent_token(data: PretrainingData) -> int:
    """The non-special id that occurs most often in the training pairs."""
    counts = data.train.token_counts(data.tokenizer.vocab_size)
    counts[list(data.tokenizer.special_ids)] = 0
    return int(np.argmax(counts))


def pair_batches(
    cfg: DictConfig, data: PretrainingData, settings: TrainerConfig
) -> tuple[ShuffledBatches, Any]:
    """Training batches (masks drawn per batch from the run's seed) and the validation
    batches (the same masks and swaps for every run, whatever its seed)."""
    collate = PretrainCollate.for_tokenizer(data.tokenizer, float(cfg.mlm_probability))
    train = ShuffledBatches(
        data.train, settings.batch_size, collate, int(cfg.seed), data.train.lengths,
        settings.bucket,
    )  # fmt: skip
    eval_size = settings.eval_batch_size or settings.batch_size
    dev = frozen_batches(data.val, eval_size, collate, SUBSET_SEED, settings.eval_examples)
    return train, dev


def run(cfg: DictConfig, run_dir: Path, console: Console) -> pd.DataFrame:
    started = time.perf_counter()
    settings = fit_schedule(trainer_config(cfg), run_dir)
    device, plan = start_run(cfg, run_dir)
    imported = None
    if str(cfg.get("init", "scratch")) != "scratch":
        imported = import_bert(str(cfg.init), OmegaConf.to_container(cfg.attention, resolve=True))
        label = attention_label(dict(cfg.attention))
        log.info("init=%s: continued pre-training with %s", cfg.init, label)
    with distributed.main_first():  # one rank trains the tokenizer and fills the caches
        data = _load_data(cfg, imported)
    tokenizer = data.tokenizer
    train, dev = pair_batches(cfg, data, settings)
    setup = (
        _distillation(imported, settings, device)
        if cfg.get("objective") == "distill"
        else _mlm_sop(cfg, imported, settings, data, dev)
    )
    trainer = Trainer(
        setup.model, setup.objective, setup.settings, run_dir, device, setup.metrics, console,
        architecture(cfg),
    )  # fmt: skip
    if setup.baseline is None:  # distillation: the converted model before any training
        setup.baseline = trainer.evaluate(dev)["distill_loss"]
        log.info("dev distill loss before training: %.5f", setup.baseline)
    fit = trainer.fit(train, dev, plan.checkpoint)
    if not distributed.is_main():
        return pd.DataFrame()
    pretrained = keep_best_encoder(run_dir, setup, tokenizer, device, fit.best_step)
    name = model_name() if imported is None else str(cfg.init)
    label = attention_label(OmegaConf.to_container(cfg.attention, resolve=True))
    metrics = read_metrics(run_dir / METRICS_FILE)
    pretraining_curves(metrics, run_dir / CURVE_FILE, f"{name}, {label}", setup)
    dev_rows = metrics[metrics.split == DEV]
    final = dev_rows.iloc[-1] if len(dev_rows) else None
    at_best = dev_rows[dev_rows.step == fit.best_step]
    best = at_best.iloc[-1] if len(at_best) else None

    def last(column: str, row: Any = final) -> float:
        return math.nan if row is None or column not in row else float(row[column])

    distill = setup.name == "distill"
    fields: dict[str, Any] = {
        "model": name,
        "attention": label,
        "objective": setup.name,
        "best_val_mlm_accuracy": math.nan if distill else fit.best_value,
        "final_val_mlm_accuracy": last("mlm_accuracy"),
        "final_val_sop_accuracy": last("sop_accuracy"),
        "final_val_mlm_loss": last("mlm_loss"),
        "best_val_sop_accuracy": last("sop_accuracy", best),  # of the pretrained/ encoder
        "most_frequent_token_accuracy": math.nan if distill else setup.baseline,
        "best_val_distill_loss": fit.best_value if distill else math.nan,
        "final_val_distill_loss": last("distill_loss"),
        "start_val_distill_loss": setup.baseline if distill else math.nan,
        "train_pairs": len(data.train),
        "val_pairs": len(data.val),
        "mean_tokens": float(data.train.lengths.mean()) + 3,
        "vocab_size": tokenizer.vocab_size,
        "max_len": setup.encoder.config.max_len,
        "pretrained": str(pretrained) if pretrained else None,
        **({} if distill else flags(row_balances(dev, setup), fit.best_value, best)),
    }
    row = result_row(fields, cfg=cfg, fit=fit, trainer=settings, train=train, device=device,
                     plan=plan, started=started)  # fmt: skip
    return pd.DataFrame([row])


def row_balances(dev: list[Batch], setup: Setup) -> tuple[ClassBalance, ClassBalance]:
    """What trivial predictors score on the dev batches: MLM, the most frequent training token
    (its share of the masked targets); SOP, the more frequent order label."""
    targets = torch.cat([b["labels"][b["labels"] != IGNORE] for b in dev])
    assert setup.baseline is not None
    vocab = setup.encoder.config.vocab_size
    mlm = ClassBalance(len(targets), len(torch.unique(targets)), setup.baseline, 1.0 / vocab)
    sop = ClassBalance.of(torch.cat([b["sop"] for b in dev]).numpy(), 2)
    return mlm, sop


def flags(
    balances: tuple[ClassBalance, ClassBalance], mlm_accuracy: Any, best: Any
) -> dict[str, Any]:
    """The best checkpoint's MLM and SOP accuracy beside their baselines, flagged by the same
    rule as every lra and finetune accuracy (``mlm_flag``, ``sop_flag``, and ``flag``: both)."""
    sop_accuracy = math.nan if best is None else float(best["sop_accuracy"])
    mlm_accuracy = math.nan if mlm_accuracy is None else float(mlm_accuracy)
    fields = {
        **baseline_fields(balances[0], mlm_accuracy, "dev MLM", prefix="mlm_"),
        **baseline_fields(balances[1], sop_accuracy, "dev SOP", prefix="sop_"),
    }
    both = [f"{what} {fields[f'{key}_flag']}" for what, key in (("MLM", "mlm"), ("SOP", "sop"))
            if fields[f"{key}_flag"]]  # fmt: skip
    return {**fields, "flag": "; ".join(both) or None}


def keep_best_encoder(
    run_dir: Path, setup: Setup, tokenizer: Any, device: Any, best_step: Any
) -> Path | None:
    """Save the best checkpoint's encoder (and tokenizer) as ``pretrained/`` for nys finetune;
    None when no checkpoint was kept."""
    if not load_best(setup.model, run_dir / CHECKPOINT_DIR, device):
        return None
    pretrained = save_pretrained(run_dir / PRETRAINED_DIR, setup.encoder.cpu(), tokenizer)
    log.info("pre-trained encoder (step %s): %s", best_step, pretrained)
    return pretrained


@dataclasses.dataclass
class Setup:
    """What one objective trains: its name (``objective=``), the trainer's model and objective,
    the encoder inside the model that ``pretrained/`` keeps, the metrics, the settings (the
    best-checkpoint metric) and the validation baseline (None: measured before training)."""

    name: str
    model: nn.Module
    encoder: BertEncoder
    objective: Objective
    metrics: tuple[str, ...]
    settings: TrainerConfig
    baseline: float | None


def _mlm_sop(
    cfg: DictConfig,
    imported: ImportedBert | None,
    settings: TrainerConfig,
    data: PretrainingData,
    dev: list[Batch],
) -> Setup:
    """MLM + SOP; the baseline is the most frequent training token's share of the targets."""
    if imported is None:
        model = BertForPretraining(bert_config(cfg, data.tokenizer.vocab_size))
    else:
        model = pretraining_model(imported)
    common = _most_frequent_token(data)
    baseline = most_frequent_token_accuracy(dev, common)
    log.info(
        "most frequent training token %r: %.2f%% of the dev MLM targets",
        data.tokenizer.decode([common]) or common,
        100 * baseline,
    )
    return Setup("mlm_sop", model, model.bert, pretraining_objective, METRICS, settings, baseline)


def _distillation(
    imported: ImportedBert | None, settings: TrainerConfig, device: torch.device
) -> Setup:
    """The imported encoder (with the run's attention, dropout off) learns every block output
    of a frozen copy of itself with the checkpoint's softmax attention; best = lowest
    validation loss. ``pretrained/`` keeps the checkpoint's dropout for fine-tuning."""
    assert imported is not None  # validate() refuses objective=distill with init=scratch
    teacher = with_attention(imported.encoder, TEACHER_ATTENTION).eval().requires_grad_(False)
    objective = HiddenStateDistillation(BlockOutputs(teacher).to(device))
    model = BlockOutputs(imported.encoder, dropout=False).train()
    settings = dataclasses.replace(settings, monitor="distill_loss", monitor_mode="min")
    return Setup("distill", model, imported.encoder, objective, DISTILL_METRICS, settings, None)


def pretraining_curves(metrics: pd.DataFrame, path: Path, title: str, setup: Setup) -> Path:
    """Dev curves against step beside their baselines: MLM accuracy (the most frequent token)
    and SOP accuracy (chance), in percent, or the distillation loss (its value before
    training)."""
    dev = metrics[metrics.split == DEV].sort_values("step")
    if setup.name == "distill":
        panels = [("distill_loss", setup.baseline, "before training")]
    else:
        panels = [
            ("mlm_accuracy", setup.baseline, "most frequent token"),
            ("sop_accuracy", 0.5, "chance"),
        ]
    fig, axes = pyplot().subplots(1, len(panels), figsize=(5.5 * len(panels), 4.2), squeeze=False)
    for ax, (column, reference, reference_label) in zip(axes[0], panels, strict=True):
        ax.plot(dev["step"], shown(column, dev[column]), marker="o", markersize=3, label=DEV)
        ax.axhline(shown(column, reference), color="grey", linestyle="--", linewidth=1,
                   label=reference_label)  # fmt: skip
        ax.set_xlabel("step")
        ax.set_ylabel(axis_label(f"{DEV} {column.replace('_', ' ')}", column))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    return save_figure(fig, path, dpi=110)


# --------------------------------------------------------------------------- rendering


def _distill_cell(row: Any) -> str:
    """Best dev distillation loss and, in brackets, the converted model's before training."""
    best = getattr(row, "best_val_distill_loss", math.nan)
    if pd.isna(best):
        return ""
    return f"{best:.4f} ({row.start_val_distill_loss:.4f})"


def render(df: pd.DataFrame) -> RenderableType:
    columns = [
        ("model", lambda r: str(r.model)),
        ("attention", lambda r: str(r.attention)),
        ("steps", lambda r: f"{r.steps}/{r.max_steps}"),
        ("best step", lambda r: whole(getattr(r, "best_step", None))),
        ("MLM %", lambda r: pct(r.best_val_mlm_accuracy)),
        ("MLM majority %", lambda r: pct(r.most_frequent_token_accuracy)),
        ("SOP %", lambda r: pct(getattr(r, "best_val_sop_accuracy", None))),
        ("SOP majority %", lambda r: pct(getattr(r, "sop_majority_rate", None))),
        ("flag", lambda r: flag_text(getattr(r, "flag", None))),
        ("MLM final %", lambda r: pct(r.final_val_mlm_accuracy)),
        ("SOP final %", lambda r: pct(r.final_val_sop_accuracy)),
        ("distill loss (start)", _distill_cell),
        ("min", lambda r: f"{r.wall_s / 60:.1f}"),
        ("tok/s", lambda r: f"{r.tokens_per_s:,.0f}"),
        ("peak MB", lambda r: f"{r.peak_mb:,.0f}"),
    ]
    title = (
        f"Pre-training runs ({DEV} accuracy % of the best {DEV} MLM checkpoint, pretrained/, "
        f"beside its majority baseline; distillation: {DEV} loss)"
    )
    return rows_table(title, df, columns, {"model", "attention"})
