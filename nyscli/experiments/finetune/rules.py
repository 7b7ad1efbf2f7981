"""``nys finetune``'s config keys and what each may hold; torch-free (see
:mod:`nyscli.experiments`).
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from nyscli.experiments import schema

SCRATCH = "scratch"  # init=: fresh weights (model.py)

RULES: dict[str, schema.Rule] = {
    "task.max_len": schema.Int(low=3, high=schema.TOKENS.high),  # [CLS] and two [SEP]
    "task.dev_examples": schema.OPTIONAL_COUNT,
    "task.test_examples": schema.OPTIONAL_COUNT,
    "task.train_examples": schema.OPTIONAL_COUNT,
    "task.dev_fraction": schema.Float(low=0.0, high=1.0, low_open=True, high_open=True),
    "task.test_fraction": schema.Float(low=0.0, high=1.0, low_open=True, high_open=True),
    "task.text_column": schema.Text(),
    "task.text_pair_column": schema.Text(null=True),
    "task.label_column": schema.Text(),
    "trainer.max_steps": schema.OPTIONAL_COUNT,  # null: the epochs decide
    "init": schema.Text(),
    "eval_only": schema.Text(null=True),
    "scratch.like": schema.Text(null=True),
    "scratch.tokenizer": schema.Text(),
    "data.path": schema.Text(null=True),
    "data.dev_path": schema.Text(null=True),
    "data.test_path": schema.Text(null=True),
    "epochs": schema.Float(low=0.0, low_open=True),
    "warmup_ratio": schema.Float(low=0.0, high=1.0, high_open=True, null=True),
    "conv_fit_examples": schema.Int(low=0),
}


def check(cfg: DictConfig) -> None:
    schema.check_training(cfg, RULES)


def builds_attention(cfg: DictConfig) -> bool:
    """Whether the run builds ``cfg.attention``: every run but a scratch model shaped like a
    pretrained folder (``scratch.like``), which takes that folder's attention and sizes."""
    return bool(cfg.get("eval_only")) or str(cfg.init) != SCRATCH or not cfg.scratch.like


def attentions(cfg: DictConfig) -> list[tuple[str, Any]]:
    """The attention configs the full check checks (:func:`schema.attentions_of`)."""
    return schema.attentions_of(cfg) if builds_attention(cfg) else []
