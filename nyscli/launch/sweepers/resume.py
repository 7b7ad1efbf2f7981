"""A grid sweep continued where it stopped.

The same ``-m`` command with ``hydra.sweep.dir=<sweep>`` (and ``--resume true`` for a training
command) continues the sweep in that folder: finished jobs are kept untouched, an interrupted
job resumes from its own checkpoint in its own folder, a failed one or one stopped before its
first checkpoint runs again there, and jobs never started run now, each under its old number.
The launcher checks all of it before anything runs (:func:`continuation`); the grid sweeper
then launches only what is left (:func:`launch_groups`), from the same job states.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from nyscli.errors import UserInputError
from nyscli.launch.progress import job_bar
from nyscli.launch.sweepers import search
from nyscli.output.runs import ERROR_FILE
from nyscli.overrides import as_override_value, override_key, override_value
from nyscli.train.checkpoint import CHECKPOINT_DIR, LAST
from nyscli.train.resume import RUN_CONTROL, is_finished, sweep_command

MULTIRUN_FILE = "multirun.yaml"  # Hydra writes it into every sweep folder it starts
LOCK_FILE = ".nys-sweep-lock"  # locked by the launch that runs the sweep (first or continued)
# What a continued sweep may change: how its jobs run, never what they compute.
HOW_TO_RUN = (*RUN_CONTROL, "cluster", "hydra")
NEW, DONE, RESUME, RERUN = "new", "done", "resume", "rerun"


@dataclass(frozen=True)
class Job:
    """One job of a sweep: its number, its overrides, what a continuation does with it and
    the folder an earlier launch ran it in (None if it never started)."""

    number: int
    overrides: tuple[str, ...]
    state: str = NEW
    folder: Path | None = None


def is_continued(folder: Path) -> bool:
    """True when ``folder`` holds a grid sweep that a launch started (an Optuna search's
    folder resumes its own way: :func:`nyscli.launch.sweepers.search.resumable`)."""
    return (Path(folder) / MULTIRUN_FILE).is_file() and not search.resumable(Path(folder))


def _what(overrides: list[str] | tuple[str, ...]) -> dict[str, str | None]:
    """What a job computes: its overrides by key, without the ones that say how it runs."""
    out = {}
    for override in overrides:
        key = override_key(override)
        if not any(key == k or key.startswith(f"{k}.") for k in HOW_TO_RUN):
            out[key] = override_value(override)
    return out


def _read_yaml(path: Path) -> object:
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # hydra.yaml is ~200 lines a job
    try:
        with open(path, encoding="utf-8") as handle:
            return yaml.load(handle, Loader=loader)  # noqa: S506 (a safe loader)
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as error:
        reason = getattr(error, "strerror", None) or type(error).__name__
        raise UserInputError(
            f"{path} cannot be read ({reason}); the sweep cannot be continued: give a new "
            "hydra.sweep.dir"
        ) from None


def _recorded(sweep_dir: Path) -> dict[int, tuple[Path, list[str]]]:
    """The jobs an earlier launch started in ``sweep_dir``: number -> (folder, overrides),
    from each job's ``.hydra/hydra.yaml`` (any ``hydra.sweep.subdir``)."""
    found: dict[int, tuple[Path, list[str]]] = {}
    paths = sorted(sweep_dir.rglob(".hydra/hydra.yaml"))
    bar = job_bar(len(paths), "read")  # ~0.7 ms a job: 100,000 jobs take over a minute
    with bar(f"reading {len(paths)} job folders of {sweep_dir}", len(paths)) as advance:
        for path in paths:
            found.update(_record(path))
            advance(1)
    return found


def _record(path: Path) -> dict[int, tuple[Path, list[str]]]:
    """{job number: (folder, overrides)} from one job's ``.hydra/hydra.yaml``."""
    node = _read_yaml(path)
    try:
        job = node["hydra"]  # type: ignore[index]
        number, overrides = int(job["job"]["num"]), [str(o) for o in job["overrides"]["task"]]
    except (KeyError, TypeError, ValueError):
        raise UserInputError(
            f"{path} holds no job number and overrides; the sweep cannot be continued: "
            "give a new hydra.sweep.dir"
        ) from None
    return {number: (path.parent.parent, overrides)}


def _state(folder: Path) -> str:
    if is_finished(folder):
        return DONE
    if (folder / CHECKPOINT_DIR / LAST).is_file():
        return RESUME
    return RERUN


def _shown(overrides: list[str] | tuple[str, ...]) -> str:
    return " ".join(f"{k}={v}" for k, v in _what(overrides).items()) or "(defaults)"


def _refuse_changed(sweep_dir: Path, command: str, overrides: list[str]) -> None:
    """One line when the sweep in ``sweep_dir`` is another command's, or started with other
    command-line values (``seed: 0,1,2 there, 0,1,3 here``)."""
    path = sweep_dir / MULTIRUN_FILE
    node = _read_yaml(path)
    try:
        hydra = node["hydra"]  # type: ignore[index]
        name, started = str(hydra["job"]["name"]), [str(o) for o in hydra["overrides"]["task"]]
    except (KeyError, TypeError):
        raise UserInputError(
            f"{path} names no command and overrides; the sweep cannot be continued: give a "
            "new hydra.sweep.dir"
        ) from None
    if name != command:
        raise UserInputError(
            f"hydra.sweep.dir={sweep_dir} holds a sweep of nys {name.replace('_', '-')}, not "
            f"of nys {command.replace('_', '-')}: give a new hydra.sweep.dir"
        )
    before, now = _what(started), _what(overrides)
    keys = [k for k in dict.fromkeys([*before, *now]) if before.get(k) != now.get(k)]
    changed = "; ".join(
        f"{k}: {before.get(k, '(not given)')} there, {now.get(k, '(not given)')} here" for k in keys
    )
    if changed:
        raise UserInputError(
            f"hydra.sweep.dir={sweep_dir} holds a sweep of other values ({changed}); a sweep "
            "continues with the values it started with: give them again, or a new "
            "hydra.sweep.dir"
        )


def job_states(sweep_dir: Path, jobs: list[list[str]]) -> list[Job]:
    """Every job of the sweep with what a continuation does with it; UserInputError when the
    jobs an earlier launch ran are not those ``jobs`` (the sweep's values changed)."""
    recorded = _recorded(sweep_dir)
    out = [Job(i, tuple(job)) for i, job in enumerate(jobs)]
    for number, (folder, ran) in sorted(recorded.items()):
        planned = jobs[number] if number < len(jobs) else None
        if planned is None or _what(ran) != _what(planned):
            now = _shown(planned) if planned is not None else "no such job"
            raise UserInputError(
                f"hydra.sweep.dir={sweep_dir} holds another sweep: its job {number} ran "
                f"'{_shown(ran)}', this command's job {number} is '{now}'; a sweep continues "
                "with the values it started with: give them again, or a new hydra.sweep.dir"
            )
        out[number] = Job(number, tuple(planned), _state(folder), folder)
    return out


@dataclass(frozen=True)
class Continuation:
    """What continuing a sweep does, decided before anything runs."""

    sweep_dir: Path
    jobs: tuple[Job, ...]

    @property
    def finished(self) -> list[Path]:
        return [j.folder for j in self.jobs if j.state == DONE and j.folder is not None]

    def note(self) -> str:
        """``continuing the sweep in S: 3 of 6 jobs finished (kept), ...``."""
        said = {RESUME: "resumed from its checkpoint", RERUN: "run again (it has no checkpoint)",
                NEW: "never started, run now"}  # fmt: skip
        parts = [f"{len(self.finished)} of {len(self.jobs)} jobs finished (kept)"]
        for state, what in said.items():
            numbers = [str(j.number) for j in self.jobs if j.state == state]
            if numbers:
                parts.append(f"{what}: job {', '.join(numbers)}")
        return f"continuing the sweep in {self.sweep_dir}: " + "; ".join(parts)

    def done(self) -> str | None:
        """The line to print instead of running, when every job has finished."""
        if len(self.finished) < len(self.jobs):
            return None
        return (
            f"every job of the sweep in {self.sweep_dir} has finished ({len(self.jobs)} of "
            f"{len(self.jobs)}); nothing to run"
        )


def continuation(
    sweep_dir: Path, command: str, overrides: list[str], jobs: list[list[str]], resume: object
) -> Continuation:
    """Check that the sweep in ``sweep_dir`` can be continued by this launch of ``command``
    (its command-line ``overrides``, its ``jobs`` and their ``resume`` value, None for a
    command without one): the same command and values, and ``--resume true`` where a job
    stopped at a checkpoint."""
    _refuse_changed(sweep_dir, command, overrides)
    states = job_states(sweep_dir, jobs)
    asked = str(resume).lower()
    if asked not in ("none", "false", "true"):
        raise UserInputError(
            f"resume={resume} cannot continue a sweep: give --resume true, and each "
            "interrupted job resumes from its own checkpoint"
        )
    stopped = [j for j in states if j.state == RESUME]
    if stopped and asked != "true":
        raise UserInputError(
            f"job {stopped[0].number} of the sweep in {sweep_dir} stopped at its checkpoint "
            f"({stopped[0].folder}); add --resume true to continue it from there, or give a "
            "new hydra.sweep.dir"
        )
    return Continuation(sweep_dir, tuple(states))


def resume_override(job: Job, has_resume: bool) -> list[str]:
    """The override a continued job gets: ``resume=<its folder>`` at a checkpoint, else
    ``resume=false`` (a job never started must not pick up another run); none for a
    command without ``resume``."""
    if not has_resume:
        return []
    value = as_override_value(str(job.folder)) if job.state == RESUME else "false"
    return [f"resume={value}"]


def launch_groups(
    sweep_dir: Path, states: list[Job], has_resume: bool, batch: int | None
) -> list[tuple[int, list[list[str]]]]:
    """The jobs left to run, as (first job number, overrides of each) groups of consecutive
    numbers (a launcher numbers a group's jobs from its first), at most ``batch`` a group
    (None or -1: no limit). A job that ran before runs in its own folder again, whatever
    ``hydra.sweep.subdir`` makes of the overrides it gets now, and loses its stale
    ``error.txt`` first."""
    groups: list[tuple[int, list[list[str]]]] = []
    size = None if batch in (None, -1) else batch
    previous = None
    for job in states:
        if job.state == DONE:
            continue
        if job.folder is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(job.folder / ERROR_FILE)
        overrides = [o for o in job.overrides if override_key(o) != "resume"]
        overrides += resume_override(job, has_resume)
        if job.folder is not None:
            subdir = as_override_value(str(job.folder.relative_to(sweep_dir)))
            overrides.append(f"hydra.sweep.subdir={subdir}")
        joins = previous == job.number - 1 and (size is None or len(groups[-1][1]) < size)
        if joins:
            groups[-1][1].append(overrides)
        else:
            groups.append((job.number, [overrides]))
        previous = job.number
    return groups


def again(sweep_dir: Path, hydra: object, trains: bool) -> str:
    """The command line that continues the sweep in ``sweep_dir`` (``hydra``: its composed
    node): with ``--resume true`` where its cut jobs resume from checkpoints, a grid of a
    command that ``trains``; a search reruns a cut trial instead."""
    return sweep_command(sweep_dir, training=trains and not search.is_search(hydra))


@contextlib.contextmanager
def held(sweep_dir: Path) -> Iterator[None]:
    """Hold the sweep for this launch: a launch that continues it while another runs it
    stops in one line (the two would run the same jobs twice). An OS lock: a launch that is
    killed releases it."""
    path = sweep_dir / LOCK_FILE
    with open(path, "a+") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserInputError(
                f"the sweep in {sweep_dir} is running in another launch (it holds {path}); "
                "wait for it to end, then continue it"
            ) from None
        yield
