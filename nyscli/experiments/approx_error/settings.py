"""What an approx-error config's keys come to where the YAML leaves them open: the sequence
length n, the budgets m, the dtype, the budget unit and how much of a text file a run reads.
Read by the command and by its helpers (fidelity, memory), so each is written once."""

from __future__ import annotations

import torch
from omegaconf import DictConfig

from nyscli.experiments.approx_error import rules, sources
from nyscli.experiments.approx_error.methods import DEFAULT_UNIT

DTYPES = {name: getattr(torch, kind) for name, kind in rules.DTYPES.items()}
SYNTHETIC_SEQ_LEN = 4096
# Bytes of text read per token the run uses: WordPiece tokens of English average ~5 bytes,
# so 64 leaves room for long words and 4-byte characters; a file of any size is read only
# that far (a 300 MB file used to be tokenized whole: 12 GB, then a native crash).
TEXT_BYTES_PER_TOKEN = 64


def budgets(cfg: DictConfig) -> list[int]:
    """Budgets m: ``budgets`` (a list or one number), else [attention.num_landmarks]."""
    value = cfg.budgets
    if value is None:
        value = [cfg.attention.num_landmarks]
    elif isinstance(value, int):
        value = [value]
    return [int(m) for m in value]


def seq_len(cfg: DictConfig) -> int:
    """n: ``seq_len``, or the source's default (4096 synthetic, 512 minilm)."""
    if cfg.seq_len is not None:
        return int(cfg.seq_len)
    real = cfg.source in ("minilm", "checkpoint")
    return sources.MINILM_MAX_TOKENS if real else SYNTHETIC_SEQ_LEN


def budget_unit(cfg: DictConfig) -> str:
    """``budget_unit``; a config without the key counts budgets in landmarks."""
    return cfg.get("budget_unit", DEFAULT_UNIT)


def text_bytes(cfg: DictConfig) -> int:
    """How much of ``data.path`` a run reads: enough for max_sequences x seq_len tokens."""
    return TEXT_BYTES_PER_TOKEN * seq_len(cfg) * int(cfg.max_sequences)
