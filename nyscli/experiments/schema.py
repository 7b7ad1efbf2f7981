"""What each config key may hold, declared once: ``key -> rule``, checked in one pass.

Every command's ``validate(cfg)`` runs :func:`check` over its table before any data, weights or
run folder exist, so ``model.dropout=1.5`` or ``seed=abc`` fails in one line (exit code 2)
naming the key, the value and what is allowed. A key absent from a config (a task without
``data.val_fraction``, say) is skipped; cross-key checks stay in the commands' ``validate``.

Thread counts: ``null`` means torch's default; ``0`` is refused (it would silently mean
"default" in some places and "error" in others).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from nyscli.errors import UserInputError

_ABSENT = object()


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_int(value) or isinstance(value, float)


@dataclass(frozen=True)
class Rule:
    """Base: ``null`` allows None; subclasses say what else is allowed."""

    null: bool = False

    def ok(self, value: Any) -> bool:
        raise NotImplementedError

    def allowed(self) -> str:
        raise NotImplementedError

    def check(self, key: str, value: Any) -> None:
        if value is None and self.null:
            return
        if value is None or not self.ok(value):
            allowed = self.allowed() + (" or null" if self.null else "")
            raise UserInputError(f"{key}={_show(value)} is not allowed; it must be {allowed}")


@dataclass(frozen=True)
class Int(Rule):
    """An integer in [low, high] (either bound optional)."""

    low: int | None = None
    high: int | None = None

    def ok(self, value: Any) -> bool:
        return (
            _is_int(value)
            and (self.low is None or value >= self.low)
            and (self.high is None or value <= self.high)
        )

    def allowed(self) -> str:
        if self.high is not None and self.low is not None:
            return f"an integer from {self.low} to {self.high}"
        return "an integer" + (f" >= {self.low}" if self.low is not None else "")


@dataclass(frozen=True)
class Float(Rule):
    """A number (int or float) between ``low`` and ``high``; ``*_open`` excludes the bound."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def ok(self, value: Any) -> bool:
        if not _is_number(value) or value != value:  # NaN compares unequal to itself
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def allowed(self) -> str:
        parts = []
        if self.low is not None:
            parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if self.high is not None:
            parts.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        return "a number" + (" " + " and ".join(parts) if parts else "")


@dataclass(frozen=True)
class Bool(Rule):
    def ok(self, value: Any) -> bool:
        return isinstance(value, bool)

    def allowed(self) -> str:
        return "true or false"


@dataclass(frozen=True)
class Choice(Rule):
    values: tuple[str, ...] = ()

    def ok(self, value: Any) -> bool:
        return isinstance(value, str) and value in self.values

    def allowed(self) -> str:
        return "one of: " + ", ".join(self.values)


@dataclass(frozen=True)
class ChoiceList(Rule):
    """A non-empty list of distinct ``values`` (a single value also passes)."""

    values: tuple[str, ...] = ()

    def ok(self, value: Any) -> bool:
        items = list(value) if isinstance(value, list | tuple | ListConfig) else [value]
        return (
            bool(items)
            and all(isinstance(v, str) and v in self.values for v in items)
            and len(set(items)) == len(items)
        )

    def allowed(self) -> str:
        return "one or a list of distinct: " + ", ".join(self.values)


@dataclass(frozen=True)
class Text(Rule):
    """A non-empty string (a path, a name)."""

    def ok(self, value: Any) -> bool:
        return isinstance(value, str) and value.strip() != ""

    def allowed(self) -> str:
        return "a non-empty text"


@dataclass(frozen=True)
class IntList(Rule):
    """A non-empty list of integers >= ``low`` (a single integer also passes)."""

    low: int = 1

    def ok(self, value: Any) -> bool:
        items = list(value) if isinstance(value, list | tuple | ListConfig) else [value]
        return bool(items) and all(_is_int(v) and v >= self.low for v in items)

    def allowed(self) -> str:
        return f"a non-empty list of integers >= {self.low}, e.g. [64,128]"


def _show(value: Any) -> str:
    if isinstance(value, ListConfig | DictConfig):
        value = OmegaConf.to_container(value, resolve=True)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ",".join(_show(v) for v in value) + "]"
    return str(value)


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


def check_attentions(nodes: Iterable[tuple[str, Any]]) -> None:
    """Check every (name, attention config) pair against :data:`ATTENTION`."""
    for name, node in nodes:
        node = node if isinstance(node, DictConfig) else OmegaConf.create(node)
        check(node, ATTENTION, prefix=f"{name}.")


SEED = Int(low=0)
THREADS = Int(low=1, null=True)
PROBABILITY = Float(low=0.0, high=1.0, high_open=True)  # dropout-like: 1 would drop everything
DEVICE = Text()  # auto | cpu | cuda[:i], checked against the machine by each command
COUNT = Int(low=1)
OPTIONAL_COUNT = Int(low=1, null=True)

# Every attention core's options (a core that lacks a key simply does not have it).
ATTENTION: dict[str, Rule] = {
    "name": Text(),
    "causal": Bool(),
    "redraw": Bool(),
    "conv_kernel_size": Int(low=0),
    "num_landmarks": COUNT,
    "pinv_iterations": COUNT,
    "kmeans_iterations": COUNT,
    "num_features": COUNT,
    "proj_dim": COUNT,
    "max_seq_len": COUNT,
    "window": COUNT,
    "global_tokens": Int(low=0),
    "n_hashes": COUNT,
    "bucket_size": COUNT,
    "seed": SEED,
}

# The encoder of lra / pretrain / finetune (conf/model/).
MODEL: dict[str, Rule] = {
    "dim": COUNT,
    "depth": COUNT,
    "num_heads": COUNT,
    "ffn_dim": COUNT,
    "dropout": PROBABILITY,
    "max_len": COUNT,
    "nystrom_conv_kernel_size": Int(low=0),
}

# conf/trainer/ (TrainerConfig.check repeats the ranges for callers outside the CLI).
TRAINER: dict[str, Rule] = {
    "max_steps": COUNT,
    "batch_size": COUNT,
    "accumulate": COUNT,
    "lr": Float(low=0.0, low_open=True),
    "weight_decay": Float(low=0.0),
    "beta1": PROBABILITY,
    "beta2": PROBABILITY,
    "eps": Float(low=0.0, low_open=True),
    "warmup_steps": Int(low=0),
    "min_lr_ratio": Float(low=0.0, high=1.0),
    "clip_grad_norm": Float(low=0.0, low_open=True, null=True),
    "eval_every": COUNT,
    "eval_examples": OPTIONAL_COUNT,
    "eval_batch_size": OPTIONAL_COUNT,
    "log_every": COUNT,
    "checkpoint_every": OPTIONAL_COUNT,
    "monitor": Text(),
    "bucket": COUNT,
    "stop_at_step": OPTIONAL_COUNT,
    "progress": Bool(),
    "nproc_per_node": COUNT,
}

# What lra, pretrain and finetune share at the top level.
TRAINING: dict[str, Rule] = merged(
    {"seed": SEED, "threads": THREADS, "device": DEVICE, "data_cache": Text(null=True)},
    prefixed("model", MODEL),
    prefixed("trainer", TRAINER),
)
