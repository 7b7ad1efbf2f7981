"""What ``resume=...`` means: which run to continue, and whether it is the same run.

A resumed run must train with exactly the settings it records. Its composed config is
compared, key by key, with the config the earlier run saved (``.hydra/config.yaml``); only
the keys in :data:`RUN_CONTROL` (how to run, not what to train) may differ. A difference is
refused with one line naming the keys, unless ``resume_changes=allow``: then the new values
are used (the trainer re-applies lr, betas, eps, weight decay, schedule and seed over the
checkpoint's) and every change is recorded, old and new value, in ``results.csv``.
``resume=true`` continues the newest *unfinished* run with identical settings that no later
run has continued already (a resumed run names its origin in :data:`RESUMED_FROM_FILE`); when
every such run has finished there is nothing to do. Either form claims the run it continues
(:func:`claim_continuation`), so a run is continued once, and not while it still trains
(:func:`hold_training`).
"""

from __future__ import annotations

import contextlib
import csv
import fcntl
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from nyscli.errors import UserInputError
from nyscli.files import write_text
from nyscli.output.runs import RESULTS_FILE
from nyscli.overrides import as_override_value, override_key
from nyscli.train.checkpoint import CHECKPOINT_DIR, LAST, check_complete, saved_architecture
from nyscli.train.errors import CheckpointError

RESUME_CHANGES = ("refuse", "allow")
RESUMED_FROM_FILE = "resumed_from.txt"  # in a resumed run: the folder of the run it continues
# In a run being continued (resume=true or resume=<run>): the folder of the run continuing it,
# locked by that launch while it runs (:func:`claim_continuation`).
CONTINUED_FILE = ".nys-continued"
# In every training run's folder: locked by its launch while it trains (:func:`hold_training`),
# so the run is not continued while it still trains (that would fork it too).
TRAINING_FILE = ".nys-training"
# Keys that say how to run, not what to train: they may differ between a run and its resume.
RUN_CONTROL = (
    "resume",
    "resume_changes",
    "threads",
    "device",
    "data_cache",
    "trainer.progress",
    "trainer.compile",  # how the same forward runs, not what it computes
    "trainer.stop_at_step",
    "trainer.stop_after_minutes",
    "trainer.log_every",
    "trainer.eval_batch_size",
    "logger",  # where the rows are also logged (TensorBoard, MLflow), not what is trained
    "optimized_metric",
)


# Keys that shape the weights (or the token ids they were trained on): a checkpoint cannot
# continue under another value, whatever resume_changes says, so they are refused before any
# data is loaded (they used to fail at the checkpoint load, after it).
ARCHITECTURE = ("model.", "attention.", "tokenizer.", "task.max_len", "init")
NOT_ARCHITECTURE = ("model.dropout",)  # no weight depends on it


def shapes_weights(key: str) -> bool:
    """True when ``key`` (dotted) is one of :data:`ARCHITECTURE`."""
    if key in NOT_ARCHITECTURE:
        return False
    return any(key == a or (a.endswith(".") and key.startswith(a)) for a in ARCHITECTURE)


@dataclass(frozen=True)
class Change:
    """One setting that differs between the checkpoint's run (``old``) and this one (``new``)."""

    key: str
    old: Any
    new: Any

    def __str__(self) -> str:
        return f"{self.key} ({self.old} -> {self.new})"


@dataclass(frozen=True)
class ResumePlan:
    """The ``last.pt`` to continue (None: start fresh), the allowed changes, and whether the
    run named by ``resume=`` already finished (then there is nothing to train)."""

    checkpoint: Path | None = None
    changes: tuple[Change, ...] = ()
    finished: bool = False

    @property
    def run(self) -> Path | None:
        return None if self.checkpoint is None else self.checkpoint.parent.parent

    def nothing_to_do(self) -> str | None:
        """The one line to print instead of starting a run, or None."""
        if not self.finished:
            return None
        return f"resume: the run {self.run} already finished (results.csv); nothing to do"

    def changes_text(self) -> str | None:
        """``key (old -> new); ...`` for results.csv, None without changes."""
        return "; ".join(map(str, self.changes)) or None


def _flat(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix: node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(_flat(value, f"{prefix}{key}." if isinstance(value, dict) else f"{prefix}{key}"))
    return out


def settings(cfg: DictConfig) -> dict[str, Any]:
    """Every resolved config value by dotted key, without the :data:`RUN_CONTROL` keys."""
    values = _flat(OmegaConf.to_container(cfg, resolve=True))
    return {
        k: v
        for k, v in values.items()
        if not any(k == c or k.startswith(f"{c}.") for c in RUN_CONTROL)
    }


def setup_changes(old: DictConfig, new: DictConfig) -> list[Change]:
    """The settings of ``new`` that differ from (or are missing in) ``old``, sorted by key."""
    before, after = settings(old), settings(new)
    missing = "(unset)"
    return [
        Change(k, before.get(k, missing), after.get(k, missing))
        for k in sorted(set(before) | set(after))
        if before.get(k, missing) != after.get(k, missing)
    ]


def architecture(cfg: DictConfig) -> dict[str, Any]:
    """The settings that shape the weights (:data:`ARCHITECTURE`): each checkpoint records
    them, so a resume finds a checkpoint that does not fit before it loads any data."""
    return {k: v for k, v in settings(cfg).items() if shapes_weights(k)}


def check_checkpoint(checkpoint: Path, cfg: DictConfig) -> None:
    """One line (CheckpointError) when ``checkpoint`` is truncated, or its weights were shaped
    by other settings than ``cfg``'s (a last.pt copied from another run, say)."""
    check_complete(checkpoint)
    saved = saved_architecture(checkpoint)
    if saved is None:  # recorded since 2026-11-28; an older checkpoint is checked as it loads
        return
    now = architecture(cfg)
    # Keys in both: a key renamed since the checkpoint was written is no difference.
    differ = [f"{k} ({saved[k]} there, {now[k]} here)" for k in sorted(set(saved) & set(now))
              if saved[k] != now[k]]  # fmt: skip
    if differ:
        raise CheckpointError(
            f"checkpoint {checkpoint} does not fit this model: its weights were shaped by "
            f"other settings: {', '.join(differ[:4])}{' ...' if len(differ) > 4 else ''}; "
            "resume from a checkpoint of this run's settings"
        )


def is_finished(run: Path) -> bool:
    """True when the run wrote ``results.csv`` and every row's ``status`` is ``ok``."""
    path = Path(run) / RESULTS_FILE
    if not path.is_file():
        return False
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    return bool(rows) and all(row.get("status", "ok") == "ok" for row in rows)


def saved_config(run: Path) -> DictConfig | None:
    """The config a run folder recorded (``.hydra/config.yaml``), None if it has none;
    CheckpointError (one line naming the file) if it cannot be read."""
    path = run / ".hydra" / "config.yaml"
    if not path.is_file():
        return None
    try:
        return OmegaConf.load(path)  # type: ignore[return-value]
    except Exception as error:  # YAML errors, a directory, unreadable bytes
        mark = getattr(error, "problem_mark", None)  # a YAML error: what and where
        reason = getattr(error, "problem", None) or (str(error).splitlines() or [""])[0]
        reason = f"{reason} at line {mark.line + 1}" if mark is not None else reason
        raise CheckpointError(
            f"{path} cannot be read ({reason}); give a run folder that nys wrote"
        ) from None


def _last_checkpoint(run: Path) -> Path | None:
    path = run / CHECKPOINT_DIR / LAST
    return path if path.is_file() else None


def _checkpoint_named(resume: Any) -> Path | None:
    """The last.pt that ``resume=<run folder or last.pt>`` names, or None."""
    path = Path(str(resume)).expanduser()
    return path if path.is_file() else (_last_checkpoint(path) if path.is_dir() else None)


def _off(resume: Any) -> bool:
    return resume is None or resume is False or str(resume).lower() in ("false", "none", "null")


def plan_resume(
    cfg: DictConfig,
    runs_root: Path,
    current_run: Path | None = None,
    upgrade: Callable[[DictConfig], DictConfig] = lambda saved: saved,
) -> ResumePlan:
    """What ``cfg.resume`` asks for (UserInputError/CheckpointError when it cannot be done).

    ``upgrade`` reads a saved config in today's key names (a run from before a rename).

    ``resume=true``: of the run folders under ``runs_root`` (other than ``current_run``) whose
    settings are identical and that no run has continued yet, the newest unfinished one (by
    ``last.pt`` time); if all of them finished, the newest, with ``finished`` set.
    ``resume=<run folder or last.pt>``: that run, after comparing its saved settings.
    """
    resume = cfg.get("resume")
    if _off(resume):
        return ResumePlan()
    allow = cfg.get("resume_changes", "refuse")
    if allow not in RESUME_CHANGES:
        raise UserInputError(
            f"resume_changes={allow} is not allowed; choose one of: {', '.join(RESUME_CHANGES)}"
        )
    here = Path(current_run).resolve() if current_run is not None else None
    if resume is True or str(resume).lower() == "true":
        return _newest_identical(cfg, Path(runs_root), here, upgrade)
    checkpoint = _checkpoint_named(resume)
    if checkpoint is None:
        raise CheckpointError(
            f"resume={resume} is not a run folder with {CHECKPOINT_DIR}/{LAST}; "
            "give a run folder of an earlier run, true (newest matching run) or false"
        )
    run = checkpoint.parent.parent
    saved = saved_config(run)
    if saved is None:
        raise CheckpointError(
            f"resume={resume}: {run}/.hydra/config.yaml is missing, so the settings it ran "
            "with are unknown; give a run folder that nys wrote"
        )
    try:
        changes = setup_changes(upgrade(saved), cfg)
    except Exception as error:  # an old config that no longer resolves
        raise CheckpointError(
            f"resume={resume}: its saved config does not resolve ({error})"
        ) from None
    shaped = [str(c) for c in changes if shapes_weights(c.key)]
    if shaped and allow == "allow":
        raise UserInputError(
            f"resume={resume}: {', '.join(shaped)} would change the model its checkpoint "
            "holds; resume_changes=allow changes training settings only: start a new run "
            "(init= takes a run's weights where the command has it)"
        )
    if changes and allow != "allow":
        raise UserInputError(
            f"resume={resume}: these settings differ from that run's: "
            f"{', '.join(map(str, changes))}; drop those overrides, or add resume_changes=allow "
            "to resume with them (both values are recorded)"
        )
    finished = is_finished(run)
    if not finished:
        check_checkpoint(checkpoint, cfg)  # a truncated or foreign file: one line now, not
        # after the data
        refuse_claimed(resume, run, here)  # continued by another launch: one line, no folder
    return ResumePlan(checkpoint, tuple(changes), finished)


def named_run(resume: Any) -> Path | None:
    """The run folder ``resume=<run folder or last.pt>`` names, when it holds a saved config;
    None for ``true``/off or a path that is not such a run (:func:`plan_resume` says why)."""
    if _off(resume) or str(resume).lower() == "true":
        return None
    checkpoint = _checkpoint_named(resume)
    if checkpoint is None:
        return None
    run = checkpoint.parent.parent
    return run if (run / ".hydra" / "config.yaml").is_file() else None


def recorded_overrides(run: Path) -> list[str]:
    """The command-line overrides a run folder recorded (``.hydra/overrides.yaml``)."""
    path = run / ".hydra" / "overrides.yaml"
    return [str(o) for o in OmegaConf.load(path)] if path.is_file() else []


def default_pins(
    saved: DictConfig, today: DictConfig, current: DictConfig, given: set[str]
) -> list[Change]:
    """The settings whose default changed since a run was recorded, for ``resume=`` to keep.

    ``saved``: the run's recorded config; ``today``: the config its recorded overrides compose
    to now; ``current``: this launch's config; ``given``: the dotted keys (or groups) this
    command line sets. A setting is kept at its recorded value when it is a scalar present
    then and now, differs between ``saved`` and ``today`` (a default moved) and this launch
    neither sets it nor gets another value for it (so a recipe or group choice made now is
    not undone). A changed list, or a key added or removed since, stays a difference for
    :func:`plan_resume` to refuse."""
    scalar = (str, int, float, bool, type(None))
    now = settings(current)
    keys = set(settings(saved)) & set(settings(today))
    return [
        c
        for c in setup_changes(saved, today)
        if c.key in keys
        and isinstance(c.old, scalar)
        and isinstance(c.new, scalar)
        and now.get(c.key) == c.new
        and not any(c.key == g or c.key.startswith(f"{g}.") for g in given)
    ]


def pin_overrides(pins: list[Change]) -> list[str]:
    """``key=<recorded value>`` overrides for :func:`default_pins`."""
    return [f"{c.key}={as_override_value(c.old)}" for c in pins]


def _newest_identical(
    cfg: DictConfig,
    runs_root: Path,
    here: Path | None,
    upgrade: Callable[[DictConfig], DictConfig],
) -> ResumePlan:
    candidates = []
    continued = _continued_runs(runs_root)
    for config in runs_root.rglob(".hydra/config.yaml"):
        run = config.parent.parent
        last = _last_checkpoint(run)
        if last is None or run.resolve() == here or run.resolve() in continued:
            continue
        try:
            same = not setup_changes(upgrade(OmegaConf.load(config)), cfg)  # type: ignore[arg-type]
        except Exception:  # an old config that no longer resolves is simply not a match
            continue
        if same:
            candidates.append((last.stat().st_mtime, str(last), last))
    if not candidates:
        raise CheckpointError(
            f"resume=true found no run with {CHECKPOINT_DIR}/{LAST} and exactly these settings "
            f"under {runs_root}; give resume=<run folder> (resume_changes=allow to change "
            "settings)"
        )
    unfinished = [c for c in candidates if not is_finished(c[2].parent.parent)]
    last = max(unfinished or candidates)[2]
    if unfinished:
        refuse_claimed("true", last.parent.parent, here)  # refused before any folder
        check_checkpoint(last, cfg)
    return ResumePlan(last, (), not unfinished)


def _continued_runs(runs_root: Path) -> set[Path]:
    """The run folders under ``runs_root`` that a later run has resumed and checkpointed
    (their own last.pt is behind that one's: continuing them again would fork the run)."""
    found = set()
    for marker in runs_root.rglob(RESUMED_FROM_FILE):
        if _last_checkpoint(marker.parent) is None:  # stopped before its first save
            continue
        with contextlib.suppress(OSError, UnicodeDecodeError):
            found.add(Path(marker.read_text().strip()).resolve())
    return found


def _claim_of(run: Path) -> tuple[Path | None, bool]:
    """(the folder named by ``run``'s claim, :data:`CONTINUED_FILE`; whether a live process
    holds the claim's lock now). (None, False) without a readable claim."""
    try:
        with open(run / CONTINUED_FILE, "rb") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released as it closes
            except BlockingIOError:
                live = True
            else:
                live = False
            return _path_in(handle.read(4096)), live
    except OSError:  # no claim, or one that cannot be read
        return None, False


def _path_in(content: bytes) -> Path | None:
    """The folder a claim's bytes name, or None (empty, or not text)."""
    try:
        text = content.decode().strip()
    except UnicodeDecodeError:
        return None
    return Path(text) if text else None


def _continuing(run: Path) -> tuple[Path, bool] | None:
    """(the run folder that continues ``run``, whether its launch is running now), or None.

    A claim counts while its launch runs (it holds the claim's lock; the OS releases it when
    that process ends, also by ``kill -9``) and afterwards when its holder saved a checkpoint
    (the run's later steps live there). A holder that ended before its first checkpoint
    (killed, or its folder removed as empty) does not count: the run can be continued again.
    """
    holder, live = _claim_of(run)
    if holder is None:
        return None
    if live:
        return holder, True
    return (holder, False) if _last_checkpoint(holder) is not None else None


def _claimed(resume: Any, run: Path, holder: Path, live: bool) -> UserInputError:
    if live:
        return UserInputError(
            f"resume={resume}: the run {run} is already being continued by {holder} (its "
            "launch is running); a run is continued once (two continuations would fork it): "
            "wait for that launch to end, then give this command again"
        )
    return UserInputError(
        f"resume={resume}: the run {run} was continued by {holder} already (its checkpoints "
        f"hold the run's later steps); a run is continued once: go on from there with "
        f"resume={holder}"
    )


def _still_training(run: Path) -> bool:
    """Whether another live launch holds ``run``'s :data:`TRAINING_FILE` lock (it trains now;
    this process's own lock, of a run it trained before, does not count)."""
    if run.resolve() in _TRAINING:
        return False
    try:
        with open(run / TRAINING_FILE, "rb") as handle:
            fcntl.flock(handle, fcntl.LOCK_SH | fcntl.LOCK_NB)  # released as it closes
    except BlockingIOError:
        return True
    except OSError:  # no lock file: a run of an older nys, or one that never trained
        pass
    return False


def _training(resume: Any, run: Path) -> UserInputError:
    return UserInputError(
        f"resume={resume}: the run {run} is still training (its launch is running); a run "
        "is continued once it has stopped (two launches would fork it): wait for it to end "
        "or stop it (Ctrl-C keeps its checkpoint), then give this command again"
    )


def refuse_claimed(resume: Any, run: Path, here: Path | None = None) -> None:
    """One line (UserInputError) when ``run`` still trains, or is being (or has been)
    continued by a run other than ``here``: a run is continued once, by ``resume=true`` or
    ``resume=<run>`` alike, and only once it has stopped."""
    if run.resolve() != here and _still_training(run):
        raise _training(resume, run)
    found = _continuing(run)
    if found is not None and found[0].resolve() != here:
        raise _claimed(resume, run, *found)


# The claims this process holds, by the run folder continuing, and the training locks of the
# runs it trains: their files stay open (and locked) until :func:`release_run_locks` or the
# process's end.
_HELD: dict[Path, int] = {}
_TRAINING: dict[Path, int] = {}


def hold_training(run_dir: Path, resume: Any = None) -> None:
    """Lock ``run_dir``'s :data:`TRAINING_FILE` while this process trains it, so that no
    launch continues it meanwhile (:func:`refuse_claimed`). A folder another live launch
    trains (a sweep's job resumed in its own folder twice at once) is refused in one line."""
    here = Path(run_dir).resolve()
    if here in _TRAINING:
        return
    here.mkdir(parents=True, exist_ok=True)  # a launch made it; a caller of run() may not have
    fd = os.open(here / TRAINING_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise _training(resume, Path(run_dir)) from None
    except OSError:  # a file system without locks (some network mounts): train unguarded
        os.close(fd)
        return
    _TRAINING[here] = fd


CLAIM_TRIES = 10  # a probe of the claim (another launch's check) holds its lock for a moment


def claim_continuation(run_dir: Path, checkpoint: Path, resume: Any = True) -> None:
    """Claim the continuation of ``checkpoint``'s run for ``run_dir`` while this process runs
    it: an exclusive lock on the run's :data:`CONTINUED_FILE`, which names ``run_dir``. Of two
    launches that continue one run at once, by ``resume=true`` or ``resume=<run>``, exactly one
    continues it and the other stops with one line. A claim whose launch ended before its
    first checkpoint is taken over; nothing when the run is ``run_dir``'s own (a continued
    sweep's job resumes in its own folder)."""
    run = checkpoint.parent.parent.resolve()
    here = Path(run_dir).resolve()
    if run == here or here in _HELD:
        return
    if _still_training(run):  # it started training again since the launch checked it
        raise _training(resume, run)
    fd = os.open(run / CONTINUED_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        for attempt in range(CLAIM_TRIES):
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if attempt == CLAIM_TRIES - 1:
                    holder = _claim_of(run)[0] or Path("another launch")
                    raise _claimed(resume, run, holder, live=True) from None
                time.sleep(0.02)
        # No launch holds it now; an earlier holder that saved a checkpoint still counts.
        previous = _path_in(os.pread(fd, 4096, 0))
        if previous is not None and previous.resolve() != here and _last_checkpoint(previous):
            raise _claimed(resume, run, previous, live=False)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{here}\n".encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    _HELD[here] = fd


def release_run_locks() -> None:
    """End the claims and training locks this process holds (its run ended): what the claims
    continued is decided by their folders from now on (a checkpoint saved, or none)."""
    while _HELD:
        os.close(_HELD.popitem()[1])
    while _TRAINING:
        os.close(_TRAINING.popitem()[1])


# A forked child (a data generator's pool) shares the locks until it closes its copies: it
# closes them at once, so they end with the launch, not with an orphaned worker.
os.register_at_fork(after_in_child=release_run_locks)


def record_resume(run_dir: Path, checkpoint: Path) -> None:
    """Name, in ``run_dir``, the run that ``checkpoint`` (its last.pt) belongs to; nothing when
    it is ``run_dir``'s own (a continued sweep's job resumes in its own folder)."""
    run = checkpoint.parent.parent.resolve()
    if run != Path(run_dir).resolve():
        write_text(f"{run}\n", run_dir / RESUMED_FROM_FILE)


def _argv_without(keys: tuple[str, ...]) -> list[str]:
    """This process's arguments without the overrides and options named by ``keys`` (an
    option's value in the next argument goes with it)."""
    args, skip = [], False
    for arg in sys.argv[1:]:
        if skip:
            skip = False
            continue
        key = override_key(arg)
        if key.startswith("--") and key in keys and "=" not in arg:
            skip = True  # its value is the next argument
        elif key not in keys:
            args.append(arg)
    return args


def resume_command(run_dir: Path) -> str:
    """The command line that continues ``run_dir``: this process's arguments with any
    ``resume``/``hydra.run.dir`` replaced by ``resume=<run_dir>``."""
    args = _argv_without(("resume", "--resume", "hydra.run.dir"))
    return shlex.join(["nys", *args, f"resume={run_dir}"])


def sweep_command(sweep_dir: Path, training: bool) -> str:
    """The command line that continues the sweep in ``sweep_dir``: this process's arguments
    with ``hydra.sweep.dir=<sweep_dir>``, and ``--resume true`` for a ``training`` command
    (each interrupted job then resumes from its own checkpoint)."""
    args = _argv_without(("resume", "--resume", "hydra.sweep.dir"))
    resume = ["--resume", "true"] if training else []
    return shlex.join(["nys", *args, f"hydra.sweep.dir={sweep_dir}", *resume])
