"""Run folders: claimed before Hydra runs (never reused, never written into twice), and removed
again when a run failed before it produced anything."""

from __future__ import annotations

import errno
import itertools
import os
import shutil
from datetime import datetime
from pathlib import Path

from nyscli import ranks
from nyscli.errors import UserInputError
from nyscli.launch.plan import Plan
from nyscli.launch.sweepers import resume, search
from nyscli.output.runs import ERROR_FILE, RESULTS_FILE
from nyscli.overrides import override_keys
from nyscli.paths import OUTPUT_ROOT
from nyscli.train import distributed
from nyscli.train.metrics import METRICS_FILE
from nyscli.train.resume import RESUMED_FROM_FILE, TRAINING_FILE

ENV_FILE = "env.json"
# What every run folder holds from its first second; a failed run with nothing else is removed.
# Created exclusively (O_EXCL) in a folder given as hydra.run.dir / hydra.sweep.dir: of several
# launches into one folder, at the same instant or later, exactly one gets it.
CLAIM_FILE = ".nys-claim"
BOOKKEEPING = (
    ".hydra",
    ENV_FILE,
    ERROR_FILE,
    CLAIM_FILE,
    RESUMED_FROM_FILE,
    TRAINING_FILE,
    resume.LOCK_FILE,
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


def _header_only(path: Path) -> bool:
    """A metrics.csv with its header and no row: a training run stopped before its first
    logged step, which produced nothing."""
    if path.name != METRICS_FILE or not path.is_file():
        return False
    try:
        with path.open("rb") as handle:
            return len(handle.read(1 << 16).splitlines()) <= 1
    except OSError:
        return False


def discard_failed(folder: Path, made_parents: list[Path]) -> None:
    """Remove a run folder that failed before it produced anything but bookkeeping (config,
    env.json, error.txt, the log): an error-only folder is no run. Anything else (metrics,
    checkpoints) keeps the folder, marked failed by its error.txt. The parents this launch
    created (``made_parents``, deepest first) go with it while they are empty, so a refused
    run leaves no ``outputs/`` behind."""
    if not folder.is_dir():
        return
    keep = [
        p
        for p in folder.iterdir()
        if p.name not in BOOKKEEPING and p.suffix != ".log" and not _header_only(p)
    ]
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
        # An interrupted search, or an earlier grid sweep checked by the plan, goes on there.
        if plan.multirun and (search.resumable(target) or plan.continued is not None):
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
