"""The grid sweeper's jobs, each ``attention.<option>=`` kept only for the attentions that have it.

``-m attention=nystrom,softmax attention.num_landmarks=32,64`` as a plain grid would give
softmax an option it lacks (Hydra refuses it) and run it twice: here the option is dropped
where the job's attention lacks it (one no attention has stays, so a typo is still refused)
and jobs that became identical run once. The launcher's check and ``hydra_plugins/nys_sweeper``
both call :func:`per_attention`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from nyscli.launch.sweepers import search
from nyscli.overrides import override_key, override_value

PREFIX = "attention."
# A group choice (``attention=``, ``experiment=``, ``task=``) shapes the attention node; the
# keys of the node are looked up once per distinct set of them.
AttentionKeys = Callable[[list[str]], set[str]]


def attention_option(override: str) -> str | None:
    """``num_landmarks`` of a plain ``attention.num_landmarks=32`` override, else None (a
    ``+``/``~`` override says on purpose what it wants)."""
    key = override.split("=", 1)[0]
    if key.startswith(("+", "~")) or not key.startswith(PREFIX):
        return None
    return key[len(PREFIX) :].split(".", 1)[0]


def _choices(job: Sequence[str]) -> tuple[str, ...]:
    return tuple(o for o in job if "." not in o.split("=", 1)[0])


@dataclass
class Split:
    """The jobs to run, and a line saying what was dropped (None when nothing was)."""

    jobs: list[list[str]]
    note: str | None = None
    dropped: dict[str, set[str]] = field(default_factory=dict)  # option -> attentions


def per_attention(jobs: list[list[str]], attention_keys: AttentionKeys) -> Split:
    """``jobs`` (each a list of overrides) with every ``attention.<option>=`` override kept
    only where the job's attention has ``<option>``; duplicates after that removed (first
    kept, order kept). ``attention_keys(overrides)``: the keys of the attention node those
    overrides compose (called with the job's overrides minus its attention options)."""
    if not any(attention_option(o) for job in jobs for o in job):
        return Split(jobs)
    cache: dict[tuple[str, ...], set[str]] = {}

    def keys(job: list[str]) -> set[str]:
        choices = _choices(job)
        if choices not in cache:
            cache[choices] = attention_keys([o for o in job if attention_option(o) is None])
        return cache[choices]

    known = set().union(*(keys(job) for job in jobs))
    kept: list[list[str]] = []
    seen: set[tuple[str, ...]] = set()
    dropped: dict[str, set[str]] = {}
    for job in jobs:
        own = keys(job)
        out = []
        for override in job:
            option = attention_option(override)
            if option is not None and option in known and option not in own:
                dropped.setdefault(option, set()).add(_attention_name(job))
                continue
            out.append(override)
        if tuple(out) not in seen:
            seen.add(tuple(out))
            kept.append(out)
    if not dropped:
        return Split(jobs)
    where = "; ".join(f"{PREFIX}{o} not for {', '.join(sorted(a))}" for o, a in dropped.items())
    note = (
        f"options apply only to the attentions that have them ({where}): "
        f"{len(kept)} jobs instead of {len(jobs)}"
    )
    return Split(kept, note, dropped)


def _attention_name(job: Sequence[str]) -> str:
    chosen = [override_value(o) for o in job if override_key(o) == "attention" and "=" in o]
    return chosen[-1] if chosen else "the default attention"


def batches(jobs: list[list[str]], size: int | None) -> list[list[list[str]]]:
    """``jobs`` in launcher batches of ``size`` (None or -1: one batch), as Hydra's sweeper."""
    if size is None or size == -1 or not jobs:
        return [jobs]
    return [jobs[i : i + size] for i in range(0, len(jobs), size)]


def grid_arguments(hydra: Any, overrides: list[str]) -> list[str]:
    """A grid sweep's arguments as Hydra's basic sweeper builds them from the composed
    ``hydra`` node: its ``hydra.sweeper.params`` (``experiment=table3_cpu``'s attentions and
    tasks) first, then the command line's ``overrides`` (a key in both takes the command
    line's values). A search's params are its space, not a grid: they are left to it."""
    sweeper = hydra.get("sweeper")
    params = sweeper.get("params") if sweeper is not None else None
    if not params or search.is_search(hydra):
        return list(overrides)
    return [*(f"{k}={v}" for k, v in params.items()), *overrides]
