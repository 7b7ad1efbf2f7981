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

from nyscli.attention import AttentionConfigError, MultiHeadAttention, attention_label
from nyscli.errors import UserInputError
from nyscli.experiments import schema
from nyscli.experiments.bench_rounds import busy_hint, measure_interleaved
from nyscli.experiments.bench_worker import DTYPES
from nyscli.report.paper import table1_rows
from nyscli.report.plots import loglog_panels
from nyscli.train.resources import DEVICES, resolve_device

log = logging.getLogger(__name__)

SCOPES = ("module", "core", "projections")
MODES = ("forward", "train")


RULES: dict[str, schema.Rule] = {
    "seq_lens": schema.IntList(low=1),
    "batch_size": schema.COUNT,
    "hidden": schema.COUNT,
    "num_heads": schema.COUNT,
    "scope": schema.Choice(values=SCOPES),
    "mode": schema.Choice(values=MODES),
    "dtype": schema.Choice(values=tuple(DTYPES)),
    "device": schema.Choice(values=DEVICES),
    "baseline": schema.Text(null=True),
    "warmup": schema.Int(low=0),
    "repeats": schema.COUNT,
    "min_repeats": schema.COUNT,
    "time_budget_s": schema.Float(low=0.0, low_open=True),
    "timeout_s": schema.Float(low=0.0, low_open=True),
    "noise_threshold": schema.Float(low=0.0, low_open=True),
    "memory_limit_mb": schema.Float(low=0.0, low_open=True, null=True),
    "threads": schema.THREADS,
    "seed": schema.SEED,
}


def _override_keys() -> list[str]:
    """The keys the command line overrode (``attention``, ``attention.num_landmarks``, ...)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return []
    return [o.split("=", 1)[0].lstrip("+~") for o in HydraConfig.get().overrides.task]


def user_selected_attention() -> bool:
    """True if the command line chose an ``attention`` (``attention=x`` or ``attention.k=v``)."""
    return any(key.split(".", 1)[0] == "attention" for key in _override_keys())


def user_set(key: str) -> bool:
    """True if the command line overrode ``key``."""
    return key in _override_keys()


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


def validate(cfg: DictConfig) -> None:
    """Cheap checks of every value before any measurement starts."""
    schema.check(cfg, RULES)
    if cfg.min_repeats > cfg.repeats:
        raise UserInputError(
            f"min_repeats={cfg.min_repeats} is not allowed; it must be <= repeats={cfg.repeats}"
        )
    resolve_device(str(cfg.device))
    if cfg.hidden % cfg.num_heads:
        raise UserInputError(f"hidden={cfg.hidden} is not divisible by num_heads={cfg.num_heads}")
    selected = user_selected_attention()
    schema.check_attentions(
        [("attention", cfg.attention)]
        + [(f"attention_rows[{i}]", row) for i, row in enumerate(cfg.attention_rows)]
    )
    rows = attention_rows(cfg, include_selected=selected)
    if not rows:
        raise UserInputError(
            "attention_set=none measures only an attention given on the command line; "
            "add attention=<name> (e.g. attention=nystrom) or pick attention_set=table1"
        )
    try:
        for row in attention_rows(cfg, include_selected=True):
            MultiHeadAttention(8 * cfg.num_heads, cfg.num_heads, row)
    except AttentionConfigError as error:
        raise UserInputError(str(error)) from error
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


def run(cfg: DictConfig, run_dir: Path, console: Console) -> pd.DataFrame:
    device = str(resolve_device(str(cfg.device)))
    if cfg.threads:  # the workers use it; set here too so env.json and the table agree
        torch.set_num_threads(int(cfg.threads))
    rows = attention_rows(cfg, include_selected=user_selected_attention())
    seq_lens = sorted(set(cfg.seq_lens))
    common = {
        "batch_size": cfg.batch_size,
        "hidden": cfg.hidden,
        "num_heads": cfg.num_heads,
        "scope": cfg.scope,
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
    records: list[dict[str, Any]] = []
    hint = busy_hint(int(cfg.threads or torch.get_num_threads()))
    if hint:
        log.warning(hint)
    # A row that ran out of memory or time at some n is not retried at larger n.
    stopped: dict[str, str] = {}
    progress = Progress(
        TextColumn("[bold]bench[/] {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    labels = [attention_label(row) for row in rows]
    with progress:
        task = progress.add_task("", total=len(rows) * len(seq_lens))
        for n in seq_lens:
            live = [i for i, label in enumerate(labels) if label not in stopped]
            progress.update(task, description=f"n={n}: warm-up and memory")
            load = os.getloadavg()[0]
            measured = measure_interleaved(
                [{**common, "attention": rows[i], "seq_len": n} for i in live],
                cfg.timeout_s,
                cfg.noise_threshold,
                lambda r, total, n=n: progress.update(task, description=f"n={n} round {r}/{total}"),
            )
            results = dict(zip(live, measured, strict=True))
            for i, (row, label) in enumerate(zip(rows, labels, strict=True)):
                result = results.get(i) or {
                    "status": "skipped",
                    "error": f"{stopped.get(label)} at a smaller n",
                }
                if result["status"] in ("oom", "timeout"):
                    stopped[label] = result["status"]
                log.info("%s n=%d: %s", label, n, _describe(result))
                records.append(
                    {
                        "attention": label,
                        "method": row["name"],
                        "seq_len": n,
                        "baseline": cfg.baseline,
                        **{k: v for k, v in common.items() if k != "memory_limit_mb"},
                        "attention_config": json.dumps(row, sort_keys=True),
                        "load_avg": load,
                        "time_ms": None,
                        "time_ms_min": None,
                        "time_ms_iqr": None,
                        "repeats": None,
                        "spread": None,
                        "remeasured": None,
                        "noisy": None,
                        "peak_mb": None,
                        "error": None,
                        **result,
                    }
                )
                progress.advance(task)
    df = pd.DataFrame.from_records(records)
    plot(df, run_dir / "bench.png", cfg)
    return df


def _describe(result: dict[str, Any]) -> str:
    if result["status"] != "ok":
        return f"{result['status']} ({result.get('error', '')})"
    noisy = ", NOISY" if result.get("noisy") else ""
    return (
        f"{result['time_ms']:.2f} ms (median of {result['repeats']}, IQR/median "
        f"{result['spread']:.2f}{noisy}), {result['peak_mb']:.1f} MB"
    )


def plot(df: pd.DataFrame, path: Path, cfg: DictConfig) -> None:
    ok = df[df.status == "ok"]
    if ok.empty:
        return
    title = (
        f"{cfg.scope}, {cfg.mode}, {cfg.dtype}, batch {cfg.batch_size}, "
        f"{cfg.hidden}/{cfg.num_heads} heads"
    )
    loglog_panels(
        ok,
        "seq_len",
        [("time_ms", "time (ms)"), ("peak_mb", "peak memory (MB)")],
        "attention",
        path,
        title,
    )


def _fmt(value: float) -> str:
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.1f}" if value >= 10 else f"{value:.2f}"


def _table(df: pd.DataFrame, column: str, title: str, baseline: str | None) -> Table:
    seq_lens = sorted(df.seq_len.unique())
    table = Table(title=title, title_justify="left")
    table.add_column("attention", style="bold")
    for n in seq_lens:
        table.add_column(f"n={n}", justify="right")
    base = {}
    if baseline is not None:
        ref = df[(df.row == baseline) & (df.status == "ok")]
        base = dict(zip(ref.seq_len, ref[column], strict=True))
    for row, group in df.groupby("row", sort=False):
        cells = []
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
                if n in base and base[n] > 0 and row != baseline:
                    text += f" [dim]({value / base[n]:.3g}×)[/]"
                cells.append(text)
        table.add_row(escape(str(row)), *cells)  # labels are data: "[...]" is no markup
    for name, paper_cells in table1_rows(column, [int(n) for n in seq_lens]):
        table.add_row(name, *paper_cells, style="dim")
    return table


def render(df: pd.DataFrame) -> RenderableType:
    """Table-1 layout: attention rows, n across; memory then time, × = value / baseline's."""
    df = df.copy()
    baseline = str(df["baseline"].iloc[0]) if "baseline" in df else ""
    jobs = df["job"].fillna("") if "job" in df else pd.Series("", index=df.index)
    df["row"] = [f"{a} [{j}]" if j else a for a, j in zip(df.attention, jobs, strict=True)]
    matches = [r for r in df.row.unique() if r.split(" [")[0] == baseline]
    if not matches and "method" in df:  # baseline=softmax names the row "softmax (SDPA)"
        matches = list(df.row[df.method == baseline].unique())
    base_row = matches[0] if len(matches) == 1 else None
    context = df.iloc[0]
    caption = (
        f"{context['scope']}, {context['mode']}, {context['dtype']}, {context['device']}, "
        f"batch {context['batch_size']}, hidden {context['hidden']}/{context['num_heads']} heads"
    )
    if "threads" in df and pd.notna(context["threads"]):
        caption += f", {int(context['threads'])} thread(s)"
    if base_row:
        caption += f"; (×) = value / {base_row}'s at the same n"
    if "noisy" in df and (df["noisy"] == True).any():  # noqa: E712  (NaN for failed points)
        caption += "; ~ = noisy: IQR/median of its times still above noise_threshold after a retry"
    return Group(
        Text(caption, style="italic"),
        _table(df, "peak_mb", "Peak memory (MB)", base_row),
        _table(df, "time_ms", "Time (ms, median)", base_row),
    )
