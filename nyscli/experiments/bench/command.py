"""``nys bench``: time and peak memory of one self-attention module vs sequence length.

The paper's Table 1 protocol: one input instance through one self-attention module (default
BERT-base sized), every (attention, n) point measured in a fresh process (see
``bench_worker``), the rows of one n timed interleaved with noisy points retried and marked
(see ``bench_rounds``), out-of-memory and over-time points marked while the run goes on.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from nyscli.allocator import preloaded, system_environ
from nyscli.attention import attention_label
from nyscli.console import heartbeat
from nyscli.errors import UserInputError
from nyscli.experiments import schema
from nyscli.experiments.bench.rounds import busy_hint, measure_interleaved
from nyscli.experiments.bench.rules import SCOPES, attentions, check
from nyscli.output.paper import table1_rows
from nyscli.output.plots import loglog_panels
from nyscli.overrides import override_key
from nyscli.train.resources import resolve_device

log = logging.getLogger(__name__)

# What env.json records: the points are measured in workers on glibc's malloc (rounds.py),
# whatever allocator this process runs on, unless the user's own LD_PRELOAD names another.
ALLOCATOR = preloaded(system_environ(os.environ))


def _override_keys() -> list[str]:
    """The keys the command line overrode (``attention``, ``attention.num_landmarks``, ...)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    return [override_key(o) for o in HydraConfig.get().overrides.task]


def user_selected_attention() -> bool:
    """True if the command line chose an ``attention`` (``attention=x`` or ``attention.k=v``)."""
    return any(key.split(".", 1)[0] == "attention" for key in _override_keys())


def user_set(key: str) -> bool:
    """True if the command line overrode ``key``."""
    return key in _override_keys()


def sweep_pins(overrides: list[str]) -> tuple[tuple[str, ...], str | None]:
    """A sweep over attentions (``-m attention=a,b``) or their options (``-m
    attention.num_landmarks=32,64``) times the swept attentions alone: every job would else
    time the whole default set again, and the set's rows (``nystrom-32`` in a job of
    ``num_landmarks=64``) would come out under another job's label. A set the user names
    (``--attention-set table1``) is kept. The overrides that do it, and the note that says so."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(overrides)
    keys = {o.key_or_group for o in parsed}
    swept = [
        o.input_line
        for o in parsed
        if o.is_sweep_override() and o.key_or_group.split(".", 1)[0] == "attention"
    ]
    if not swept or "attention_set" in keys:
        return (), None
    note = (
        f"a sweep over attentions ({' '.join(swept)}) times only the swept attentions "
        "(attention_set=none); --attention-set table1 times the set in every job too"
    )
    return ("attention_set=none",), note


def attention_rows(cfg: DictConfig, include_selected: bool) -> list[dict[str, Any]]:
    """The attention configs to measure: the ``attention_set``'s rows, plus the ``attention``
    config when the user picked one (so ``nys bench attention=x`` measures x beside the set)."""
    rows = [OmegaConf.to_container(row, resolve=True) for row in cfg.attention_rows]
    if include_selected:
        rows.append(OmegaConf.to_container(cfg.attention, resolve=True))
    unique: dict[str, dict[str, Any]] = {}
    for row in rows:
        unique.setdefault(attention_label(row), row)
    return list(unique.values())


def scopes_of(cfg: DictConfig) -> list[str]:
    """``scope`` as a list: one scope, or several measured side by side in one run."""
    scope = cfg.scope
    return [str(scope)] if isinstance(scope, str) else [str(s) for s in scope]


def validate(cfg: DictConfig) -> None:
    """Cheap checks of every value before any measurement starts."""
    check(cfg)
    if cfg.min_repeats > cfg.repeats:
        raise UserInputError(
            f"min_repeats={cfg.min_repeats} is not allowed; it must be <= repeats={cfg.repeats}"
        )
    resolve_device(str(cfg.device))
    if cfg.hidden % cfg.num_heads:
        raise UserInputError(f"hidden={cfg.hidden} is not divisible by num_heads={cfg.num_heads}")
    selected = user_selected_attention()
    schema.check_attentions(attentions(cfg))
    rows = attention_rows(cfg, include_selected=selected)
    if not rows:
        raise UserInputError(
            "attention_set=none measures only an attention given on the command line; "
            "add attention=<name> (e.g. attention=nystrom) or pick attention_set=table1"
        )
    labels = [attention_label(row) for row in rows]
    names = [str(row.get("name")) for row in rows]
    # render() matches a row by its label, or by its attention name when that names one row
    known = labels + [name for name in names if names.count(name) == 1]
    if cfg.baseline is not None and cfg.baseline not in known and user_set("baseline"):
        raise UserInputError(
            f"baseline={cfg.baseline} is not allowed; it must be a measured row: "
            f"{', '.join(labels)} (or its attention name, or null)"
        )


def memory_limit_mb(cfg: DictConfig) -> float | None:
    """The per-point virtual-memory cap: the config's, or 90% of the memory available now."""
    if cfg.memory_limit_mb is not None:
        return float(cfg.memory_limit_mb)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024 * 0.9
    except OSError:
        pass
    return None


def worker_settings(cfg: DictConfig, device: str) -> dict[str, Any]:
    """What every worker of the run measures with, besides its attention, scope and n."""
    return {
        "batch_size": cfg.batch_size,
        "hidden": cfg.hidden,
        "num_heads": cfg.num_heads,
        "mode": cfg.mode,
        "dtype": cfg.dtype,
        "device": device,
        "warmup": cfg.warmup,
        "repeats": cfg.repeats,
        "min_repeats": cfg.min_repeats,
        "time_budget_s": cfg.time_budget_s,
        "seed": cfg.seed,
        "threads": int(cfg.threads or torch.get_num_threads()),
        "memory_limit_mb": memory_limit_mb(cfg),
    }


def record(
    point: dict[str, Any],
    row: Any,
    cfg: DictConfig,
    common: dict[str, Any],
    load: float,
    result: dict[str, Any],
) -> dict[str, Any]:
    """One results.csv row: the point, the settings, and what the worker measured (every
    measurement column present, None where the point failed or was skipped)."""
    return {
        **point,
        "baseline": cfg.baseline,
        **{k: v for k, v in common.items() if k != "memory_limit_mb"},
        "attention_config": json.dumps(row, sort_keys=True),
        "load_avg": load,
        "time_ms": None,
        "time_ms_median": None,
        "time_ms_min": None,
        "time_ms_q3": None,
        "time_ms_iqr": None,
        "repeats": None,
        "spread": None,
        "remeasured": None,
        "noisy": None,
        "peak_mb": None,
        "cuda_graph": None,
        "path": None,
        "input_dtype": None,
        "error": None,
        **result,
    }


def run(cfg: DictConfig, run_dir: Path, console: Console) -> pd.DataFrame:
    device = str(resolve_device(str(cfg.device)))
    rows = attention_rows(cfg, include_selected=user_selected_attention())
    labels = [attention_label(row) for row in rows]
    # Every (attention, scope) pair of one n is timed interleaved with the others, so a
    # module's time can be set against its projections' and its core's from the same rounds.
    points = [
        (row, label, scope)
        for scope in scopes_of(cfg)
        for row, label in zip(rows, labels, strict=True)
    ]
    seq_lens = sorted(set(cfg.seq_lens))
    common = worker_settings(cfg, device)
    records: list[dict[str, Any]] = []
    hint = busy_hint(int(cfg.threads or torch.get_num_threads()))
    if hint:
        log.warning(hint)
    # A row that ran out of memory or time at some n is not retried at larger n.
    stopped: dict[tuple[str, str], str] = {}
    progress = Progress(
        TextColumn("[bold]bench[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    total = len(points) * len(seq_lens)

    def show(description: str) -> None:
        progress.update(task, description=description)
        beat.say(f"bench {description}, {len(records)}/{total} points done")

    with progress, heartbeat(log, "bench") as beat:
        task = progress.add_task("", total=total)
        for n in seq_lens:
            live = [i for i, (_, *key) in enumerate(points) if tuple(key) not in stopped]
            show(f"n={n}: warm-up and memory of {len(live)} row(s)")
            load = os.getloadavg()[0]
            measured = measure_interleaved(
                [
                    {**common, "attention": points[i][0], "scope": points[i][2], "seq_len": n}
                    for i in live
                ],
                cfg.timeout_s,
                cfg.noise_threshold,
                lambda r, rounds, n=n: show(f"n={n} round {r}/{rounds}"),
            )
            results = dict(zip(live, measured, strict=True))
            for i, (row, label, scope) in enumerate(points):
                result = results.get(i) or {
                    "status": "skipped",
                    "error": f"{stopped.get((label, scope))} at a smaller n",
                }
                if result["status"] in ("oom", "timeout"):
                    stopped[(label, scope)] = result["status"]
                log.info("%s [%s] n=%d: %s", label, scope, n, _describe(result))
                point = {"attention": label, "method": row["name"], "scope": scope, "seq_len": n}
                records.append(record(point, row, cfg, common, load, result))
                progress.advance(task)
    df = pd.DataFrame.from_records(records)
    plot(df, run_dir / "bench.png", cfg)
    return df


def _describe(result: dict[str, Any]) -> str:
    if result["status"] != "ok":
        return f"{result['status']} ({result.get('error', '')})"
    noisy = ", NOISY" if result.get("noisy") else ""
    graph = ", a CUDA graph replayed on the same inputs" if result.get("cuda_graph") else ""
    return (
        f"{result['time_ms']:.2f} ms (lower quartile of {result['repeats']}, IQR/median "
        f"{result['spread']:.2f}{noisy}{graph}), {result['peak_mb']:.1f} MB"
    )


def row_names(df: pd.DataFrame) -> list[str]:
    """One table/plot row per attention label, told apart by its sweep job when the frame
    holds several runs, else by its scope when one run measured several."""
    jobs = df["job"].fillna("") if "job" in df else pd.Series("", index=df.index)
    several_scopes = df["scope"].nunique() > 1
    return [
        f"{label} [{job}]" if job else f"{label} [{scope}]" if several_scopes else label
        for label, scope, job in zip(df.attention, df.scope, jobs, strict=True)
    ]


def plot(df: pd.DataFrame, path: Path, cfg: DictConfig) -> None:
    ok = df[df.status == "ok"].assign(row=lambda d: row_names(d))
    if ok.empty:
        return
    title = (
        f"{', '.join(scopes_of(cfg))}, {cfg.mode}, {cfg.dtype}, batch {cfg.batch_size}, "
        f"{cfg.hidden}/{cfg.num_heads} heads"
    )
    loglog_panels(
        ok,
        "seq_len",
        [("time_ms", "time (ms)"), ("peak_mb", "peak memory (MB)")],
        "row",
        path,
        title,
    )


def _fmt(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _table(df: pd.DataFrame, column: str, title: str, base_rows: dict[str, str]) -> Table:
    """One Table-1 panel; ``base_rows`` names the baseline row of each scope (ratios are taken
    within a scope only)."""
    seq_lens = sorted(df.seq_len.unique())
    table = Table(title=title, title_justify="left")
    table.add_column("attention", style="bold")
    for n in seq_lens:
        table.add_column(f"n={n}", justify="right")
    ref = df[df.row.isin(list(base_rows.values())) & (df.status == "ok")]
    base = {(r.scope, r.seq_len): r for r in ref.itertuples()}
    for row, group in df.groupby("row", sort=False):
        cells = []
        scope = group.scope.iloc[0]
        by_n = {r.seq_len: r for r in group.itertuples()}
        for n in seq_lens:
            point = by_n.get(n)
            if point is None:
                cells.append("")
            elif point.status != "ok":
                cells.append(f"[red]{point.status.upper()}[/]")
            else:
                value = getattr(point, column)
                text = _fmt(value)
                if column == "time_ms" and getattr(point, "noisy", False) is True:
                    text += "[yellow]~[/]"
                reference = base.get((scope, n))
                if reference is not None and row != base_rows.get(scope):
                    text += ratio_text(point, reference, column)
                cells.append(text)
        table.add_row(escape(str(row)), *cells)  # labels are data: "[...]" is no markup
    if column == "time_ms":
        for name, overhead_cells in module_overhead_rows(df, seq_lens):
            table.add_row(escape(name), *overhead_cells, style="cyan")
    for name, paper_cells in table1_rows(column, [int(n) for n in seq_lens]):
        table.add_row(name, *paper_cells, style="dim")
    return table


def ratio_text(point: Any, reference: Any, column: str) -> str:
    """ " (0.42×)": the point's value over its baseline's; for times whose quartiles put the
    ratio on both sides of 1 (the row's IQR against the baseline's), " (≈1×)" instead: the
    two are not told apart at this n on this machine."""
    value, base = getattr(point, column), getattr(reference, column)
    if not base or base <= 0:
        return ""
    if column == "time_ms" and straddles_one(point, reference):
        return " [yellow](≈1×)[/]"
    return f" [dim]({value / base:.3g}×)[/]"


def straddles_one(point: Any, reference: Any) -> bool:
    """Whether the ratio's range from the two rows' quartiles (the row's lower quartile over
    the baseline's upper, its upper over the baseline's lower) holds 1."""
    quartiles = [
        getattr(r, name, None) for r in (point, reference) for name in ("time_ms", "time_ms_q3")
    ]
    if any(q is None or q != q or q <= 0 for q in quartiles):  # older results: no quartiles
        return False
    low, high, base_low, base_high = quartiles
    return low / base_high < 1 < high / base_low


def module_overhead_rows(df: pd.DataFrame, seq_lens: list[int]) -> list[tuple[str, list[str]]]:
    """For each attention measured in all three scopes: module time / (projections + core)
    per n, how much the module costs beyond its two parts (1.0 = nothing)."""
    ok = df[df.status == "ok"]
    times = ok.pivot_table(
        index=["attention", "seq_len"], columns="scope", values="time_ms", aggfunc="first"
    )
    if not set(SCOPES) <= set(times.columns):
        return []
    rows = []
    for label in dict.fromkeys(ok.attention):
        cells = []
        for n in seq_lens:
            point = times.loc[(label, n)] if (label, n) in times.index else None
            parts = None if point is None else point["projections"] + point["core"]
            ratio = None if parts is None else point["module"] / parts
            cells.append("" if ratio is None or ratio != ratio else f"{ratio:.2f}×")
        if any(cells):
            rows.append((f"{label}: module / (projections + core)", cells))
    return rows


def render(df: pd.DataFrame) -> RenderableType:
    """Table-1 layout: attention rows, n across; memory then time, × = value / baseline's
    (at the same n and scope)."""
    df = df.copy()
    baseline = str(df["baseline"].iloc[0]) if "baseline" in df else ""
    df["row"] = row_names(df)
    base_rows = {}
    for scope, group in df.groupby("scope", sort=False):
        matches = [r for r in group.row.unique() if r.split(" [")[0] == baseline]
        if not matches and "method" in df:  # baseline=softmax names the row "softmax (SDPA)"
            matches = list(group.row[group.method == baseline].unique())
        if len(matches) == 1:
            base_rows[scope] = matches[0]
    context = df.iloc[0]
    scopes = ", ".join(dict.fromkeys(df.scope))
    caption = (
        f"{scopes}, {context['mode']}, {context['dtype']}, {context['device']}, "
        f"batch {context['batch_size']}, hidden {context['hidden']}/{context['num_heads']} heads"
    )
    if "threads" in df and pd.notna(context["threads"]):
        threads = context["threads"]  # "1 / 2" where pooled seeds ran with different threads
        caption += f", {int(threads) if isinstance(threads, (int, float)) else threads} thread(s)"
    if len(base_rows) == 1:
        caption += f"; (×) = value / {next(iter(base_rows.values()))}'s at the same n"
    elif base_rows:
        names = dict.fromkeys(df.attention[df.row.isin(list(base_rows.values()))])
        caption += f"; (×) = value / {' / '.join(names)}'s at the same n and scope"
    if "noisy" in df and (df["noisy"] == True).any():  # noqa: E712  (NaN for failed points)
        caption += "; ~ = noisy: IQR/median of its times still above noise_threshold after a retry"
    return Group(
        Text(caption, style="italic"),
        _table(df, "peak_mb", "Peak memory (MB)", base_rows),
        _table(df, "time_ms", "Time (ms, lower quartile)", base_rows),
    )
