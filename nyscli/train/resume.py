"""What ``resume=...`` means: which run to continue, and whether it is the same run.

A resumed run must train with exactly the settings it records. Its composed config is
compared, key by key, with the config the earlier run saved (``.hydra/config.yaml``); only
the keys in :data:`RUN_CONTROL` (how to run, not what to train) may differ. A difference is
refused with one line naming the keys, unless ``resume_changes=allow``: then the new values
are used (the trainer re-applies lr, betas, eps, weight decay, schedule and seed over the
checkpoint's) and every change is recorded, old and new value, in ``results.csv``.
``resume=true`` continues the newest *unfinished* run with identical settings that no later
run has continued already (a resumed run names its origin in :data:`RESUMED_FROM_FILE`); when
every such run has finished there is nothing to do.
"""

from __future__ import annotations

import contextlib
import csv
import os
import shlex
import sys
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
# In a run that resume=true continues: the folder of the run continuing it, created exclusively.
CONTINUED_FILE = ".nys-continued"
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
        holder = _continuing(last.parent.parent)
        if holder is not None and holder.resolve() != here:  # refused before any folder
            raise _claimed(last.parent.parent, holder)
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


def _continuing(run: Path) -> Path | None:
    """The live run folder that claimed the continuation of ``run`` (:data:`CONTINUED_FILE`),
    or None: no claim, or its holder was removed (it failed before it produced anything)."""
    try:
        holder = Path((run / CONTINUED_FILE).read_text().strip())
    except (OSError, UnicodeDecodeError):
        return None
    return holder if str(holder) and holder.is_dir() else None


def _claimed(run: Path, holder: Path) -> UserInputError:
    return UserInputError(
        f"resume=true: the run {run} is already being continued by {holder}; a run is "
        f"continued once (two continuations would fork it): wait for that one, or continue "
        f"it with resume={holder}"
    )


def claim_continuation(run_dir: Path, checkpoint: Path) -> None:
    """Claim the continuation of ``checkpoint``'s run for ``run_dir``, atomically (O_EXCL, as
    run folders are claimed): of two ``resume=true`` launches at once, exactly one continues
    it and the other stops with one line. A claim whose holder folder is gone is taken over."""
    run = checkpoint.parent.parent.resolve()
    here = Path(run_dir).resolve()
    try:
        fd = os.open(run / CONTINUED_FILE, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        holder = _continuing(run)
        if holder is not None and holder.resolve() != here:
            raise _claimed(run, holder) from None
        write_text(f"{here}\n", run / CONTINUED_FILE)  # a stale claim
        return
    with os.fdopen(fd, "w") as handle:
        handle.write(f"{here}\n")


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
