"""``nys pretrain``: BERT MLM + SOP pre-training with any attention (the paper's Fig. 5/6).

One run = one (model, attention) on one corpus. Documents are split train/validation, a
WordPiece tokenizer is trained on the training documents (or a vocab.txt is used), and the
shared trainer optimises MLM + SOP loss (``pretrain_objectives``). The run folder gets
``metrics.csv`` (validation MLM/SOP loss and accuracy every ``trainer.eval_every`` steps),
``pretraining_curves.png``, and ``pretrained/`` (encoder weights of the best validation MLM
accuracy, config, tokenizer) for ``nys finetune init=<run folder>``.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from rich.console import Console, RenderableType

from nyscli.attention import attention_label
from nyscli.checkpoints.hf_import import (
    ImportedBert,
    check_checkpoint_spec,
    import_bert,
    is_checkpoint_spec,
)
from nyscli.checkpoints.pretrained import PRETRAINED_DIR, save_pretrained
from nyscli.data.common import DataError
from nyscli.data.corpus import SOURCES
from nyscli.data.pretraining import TOKENIZER_KINDS, PretrainingData, prepare_pretraining
from nyscli.data.subsets import SUBSET_SEED
from nyscli.errors import UserInputError
from nyscli.experiments import schema
from nyscli.experiments.pretrain_objectives import (
    METRICS,
    PretrainCollate,
    frozen_batches,
    most_frequent_token_accuracy,
    pretraining_objective,
)
from nyscli.experiments.training import (
    bert_config,
    check_attention,
    check_device,
    check_values,
    fit_schedule,
    preflight,
    run_context,
    start_run,
)
from nyscli.models.bert import BertForPretraining
from nyscli.report.plots import pyplot, save_figure
from nyscli.report.tables import pct, rows_table
from nyscli.train import (
    BEST,
    CHECKPOINT_DIR,
    METRICS_FILE,
    ShuffledBatches,
    Trainer,
    TrainerConfig,
    distributed,
    load_checkpoint,
    peak_memory_mb,
)

log = logging.getLogger(__name__)

CURVE_FILE = "pretraining_curves.png"
__all__ = ["preflight", "render", "run", "validate"]  # preflight: the bridge's resume check


RULES: dict[str, schema.Rule] = {
    "mlm_probability": schema.Float(low=0.0, high=1.0, low_open=True, high_open=True),
    "data.source": schema.Choice(values=SOURCES),
    "data.path": schema.Text(null=True),
    "data.text_field": schema.Text(),
    "data.name": schema.Text(),
    "data.split": schema.Text(),
    "data.val_fraction": schema.Float(low=0.0, high=1.0, low_open=True, high_open=True),
    "data.split_seed": schema.SEED,
    "tokenizer.kind": schema.Choice(values=TOKENIZER_KINDS),
    "tokenizer.path": schema.Text(null=True),
    # The five special tokens and a basic alphabet must fit.
    "tokenizer.vocab_size": schema.Int(low=100),
    "tokenizer.min_frequency": schema.COUNT,
}


def trainer_config(cfg: DictConfig) -> TrainerConfig:
    return TrainerConfig.from_mapping(OmegaConf.to_container(cfg.trainer, resolve=True))


def validate(cfg: DictConfig) -> None:
    """Cheap checks of every value (the corpus is not read)."""
    check_values(cfg, RULES)
    source = cfg.data.get("source")
    if source not in SOURCES:
        raise UserInputError(
            f"data.source={source} is not allowed; choose one of: {', '.join(SOURCES)}"
        )
    if source == "folder":
        path = cfg.data.get("path")
        if not path or not Path(str(path)).expanduser().exists():
            raise UserInputError(
                f"data.path={path} does not exist; expected a folder of .txt/.jsonl documents"
            )
    init = str(cfg.get("init", "scratch"))
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
        return prepare_pretraining(cfg.data, tokenizer, max_len, cfg.data_cache)
    except DataError as error:
        raise UserInputError(str(error)) from error


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
    log.info(
        "corpus: %d train / %d validation documents -> %d / %d pairs (%.0f tokens on average); "
        "vocabulary %d",
        len(data.train_docs),
        len(data.val_docs),
        len(data.train),
        len(data.val),
        float(data.train.lengths.mean()),
        tokenizer.vocab_size,
    )
    if imported is None:
        model = BertForPretraining(bert_config(cfg, tokenizer.vocab_size))
    else:
        model = pretraining_model(imported)
    collate = PretrainCollate.for_tokenizer(tokenizer, float(cfg.mlm_probability))
    train = ShuffledBatches(
        data.train,
        settings.batch_size,
        collate,
        int(cfg.seed),
        data.train.lengths,
        settings.bucket,
    )
    dev = frozen_batches(
        data.val,
        settings.eval_batch_size or settings.batch_size,
        collate,
        SUBSET_SEED,  # the same masks and swaps for every run, whatever its seed
        settings.eval_examples,
    )
    common = _most_frequent_token(data)
    baseline = most_frequent_token_accuracy(dev, common)
    log.info(
        "most frequent training token %r: %.4f of the validation MLM targets",
        tokenizer.decode([common]) or common,
        baseline,
    )
    trainer = Trainer(model, pretraining_objective, settings, run_dir, device, METRICS, console)
    fit = trainer.fit(train, dev, plan.checkpoint)
    if not distributed.is_main():
        return pd.DataFrame()
    best = run_dir / CHECKPOINT_DIR / BEST
    pretrained = None
    if best.exists():
        model.load_state_dict(load_checkpoint(best, device)["model"])
        pretrained = save_pretrained(run_dir / PRETRAINED_DIR, model.bert.cpu(), tokenizer)
        log.info("pre-trained encoder (step %s): %s", fit.best_step, pretrained)
    name = model_name() if imported is None else str(cfg.init)
    label = attention_label(OmegaConf.to_container(cfg.attention, resolve=True))
    metrics = pd.read_csv(run_dir / METRICS_FILE)
    pretraining_curves(metrics, run_dir / CURVE_FILE, f"{name}, {label}", baseline)
    val = metrics[metrics.split == "val"]
    final = val.iloc[-1] if len(val) else None
    row: dict[str, Any] = {
        "model": name,
        "attention": label,
        "steps": fit.step,
        "max_steps": settings.max_steps,
        "best_val_mlm_accuracy": fit.best_value,
        "best_step": fit.best_step,
        "final_val_mlm_accuracy": math.nan if final is None else final.mlm_accuracy,
        "final_val_sop_accuracy": math.nan if final is None else final.sop_accuracy,
        "final_val_mlm_loss": math.nan if final is None else final.mlm_loss,
        "most_frequent_token_accuracy": baseline,
        "status": "ok" if fit.completed else f"stopped at step {fit.step}",
        "wall_s": time.perf_counter() - started,
        "train_s": fit.train_seconds,
        "tokens_per_s": fit.tokens_per_s,
        "peak_mb": peak_memory_mb(device),
        "train_pairs": len(data.train),
        "val_pairs": len(data.val),
        "mean_tokens": float(data.train.lengths.mean()) + 3,
        "vocab_size": tokenizer.vocab_size,
        "max_len": model.config.max_len,
        "batch_size": train.global_batch_size * settings.accumulate,  # examples per update
        "pretrained": str(pretrained) if pretrained else None,
        **run_context(cfg, settings, device, plan),
    }
    return pd.DataFrame([row])


def pretraining_curves(metrics: pd.DataFrame, path: Path, title: str, baseline: float) -> Path:
    """Validation MLM and SOP accuracy (and the constant MLM baseline) against step."""
    val = metrics[metrics.split == "val"].sort_values("step")
    fig, axes = pyplot().subplots(1, 2, figsize=(11, 4.2))
    for ax, column, chance, chance_label in (
        (axes[0], "mlm_accuracy", baseline, "most frequent token"),
        (axes[1], "sop_accuracy", 0.5, "chance"),
    ):
        ax.plot(val["step"], val[column], marker="o", markersize=3, label="validation")
        ax.axhline(chance, color="grey", linestyle="--", linewidth=1, label=chance_label)
        ax.set_xlabel("step")
        ax.set_ylabel(column.replace("_", " "))
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    return save_figure(fig, path, dpi=110)


# --------------------------------------------------------------------------- rendering


def render(df: pd.DataFrame) -> RenderableType:
    columns = [
        ("model", lambda r: str(r.model)),
        ("attention", lambda r: str(r.attention)),
        ("steps", lambda r: f"{r.steps}/{r.max_steps}"),
        ("MLM best", lambda r: pct(r.best_val_mlm_accuracy)),
        ("MLM final", lambda r: pct(r.final_val_mlm_accuracy)),
        ("SOP final", lambda r: pct(r.final_val_sop_accuracy)),
        ("MLM baseline", lambda r: pct(r.most_frequent_token_accuracy)),
        ("min", lambda r: f"{r.wall_s / 60:.1f}"),
        ("tok/s", lambda r: f"{r.tokens_per_s:,.0f}"),
        ("peak MB", lambda r: f"{r.peak_mb:,.0f}"),
    ]
    title = "Pre-training runs (validation accuracy %)"
    return rows_table(title, df, columns, {"model", "attention"})
