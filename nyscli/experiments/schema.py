"""What each config key may hold, declared once: ``key -> rule``, checked in one pass.

Every command's ``validate(cfg)`` runs :func:`check` over its table before any data, weights or
run folder exist, so ``model.dropout=1.5`` or ``seed=abc`` fails in one line (exit code 2)
naming the key, the value and what is allowed. A key absent from a config (a task without
``data.val_fraction``, say) is skipped; cross-key checks stay in the commands' ``validate``.

Torch-free, as are the commands' ``rules`` modules that use it: the command line runs their
checks before torch is imported (``nyscli.launch.compose.early_refusal``).

Thread counts: ``null`` means torch's default; ``0`` is refused (it would silently mean
"default" in some places and "error" in others).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from nyscli.rules import (  # noqa: F401
    PROBABILITY,
    Bool,
    Choice,
    ChoiceList,
    Float,
    Int,
    IntList,
    Rule,
    Text,
)
from nyscli.train.config import BATCH, TRAINER  # noqa: F401  (BATCH: one source)

_ABSENT = object()


def check(cfg: DictConfig, rules: Mapping[str, Rule], prefix: str = "") -> None:
    """Check every key of ``rules`` present in ``cfg``; the first bad one raises
    UserInputError(``<prefix><key>=<value> is not allowed; it must be ...``)."""
    for key, rule in rules.items():
        value = OmegaConf.select(cfg, key, default=_ABSENT)
        if value is _ABSENT:
            continue
        if isinstance(value, ListConfig):
            value = OmegaConf.to_container(value, resolve=True)
        rule.check(prefix + key, value)


def merged(*tables: Mapping[str, Rule]) -> dict[str, Rule]:
    """One table from several (later ones win)."""
    out: dict[str, Rule] = {}
    for table in tables:
        out.update(table)
    return out


def prefixed(prefix: str, table: Mapping[str, Rule]) -> dict[str, Rule]:
    return {f"{prefix}.{key}": rule for key, rule in table.items()}


def check_training(cfg: DictConfig, rules: Mapping[str, Rule]) -> None:
    """A training command's ``rules``, then the keys every training command shares
    (:data:`TRAINING`: seed, threads, model.*, trainer.*) that ``rules`` does not redefine."""
    check(cfg, rules)  # first: a task key names what the user set, not its echo
    check(cfg, {k: r for k, r in TRAINING.items() if k not in rules})


def attentions_of(cfg: DictConfig) -> list[tuple[str, Any]]:
    """Every attention config of a job, named as a refusal names it: ``attention``, and each
    of bench's ``attention_rows``."""
    rows = cfg.get("attention_rows") or []
    return [("attention", cfg.attention)] + [
        (f"attention_rows[{i}]", r) for i, r in enumerate(rows)
    ]


def check_attentions(nodes: Iterable[tuple[str, Any]]) -> None:
    """Check every (name, attention config) pair against its core's declared options."""
    # Here, not at the top: the cores' options are declared on their torch modules, and the
    # rest of this module is checked before torch is imported (the commands' rules.py).
    from nyscli.attention import check_config

    for name, node in nodes:
        if isinstance(node, DictConfig | ListConfig):
            node = OmegaConf.to_container(node, resolve=True)
        check_config(node, prefix=name)


SEED = Int(low=0)
# Threads beyond a few per core only slow torch down; the floor of 64 leaves room for a job
# checked on a small login node and run on a big cluster node.
THREADS = Int(low=1, high=max(64, 4 * (os.cpu_count() or 1)), null=True)
DEVICE = Text()  # auto | cpu | cuda[:i], checked against the machine by each command
COUNT = Int(low=1)
OPTIONAL_COUNT = Int(low=1, null=True)
# Sizes that become tensor dimensions: beyond these a table or activation cannot be allocated
# on any machine nys runs on (a 2^63 position table overflowed torch in a traceback).
TOKENS = Int(low=1, high=2**20)  # a sequence length: 1,048,576 tokens (the paper's longest: 8,192)
WIDTH = Int(low=1, high=2**16)  # a hidden size
FFN_WIDTH = Int(low=1, high=2**18)
LAYERS = Int(low=1, high=1024)  # layers or heads

# The encoder of lra / pretrain / finetune (conf/model/).
MODEL: dict[str, Rule] = {
    "dim": WIDTH,
    "depth": LAYERS,
    "num_heads": LAYERS,
    "ffn_dim": FFN_WIDTH,
    "dropout": PROBABILITY,
    "max_len": TOKENS,
    "nystrom_conv_kernel_size": Int(low=0),
    "softmax_attention_dropout": PROBABILITY,
}

# What lra, pretrain and finetune share at the top level.
TRAINING: dict[str, Rule] = merged(
    {"seed": SEED, "threads": THREADS, "device": DEVICE, "data_cache": Text(null=True)},
    prefixed("model", MODEL),
    prefixed("trainer", TRAINER),
)
