"""``nys pretrain``'s config keys and what each may hold; torch-free (see
:mod:`nyscli.experiments`).
"""

from __future__ import annotations

from omegaconf import DictConfig

from nyscli.data.choices import CORPUS_SOURCES, TOKENIZER_KINDS
from nyscli.experiments import schema

OBJECTIVES = ("mlm_sop", "distill")

RULES: dict[str, schema.Rule] = {
    "mlm_probability": schema.Float(low=0.0, high=1.0, low_open=True, high_open=True),
    "objective": schema.Choice(values=OBJECTIVES),
    "data.source": schema.Choice(values=CORPUS_SOURCES),
    "data.path": schema.Text(null=True),
    "data.text_field": schema.Text(),
    "data.name": schema.Text(),
    "data.split": schema.Text(),
    "data.val_fraction": schema.Float(low=0.0, high=1.0, low_open=True, high_open=True),
    "data.split_seed": schema.SEED,
    "tokenizer.kind": schema.Choice(values=TOKENIZER_KINDS),
    "tokenizer.path": schema.Text(null=True),
    # The five special tokens and a basic alphabet must fit.
    "tokenizer.vocab_size": schema.Int(low=100, high=2**22),  # a 4M-row embedding at most
    "tokenizer.min_frequency": schema.COUNT,
}

# The attention configs the full check checks: every one a job holds.
attentions = schema.attentions_of


def check(cfg: DictConfig) -> None:
    schema.check_training(cfg, RULES)
