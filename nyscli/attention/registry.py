"""Name -> attention core class, and building a core from a plain config mapping."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from types import SimpleNamespace
from typing import Any, TypeVar

from torch import nn

from nyscli.attention.errors import AttentionConfigError
from nyscli.rules import Int

_REGISTRY: dict[str, type[nn.Module]] = {}

# Options of the multi-head wrapper, not of the core (besides ``name``): 0 = no conv skip.
WRAPPER_OPTIONS = {"conv_kernel_size": Int(low=0)}
WRAPPER_KEYS = frozenset({"name", *WRAPPER_OPTIONS})

T = TypeVar("T", bound=type[nn.Module])


def register(name: str) -> Callable[[T], T]:
    """Class decorator: make an attention core available under ``name`` in configs.

    A core declares ``options`` (its constructor's keyword arguments -> a rule from
    :mod:`nyscli.rules`) and ``budget_key`` (the option that sets its cost, or None for exact
    attention): the one place each is written.
    """

    def add(cls: T) -> T:
        if name in _REGISTRY:
            raise RuntimeError(f"attention '{name}' registered twice")
        params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
        declared = getattr(cls, "options", None)
        if declared is None or sorted(declared) != sorted(params):
            raise RuntimeError(f"attention '{name}' must declare options for {params}")
        if getattr(cls, "budget_key", "") not in (None, *params):
            raise RuntimeError(f"attention '{name}': budget_key must be one of {params} or None")
        _REGISTRY[name] = cls
        cls.registry_name = name
        return cls

    return add


def available() -> list[str]:
    """Sorted names of every registered attention core."""
    return sorted(_REGISTRY)


def core_class(name: str) -> type[nn.Module]:
    """The class registered under ``name``; a one-line error listing the choices otherwise."""
    if name not in _REGISTRY:
        raise AttentionConfigError(
            f"unknown attention '{name}'; choose one of: {', '.join(available())}"
        )
    return _REGISTRY[name]


def core_options(config: Mapping[str, Any]) -> tuple[type[nn.Module], dict[str, Any]]:
    """The core class ``config`` names and the keyword arguments it gives that class.

    Keys that belong to the multi-head wrapper (``conv_kernel_size``) are ignored here.
    Unknown keys are an error naming the keys the core accepts.
    """
    config = dict(config)
    if "name" not in config:
        raise AttentionConfigError("attention config has no 'name'")
    cls = core_class(str(config["name"]))
    kwargs = {k: v for k, v in config.items() if k not in WRAPPER_KEYS}
    params = inspect.signature(cls.__init__).parameters
    accepted = [p for p in params if p != "self"]
    unknown = sorted(set(kwargs) - set(accepted))
    if unknown:
        raise AttentionConfigError(
            f"attention '{config['name']}' has no option {', '.join(unknown)}; "
            f"allowed: {', '.join(accepted + sorted(WRAPPER_KEYS - {'name'}))}"
        )
    return cls, kwargs


def check_config(config: Mapping[str, Any], prefix: str = "attention") -> None:
    """Check ``config`` against its core's declared options without building it (no weights,
    no random draws): the name, unknown keys, then every value; one-line errors naming
    ``<prefix>.<key>``."""
    cls, _ = core_options(config)
    check_wrapper_options(config, prefix)
    for key, value in config.items():
        if key in cls.options:
            cls.options[key].check(f"{prefix}.{key}", value, AttentionConfigError)


def check_wrapper_options(config: Mapping[str, Any], prefix: str = "attention") -> None:
    """The multi-head wrapper's own options of ``config`` (the core checks the rest)."""
    for key, rule in WRAPPER_OPTIONS.items():
        if key in config:
            rule.check(f"{prefix}.{key}", config[key], AttentionConfigError)


def budget_key(config: Mapping[str, Any]) -> str | None:
    """The option that sets the cost of the core ``config`` names (``num_landmarks``,
    ``proj_dim``, ``window``, ...), or None for exact attention."""
    return core_class(str(config.get("name"))).budget_key


def budget(config: Mapping[str, Any]) -> int | None:
    """The value of the core's budget option (its class default if ``config`` omits it), or
    None for exact attention."""
    key = budget_key(config)
    if key is None:
        return None
    if key in config:
        return config[key]
    return inspect.signature(core_class(str(config["name"]))).parameters[key].default


def pairs_per_query(config: Mapping[str, Any]) -> int | None:
    """The budget of the core ``config`` describes in scored query-key pairs per query (the
    core's ``pairs()``, read from its options and class defaults without building it), or
    None for exact attention."""
    cls, kwargs = core_options(config)
    options = inspect.signature(cls).bind(**kwargs)
    options.apply_defaults()
    return cls.pairs(SimpleNamespace(**options.arguments))


def config_at_pairs(name: str, pairs: int) -> dict[str, Any]:
    """The config of core ``name`` at a budget of ``pairs`` scored pairs per query (its
    ``at_pairs``); an error for a core without a budget."""
    return {"name": name, **core_class(name).at_pairs(pairs)}


def build_attention(config: Mapping[str, Any]) -> nn.Module:
    """Build the core described by ``config`` (``name`` plus the core's keyword arguments)."""
    cls, kwargs = core_options(config)
    return cls(**kwargs)


def attention_label(config: Mapping[str, Any]) -> str:
    """The core's ``label()`` for ``config`` (``+conv<k>`` when the wrapper adds a conv skip),
    read from the options and the class defaults without building the core (no weights, no
    random draws just for a table row)."""
    cls, kwargs = core_options(config)
    options = inspect.signature(cls).bind(**kwargs)
    options.apply_defaults()
    label = cls.label(SimpleNamespace(**options.arguments))
    kernel = config.get("conv_kernel_size") or 0
    return f"{label}+conv{kernel}" if kernel else label
