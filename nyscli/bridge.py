"""The bridge from a Typer command to Hydra: overrides in, a composed config and a run folder out.

Each command turns its typed options into Hydra override strings, appends the free overrides
and hands everything to Hydra's own entry point (``_run_hydra``), so multirun, launcher plugins,
``--cfg``, ``.hydra/`` and callbacks behave exactly as in a ``@hydra.main`` script. Before
launching, every job's config is composed and validated, so a typo fails in one line with exit
code 2 instead of deep inside a sweep.
"""

from __future__ import annotations

import contextlib
import copy
import errno
import itertools
import logging
import os
import re
import shutil
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from types import ModuleType
from typing import Any, NoReturn

import hydra
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra._internal.hydra import Hydra
from hydra._internal.utils import (
    _run_hydra,
    create_automatic_config_search_path,
    get_args_parser,
)
from hydra.core.config_search_path import ConfigSearchPath, SearchPathQuery
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import ValueType
from hydra.errors import HydraException, MissingConfigException
from hydra.initialize import get_gh_backup, restore_gh_from_backup
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException
from rich.markup import escape

from nyscli import ranks, tracking
from nyscli.console import console
from nyscli.data.common import progress_bar
from nyscli.errors import UserInputError, describe_os_error, naming
from nyscli.experiments import experiment_module
from nyscli.experiments.renamed import refuse_renamed
from nyscli.experiments.report.sweep_summary import write_summary
from nyscli.files import write_csv, write_json, write_text
from nyscli.output.env import collect_env
from nyscli.output.runs import ERROR_FILE, RESULTS_FILE, find_run_folders
from nyscli.overrides import override_key, override_keys, override_value
from nyscli.paths import CONF_SOURCE, OUTPUT_ROOT
from nyscli.stops import sigterm_raises, stop_code, stopped
from nyscli.sweeps import per_attention
from nyscli.tracking import search
from nyscli.train import distributed
from nyscli.train.errors import TrainingInterrupted
from nyscli.train.resume import RESUMED_FROM_FILE, pin_overrides

log = logging.getLogger("nys")

ENV_FILE = "env.json"
# What every run folder holds from its first second; a failed run with nothing else is removed.
# Created exclusively (O_EXCL) in a folder given as hydra.run.dir / hydra.sweep.dir: of several
# launches into one folder, at the same instant or later, exactly one gets it.
CLAIM_FILE = ".nys-claim"
BOOKKEEPING = (".hydra", ENV_FILE, ERROR_FILE, CLAIM_FILE, RESUMED_FROM_FILE)
# AttentionConfigError and DataError are UserInputErrors too.
USER_ERRORS = (UserInputError, HydraException, OmegaConfBaseException)
# The optional Hydra launcher plugins behind conf/cluster/ presets: launcher -> pip package.
LAUNCHER_PACKAGES = {
    "joblib": "hydra-joblib-launcher",
    "submitit_local": "hydra-submitit-launcher",
    "submitit_slurm": "hydra-submitit-launcher",
}


class Abort(BaseException):
    """Leaves Hydra's job runner untouched (it only catches Exception) with an exit code."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.message = message
        self.code = code


def one_line(error: BaseException) -> str:
    """The error's message, and its cause's, on one line."""
    # Hydra appends its whole config search path to missing-config errors: noise for users.
    text = " ".join(str(error).split("Config search path")[0].split())
    cause = error.__cause__
    if cause is not None and str(cause).strip():
        first = str(cause).strip().splitlines()[0].strip()
        if first not in text:
            text += f" ({first})"
    return text


# Hydra's advice for an unknown attention option (+attention.x=...) only leads to our own
# refusal of the option: say what it is instead.
_UNKNOWN_OPTION = re.compile(r"Could not override '(attention\.[\w.]+)'.*not in struct")


def _attention_hint(text: str) -> str:
    found = _UNKNOWN_OPTION.search(text)
    if found is None:
        return text
    return (
        f"{found.group(1)} is not an option of the chosen attention (of none in a sweep); "
        "--cfg job shows the options it has"
    )


def fault_line(error: BaseException) -> str:
    """One line for a user error, or for an OS fault (file, reason, what to do)."""
    # Hydra's MissingConfigException is an IOError too, but a user error, not a disk fault.
    if isinstance(error, OSError) and not isinstance(error, USER_ERRORS):
        return describe_os_error(error)
    return _attention_hint(one_line(error))


_GRAMMAR_ERRORS = ("mismatched input", "token recognition error", "no viable alternative",
                   "extraneous input", "missing EQUAL")  # fmt: skip


def _first_unparsable(overrides: list[str]) -> int | None:
    parser = OverridesParser.create()
    for index, override in enumerate(overrides):
        try:
            parser.parse_override(override)
        except HydraException:
            return index
    return None


def parse_hint(message: str, overrides: list[str]) -> str:
    """Hydra's override-grammar error, said as what to type: which argument it could not
    parse, and how to quote a path with spaces (the shell splits it) or with ``(),[]{}=``
    (Hydra's grammar reads them)."""
    if not any(marker in message for marker in _GRAMMAR_ERRORS):
        return message
    index = _first_unparsable(overrides)
    if index is None:
        return message
    override = overrides[index]
    if "=" not in override and index and "=" in overrides[index - 1]:
        whole = f"{overrides[index - 1]} {override}"
        return (
            f"cannot read the argument '{override}' (no key=value): if it belongs to the value "
            f'before it, quote the whole override for your shell: "{whole}"'
        )
    key, _, value = override.partition("=")
    return (
        f"cannot read {override}: Hydra's grammar reads ( ) [ ] {{ }} , = and quotes in a "
        f"value; quote the value inside the shell's quotes: \"{key}='{value}'\""
    )


def missing_launcher(error: BaseException, overrides: list[str]) -> str | None:
    """The one-line install hint when a cluster preset's launcher plugin is not installed."""
    if not isinstance(error, MissingConfigException):
        return None
    missing = str(error.missing_cfg_file or "")
    launcher = missing.removeprefix("hydra/launcher/")
    if launcher == missing or launcher not in LAUNCHER_PACKAGES:
        return None
    package = LAUNCHER_PACKAGES[launcher]
    # The default preset (local) needs no plugin: the culprit is the one given, if any.
    presets = [o.lstrip("+~") for o in overrides if override_key(o) == "cluster"]
    choice = presets[-1] if presets else f"hydra/launcher={launcher}"
    return (
        f"{choice} needs the Hydra launcher plugin {package}, which is not installed: "
        f"pip install {package}"
    )


def not_a_folder(path: Path) -> Path | None:
    """The first of ``path`` and its parents that exists but is no folder (a file, a dangling
    link), or None: creating ``path`` would fail there."""
    for part in [*reversed(path.parents), path]:
        if os.path.lexists(part) and not part.is_dir():
            return part
    return None


def _blocked(path: Path, key: str | None = None) -> UserInputError:
    """``key=path`` (or the run folder ``path``) cannot be created: name what is in the way."""
    part = not_a_folder(path)
    what = "a dangling link" if part is not None and part.is_symlink() else "a file"
    given = f"{key}={path}" if key else f"the run folder {path}"
    return UserInputError(
        f"{given} cannot be created: {part} is {what}, not a folder; "
        "remove it or give another folder"
    )


def claim_dir(base: Path) -> Path:
    """Create ``base`` (or ``base_1``, ``base_2``, ...) atomically: folders are never reused."""
    for i in itertools.count():
        candidate = base if i == 0 else base.with_name(f"{base.name}_{i}")
        try:
            candidate.mkdir(parents=True)
            return candidate
        except FileExistsError:
            if not_a_folder(candidate.parent) is not None:  # e.g. a dangling outputs link:
                raise _blocked(candidate) from None  # every name would fail the same way
            continue
    raise AssertionError("unreachable")


def job_overrides(overrides: list[str], multirun: bool) -> list[list[str]]:
    """The override list of every job the launch would run (one list unless multirun)."""
    if not multirun:
        return [overrides]
    parser = OverridesParser.create()
    parsed = parser.parse_overrides(overrides)
    # An Optuna search's interval(a, b) has no job list: its bounds are checked instead.
    parsed = [
        parser.parse_override(f"{o.get_key_element()}=choice({o.value().start},{o.value().end})")
        if o.value_type == ValueType.INTERVAL_SWEEP
        else o
        for o in parsed
    ]
    return [job for batch in BasicSweeper.split_arguments(parsed, None) for job in batch]


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


def _task_overrides(overrides: list[str]) -> list[str]:
    # hydra.* overrides shape the run, not the job (hydra.searchpath excepted: it finds configs).
    return [
        o
        for o in overrides
        if not override_key(o).startswith("hydra") or override_key(o) == "hydra.searchpath"
    ]


def _compose_job(composing: Hydra, command: str, overrides: list[str]) -> DictConfig:
    """One job's config with its hydra node (for HydraConfig), as the run will see it."""
    return composing.compose_config(
        config_name=command, overrides=overrides, run_mode=RunMode.RUN, with_log_configuration=False
    )


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


@dataclass(frozen=True)
class Plan:
    """What a launch will do, decided before any folder exists."""

    multirun: bool
    hydra: DictConfig  # the composed hydra node: mode, run and sweep dirs
    done: str | None = None  # a line saying there is nothing to run (resume= a finished run)
    jobs: tuple[tuple[str, ...], ...] = ()  # a sweep's jobs (overrides each), as they will run
    note: str | None = None  # what the launch changed (sweep options dropped, settings kept)
    pins: tuple[str, ...] = ()  # overrides added to the command line (resume= keeps settings)


def _check_job(module: ModuleType, command: str, cfg: DictConfig, overrides: list[str]) -> None:
    """Validate one job's composed config as the run will see it (HydraConfig set to it, so
    ``validate`` sees the overrides and group choices); its hydra node is dropped."""
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    _same_command(cfg, command, overrides)
    module.validate(cfg)
    tracking.check(cfg.get("logger"))


class JobComposer:
    """A sweep's jobs composed for checking, fast: Hydra composes (reads every YAML file, ~0.12
    s) once per distinct set of config-group choices (``attention=...``, ``+experiment=...``,
    any ``+``/``~`` override); a job's plain ``key=value`` overrides are then applied to a copy
    by Hydra's own override step, as its composition applies them last."""

    def __init__(self, composing: Hydra, command: str) -> None:
        self.composing, self.command = composing, command
        self.repository = composing.config_loader.repository  # type: ignore[attr-defined]
        self.parser = OverridesParser.create()
        self.bases: dict[tuple[str, ...], DictConfig] = {}

    def _plain(self, override: Any) -> bool:
        return (
            override.package is None
            and not (override.is_add() or override.is_delete() or override.is_force_add())
            and not self.repository.group_exists(override.key_or_group)
            and not override.key_or_group.startswith("hydra")
        )

    def compose(self, job: list[str]) -> DictConfig:
        parsed = self.parser.parse_overrides(job)
        plain = [o for o in parsed if self._plain(o)]
        groups = tuple(o.input_line for o in parsed if not self._plain(o))
        if groups not in self.bases:
            self.bases[groups] = _compose_job(self.composing, self.command, list(groups))
        cfg = copy.deepcopy(self.bases[groups])
        ConfigLoaderImpl._apply_overrides_to_config(plain, cfg)
        with open_dict(cfg):
            cfg.hydra.overrides.task = list(job)
        return cfg


SWEEP_BAR_JOBS = 20  # checking fewer jobs takes a few seconds: no bar


@contextlib.contextmanager
def _no_bar(description: str, total: int) -> Iterator[Any]:
    yield lambda k: None


def _sweeps(overrides: list[str]) -> bool:
    return any(o.is_sweep_override() for o in OverridesParser.create().parse_overrides(overrides))


def _resume_pins(
    module: ModuleType, composing: Hydra, command: str, cfg: DictConfig, overrides: list[str]
) -> tuple[tuple[str, ...], str | None]:
    """``resume=<run folder>`` keeps the recorded value of every setting whose default changed
    since that run (a training command's ``resume_pins``): the overrides that do it, and the
    note that says so. A resumed run trains with the settings it records, and a code update
    between two chunks of a run is not a change the user asked for."""
    pins_of = getattr(module, "resume_pins", None)
    if pins_of is None:
        return (), None

    def compose(job: list[str]) -> DictConfig:
        today = _compose_job(composing, command, _task_overrides(job))
        with open_dict(today):
            del today["hydra"]
        return today

    given = override_keys(overrides)
    pins = pins_of(cfg, given, compose)
    if not pins:
        return (), None
    kept = ", ".join(f"{p.key}={p.old} (default now {p.new})" for p in pins)
    return tuple(pin_overrides(pins)), f"resume keeps that run's settings: {kept}"


def plan_launch(
    command: str, overrides: list[str], multirun: bool, config_dir: str | None = None
) -> Plan:
    """Compose and validate every job before anything runs; raise one of USER_ERRORS at the
    first bad value.

    A single run is composed once here, and once more by Hydra when it runs it (``_run_hydra``
    composes its own): this one checks every value, asks the command's ``preflight`` and
    yields the run folder before the folder exists. A sweep composes its hydra node, then
    each job.
    """
    refuse_renamed(command, overrides)
    module = experiment_module(command)
    with composer(command, config_dir) as composing:
        if not multirun and not _sweeps(overrides):
            cfg = _compose_job(composing, command, overrides)
            node = cfg.hydra
            if node.mode != RunMode.MULTIRUN:  # else a cluster preset makes it a sweep
                _check_job(module, command, cfg, overrides)
                pins, note = _resume_pins(module, composing, command, cfg, overrides)
                if pins:  # the run composed as it will run, with the settings it keeps
                    cfg = _compose_job(composing, command, [*overrides, *pins])
                    node = cfg.hydra
                    _check_job(module, command, cfg, [*overrides, *pins])
                check = getattr(module, "preflight", None)
                return Plan(False, node, check(cfg) if check else None, note=note, pins=pins)
        node = composing.compose_config(
            config_name=command,
            overrides=overrides,
            run_mode=RunMode.MULTIRUN,
            with_log_configuration=False,
            validate_sweep_overrides=False,
        ).hydra
        multirun = multirun or node.mode == RunMode.MULTIRUN
        search.check_sweeper(node)  # hparams_search=: its settings, optuna installed

        def attention_keys(job: list[str]) -> set[str]:
            found = _compose_job(composing, command, job).get("attention")
            return set(found.keys()) if found is not None else set()

        split = per_attention(job_overrides(_task_overrides(overrides), multirun), attention_keys)
        # Each job is composed as it will run (~0.14 s on a 2-core CPU): a bar for big sweeps.
        bar = progress_bar if len(split.jobs) >= SWEEP_BAR_JOBS else _no_bar
        cached = JobComposer(composing, command)
        with bar(f"checking {len(split.jobs)} jobs", len(split.jobs)) as advance:
            for job in split.jobs:
                _check_job(module, command, cached.compose(job), job)
                advance(1)
    return Plan(multirun, node, jobs=tuple(tuple(j) for j in split.jobs), note=split.note)


def show_jobs(command: str, plan: Plan, what: str, resolve: bool, config_dir: str | None) -> None:
    """``--cfg job|hydra|all`` with ``-m``: each job's config as the sweep will run it (Hydra
    itself refuses the pair), after a ``# job i: overrides`` line."""
    with composer(command, config_dir) as composing:
        for index, job in enumerate(plan.jobs):
            cfg = _compose_job(composing, command, list(job))
            if what == "job":
                with open_dict(cfg):
                    del cfg["hydra"]
            elif what == "hydra":
                cfg = cfg.hydra
            console.print(f"# job {index}: {' '.join(job) or '(defaults)'}", highlight=False)
            console.out(OmegaConf.to_yaml(cfg, resolve=resolve), highlight=False)


RUN_MARKS = (".hydra", RESULTS_FILE, ERROR_FILE, "metrics.csv", "checkpoints", CLAIM_FILE)
ENCLOSING_MARKS = (".hydra/config.yaml", "multirun.yaml", CLAIM_FILE)  # a run's, a sweep's


def existing_run(folder: Path) -> Path | None:
    """The first run folder at or below ``folder`` (it holds ``.hydra/``, results or
    checkpoints), or None: such a folder is never written into again."""
    if not folder.is_dir():
        return None
    for mark in RUN_MARKS:
        found = sorted(folder.rglob(mark))
        if found:
            return found[0].parent
    return None


class Task:
    """The Hydra task function of ``command``: run the experiment, write results and env.

    A class, not a closure, so launchers that ship the task to other processes (joblib,
    submitit) pickle it by reference.
    """

    def __init__(self, command: str) -> None:
        self.command = command

    def __call__(self, cfg: DictConfig) -> float | None:
        """Run one job; returns the value a search optimises (``optimized_metric``) or None."""
        command = self.command
        hydra_cfg = HydraConfig.get()
        run_dir = Path(hydra_cfg.runtime.output_dir)
        multirun = hydra_cfg.mode == RunMode.MULTIRUN
        module = experiment_module(command)
        main = ranks.launched_rank() == 0  # torchrun/srun/submitit ranks > 0 write nothing
        if main:
            allocator = getattr(module, "ALLOCATOR", None)
            env = collect_env(str(cfg.get("device", "cpu")), cfg.get("threads"), allocator)
            try:
                write_json(env, run_dir / ENV_FILE)
            except OSError as error:
                raise Abort(describe_os_error(error), 2) from error
        else:
            logging.getLogger().setLevel(logging.WARNING)
        nproc = int(OmegaConf.select(cfg, "trainer.nproc_per_node", default=1))
        try:
            module.validate(cfg)
            df = ranks.run_on_ranks(module.run, cfg, run_dir, console, nproc)
        except TrainingInterrupted as stop:
            if main:  # the folder then tells `nys report` where it stopped and how to resume
                with contextlib.suppress(OSError):
                    write_text(stop.message + "\n", run_dir / ERROR_FILE)
            raise
        except (*USER_ERRORS, OSError) as error:
            message = fault_line(error)
            with contextlib.suppress(OSError):  # the disk may be the very thing that failed
                write_text(message + "\n", run_dir / ERROR_FILE)
            if not multirun:
                raise Abort(message, 2) from error
            log.error("job failed: %s", message)
            return
        except Exception as error:
            write_text(f"{one_line(error)}\n\n{traceback.format_exc()}", run_dir / ERROR_FILE)
            if not multirun:
                raise
            # One line: the sweep goes on and ends with the list of failed jobs; the traceback
            # is in the job's error.txt, not on the console between the other jobs.
            log.error("job failed: %s (traceback in %s)", one_line(error), run_dir / ERROR_FILE)
            return
        if df is None:
            return None
        write_csv(df, run_dir / RESULTS_FILE)
        console.print(module.render(df))
        log.info("results: %s", run_dir / RESULTS_FILE)
        tracking.finish(cfg, run_dir, df)  # final metrics and files to TensorBoard / MLflow
        return tracking.objective(cfg, df)


def _run_folder(base: Path, shared: bool) -> Path:
    """A new folder for this run, or the one all ranks of a launched world share."""
    if not shared:
        return claim_dir(base)
    base.mkdir(parents=True, exist_ok=True)
    return base


def enclosing_run(folder: Path) -> Path | None:
    """The run (or sweep) folder that ``folder`` would sit inside, or None. Only marks no
    other folder has count (a user's project folder may well hold a results.csv)."""
    for parent in folder.absolute().parents:
        if any((parent / mark).exists() for mark in ENCLOSING_MARKS):
            return parent
    return None


def check_new_folder(key: str, target: Path) -> Path | None:
    """Claim ``key=target`` for this launch, or refuse it in one line: when it already holds
    a run (runs are never overwritten), lies inside one, holds anything else, cannot be
    created or written, or another launch claimed it first (:data:`CLAIM_FILE`, created
    exclusively, decides a race). Returns ``target`` if this call created it, else None."""
    if not_a_folder(target) is not None:
        raise _blocked(target, key)
    inside = enclosing_run(target)
    if inside is not None:
        raise UserInputError(
            f"{key}={target} lies inside the run {inside}; runs are never written into: "
            "give a folder outside it"
        )
    run = existing_run(target)
    if run is not None:
        raise UserInputError(
            f"{key}={target} already holds a run ({run}); runs are never overwritten: "
            f"give a new folder, or resume=<run folder> to continue one"
        )
    created = not target.exists()
    target.mkdir(parents=True, exist_ok=True)
    if not os.access(target, os.W_OK | os.X_OK):
        raise OSError(errno.EACCES, os.strerror(errno.EACCES), str(target))
    if not created and any(target.iterdir()):
        raise UserInputError(
            f"{key}={target} is a folder that is not empty; a run needs a new or empty folder"
        )
    try:
        os.close(os.open(target / CLAIM_FILE, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        raise UserInputError(
            f"{key}={target} was claimed by another launch at the same moment; give a new folder"
        ) from None
    return target if created else None


def missing_parents(folder: Path) -> list[Path]:
    """The parents of ``folder`` that creating it would add (e.g. ``outputs/finetune``),
    deepest first."""
    return [p for p in folder.parents if not p.exists()]


def discard_failed(folder: Path, made_parents: list[Path]) -> None:
    """Remove a run folder that failed before it produced anything but bookkeeping (config,
    env.json, error.txt, the log): an error-only folder is no run. Anything else (metrics,
    checkpoints) keeps the folder, marked failed by its error.txt. The parents this launch
    created (``made_parents``, deepest first) go with it while they are empty, so a refused
    run leaves no ``outputs/`` behind."""
    if not folder.is_dir():
        return
    keep = [p for p in folder.iterdir() if p.name not in BOOKKEEPING and p.suffix != ".log"]
    if keep:
        return
    shutil.rmtree(folder, ignore_errors=True)
    for parent in made_parents:
        try:
            parent.rmdir()
        except OSError:  # another run wrote there meanwhile: keep it and what is above it
            return


def claim_run_folder(
    command: str, overrides: list[str], plan: Plan
) -> tuple[Path | None, list[Path], Path | None]:
    """Create the run (or sweep) folder before Hydra runs: a new timestamped one under
    ``outputs/<command>/``, appended to ``overrides``, or the one given, checked to be new.

    Returns (the folder this launch created, None if it created none; the parents it created,
    deepest first; the sweep folder, None for a single run).
    """
    key = "hydra.sweep.dir" if plan.multirun else "hydra.run.dir"
    if key in override_keys(overrides):
        target = Path(str(plan.hydra.sweep.dir if plan.multirun else plan.hydra.run.dir))
        if plan.multirun and search.resumable(target):  # an interrupted search goes on there
            return None, [], target
        world = distributed.world_from_env()
        if world is not None and world.size >= 2:  # the ranks of one world share the folder
            return None, [], None
        parents = missing_parents(target)  # before the folder (and they) are created
        return check_new_folder(key, target), parents, (target if plan.multirun else None)
    # Every rank of a torchrun/srun job runs this: they must share one folder.
    shared = ranks.shared_run_name()
    root = Path(OUTPUT_ROOT) / command / ("multirun" if plan.multirun else "")
    name = shared or datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    made_parents = missing_parents(root / name)
    folder = _run_folder(root / name, shared is not None)
    overrides.append(f"{key}={folder}")
    return (None if shared else folder), made_parents, (folder if plan.multirun else None)


def _show_sweep(command: str, args: Any) -> int:
    """``--cfg`` with ``-m`` (or a sweep a cluster preset makes): every job's config, checked
    like a launch; nothing runs."""
    try:
        plan = plan_launch(command, list(args.overrides), bool(args.multirun), args.config_dir)
        if plan.note:
            console.print(f"# note: {escape(plan.note)}", highlight=False, soft_wrap=True)
        show_jobs(command, plan, str(args.cfg), bool(args.resolve), args.config_dir)
    except (*USER_ERRORS, OSError) as error:
        message = missing_launcher(error, args.overrides) or fault_line(error)
        console.print(f"[red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
        return 2
    return 0


def launch(command: str, arguments: list[str]) -> int:
    """Run ``nys <command>`` with Hydra-style ``arguments``; returns the process exit code.

    SIGTERM raises :class:`Terminated` (a KeyboardInterrupt) wherever the run is, as Ctrl-C
    does: every phase unwinds, so temporary files go, worker processes are stopped, and the
    run ends with one line (exit 143; Ctrl-C 130)."""
    with sigterm_raises():
        try:
            return _launch(command, arguments)
        except KeyboardInterrupt as stop:  # before a run folder was claimed
            console.print(f"[red]error:[/] {stopped(stop)}; nothing was written", highlight=False)
            return stop_code(stop)


def _given_dir(overrides: list[str]) -> Path:
    """The run (or sweep) folder of the launch: the last hydra.run.dir/sweep.dir override
    (claim_run_folder adds one for the timestamped default)."""
    keys = ("hydra.run.dir", "hydra.sweep.dir")
    given = [override_value(o) for o in overrides if override_key(o) in keys and "=" in o]
    return Path(given[-1]) if given else Path(OUTPUT_ROOT)


@contextlib.contextmanager
def _hydra_reraises() -> Iterator[None]:
    """Hydra prints an exception from its own steps as a stripped traceback and exits 1,
    unless HYDRA_FULL_ERROR=1: then it re-raises, and a fault such as a full disk while it
    writes the run's config becomes our one line."""
    before = os.environ.get("HYDRA_FULL_ERROR")
    os.environ["HYDRA_FULL_ERROR"] = "1"
    try:
        yield
    finally:
        if before is None:
            del os.environ["HYDRA_FULL_ERROR"]
        else:
            os.environ["HYDRA_FULL_ERROR"] = before


def _launch(command: str, arguments: list[str]) -> int:
    parser = get_args_parser()
    parser.prog = f"nys {command}"

    def usage_error(message: str) -> NoReturn:  # argparse would print its usage block
        raise UserInputError(f"{message}; see nys {command.replace('_', '-')} --help")

    parser.error = usage_error  # type: ignore[method-assign]
    try:
        args = parser.parse_intermixed_args(arguments)
    except UserInputError as error:
        console.print(f"[red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
        return 2
    hydra.version.setbase("1.3")
    multirun = bool(args.multirun)
    inspecting = bool(
        args.cfg or args.info or args.help or args.hydra_help or args.shell_completion
    )
    if args.cfg and (multirun or _sweeps(args.overrides)):
        return _show_sweep(command, args)
    sweep_dir = None
    earlier: set[Path] = set()  # job folders a resumed search's sweep folder already held
    fresh = None  # the run folder this launch created: removed again if the run fails early
    made_parents: list[Path] = []  # the folders above it that this launch created
    if not inspecting:
        try:
            plan = plan_launch(command, list(args.overrides), multirun, args.config_dir)
            multirun = plan.multirun
            if plan.note:
                console.print(f"note: {escape(plan.note)}", highlight=False, soft_wrap=True)
            if plan.done:  # e.g. resume= names a finished run: nothing to run, no folder
                console.print(escape(plan.done), highlight=False, soft_wrap=True)
                return 0
            args.overrides = [*args.overrides, *plan.pins]  # Hydra composes the run with them
            fresh, made_parents, sweep_dir = claim_run_folder(command, args.overrides, plan)
            # A resumed search's sweep folder holds earlier jobs (one cut short): not this launch's.
            earlier = set(find_run_folders([sweep_dir])) if sweep_dir is not None else set()
        except (*USER_ERRORS, OSError) as error:
            message = missing_launcher(error, args.overrides) or parse_hint(
                fault_line(error), list(args.overrides)
            )
            console.print(f"[red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
            return 2
    try:
        with _hydra_reraises():
            _run_hydra(
                args=args,
                args_parser=parser,
                task_function=Task(command),
                config_path=CONF_SOURCE,
                config_name=command,
            )
    except OSError as error:
        # Hydra's own writes failed (the run's .hydra/ config on a full or read-only disk); the
        # job's faults became Abort in Task already.
        if fresh is not None and not multirun:
            discard_failed(fresh, made_parents)
        error = naming(error, _given_dir(args.overrides) / ".hydra")  # a write names no file
        console.print(
            f"[red]error:[/] {escape(describe_os_error(error))}", highlight=False, soft_wrap=True
        )
        return 2
    except (Abort, TrainingInterrupted) as abort:
        # An interrupted run keeps its folder: the message says how to resume it.
        if isinstance(abort, Abort) and fresh is not None and not multirun:
            discard_failed(fresh, made_parents)
        console.print(f"[red]error:[/] {escape(abort.message)}", highlight=False, soft_wrap=True)
        return abort.code
    except KeyboardInterrupt as stop:
        # Ctrl-C or SIGTERM outside the training loop (data preparation, bench, evaluation);
        # the loop itself raises TrainingInterrupted with its resume line.
        if fresh is not None and not multirun:
            discard_failed(fresh, made_parents)
        kept = fresh is not None and fresh.is_dir()
        where = f"; what it wrote is kept in {fresh}" if kept else "; no run folder is left"
        line = f"{stopped(stop)}{where}"
        console.print(f"[red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
        return stop_code(stop)
    except SystemExit as exit_:
        # Hydra reported a launcher failure (e.g. a submitit job killed by SIGKILL, OOM):
        # the jobs that did finish still get their summary, and the lost ones are listed.
        if sweep_dir is None:
            raise
        write_summary(sweep_dir)
        if exit_.code not in (None, 0):
            return sweep_outcome(sweep_dir, earlier) or 1
    return 0 if sweep_dir is None else sweep_outcome(sweep_dir, earlier)


def sweep_outcome(sweep_dir: Path, earlier: set[Path] = frozenset()) -> int:
    """1 with one line naming the failed jobs of this launch (those without results, of any
    launcher, also ones killed before they could write error.txt; ``earlier`` job folders
    were there before it), else 0."""
    jobs = [p for p in find_run_folders([sweep_dir]) if p not in earlier]
    failed = [p for p in jobs if not (p / RESULTS_FILE).exists()]
    if not failed:
        return 0
    console.print(
        f"[red]{len(failed)} job(s) failed[/]; see {escape(', '.join(map(str, failed)))}",
        highlight=False,
        soft_wrap=True,
    )
    return 1
