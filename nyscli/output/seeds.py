"""Seeds as a dimension: runs that differ only in their seed, pooled into mean ± std (n).

Two runs belong to one group when their resolved configs are equal once the keys that never
change a result are left out (``NOT_A_SETTING``: the seed itself, threads, device, resume,
paths, fail_fast). Within a group every run's results.csv has the same rows in the same
order (the same config made them), so the rows are pooled position by position: a float
column that differs between the seeds, or is named as a measurement (``MEASURED``), is a
metric (mean, sample std with ddof = 1, n); another numeric column says which row it is
(seq_len, budget); a text column lists what the seeds gave. A group of one run has n = 1 and
no std.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from nyscli.output.runs import RunFolder, overrides_dict, sweep_overrides

# Top-level config keys that never change what a run computes.
NOT_A_SETTING = ("seed", "threads", "device", "resume", "data_cache", "fail_fast")
DDOF = 1  # the sample standard deviation, as numpy.std(ddof=1)
# A numeric column by this name is a measurement even where every seed gave the same value
# (test accuracy 0 three times is a result with std 0, not a label); other numeric columns
# equal across the seeds say which row it is (seq_len, budget).
MEASURED = re.compile(r"(accuracy|loss|error|value|score|rate|_ms|_mb|_s)$")


@dataclass
class SeedGroup:
    """Runs whose settings are equal but for the seed, and their seeds in run order."""

    runs: list[RunFolder]
    seeds: list[int | str] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.runs)


def settings(run: RunFolder, config: dict) -> str:
    """The run's resolved ``config`` and its overrides without ``NOT_A_SETTING``, as canonical
    JSON; a config with no seed at all is a group of its own (its folder in the key)."""
    kept = {key: value for key, value in config.items() if key not in NOT_A_SETTING}
    given = sorted(o for o in run.overrides if o.split("=")[0].lstrip("+~") not in NOT_A_SETTING)
    alone = None if "seed" in config else str(run.path)
    return json.dumps([kept, given, alone], sort_keys=True, default=str)


def seed_groups(runs: list[RunFolder]) -> list[SeedGroup]:
    """The runs with results, grouped by their settings (first appearance order)."""
    groups: dict[str, SeedGroup] = {}
    for run in runs:
        if run.results is None:
            continue
        loaded = OmegaConf.load(Path(run.path) / ".hydra" / "config.yaml")
        config = OmegaConf.to_container(loaded, resolve=False)
        assert isinstance(config, dict)
        group = groups.setdefault(settings(run, config), SeedGroup([]))
        group.runs.append(run)
        seed = config.get("seed", "?")
        group.seeds.append(int(seed) if isinstance(seed, int) else str(seed))
    return list(groups.values())


def pooled(group: SeedGroup) -> pd.DataFrame | None:
    """One row per results row, every metric as ``<metric>`` (mean), ``<metric>_std`` and the
    columns ``n`` and ``seeds``; None when the runs' tables do not line up (other rows)."""
    tables = [run.results for run in group.runs]
    first = tables[0]
    assert first is not None
    if any(t is None or t.shape != first.shape or list(t.columns) != list(first.columns)
           for t in tables):  # fmt: skip
        return None
    stacked = pd.concat(tables, keys=range(len(tables)))  # (run, row) index
    out = first.copy()
    metrics = []
    for column in first.columns:
        values = stacked[column].unstack(0)  # rows x runs
        if column == "seed":  # the group lists its seeds instead
            out[column] = " ".join(str(s) for s in group.seeds)
            continue
        if column in NOT_A_SETTING or not pd.api.types.is_numeric_dtype(first[column]):
            # How the runs ran (threads, device), which seeds may differ in, or
            # a label drawn from a metric ("= majority" for one seed, "< majority" for
            # another): every value the seeds gave, in seed order, each once.
            out[column] = values.apply(lambda r: " / ".join(dict.fromkeys(map(str, r))), axis=1)
            continue
        if values.isna().all().all():
            continue  # nothing measured (resumed_from of runs never resumed)
        same = values.nunique(axis=1, dropna=False).le(1).all()
        if same and not MEASURED.search(column):
            continue  # says which row (seq_len, budget, max_steps)
        metrics.append(column)
        out[column] = values.mean(axis=1)
        std = values.std(axis=1, ddof=DDOF) if group.n > 1 else math.nan
        out[f"{column}_std"] = std
    out["n"] = group.n
    out["seeds"] = " ".join(str(s) for s in group.seeds)
    out.attrs["metrics"] = metrics
    return out


def mean_std(mean: float, std: float, n: int) -> str:
    """``mean ± std (n = 3)``; ``mean (n = 1)`` for one run (no spread to show)."""
    if n <= 1 or std != std:  # NaN
        return f"{mean:.4g} (n = {n})"
    return f"{mean:.4g} ± {std:.2g} (n = {n})"


def group_labels(groups: list[SeedGroup]) -> list[str]:
    """Each group's label: the overrides that differ between the groups, seeds and the other
    ``NOT_A_SETTING`` keys left out (``attention=nystrom``); the first run's folder name where
    nothing differs."""
    firsts = [g.runs[0] for g in groups]
    keys = [k for k in sweep_overrides(firsts) if k.lstrip("+~") not in NOT_A_SETTING]
    given = [overrides_dict(run.overrides) for run in firsts]
    return [
        " ".join(f"{k}={d[k]}" for k in keys if k in d) or run.path.name
        for run, d in zip(firsts, given, strict=True)
    ]


def spread_table(groups: list[SeedGroup]) -> pd.DataFrame:
    """Long format, one row per (group, results row, metric): the group's label, the row's
    own columns, ``result`` (the results.csv column pooled), ``mean``, ``std`` (ddof 1; empty
    for n = 1), ``n``, ``seeds``.
    Groups whose runs' tables do not line up give one row per run (n = 1)."""
    rows = []
    for group, label in zip(groups, group_labels(groups), strict=True):
        parts = [group] if pooled(group) is not None else [
            SeedGroup([run], [seed]) for run, seed in zip(group.runs, group.seeds, strict=True)
        ]  # fmt: skip
        for part in parts:
            table = pooled(part)
            assert table is not None
            metrics = table.attrs["metrics"]
            pooled_columns = {*metrics, *(f"{m}_std" for m in metrics), "n", "seeds"}
            ids = [c for c in table.columns if c not in pooled_columns]
            for _, row in table.iterrows():
                for metric in metrics:
                    rows.append({"group": label, **{c: row[c] for c in ids}, "result": metric,
                                 "mean": row[metric], "std": row[f"{metric}_std"],
                                 "n": part.n, "seeds": row["seeds"]})  # fmt: skip
    return pd.DataFrame(rows)


def means_frame(groups: list[SeedGroup]) -> pd.DataFrame:
    """The groups' results as one table a command's own ``render`` can show: each metric its
    mean over the seeds (``<metric>_std``, ``n``, ``seeds`` beside), ``job`` the group's label,
    ``run_dir`` its first run; groups whose tables do not line up, run by run."""
    frames = []
    for group, label in zip(groups, group_labels(groups), strict=True):
        table = pooled(group)
        parts = [(table, group)] if table is not None else [
            (pooled(SeedGroup([r], [s])), SeedGroup([r], [s]))
            for r, s in zip(group.runs, group.seeds, strict=True)
        ]  # fmt: skip
        for frame, part in parts:
            assert frame is not None
            frame = frame.copy()
            frame.insert(0, "job", label)
            frame.insert(1, "run_dir", str(part.runs[0].path))
            frames.append(frame)
    return pd.concat(frames, ignore_index=True)
