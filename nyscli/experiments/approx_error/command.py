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
from rich.console import Console, Group, RenderableType
from rich.markup import escape
from rich.table import Table

from nyscli.attention import available, pairs_per_query
from nyscli.checkpoints.hf_import import check_checkpoint_spec, is_checkpoint_spec
from nyscli.console import heartbeat
from nyscli.data.common import read_text_file
from nyscli.errors import UserInputError
from nyscli.experiments import schema
from nyscli.experiments.approx_error import cache as source_cache
from nyscli.experiments.approx_error import fidelity as approx_fidelity
from nyscli.experiments.approx_error import memory as approx_memory
from nyscli.experiments.approx_error import methods as approx_methods
from nyscli.experiments.approx_error import plots, sources
from nyscli.experiments.approx_error.evaluate import evaluate_head, iter_heads
from nyscli.experiments.approx_error.metrics import METRIC_LABELS
from nyscli.experiments.approx_error.progress import ProgressLog, log_to_file
from nyscli.experiments.approx_error.sample_text import SAMPLE_TEXT
from nyscli.experiments.approx_error.summary import per_layer, row_note, summarise
from nyscli.files import atomic_writer
from nyscli.train.resources import resolve_device

log = logging.getLogger(__name__)

DTYPES = {"fp64": torch.float64, "fp32": torch.float32}
SYNTHETIC_SEQ_LEN = 4096


RULES: dict[str, schema.Rule] = {
    "source": schema.Choice(values=sources.SOURCES),
    "seq_len": schema.OPTIONAL_COUNT,
    "head_dim": schema.WIDTH,
    "heads": schema.COUNT,
    "max_sequences": schema.COUNT,
    "svd_max_seq_len": schema.COUNT,
    "scale": schema.Float(low=0.0, low_open=True),
    "correlation_length": schema.Float(low=0.0, low_open=True),
    "max_matrix_mb": schema.Float(low=0.0, low_open=True),
    "seed": schema.SEED,
    "threads": schema.THREADS,
    "plot_layer": schema.Int(low=0),
    "plot_head": schema.Int(low=0),
    "budgets": schema.IntList(low=1, null=True),
    "budget_unit": schema.Choice(values=approx_methods.BUDGET_UNITS),
    "data.path": schema.Text(null=True),
    "dtype": schema.Choice(values=tuple(DTYPES)),
    "device": schema.DEVICE,
    "plots": schema.Bool(),
    "checkpoint": schema.Text(null=True),
    "fidelity.path": schema.Text(null=True),
    "fidelity.max_texts": schema.Int(low=2),
}


def _one_of(key: str, value: object, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise UserInputError(f"{key}={value} is not allowed; choose one of: {', '.join(allowed)}")


def budgets(cfg: DictConfig) -> list[int]:
    """Budgets m: ``budgets`` (a list or one number), else [attention.num_landmarks]."""
    value = cfg.budgets
    if value is None:
        value = [cfg.attention.num_landmarks]
    elif isinstance(value, int):
        value = [value]
    return [int(m) for m in value]


def seq_len(cfg: DictConfig) -> int:
    """n: ``seq_len``, or the source's default (4096 synthetic, 512 minilm)."""
    if cfg.seq_len is not None:
        return int(cfg.seq_len)
    real = cfg.source in ("minilm", "checkpoint")
    return sources.MINILM_MAX_TOKENS if real else SYNTHETIC_SEQ_LEN


def validate(cfg: DictConfig) -> None:
    """Cheap checks; a ``UserInputError`` naming the bad value and what is allowed."""
    schema.check(cfg, RULES)
    schema.check_attentions([("attention", cfg.attention)])
    if cfg.source == "checkpoint" and not cfg.get("checkpoint"):
        raise UserInputError(
            "source=checkpoint needs checkpoint=<minilm | hf:<folder or hub id> | nys pretrain "
            "folder | nys finetune run folder>"
        )
    if not cfg.methods and not cfg.baselines:
        raise UserInputError("methods=[] and baselines=[]: nothing to compare; name a method")
    for method in cfg.methods:
        _one_of("methods", method, approx_methods.METHODS)
        if approx_methods.core_name(method) not in available():
            raise UserInputError(
                f"methods={method} is not allowed: attention core "
                f"'{approx_methods.core_name(method)}' is not in this build; "
                f"choose from: {', '.join(available())}"
            )
    for baseline in cfg.baselines:
        _one_of("baselines", baseline, approx_methods.BASELINES)
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
    schema.check_attentions([("attention", cfg.attention)])
    approx_methods.check_distinct(list(cfg.methods), cfg.attention)
    if cfg.source == "checkpoint":
        if cfg.data.path is not None and not Path(cfg.data.path).is_file():
            raise UserInputError(f"data.path={cfg.data.path} is not a readable file")
        spec = str(cfg.checkpoint)
        if is_checkpoint_spec(spec):
            check_checkpoint_spec(spec, "checkpoint")
        elif not Path(spec).expanduser().is_dir():
            raise UserInputError(f"checkpoint={spec} is not a folder, minilm or hf:<...>")
    if cfg.fidelity.path is not None:
        fidelity_texts(cfg)  # refused before the run: no such file, fewer than 2 texts
    if cfg.source == "minilm":
        if seq_len(cfg) > sources.MINILM_MAX_TOKENS:
            raise UserInputError(
                f"seq_len={cfg.seq_len} is not allowed with source=minilm; "
                f"the model reads at most {sources.MINILM_MAX_TOKENS} tokens"
            )
        if cfg.data.path is not None:
            read_text_file(Path(cfg.data.path), "data.path", limit_bytes=text_bytes(cfg))
        hint = sources.minilm_missing()
        if hint:
            raise UserInputError(hint)
    check_memory(cfg)


def estimated_peak(cfg: DictConfig) -> int:
    """A run's peak bytes on the CPU, estimated before anything is allocated (``memory``)."""
    n, m = seq_len(cfg), max(budgets(cfg))
    itemsize = torch.finfo(DTYPES[cfg.dtype]).bits // 8
    with_matrix = n * n * itemsize <= cfg.max_matrix_mb * 2**20
    with_svd = "svd" in cfg.baselines and with_matrix and n <= cfg.svd_max_seq_len
    return approx_memory.estimated_bytes(
        str(cfg.source), n, int(cfg.heads), int(cfg.head_dim), int(cfg.max_sequences),
        float(cfg.correlation_length), m, itemsize, with_matrix, with_svd,
    )  # fmt: skip


def check_memory(cfg: DictConfig) -> None:
    """Refuse, before anything is allocated, a run whose estimated peak (see ``memory``) does
    not fit this machine's memory (CPU runs; a GPU run's tensors live on the GPU)."""
    if str(cfg.device).startswith("cuda"):
        return
    n, m = seq_len(cfg), max(budgets(cfg))
    what = f"seq_len={n}, budgets up to {m}, heads={cfg.heads}, dtype={cfg.dtype}"
    line = approx_memory.refusal(estimated_peak(cfg), approx_memory.available_bytes(), what)
    if line:
        raise UserInputError(line)


# Bytes of text read per token the run uses: WordPiece tokens of English average ~5 bytes,
# so 64 leaves room for long words and 4-byte characters; a file of any size is read only
# that far (a 300 MB file used to be tokenized whole: 12 GB, then a native crash).
TEXT_BYTES_PER_TOKEN = 64


def fidelity_texts(cfg: DictConfig) -> list[str]:
    """The texts of ``fidelity.path`` (paragraphs, at most ``fidelity.max_texts``); one-line
    errors for a run that cannot have them."""
    if cfg.source != "checkpoint":
        raise UserInputError(
            f"fidelity.path={cfg.fidelity.path} needs source=checkpoint (an encoder whose "
            f"embeddings to compare); source={cfg.source} has none"
        )
    limit = TEXT_BYTES_PER_TOKEN * seq_len(cfg) * int(cfg.fidelity.max_texts)
    text = read_text_file(Path(cfg.fidelity.path), "fidelity.path", limit_bytes=limit)
    texts = approx_fidelity.paragraphs(text, int(cfg.fidelity.max_texts))
    if len(texts) < 2:
        raise UserInputError(
            f"fidelity.path={cfg.fidelity.path} holds {len(texts)} text; nearest neighbours "
            "need at least 2 (texts are separated by blank lines)"
        )
    return texts


def measure_fidelity(
    cfg: DictConfig, cores: dict[tuple[str, int | None], torch.nn.Module], console: Console
) -> pd.DataFrame:
    """``fidelity.fidelity`` of every core on the texts of ``fidelity.path``, read by the
    checkpoint's encoder in the run's dtype."""
    from nyscli.checkpoints.capture import load_encoder

    texts = fidelity_texts(cfg)
    encoder, tokenizer = load_encoder(str(cfg.checkpoint))
    encoder = encoder.to(DTYPES[cfg.dtype])
    total = len(cores) + 1
    done = iter(range(1, total + 1))
    with heartbeat(log, "approx-error: fidelity") as beat:
        return approx_fidelity.fidelity(
            encoder, tokenizer, texts, seq_len(cfg), cores,
            lambda label: beat.say(f"fidelity {next(done)}/{total}: {label}"),
        )  # fmt: skip


def fidelity_table(frame: pd.DataFrame, symbol: str = "m") -> Table:
    """The fidelity rows as a table (cosine to exact, nearest-neighbour agreement, exact's
    neighbour among the top 3); ``symbol`` heads the budget column, as in the error tables."""
    texts = int(frame.texts.iloc[0])
    top = min(approx_fidelity.TOP, texts - 1)
    table = Table(
        title=f"embeddings vs exact attention ({texts} texts; a random neighbour agrees "
        f"{1 / (texts - 1):.1%}, falls in a random top {top} {top / (texts - 1):.1%})"
    )
    columns = ("method", symbol, "cosine mean", "cosine min", "same nearest neighbour",
               f"exact's neighbour in top {top}")  # fmt: skip
    for column in columns:
        table.add_column(column)
    for row in frame.itertuples():
        budget = "—" if pd.isna(row.budget) else str(row.budget)
        table.add_row(
            escape(str(row.method)), budget, f"{row.cosine_mean:.4f}", f"{row.cosine_min:.4f}",
            f"{row.nn_agreement:.1%}", f"{row.nn_in_top3:.1%}",
        )  # fmt: skip
    return table


def text_bytes(cfg: DictConfig) -> int:
    """How much of ``data.path`` a run reads: enough for max_sequences x seq_len tokens."""
    return TEXT_BYTES_PER_TOKEN * seq_len(cfg) * int(cfg.max_sequences)


def source_text(cfg: DictConfig) -> str | None:
    """The text a real model reads (``data.path``, else the built-in sample); None for the
    synthetic sources."""
    if cfg.source in ("gaussian", "smooth"):
        return None
    if cfg.data.path is None:
        return SAMPLE_TEXT
    return read_text_file(Path(cfg.data.path), "data.path", limit_bytes=text_bytes(cfg))


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


def source_settings(cfg: DictConfig, text: str | None, device: torch.device) -> dict[str, Any]:
    """Exactly the settings that determine the source's Q, K, V and each head's exact attention
    and SVD: the key of the work a sweep's jobs share (``cache``). No method's setting is in
    it (budgets, attention.*, methods, baselines, plots), so a sweep over those computes the
    source once; ``threads`` is left out too (it may change a last bit, never a result)."""
    settings: dict[str, Any] = {
        "source": str(cfg.source),
        "seq_len": seq_len(cfg),
        "dtype": str(cfg.dtype),
        "device": str(device),
    }
    if text is None:  # synthetic: drawn from these alone
        settings.update(head_dim=int(cfg.head_dim), heads=int(cfg.heads))
        settings.update(scale=float(cfg.scale), seed=int(cfg.seed))
        if cfg.source == "smooth":
            settings["correlation_length"] = float(cfg.correlation_length)
        return settings
    settings.update(max_sequences=int(cfg.max_sequences), text=source_cache.text_digest(text))
    if cfg.source == "checkpoint":
        spec = str(cfg.checkpoint)
        settings["checkpoint"] = [spec, source_cache.folder_fingerprint(spec)]
    return settings


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
                    method, m or 0, n, attention, cfg.seed, cfg.get("budget_unit", "landmarks")
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
    validate(cfg)
    threads = torch.get_num_threads()
    try:
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        df = measure(cfg, Path(run_dir), console)
        log_to_file(render(df))  # the console gets the same table from the launcher
        return df
    finally:
        torch.set_num_threads(threads)


def measure(cfg: DictConfig, run_dir: Path, console: Console) -> pd.DataFrame:
    """``run`` after validation, with the thread count set."""
    dtype, device = DTYPES[cfg.dtype], resolve_device(str(cfg.device))
    text = source_text(cfg)
    cache = source_cache.SourceCache(
        source_settings(cfg, text, device), source_cache.sweep_folder()
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
            len(layers) * b * h * per_head, estimated_peak(cfg), approx_memory.available_bytes()
        )
    configs = core_configs(cfg, n, budget_list)
    cores = {
        key: approx_methods.build_core(config, cfg.seed) for key, (_, config) in configs.items()
    }
    unit = cfg.get("budget_unit", "landmarks")
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
        fidelity = measure_fidelity(cfg, cores, console)
        with atomic_writer(run_dir / "fidelity.csv", "w") as handle:
            fidelity.to_csv(handle, index=False)
        table = fidelity_table(fidelity, budget_symbol(df))
        console.print(table)
        log_to_file(table)
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
    df["budget_unit"] = cfg.get("budget_unit", "landmarks")
    return df


def budget_symbol(df: pd.DataFrame) -> str:
    """How the budget column is headed: ``m`` (Nyström's landmarks, the default unit) or
    ``pairs`` (scored query-key pairs per query, ``budget_unit=pairs``)."""
    units = set(df["budget_unit"]) if "budget_unit" in df else set()
    return "pairs" if units == {"pairs"} else "m"


def _cell(mean: float, std: float) -> str:
    if pd.isna(mean):
        return ""
    if pd.isna(std):
        return f"{mean:.3g}"
    return f"{mean:.3g} ± {std:.2g}"


def render(df: pd.DataFrame) -> RenderableType:
    """Summary table: one row per method and budget, each metric as mean ± sd over heads;
    for a real model (several layers) a second table gives the output error per layer."""
    table = summary_table(df)
    layers = per_layer(df)
    return table if layers.empty else Group(table, layer_table(layers, budget_symbol(df)))


def layer_table(layers: pd.DataFrame, symbol: str = "m") -> Table:
    """``per_layer``'s frame as a table: one row per method and budget, one column per layer."""
    keys = [k for k in layers.columns if isinstance(k, str)]
    table = Table(title=f"mean {METRIC_LABELS['output_error']} per layer (over heads)")
    for key in keys:
        table.add_column(
            symbol if key == "budget" else key, justify="left" if key != "budget" else "right"
        )
    for layer in layers.columns[len(keys) :]:
        table.add_column(f"layer {layer}", justify="right")
    for row in layers.itertuples(index=False, name=None):
        labels = ["—" if pd.isna(v) else escape(str(v)) for v in row[: len(keys)]]
        table.add_row(*labels, *(_cell(v, math.nan) for v in row[len(keys) :]))
    return table


def summary_table(df: pd.DataFrame) -> Table:
    """One row per method and budget, each metric as mean ± sd over heads, a note saying what
    a row is (untrained rival, trivial baseline, pinv floor) and a footnote per note shown."""
    summary = summarise(df)
    metrics = [m for m in METRIC_LABELS if f"{m}_mean" in summary]
    run_keys = [k for k in summary.columns if k in ("job", "source", "seq_len")]
    notes = [row_note(row) for _, row in summary.iterrows()]
    off = pairs_off(df)
    table = Table(
        title="approx-error: approximation vs exact softmax attention (mean ± sd over heads)",
        caption="\n".join([_caption(df), *_footnotes(notes)]),
    )
    for key in run_keys:
        table.add_column(key, no_wrap=key == "job")  # the swept key=value, never cut
    table.add_column("method", no_wrap=True)
    table.add_column(budget_symbol(df), justify="right")
    table.add_column("heads", justify="right")
    for metric in metrics:
        table.add_column(METRIC_LABELS[metric], justify="right")
    table.add_column("note")
    for (_, row), note in zip(summary.iterrows(), notes, strict=True):
        budget = "—" if pd.isna(row["budget"]) else str(int(row["budget"]))
        used = off.get((row["method"], row["budget"]))
        if used is not None:  # the row's core scores another count than its budget says
            note = f"{note}; scores {used} pairs" if note else f"scores {used} pairs"
        cells = [_cell(row[f"{m}_mean"], row[f"{m}_std"]) for m in metrics]
        table.add_row(
            *(escape(str(row[k])) for k in run_keys),  # labels are data: "[...]" is no markup
            escape(str(row["method"])),
            budget,
            str(row["heads"]),
            *cells,
            escape(note),
        )
    return table


def pairs_off(df: pd.DataFrame) -> dict[tuple[str, int], int]:
    """(method, budget) -> the pairs a query its core scores, for the rows whose core cannot
    meet the budget exactly (``pairs_frame``); empty for results without those columns."""
    if "pairs_used" not in df:
        return {}
    rows = df.dropna(subset=["pairs_used"])
    rows = rows[rows.pairs_used != rows.pairs_asked].drop_duplicates(["method", "budget"])
    return {(r.method, r.budget): int(r.pairs_used) for r in rows.itertuples()}


def _caption(df: pd.DataFrame) -> str:
    """``source=..., n=..., d=...`` when the rows come from one source."""
    if "source" not in df or df["source"].nunique() != 1:
        return ""
    caption = f"source={df['source'].iloc[0]}"
    if "seq_len" in df:
        caption += f", n={df['seq_len'].iloc[0]}"
    if "head_dim" in df:
        caption += f", d={df['head_dim'].iloc[0]}"
    return caption


def _footnotes(notes: list[str]) -> list[str]:
    """One line explaining each note that appears, in order of first appearance."""
    return [
        escape(approx_methods.FOOTNOTES[n])
        for n in dict.fromkeys(notes)
        if n in approx_methods.FOOTNOTES
    ]
