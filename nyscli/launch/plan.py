"""Plan and check a launch's jobs before anything runs: every job's config composed as it will
run and validated, so a typo fails in one line with exit code 2 instead of deep inside a
sweep."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra._internal.hydra import Hydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import IntervalSweep, RangeSweep, ValueType
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from nyscli import tracking
from nyscli.console import console
from nyscli.errors import UserInputError
from nyscli.experiments import experiment_module
from nyscli.launch.compose import (
    compose_job,
    composer,
    composition_refused,
    is_sweep,
    job_config,
    refuse_before_composing,
    task_overrides,
)
from nyscli.launch.progress import job_bar
from nyscli.launch.sweepers import resume, search
from nyscli.launch.sweepers.grid import grid_arguments, per_attention
from nyscli.overrides import override_key, override_keys
from nyscli.train.resume import pin_overrides


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


@dataclass(frozen=True)
class Plan:
    """What a launch will do, decided before any folder exists."""

    multirun: bool
    hydra: DictConfig  # the composed hydra node: mode, run and sweep dirs
    done: str | None = None  # a line saying there is nothing to run (resume= a finished run)
    jobs: tuple[tuple[str, ...], ...] = ()  # a sweep's jobs (overrides each), as they will run
    note: str | None = None  # what the launch changed (sweep options dropped, settings kept)
    pins: tuple[str, ...] = ()  # overrides added to the command line (resume= keeps settings,
    # a bench sweep over attentions times them alone)
    continued: resume.Continuation | None = None  # hydra.sweep.dir= names an earlier sweep


# The jobs this process has validated, by their composed config: a job run in this process
# (the local launcher) is not validated again; one run elsewhere (joblib, submitit, SLURM, a
# search's trials, which only exist once the search runs) is, in its own process.
_VALIDATED: set[str] = set()


def _fingerprint(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=False)


def validated(cfg: DictConfig) -> bool:
    """Whether this process validated a job of exactly this config before it started."""
    return _fingerprint(cfg) in _VALIDATED


def _check_job(module: ModuleType, command: str, cfg: DictConfig, overrides: list[str]) -> None:
    """Validate one job's composed config as the run will see it (HydraConfig set to it, so
    ``validate`` sees the overrides and group choices); its hydra node is dropped."""
    module.validate(job_config(cfg, command, overrides))
    tracking.check(cfg.get("logger"))
    _VALIDATED.add(_fingerprint(cfg))


class JobComposer:
    """A sweep's jobs composed for checking, fast: Hydra composes (reads every YAML file) once
    per distinct set of config-group choices (``attention=...``, ``+experiment=...``, any
    ``+``/``~`` override); a job's plain ``key=value`` overrides are then applied to a copy by
    Hydra's own override step, as its composition applies them last (timings:
    docs/results/launcher.md)."""

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
            self.bases[groups] = compose_job(self.composing, self.command, list(groups))
        cfg = copy.deepcopy(self.bases[groups])
        ConfigLoaderImpl._apply_overrides_to_config(plain, cfg)
        with open_dict(cfg):
            cfg.hydra.overrides.task = list(job)
        return cfg


def _no_values(sweep: Any, in_search: bool) -> str | None:
    """Why a sweep value cannot be swept, or None: a range that holds no value (Hydra would
    launch 0 jobs and exit 0) or steps by 0; in a search, an interval whose bounds are
    reversed or, on a log scale, not above 0 (Optuna refuses it in a traceback)."""
    if isinstance(sweep, RangeSweep):
        start, stop, step = sweep.start, sweep.stop, sweep.step
        if step == 0:
            return "its step is 0; give a step above 0 to count up or below 0 to count down"
        if (step > 0 and start >= stop) or (step < 0 and start <= stop):
            if step > 0:
                counts, instead = f"up from {start} while below {stop}", f"range({stop}, {start})"
            else:
                counts = f"down from {start} while above {stop}"
                instead = f"range({start}, {stop}, step={-step})"
            return f"it holds no value (it counts {counts}), so nothing would run; give {instead}"
        return None
    if not (in_search and isinstance(sweep, IntervalSweep)):
        return None
    if sweep.start > sweep.end:
        return (
            f"its lower bound {sweep.start} is above its upper bound {sweep.end}; give "
            f"interval({sweep.end}, {sweep.start})"
        )
    if "log" in sweep.tags and sweep.start <= 0:
        return f"a log-scale interval needs a lower bound above 0, not {sweep.start}"
    return None


def _refuse_unsweepable(node: DictConfig, overrides: list[str]) -> None:
    """One line, before any folder exists, for a sweep value that cannot be swept
    (:func:`_no_values`): in the command line's overrides or the preset's
    ``hydra.sweeper.params`` (a search's space, ``experiment=table3_cpu``'s grid)."""
    sweeper = node.get("sweeper")
    params = (sweeper.get("params") if sweeper is not None else None) or {}
    lines = [*(f"{k}={v}" for k, v in params.items()), *task_overrides(overrides)]
    in_search = search.is_search(node)
    for override in OverridesParser.create().parse_overrides(lines):
        problem = _no_values(override.value(), in_search) if override.is_sweep_override() else None
        if problem:
            raise UserInputError(f"{override.input_line} is not allowed: {problem}")


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
        today = compose_job(composing, command, task_overrides(job))
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
    refuse_before_composing(command, overrides)
    module = experiment_module(command)
    with (
        composer(command, config_dir) as composing,
        composition_refused(composing, command, overrides),
    ):
        return _plan(module, composing, command, overrides, multirun)


def _plan(
    module: ModuleType, composing: Hydra, command: str, overrides: list[str], multirun: bool
) -> Plan:
    if not multirun and not is_sweep(overrides):
        cfg = compose_job(composing, command, overrides)
        node = cfg.hydra
        if node.mode != RunMode.MULTIRUN:  # else a cluster preset makes it a sweep
            _check_job(module, command, cfg, overrides)
            pins, note = _resume_pins(module, composing, command, cfg, overrides)
            if pins:  # the run composed as it will run, with the settings it keeps
                cfg = compose_job(composing, command, [*overrides, *pins])
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
    if not multirun:  # Hydra would read the comma list as a value and fail on its type
        swept = next(o for o in OverridesParser.create().parse_overrides(overrides)
                     if o.is_sweep_override())  # fmt: skip
        raise UserInputError(
            f"{swept.input_line} is a sweep: add -m to run one job per value "
            "(a list value is written key=[a,b])"
        )
    search.check_sweeper(node)  # hparams_search=: its settings, optuna installed
    _refuse_unsweepable(node, overrides)  # seed=range(5,0): no job; a reversed interval
    # A command may add overrides to every job of a sweep (bench: attention_set=none).
    pins_of = getattr(module, "sweep_pins", None)
    pins, pinned = pins_of(task_overrides(overrides)) if pins_of else ((), None)
    overrides = [*overrides, *pins]

    def attention_keys(job: list[str]) -> set[str]:
        found = compose_job(composing, command, job).get("attention")
        return set(found.keys()) if found is not None else set()

    grid = grid_arguments(node, task_overrides(overrides))  # + hydra.sweeper.params
    split = per_attention(job_overrides(grid, multirun), attention_keys)
    # Each job is composed as it will run: a bar for big sweeps.
    bar = job_bar(len(split.jobs))
    cached = JobComposer(composing, command)
    with bar(f"checking {len(split.jobs)} jobs", len(split.jobs)) as advance:
        for job in split.jobs:
            _check_job(module, command, cached.compose(job), job)
            advance(1)
    continued = _continued(module, cached, node, overrides, split.jobs)
    said = continued.note() if continued and not continued.done() else None
    note = "; ".join(n for n in (pinned, split.note, said) if n)
    return Plan(multirun, node, continued.done() if continued else None,
                tuple(tuple(j) for j in split.jobs), note or None, pins, continued)  # fmt: skip


def _continued(
    module: ModuleType, cached: JobComposer, node: DictConfig, overrides: list[str],
    jobs: list[list[str]],
) -> resume.Continuation | None:  # fmt: skip
    """``hydra.sweep.dir=`` an earlier grid sweep: what continuing it does, checked (each job
    resumed at its checkpoint compared with the settings it recorded, as ``resume=`` is)."""
    sweep_dir = Path(str(node.sweep.dir))
    if "hydra.sweep.dir" not in override_keys(overrides) or not resume.is_continued(sweep_dir):
        return None
    first = cached.compose(jobs[0]) if jobs else OmegaConf.create()
    given = task_overrides(overrides)
    found = resume.continuation(sweep_dir, str(node.job.name), given, jobs, first.get("resume"))
    check = getattr(module, "preflight", None)
    for job in found.jobs:
        if job.state == resume.RESUME and check is not None:
            given = [o for o in job.overrides if override_key(o) != "resume"]
            cfg = cached.compose([*given, *resume.resume_override(job, True)])
            with open_dict(cfg):
                del cfg["hydra"]
            check(cfg)
    return found


def show_jobs(command: str, plan: Plan, what: str, resolve: bool, config_dir: str | None) -> None:
    """``--cfg job|hydra|all`` with ``-m``: each job's config as the sweep will run it (Hydra
    itself refuses the pair), after a ``# job i: overrides`` line."""
    with composer(command, config_dir) as composing:
        for index, job in enumerate(plan.jobs):
            cfg = compose_job(composing, command, list(job))
            if what == "job":
                with open_dict(cfg):
                    del cfg["hydra"]
            elif what == "hydra":
                cfg = cfg.hydra
            console.print(f"# job {index}: {' '.join(job) or '(defaults)'}", highlight=False)
            console.out(OmegaConf.to_yaml(cfg, resolve=resolve), highlight=False)
