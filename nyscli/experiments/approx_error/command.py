"""``nys approx-error``: how close Nyström is to exact softmax attention, against its rivals.

For every head of the chosen source (synthetic draws or a real BERT's layers), every method at
every budget m: relative errors of the attention matrix and of the output, row-sum deviation,
and Nyström's pseudo-inverse residual. The numerical work lives beside it in this package.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import pandas as pd
import torch
from omegaconf import DictConfig, OmegaConf
from rich.console import Console
from rich.markup import escape

from nyscli.attention import available, pairs_per_query
from nyscli.checkpoints.hf_import import check_checkpoint_spec, is_checkpoint_spec
from nyscli.console import heartbeat
from nyscli.data.table import is_table
from nyscli.errors import UserInputError
from nyscli.experiments import schema
from nyscli.experiments.approx_error import cache as source_cache
from nyscli.experiments.approx_error import fidelity as approx_fidelity
from nyscli.experiments.approx_error import memory as approx_memory
from nyscli.experiments.approx_error import methods as approx_methods
from nyscli.experiments.approx_error import plots, sources
from nyscli.experiments.approx_error.evaluate import evaluate_head, iter_heads
from nyscli.experiments.approx_error.progress import ProgressLog, log_to_file
from nyscli.experiments.approx_error.rules import attentions, check
from nyscli.experiments.approx_error.sample_text import SAMPLE_TEXT
from nyscli.experiments.approx_error.settings import (
    DTYPES,
    budget_unit,
    budgets,
    seq_len,
    text_bytes,
)
from nyscli.experiments.approx_error.summary import per_layer
from nyscli.experiments.approx_error.tables import budget_symbol, render
from nyscli.experiments.approx_error.texts import file_text
from nyscli.train.resources import resolve_device

log = logging.getLogger(__name__)

# One item of methods / baselines (the lists may be empty, and repeat a name).
METHOD = schema.Choice(values=approx_methods.METHODS)
BASELINE = schema.Choice(values=approx_methods.BASELINES)


def _one_of(key: str, value: object, rule: schema.Choice) -> None:
    """``rule``'s test, refused in the words these keys have always used (``choose``)."""
    if not rule.ok(value):
        raise UserInputError(f"{key}={value} is not allowed; choose {rule.allowed()}")


def validate(cfg: DictConfig) -> None:
    """Cheap checks; a ``UserInputError`` naming the bad value and what is allowed."""
    check(cfg)
    schema.check_attentions(attentions(cfg))
    if cfg.source == "checkpoint" and not cfg.get("checkpoint"):
        raise UserInputError(
            "source=checkpoint needs checkpoint=<minilm | hf:<folder or hub id> | nys pretrain "
            "folder | nys finetune run folder>"
        )
    if not cfg.methods and not cfg.baselines:
        raise UserInputError("methods=[] and baselines=[]: nothing to compare; name a method")
    for method in cfg.methods:
        _one_of("methods", method, METHOD)
        if approx_methods.core_name(method) not in available():
            raise UserInputError(
                f"methods={method} is not allowed: attention core "
                f"'{approx_methods.core_name(method)}' is not in this build; "
                f"choose from: {', '.join(available())}"
            )
    for baseline in cfg.baselines:
        _one_of("baselines", baseline, BASELINE)
    device = str(cfg.device)
    if device not in ("auto", "cpu") and not device.startswith("cuda"):
        raise UserInputError(f"device={device} is not allowed; choose one of: auto, cpu, cuda")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserInputError(f"device={device} but no CUDA device is available; use device=cpu")
    if cfg.attention.get("name") != "nystrom":
        raise UserInputError(
            f"attention={cfg.attention.get('name')} is not allowed here: attention.* holds the "
            "Nyström settings; pick rivals with methods=[...]"
        )
    approx_methods.check_distinct(list(cfg.methods), cfg.attention)
    if cfg.source == "checkpoint":
        if cfg.data.path is not None and not Path(cfg.data.path).is_file():
            raise UserInputError(f"data.path={cfg.data.path} is not a readable file")
        if cfg.data.path is not None and is_table(str(cfg.data.path)):
            file_text(cfg, str(cfg.data.path), "data.path", text_bytes(cfg))
        spec = str(cfg.checkpoint)
        if is_checkpoint_spec(spec):
            check_checkpoint_spec(spec, "checkpoint")
        elif not Path(spec).expanduser().is_dir():
            raise UserInputError(f"checkpoint={spec} is not a folder, minilm or hf:<...>")
    if cfg.fidelity.path is not None:  # refused before the run: no such file, fewer than 2 texts
        approx_fidelity.fidelity_texts(cfg)
    if cfg.source == "minilm":
        if seq_len(cfg) > sources.MINILM_MAX_TOKENS:
            raise UserInputError(
                f"seq_len={cfg.seq_len} is not allowed with source=minilm; "
                f"the model reads at most {sources.MINILM_MAX_TOKENS} tokens"
            )
        if cfg.data.path is not None:
            file_text(cfg, str(cfg.data.path), "data.path", text_bytes(cfg))
        hint = sources.minilm_missing()
        if hint:
            raise UserInputError(hint)
    approx_memory.check_memory(cfg)


def source_text(cfg: DictConfig) -> str | None:
    """The text a real model reads (``data.path``: a text file, or a table file's
    ``task.text_column`` joined by blank lines; else the built-in sample); None for the
    synthetic sources."""
    if cfg.source in ("gaussian", "smooth"):
        return None
    if cfg.data.path is None:
        return SAMPLE_TEXT
    return file_text(cfg, str(cfg.data.path), "data.path", text_bytes(cfg))


def load_inputs(cfg: DictConfig, text: str | None = None) -> list[sources.AttentionInputs]:
    """The Q, K, V under study, one ``AttentionInputs`` per layer, in float64 on the CPU (a
    real model's in its own dtype); ``text``: ``source_text(cfg)`` if already read."""
    n = seq_len(cfg)
    if cfg.source == "gaussian":
        return [sources.gaussian(n, cfg.head_dim, cfg.heads, cfg.scale, cfg.seed)]
    if cfg.source == "smooth":
        return [
            sources.smooth(n, cfg.head_dim, cfg.heads, cfg.scale, cfg.correlation_length, cfg.seed)
        ]
    text = source_text(cfg) if text is None else text
    if cfg.source == "checkpoint":
        return sources.checkpoint(str(cfg.checkpoint), text, n, cfg.max_sequences)
    return sources.minilm(text, n, cfg.max_sequences)


def core_configs(
    cfg: DictConfig, n: int, budget_list: list[int]
) -> dict[tuple[str, int | None], tuple[str, dict[str, Any]]]:
    """(label, budget) -> (method, ``build_attention`` config) for every requested method;
    unbudgeted methods once (None). A budget is Nyström's m, or with ``budget_unit=pairs``
    scored pairs per query for all."""
    attention = OmegaConf.to_container(cfg.attention, resolve=True)
    configs: dict[tuple[str, int | None], tuple[str, dict[str, Any]]] = {}
    for method in cfg.methods:
        label = approx_methods.method_label(method, attention)
        for m in [None] if method in approx_methods.UNBUDGETED else budget_list:
            if (label, m) not in configs:
                config = approx_methods.core_config(
                    method, m or 0, n, attention, cfg.seed, budget_unit(cfg)
                )
                configs[label, m] = (method, config)
    return configs


def pairs_frame(
    configs: dict[tuple[str, int | None], tuple[str, dict[str, Any]]], unit: str
) -> pd.DataFrame:
    """One row per budgeted (method label, budget) of ``core_configs``: the scored pairs per
    query the budget stands for in ``unit`` (``pairs_asked``) and those its core scores
    (``pairs_used``)."""
    rows = [
        (label, m, approx_methods.pairs_asked(method, m, unit), pairs_per_query(config))
        for (label, m), (method, config) in configs.items()
        if m is not None
    ]
    frame = pd.DataFrame(rows, columns=["method", "budget", "pairs_asked", "pairs_used"])
    return frame.astype({"budget": "Int64", "pairs_asked": "Int64", "pairs_used": "Int64"})


def run(cfg: DictConfig, run_dir: Path, console: Console) -> pd.DataFrame:
    """Measure every method on every head; write the two PNGs; return the long-format results.

    Columns: source, seq_len, head_dim, layer, sequence, head, n (real tokens of the head),
    method, budget (NA for methods without one), metric, value, then the run's settings.
    """
    df = measure(cfg, Path(run_dir), console)  # on the threads the job's launch set
    log_to_file(render(df))  # the console gets the same table from the launcher
    return df


def measure(cfg: DictConfig, run_dir: Path, console: Console) -> pd.DataFrame:
    """``run``'s measurement, before its table is logged."""
    dtype, device = DTYPES[cfg.dtype], resolve_device(str(cfg.device))
    text = source_text(cfg)
    cache = source_cache.SourceCache(
        source_cache.source_settings(cfg, text, device), source_cache.sweep_folder()
    )
    with heartbeat(log, f"approx-error: making q, k, v (source={cfg.source})"):
        layers = cache.inputs(lambda: [x.to(dtype, device) for x in load_inputs(cfg, text)])
    b, h, n, d = layers[0].q.shape
    budget_list = budgets(cfg)
    itemsize = torch.finfo(dtype).bits // 8
    with_matrix = n * n * itemsize <= cfg.max_matrix_mb * 2**20
    baselines = list(cfg.baselines)
    if "svd" in baselines and not (with_matrix and n <= cfg.svd_max_seq_len):
        console.print(
            f"[yellow]note:[/] no SVD baseline at n={n} (see max_matrix_mb, svd_max_seq_len)"
        )
        baselines.remove("svd")
    if not with_matrix:
        console.print(f"[yellow]note:[/] n={n} too large for n x n matrices: no matrix_error")
    if device.type == "cpu":  # a sweep's jobs in this process keep every head's S (and SVD)
        per_head = (n * n * (4 if "svd" in baselines else 1) if with_matrix else n * d) * itemsize
        cache.hold(
            len(layers) * b * h * per_head,
            approx_memory.estimated_peak(cfg),
            approx_memory.available_bytes(),
        )
    configs = core_configs(cfg, n, budget_list)
    cores = {
        key: approx_methods.build_core(config, cfg.seed) for key, (_, config) in configs.items()
    }
    unit = budget_unit(cfg)
    pairs = pairs_frame(configs, unit)
    for row in pairs[pairs.pairs_asked != pairs.pairs_used].itertuples():
        console.print(
            f"[yellow]note:[/] {escape(row.method)} at {row.budget} scores {row.pairs_used} "
            f"pairs a query, not {row.pairs_asked}: its options cannot meet that budget exactly"
        )
    nystrom_m = cfg.attention.num_landmarks * (2 if unit == "pairs" else 1)
    keep_budget = min(budget_list, key=lambda m: (abs(m - nystrom_m), m))
    example = (cfg.plot_layer, 0, cfg.plot_head)

    records, example_maps = [], {}
    n_heads = len(layers) * b * h
    with (
        torch.no_grad(),
        ProgressLog(n_heads * (len(cores) + len(baselines)), n_heads, console) as bar,
        heartbeat(log, "approx-error") as beat,
    ):

        def say(what: str) -> None:
            beat.say(f"approx-error {what}")

        heads = iter_heads(layers, with_matrix, "svd" in baselines, cache.fetch, say)
        for i, head in enumerate(heads):
            keep = (head.layer, head.sequence, head.head) == example
            say(f"head {i + 1}/{n_heads}: the methods")
            recs, maps = evaluate_head(
                head,
                cores,
                budget_list,
                baselines,
                keep_budget if keep else None,
                lambda label, m, i=i: bar.step(i, label, m),
            )
            records += recs
            example_maps.update(maps)
    cache.report()

    df = results_frame(records, cfg, n, d).merge(pairs, on=["method", "budget"], how="left")
    if cfg.fidelity.path is not None:
        approx_fidelity.write_fidelity(cfg, cores, run_dir, console, budget_symbol(df))
    if not cfg.plots:
        return df
    plots.error_vs_budget(df, run_dir / "error_vs_budget.png")
    plots.error_per_layer(
        per_layer(df),
        run_dir / "error_per_layer.png",
        title=f"source={cfg.source}, n={n}",
        symbol=budget_symbol(df),
    )
    if "exact" in example_maps:
        symbol = budget_symbol(df)
        title = (
            f"{cfg.source}: layer {example[0]}, head {example[2]}, n={n}; {symbol}={keep_budget}"
        )
        plots.attention_maps(example_maps, run_dir / "attention_maps.png", title)
    return df


def results_frame(records: list[dict[str, Any]], cfg: DictConfig, n: int, d: int) -> pd.DataFrame:
    """``evaluate_head``'s records as ``run``'s frame: the source and run settings beside them."""
    df = pd.DataFrame.from_records(records)
    df["budget"] = df["budget"].astype("Int64")
    df.insert(0, "source", cfg.source)
    df.insert(1, "seq_len", n)
    df.insert(2, "head_dim", d)
    synthetic = cfg.source not in ("minilm", "checkpoint")
    df["scale"] = cfg.scale if synthetic else math.nan
    df["correlation_length"] = cfg.correlation_length if cfg.source == "smooth" else math.nan
    df["dtype"] = cfg.dtype
    df["pinv"] = cfg.attention.pinv
    df["pinv_iterations"] = cfg.attention.pinv_iterations
    df["pinv_tolerance"] = cfg.attention.get("pinv_tolerance")
    df["seed"] = cfg.seed
    df["budget_unit"] = budget_unit(cfg)
    return df
