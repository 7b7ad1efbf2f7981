"""Run a command through Hydra: overrides in, checked jobs, a claimed run folder, Hydra's own
runner, and one exit code out.

Each command turns its typed options into Hydra override strings, appends the free overrides
and hands everything to Hydra's own entry point (``_run_hydra``), so multirun, launcher plugins,
``--cfg``, ``.hydra/`` and callbacks behave exactly as in a ``@hydra.main`` script. Before
launching, every job's config is composed and validated (:mod:`nyscli.launch.plan`), so a typo
fails in one line with exit code 2 instead of deep inside a sweep.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import hydra
from hydra._internal.utils import _run_hydra, get_args_parser
from rich.markup import escape

from nyscli.console import console, say_error
from nyscli.errors import UserInputError, describe_os_error, naming
from nyscli.experiments import experiment_module
from nyscli.experiments.report.sweep_summary import write_summary
from nyscli.launch.compose import is_sweep
from nyscli.launch.faults import (
    USER_ERRORS,
    Abort,
    JobFailed,
    as_typed,
    fault_line,
    missing_launcher,
    refusal_line,
)
from nyscli.launch.folders import claim_run_folder, discard_failed
from nyscli.launch.plan import Plan, plan_launch, show_jobs
from nyscli.launch.sweepers import resume, search
from nyscli.launch.task import Task
from nyscli.output.runs import RESULTS_FILE, find_run_folders
from nyscli.overrides import override_key, override_value
from nyscli.paths import CONF_SOURCE, OUTPUT_ROOT, SWEEP_CACHE
from nyscli.stops import sigterm_raises, stop_code, stopped
from nyscli.train.errors import TrainingInterrupted


def _show_sweep(command: str, args: Any, typed: dict[str, str]) -> int:
    """``--cfg`` with ``-m`` (or a sweep a cluster preset makes): every job's config, checked
    like a launch; nothing runs."""
    try:
        plan = plan_launch(command, list(args.overrides), bool(args.multirun), args.config_dir)
        if plan.note:
            console.print(f"# note: {escape(plan.note)}", highlight=False, soft_wrap=True)
        show_jobs(command, plan, str(args.cfg), bool(args.resolve), args.config_dir)
    except (*USER_ERRORS, OSError) as error:
        message = missing_launcher(error, args.overrides) or fault_line(error)
        say_error(as_typed(message, typed))
        return 2
    return 0


def launch(command: str, arguments: list[str], typed: dict[str, str] | None = None) -> int:
    """Run ``nys <command>`` with Hydra-style ``arguments``; returns the process exit code.
    ``typed``: the overrides typed options became -> the options as typed, for refusals.

    SIGTERM raises :class:`Terminated` (a KeyboardInterrupt) wherever the run is, as Ctrl-C
    does: every phase unwinds, so temporary files go, worker processes are stopped, and the
    run ends with one line (exit 143; Ctrl-C 130)."""
    with sigterm_raises():
        try:
            return _launch(command, arguments, typed or {})
        except KeyboardInterrupt as stop:  # before a run folder was claimed
            say_error(f"{stopped(stop)}; nothing was written")
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


@contextlib.contextmanager
def _shared_work_removed(sweep_dir: Path | None) -> Iterator[None]:
    """A sweep's shared work (``<sweep>/.cache``, ~1.5 GB for approx-error at the defaults) is
    removed however the sweep ends: Hydra's end-of-sweep callback removes it, but a sweep
    stopped by Ctrl-C, SIGTERM or a failed job never reaches that callback."""
    try:
        yield
    finally:
        if sweep_dir is not None:
            shutil.rmtree(sweep_dir / SWEEP_CACHE, ignore_errors=True)


@dataclass
class _Claim:
    """What a launch holds when Hydra starts: its plan (None for --help, --info and --cfg, and
    when there is nothing to run) and the folders it created, which a failed start removes
    again (``_discarded_if_failed``)."""

    multirun: bool
    plan: Plan | None = None
    fresh: Path | None = None  # the run (or sweep) folder this launch created
    made_parents: list[Path] = field(default_factory=list)  # the folders above it it created
    sweep_dir: Path | None = None
    earlier: set[Path] = field(default_factory=set)  # job folders the sweep folder already held
    hold: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    holding: bool = False  # the sweep's lock is in ``hold`` already (a continued sweep)

    def held(self) -> contextlib.ExitStack:
        """A grid sweep is held while it runs, so no other launch continues it meanwhile (a
        search's study takes several workers by design); a continued sweep is held from
        before its note is printed (:func:`_hold_continued`)."""
        if self.holding or self.sweep_dir is None or self.plan is None:
            return self.hold
        if not search.is_search(self.plan.hydra):
            self.hold.enter_context(resume.held(self.sweep_dir))
        return self.hold


def _hold_continued(plan: Plan) -> contextlib.ExitStack:
    """The lock of the sweep that ``plan`` continues, taken before anything is said about it:
    of two identical continuations at once, the second says only that the first runs it."""
    hold = contextlib.ExitStack()
    if plan.continued is not None:
        hold.enter_context(resume.held(plan.continued.sweep_dir))
    return hold


def _launch(command: str, arguments: list[str], typed: dict[str, str]) -> int:
    parser = get_args_parser()
    parser.prog = f"nys {command}"

    def usage_error(message: str) -> NoReturn:  # argparse would print its usage block
        raise UserInputError(f"{message}; see nys {command.replace('_', '-')} --help")

    parser.error = usage_error  # type: ignore[method-assign]
    try:
        args = parser.parse_intermixed_args(arguments)
    except UserInputError as error:
        say_error(str(error))
        return 2
    hydra.version.setbase("1.3")
    if args.cfg and (args.multirun or is_sweep(args.overrides)):
        return _show_sweep(command, args, typed)
    claim = _Claim(bool(args.multirun))
    if not (args.cfg or args.info or args.help or args.hydra_help or args.shell_completion):
        try:
            claim = _plan_and_claim(command, args)
        except (*USER_ERRORS, OSError) as error:
            say_error(refusal_line(error, list(args.overrides), typed))
            return 2
        if claim.plan is None:  # e.g. resume= names a finished run: nothing to run, no folder
            return 0
    return _run(command, args, parser, claim)


def _plan_and_claim(command: str, args: Any) -> _Claim:
    """Every job composed and checked (``plan_launch``), then the run or sweep folder claimed;
    a claim without a plan when there is nothing to run."""
    plan = plan_launch(command, list(args.overrides), bool(args.multirun), args.config_dir)
    hold = _hold_continued(plan)
    try:
        if plan.note:
            console.print(f"note: {escape(plan.note)}", highlight=False, soft_wrap=True)
        if plan.done:
            console.print(escape(plan.done), highlight=False, soft_wrap=True)
            hold.close()
            return _Claim(plan.multirun)
        args.overrides = [*args.overrides, *plan.pins]  # Hydra composes the run with them
        fresh, made_parents, sweep_dir = claim_run_folder(command, args.overrides, plan)
    except BaseException:
        hold.close()
        raise
    # A resumed search's sweep folder holds earlier jobs (one cut short), a continued sweep's
    # its finished ones: not this launch's.
    earlier: set[Path] = set()
    if plan.continued is not None:
        earlier = set(plan.continued.finished)
    elif sweep_dir is not None:
        earlier = set(find_run_folders([sweep_dir]))
    holding = plan.continued is not None
    return _Claim(plan.multirun, plan, fresh, made_parents, sweep_dir, earlier, hold, holding)


def _discards(error: BaseException, claim: _Claim) -> bool:
    """Whether a launch that ended with ``error`` leaves its new folder to ``discard_failed``
    (which still keeps one that produced something): a single run's Hydra write, abort or
    interruption; a sweeper's refusal before its first job. A failed sweep job, a launcher's
    exit or a crash (error.txt holds its traceback) keep it."""
    if isinstance(error, OSError):
        return not claim.multirun
    if isinstance(error, JobFailed):
        return False
    if isinstance(error, USER_ERRORS):
        return claim.fresh is not None and not find_run_folders([claim.fresh])
    return isinstance(error, Abort | TrainingInterrupted | KeyboardInterrupt) and not claim.multirun


@contextlib.contextmanager
def _discarded_if_failed(claim: _Claim) -> Iterator[None]:
    """The one place a launch removes the folder it claimed (see ``_discards``), before the
    failure is reported."""
    try:
        yield
    except BaseException as error:
        if claim.fresh is not None and _discards(error, claim):
            discard_failed(claim.fresh, claim.made_parents)
        raise


def _run(command: str, args: Any, parser: Any, claim: _Claim) -> int:
    """Hydra's own runner on the claimed folder; how it ended as one line and an exit code."""
    sweep_dir, fresh = claim.sweep_dir, claim.fresh
    try:
        with (
            _discarded_if_failed(claim),
            claim.held(),
            _hydra_reraises(),
            _shared_work_removed(sweep_dir),
        ):
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
        error = naming(error, _given_dir(args.overrides) / ".hydra")  # a write names no file
        say_error(describe_os_error(error))
        return 2
    except JobFailed as failed:  # fail_fast: the first failed job stopped the sweep
        jobs = len(claim.plan.jobs) if claim.plan is not None else 0
        of = f" of {jobs}" if jobs else ""
        say_error(
            f"job {failed.job} failed: {failed.message} ({failed.folder}); fail_fast stopped "
            f"the sweep there (job {failed.job}{of}: no later job was started)"
        )
        return failed.code
    except USER_ERRORS as error:
        # A sweeper's refusal before its first job (a search whose study cannot be opened);
        # the jobs' own faults became Abort or a failed job in Task already.
        say_error(fault_line(error))
        return 2
    except (Abort, TrainingInterrupted) as abort:
        # An interrupted run keeps its folder when it produced something (metrics rows, a
        # checkpoint): the message says how to resume it. Stopped before its first step, it is
        # removed like any run that failed before it produced anything.
        message = abort.message
        removed = fresh is not None and not claim.multirun and not fresh.exists()
        if isinstance(abort, TrainingInterrupted) and removed:
            message += "; no run folder is left"
        say_error(message)
        return abort.code
    except KeyboardInterrupt as stop:
        # Ctrl-C or SIGTERM outside the training loop (data preparation, bench, evaluation);
        # the loop itself raises TrainingInterrupted with its resume line.
        say_error(_stopped_line(command, stop, claim))
        return stop_code(stop)
    except SystemExit as exit_:
        # Hydra reported a launcher failure (e.g. a submitit job killed by SIGKILL, OOM):
        # the jobs that did finish still get their summary, and the lost ones are listed.
        if sweep_dir is None:
            raise
        write_summary(sweep_dir)
        if exit_.code not in (None, 0):
            return sweep_outcome(sweep_dir, claim.earlier) or 1
    return 0 if sweep_dir is None else sweep_outcome(sweep_dir, claim.earlier)


def _stopped_line(command: str, stop: KeyboardInterrupt, claim: _Claim) -> str:
    """What a stop left: the run folder kept or gone, or how the sweep continues."""
    kept = claim.fresh is not None and claim.fresh.is_dir()
    where = f"; what it wrote is kept in {claim.fresh}" if kept else "; no run folder is left"
    if claim.sweep_dir is not None:  # a sweep goes on where it stopped
        assert claim.plan is not None  # a sweep folder is claimed from the plan
        trains = hasattr(experiment_module(command), "resume_pins")
        again = resume.again(claim.sweep_dir, claim.plan.hydra, trains)
        where = f"; the sweep continues with: {again}"
    return f"{stopped(stop)}{where}"


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
