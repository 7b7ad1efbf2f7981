"""Find run folders on disk and gather their results into one DataFrame.

A run folder is any directory holding ``.hydra/config.yaml`` (single runs and the per-job
folders of a sweep alike, whichever Hydra launcher ran them: basic, joblib and submitit all
write ``<sweep>/<job number>/``). A run without ``results.csv`` is reported as failed, so a
partly failed sweep still aggregates; a submitit job killed before it could write
``error.txt`` (time limit, memory, preemption) points to its log under ``<sweep>/.submitit/``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from nyscli.errors import UserInputError

ERROR_FILE = "error.txt"
RESULTS_FILE = "results.csv"
TRIALS_FILE = "trials.csv"  # a search's trials, in its sweep folder


@dataclass
class RunFolder:
    """One run: where it is, which command made it, its overrides, and its results if any."""

    path: Path
    command: str
    overrides: list[str]
    results: pd.DataFrame | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.results is not None


def find_run_folders(paths: list[Path]) -> list[Path]:
    """Every run folder at or below each path, in natural order (numbers in names compare
    as numbers: sweep job 2 before job 10, ``m16`` before ``m128``); a missing path is a
    UserInputError."""
    found: set[Path] = set()
    for path in paths:
        path = Path(path)
        if not path.is_dir():
            raise UserInputError(f"{path} is not a directory; give run folders or a parent of them")
        found.update(cfg.parent.parent for cfg in path.rglob(".hydra/config.yaml"))
    return sorted(found, key=natural_key)


def natural_key(path: Path) -> tuple[tuple[str | int, ...], ...]:
    """Each part of ``path`` split into text and numbers (``m128`` -> ``("m", 128, "")``), so
    numbers sort numerically; text and number positions always alternate, so keys compare."""
    return tuple(
        tuple(int(t) if i % 2 else t for i, t in enumerate(re.split(r"(\d+)", part)))
        for part in Path(path).parts
    )


def load_run(path: Path) -> RunFolder:
    """One run folder; unreadable files make it a failed run that says which file."""
    try:
        config = OmegaConf.load(path / ".hydra" / "config.yaml")
        overrides_file = path / ".hydra" / "overrides.yaml"
        overrides = list(OmegaConf.load(overrides_file)) if overrides_file.exists() else []
    except Exception as error:  # yaml, OS and OmegaConf errors alike: the run is unreadable
        reason = f"unreadable .hydra/ ({type(error).__name__}); not counted"
        return RunFolder(path, "unknown", [], None, reason)
    command = str(config.get("command", "unknown"))
    results_file = path / RESULTS_FILE
    try:
        results = None
        if results_file.exists():
            with open(results_file, "rb") as handle:
                if b"\x00" in handle.read(65536):  # pandas reads such bytes as a column name
                    raise ValueError("binary, not CSV")
            results = pd.read_csv(results_file)
    except Exception as error:  # pandas raises many types for empty or corrupt CSVs
        reason = f"unreadable {RESULTS_FILE} ({type(error).__name__}); not counted"
        return RunFolder(path, command, [str(o) for o in overrides], None, reason)
    error_file = path / ERROR_FILE
    if error_file.exists():
        # errors="replace": a corrupt error.txt still names the run as failed.
        error = (error_file.read_text(errors="replace").strip().splitlines() or ["failed"])[0]
    elif results is None:
        error = "no results.csv (the run failed or is still running)"
        log = submitit_log(path)
        if log is not None:
            error += f"; launcher log {log}: {_last_line(log)}"
    else:
        error = None
    return RunFolder(path, command, [str(o) for o in overrides], results, error)


def submitit_log(path: Path) -> Path | None:
    """The stderr log submitit kept for the job in ``path`` (default ``.submitit/%j`` layout)."""
    hydra_file = path / ".hydra" / "hydra.yaml"
    if not hydra_file.exists():
        return None
    job_id = OmegaConf.select(OmegaConf.load(hydra_file), "hydra.job.id", default=None)
    if job_id is None:
        return None
    logs = sorted((path.parent / ".submitit" / str(job_id)).glob("*_log.err"))
    return logs[0] if logs else None


def _last_line(log: Path) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines()]
    return next((line for line in reversed(lines) if line), "(empty)")


def overrides_dict(overrides: list[str]) -> dict[str, str]:
    return dict(o.partition("=")[::2] for o in overrides)


# How a job was run or continued, never what it is: a continued sweep's jobs carry
# resume=<folder> or resume=false (and maybe another cluster=), and are the same jobs as before.
NOT_A_JOB = ("resume", "cluster")


def sweep_overrides(runs: list[RunFolder]) -> list[str]:
    """Override keys whose value (or presence) differs between runs: they tell jobs apart."""
    given = [overrides_dict(run.overrides) for run in runs]
    keys = dict.fromkeys(k for g in given for k in g if k not in NOT_A_JOB)
    return [k for k in keys if len({g.get(k) for g in given}) > 1]


def aggregate(runs: list[RunFolder]) -> pd.DataFrame:
    """All successful runs' results stacked, each row tagged with its run folder and ``job``.

    ``job`` is the run's overrides that vary across the given runs (e.g.
    ``attention.num_landmarks=16``): it tells the rows of different sweep jobs apart.
    """
    keys = sweep_overrides(runs)
    frames = []
    for run in runs:
        if run.results is None:
            continue
        frame = run.results.copy()
        given = overrides_dict(run.overrides)
        frame.insert(0, "job", " ".join(f"{k}={given[k]}" for k in keys if k in given))
        frame.insert(1, "run_dir", str(run.path))
        frames.append(frame)
    if not frames:
        return pd.DataFrame(columns=["job", "run_dir"])
    return pd.concat(frames, ignore_index=True)
