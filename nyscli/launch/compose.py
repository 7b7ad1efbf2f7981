"""Composing a command's config with Hydra, and the refusals composing alone finds.

Everything here needs Hydra and the torch-free rules of the layers below (each command's
``rules``), never torch: ``nys`` asks :func:`early_refusal` before it imports the commands
(torch and pandas take seconds to load, tens of seconds on a busy machine), so an unknown key
or option, a misspelt group choice, an unreadable override or a value out of its range is
refused at once, with the same line the full check (:mod:`nyscli.launch.plan`, which composes
through these functions too) would give. Only an attention's options need torch (each core
declares them on its module); they are checked last.
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import os
import re
import sys
from collections.abc import Iterator

import hydra
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_automatic_config_search_path, get_args_parser
from hydra.core.config_search_path import ConfigSearchPath, SearchPathQuery
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException, MissingConfigException
from hydra.initialize import get_gh_backup, restore_gh_from_backup
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from nyscli.errors import UserInputError
from nyscli.experiments import schema, value_rules
from nyscli.experiments.renamed import refuse_renamed
from nyscli.launch.faults import USER_ERRORS, fault_line, one_line, refusal_line
from nyscli.overrides import override_key
from nyscli.paths import CONF_SOURCE
from nyscli.rules import Bool, show


def search_path(config_dir: str | None = None) -> ConfigSearchPath:
    """Hydra's config search path of every command: the package's configs, and the user's
    ``--config-dir`` folder after them (new groups and options, e.g. ``attention/mine.yaml``),
    exactly as Hydra's own entry point adds it."""
    path = create_automatic_config_search_path(None, None, CONF_SOURCE)
    if config_dir is not None:
        folder = os.path.abspath(config_dir)
        if not os.path.isdir(folder):
            raise UserInputError(f"--config-dir {config_dir} is not a directory")
        path.prepend("command-line", f"file://{folder}", SearchPathQuery(provider="schema"))
    return path


@contextlib.contextmanager
def composer(command: str, config_dir: str | None = None) -> Iterator[Hydra]:
    """A Hydra instance that composes ``command``'s configs as the run will (the global one is
    restored afterwards, as ``hydra.initialize_config_dir`` does)."""
    hydra.version.setbase("1.3")
    path = search_path(config_dir)
    backup = get_gh_backup()
    try:
        yield Hydra.create_main_hydra2(task_name=command, config_search_path=path)
    finally:
        restore_gh_from_backup(backup)


def task_overrides(overrides: list[str]) -> list[str]:
    # hydra.* overrides shape the run, not the job (hydra.searchpath excepted: it finds configs).
    return [
        o
        for o in overrides
        if not override_key(o).startswith("hydra") or override_key(o) == "hydra.searchpath"
    ]


def compose_job(composing: Hydra, command: str, overrides: list[str]) -> DictConfig:
    """One job's config with its hydra node (for HydraConfig), as the run will see it."""
    return composing.compose_config(
        config_name=command, overrides=overrides, run_mode=RunMode.RUN, with_log_configuration=False
    )


# Keys of conf/base/default.yaml the launcher itself reads (the commands check their own).
LAUNCH_RULES = {"fail_fast": Bool()}


def job_config(cfg: DictConfig, command: str, overrides: list[str]) -> DictConfig:
    """A composed job's config as its command's checks see it: HydraConfig set to it (they
    read the overrides and group choices), its hydra node dropped, and what the launcher
    checks itself checked (the recipe's command, the launcher's keys)."""
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    _same_command(cfg, command, overrides)
    schema.check(cfg, LAUNCH_RULES)
    return cfg


def _same_command(cfg: DictConfig, command: str, overrides: list[str]) -> None:
    """An ``experiment=`` recipe names its command; another command's recipe is refused."""
    made_for = cfg.get("command")
    if made_for == command:
        return
    recipe = [o for o in overrides if override_key(o) == "experiment"]
    what = recipe[-1].lstrip("+~") if recipe else f"command={made_for}"
    raise UserInputError(
        f"{what} is a recipe for nys {str(made_for).replace('_', '-')}, not for nys "
        f"{command.replace('_', '-')}; see nyscli/conf/experiment/"
    )


# Python reads integers of at most this many digits (sys.get_int_max_str_digits()); Hydra's
# parser would fail on a longer one with a ValueError and a traceback.
_MAX_DIGITS = sys.get_int_max_str_digits() or 4300
_DIGITS = re.compile(rf"\d{{{_MAX_DIGITS + 1},}}")


def refuse_unreadable_numbers(overrides: list[str]) -> None:
    """One line for a number too long to read (``seed=`` and 5,000 nines), its key named."""
    for override in overrides:
        digits = _DIGITS.search(override)
        if digits:
            key = override_key(override) if "=" in override else override[:20]
            raise UserInputError(
                f"{key}={show(override.partition('=')[2])} is not allowed: a number of "
                f"{len(digits.group())} digits (the largest readable has {_MAX_DIGITS})"
            )


_SEARCH_PARAMS = "hydra.sweeper.params."


def refuse_before_composing(command: str, overrides: list[str]) -> None:
    """What is refused before Hydra reads the overrides: a renamed key, a number too long to
    read, a sweep given inside ``hydra.sweeper.params``."""
    refuse_renamed(command, overrides)
    refuse_unreadable_numbers(overrides)  # before Hydra's parser, which fails on them
    refuse_search_params(overrides)


def refuse_search_params(overrides: list[str]) -> None:
    """``hydra.sweeper.params.<key>=interval(...)`` or ``=a,b`` reads as a sweep over Hydra's
    own config, which Hydra refuses in words that do not say how to change a sweep's values:
    name the override that does (the key itself, which the sweep takes over its preset's
    entry: a search's space, table3_cpu's attentions)."""
    parser = OverridesParser.create()
    for override in overrides:
        key = override_key(override)
        if (
            not key.startswith(_SEARCH_PARAMS)
            or not parser.parse_override(override).is_sweep_override()
        ):
            continue
        value = override.partition("=")[2]
        raise UserInputError(
            f"{override.lstrip('+~')} is not allowed: Hydra reads a sweep in a hydra.* key as a "
            f"sweep of its own settings; give the key itself, which replaces the preset's "
            f"values: '{key.removeprefix(_SEARCH_PARAMS)}={value}'"
        )


_UNKNOWN_KEY = re.compile(r"Could not override '([\w.]+)'.*not in struct")


def _did_you_mean(
    error: BaseException, composing: Hydra, command: str, overrides: list[str]
) -> str | None:
    """The name nearest to a misspelt config option (``attention=nystorm``) or key
    (``attention.num_landmark=32``, ``seq_len=512``), as the user would type it; None when
    the error names no unknown name or none is near."""
    if isinstance(error, MissingConfigException):
        group, _, name = str(error.missing_cfg_file or "").rpartition("/")
        near = difflib.get_close_matches(name, error.options or [], n=1)
        return f"{group}={near[0]}" if group and near else None
    found = _UNKNOWN_KEY.search(one_line(error))
    if found is None:
        return None
    # The keys of the config the user chose (attention=softmax has no num_landmarks).
    groups = composing.config_loader.repository  # type: ignore[attr-defined]
    choices = [o for o in overrides if groups.group_exists(override_key(o)) and "," not in o]
    try:
        cfg = compose_job(composing, command, task_overrides(choices))
    except (HydraException, OmegaConfBaseException):
        return None
    # A top-level name may be a config group (scheduler=cpu for schedule=cpu), which the
    # composed config holds only as its choice.
    groups_here = [str(g) for g in cfg.hydra.runtime.choices if "/" not in str(g)]
    with open_dict(cfg):
        del cfg["hydra"]
    # A name is compared with its siblings only: their shared parent would make any two
    # attention options look alike.
    parent, _, name = found.group(1).rpartition(".")
    node = OmegaConf.select(cfg, parent) if parent else cfg
    siblings = [str(key) for key in node] if isinstance(node, DictConfig) else []
    if not parent:
        siblings += groups_here
    alias = _ALIASES.get(name)
    near = [alias] if alias in siblings else difflib.get_close_matches(name, siblings, n=1)
    return f"{parent}.{near[0]}" if near and parent else near[0] if near else None


# Names Hugging Face's Trainer uses for a key `nys` spells differently, which
# difflib does not find near: learning_rate and lr share two letters.
_ALIASES = {
    "learning_rate": "lr",
    "gradient_accumulation_steps": "accumulate",
    "per_device_train_batch_size": "batch_size",
    "train_batch_size": "batch_size",
    "num_warmup_steps": "warmup_steps",
    "max_grad_norm": "clip_grad_norm",
    "adam_epsilon": "eps",
}


@contextlib.contextmanager
def composition_refused(composing: Hydra, command: str, overrides: list[str]) -> Iterator[None]:
    """Hydra's refusal of an unknown key or option in the block, as one line with the nearest
    name (``scheduler is not a key of nys lra; did you mean schedule?``); other Hydra errors
    pass through as they are."""
    try:
        yield
    except (HydraException, OmegaConfBaseException) as error:
        text = fault_line(error)
        unknown = _UNKNOWN_KEY.match(text)  # Hydra's advice (+key=...) would add the typo
        hint = _did_you_mean(error, composing, command, overrides)
        if unknown is None and hint is None:
            raise
        if unknown:
            text = f"{unknown.group(1)} is not a key of nys {command.replace('_', '-')}"
        raise UserInputError(text + (f"; did you mean {hint}?" if hint else "")) from None


class _NotPlain(Exception):
    """The command line is not a plain single run (a usage error, --help, -m, a sweep)."""


def early_refusal(command: str, arguments: list[str], typed: dict[str, str]) -> str | None:
    """The line refusing a plain single run that composing, the command's value rules (its
    torch-free ``rules.check``, in the order its ``validate`` runs them) or its attentions'
    options find bad, before the launcher and the commands are imported, or None. The full
    check refuses it too; a command line with several faults may hear of another first (the
    full check tests some, like ``device=cuda`` without a GPU, before the attention's options).
    A sweep, ``--cfg``, ``--help`` and the like, and a command line argparse refuses, are left
    to the full launch, which checks everything again. ``arguments``, ``typed``: as
    ``launch`` takes them."""
    parser = get_args_parser()

    def not_plain(message: str) -> None:
        raise _NotPlain(message)

    parser.error = not_plain  # type: ignore[method-assign]
    try:
        args: argparse.Namespace = parser.parse_intermixed_args(arguments)
    except _NotPlain:
        return None
    asked = (args.cfg, args.info, args.help, args.hydra_help, args.shell_completion, args.multirun)
    overrides = list(args.overrides)
    if any(asked):
        return None
    try:
        refuse_before_composing(command, overrides)
        if is_sweep(overrides):
            return None
        with (
            composer(command, args.config_dir) as composing,
            composition_refused(composing, command, overrides),
        ):
            cfg = compose_job(composing, command, overrides)
            if cfg.hydra.mode == RunMode.MULTIRUN:  # a cluster preset makes it a sweep
                return None
            job = job_config(cfg, command, overrides)
            rules = value_rules(command)
            rules.check(job)
            # torch loads here (the cores declare their options on their torch modules): a
            # bad attention option is still refused before pandas, plotting and the launcher
            # load, and a run that passes needs torch next anyway.
            schema.check_attentions(rules.attentions(job))
    except (*USER_ERRORS, OSError) as error:
        return refusal_line(error, overrides, typed)
    except Exception:  # noqa: BLE001  the full launch meets it again and reports it its way
        return None
    return None


def is_sweep(overrides: list[str]) -> bool:
    return any(o.is_sweep_override() for o in OverridesParser.create().parse_overrides(overrides))
