"""Fidelity users feel: a converted encoder's sentence embeddings against exact attention's.

The per-layer errors say how far each core's attention output is from exact attention; a user
of a sentence encoder sees the final embeddings. Here every text is read alone (cut at
``seq_len`` tokens) by the checkpoint's encoder with each method's core swapped into every
layer, no gradient step, and its mean-pooled last hidden state (MiniLM's sentence embedding)
is compared with the same encoder's under its own attention:

- cosine to exact, per text (mean and minimum);
- nearest-neighbour agreement: the share of texts whose most similar other text (cosine) is
  the same one as with exact attention; with T texts a random pick agrees 1 / (T - 1) of the
  time;
- the share whose exact nearest neighbour is among the approximate embeddings' ``TOP``
  nearest (recall at 3; a random pick 3 / (T - 1)): whether a lost neighbour is a near-tie
  moved down a place or lost altogether.

Uniform attention (every query gets the mean of V) is the trivial baseline. The run's side is
here too: ``fidelity.path``'s texts read and checked (a text file's paragraphs, or a table
file's ``task.text_column``, one text a row), the checkpoint's encoder loaded, and
``fidelity.csv`` with its table.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from pathlib import Path

import pandas as pd
import torch
from omegaconf import DictConfig
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from torch import Tensor, nn

from nyscli.console import heartbeat
from nyscli.data.common import pad_batch, read_text_file
from nyscli.data.pairs import layout
from nyscli.data.table import is_table
from nyscli.errors import UserInputError
from nyscli.experiments.approx_error.progress import log_to_file
from nyscli.experiments.approx_error.settings import DTYPES, TEXT_BYTES_PER_TOKEN, seq_len
from nyscli.experiments.approx_error.texts import table_texts
from nyscli.files import atomic_writer

log = logging.getLogger(__name__)

# Texts read at once: MiniLM at 512 tokens in float64 peaks at ~1 GB for 16.
BATCH = 16
# How far down the approximate ranking exact's nearest neighbour may stand for ``nn_in_top3``.
TOP = 3


class UniformAttention(nn.Module):
    """q, k, v (B, H, n, d), key_padding_mask (B, n) -> the mean of V over the real keys,
    for every query: the trivial baseline (no attention)."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None) -> Tensor:
        if mask is None:
            return v.mean(dim=2, keepdim=True).expand_as(v)
        weight = mask[:, None, :, None].to(v.dtype)
        mean = (v * weight).sum(2, keepdim=True) / weight.sum(2, keepdim=True)
        return mean.expand_as(v)


def paragraphs(text: str, max_texts: int) -> list[str]:
    """The first ``max_texts`` non-empty paragraphs of ``text`` (separated by blank lines)."""
    parts = (part.strip() for part in re.split(r"\n\s*\n", text))
    return [part for part in parts if part][:max_texts]


def token_batch(tokenizer: object, texts: list[str], seq_len: int) -> tuple[Tensor, Tensor]:
    """ids and mask (T, n) of each text alone: [CLS] its first seq_len - 2 tokens [SEP] (as
    fine-tuning lays out one text), padded to the longest."""
    rows = [
        torch.tensor(layout(tokens, None, seq_len, tokenizer.cls_id, tokenizer.sep_id)[0])
        for tokens in tokenizer.encode_batch(texts)
    ]
    return pad_batch(rows, seq_len, tokenizer.pad_id)


def embeddings(encoder: nn.Module, ids: Tensor, mask: Tensor) -> Tensor:
    """Mean-pooled last hidden states over the real tokens, (T, dim), ``BATCH`` texts at a
    time (texts are sorted by length first, so a batch pads little)."""
    order = mask.sum(1).argsort()
    out = torch.empty(len(ids), encoder.config.dim, dtype=torch.float64)
    with torch.no_grad():
        for start in range(0, len(ids), BATCH):
            rows = order[start : start + BATCH]
            width = int(mask[rows].sum(1).max())
            hidden = encoder(ids[rows, :width], mask[rows, :width])
            weight = mask[rows, :width, None].to(hidden.dtype)
            out[rows] = ((hidden * weight).sum(1) / weight.sum(1)).double()
    return out


def similarity(x: Tensor) -> Tensor:
    """Cosine similarity of every row to every other row (T, T), -2 on the diagonal (a text
    is never its own neighbour)."""
    unit = torch.nn.functional.normalize(x, dim=-1)
    return (unit @ unit.T).fill_diagonal_(-2.0)


def nearest(x: Tensor) -> Tensor:
    """Each row's most cosine-similar other row (T,)."""
    return similarity(x).argmax(-1)


def compare(exact: Tensor, approx: Tensor) -> dict[str, float]:
    """Cosine of each text's embedding to exact (mean, min), nearest-neighbour agreement, and
    the share of texts whose exact nearest neighbour is among approx's ``TOP`` nearest."""
    cosine = torch.nn.functional.cosine_similarity(exact, approx, dim=-1)
    target = nearest(exact)
    ranked = similarity(approx)
    top = ranked.topk(min(TOP, len(exact) - 1), dim=-1).indices  # (T, TOP)
    return {
        "cosine_mean": float(cosine.mean()),
        "cosine_min": float(cosine.min()),
        "nn_agreement": float((target == ranked.argmax(-1)).double().mean()),
        "nn_in_top3": float((top == target[:, None]).any(-1).double().mean()),
    }


def fidelity(
    encoder: nn.Module,
    tokenizer: object,
    texts: list[str],
    seq_len: int,
    cores: Mapping[tuple[str, int | None], nn.Module],
    step: object = None,
) -> pd.DataFrame:
    """One row per (method, budget) of ``cores`` and the uniform baseline: ``compare`` of its
    embeddings with the encoder's own, and the number of texts. ``step(label)`` is called
    as each row starts (progress)."""
    ids, mask = token_batch(tokenizer, texts, seq_len)
    blocks = encoder.encoder.blocks
    own = [block.attention.core for block in blocks]
    exact = embeddings(encoder, ids, mask)
    rows = []
    swaps = {**cores, ("uniform", None): UniformAttention()}
    try:
        for (label, budget), core in swaps.items():
            if step is not None:
                step(label)
            for block in blocks:
                block.attention.core = core
            scores = compare(exact, embeddings(encoder, ids, mask))
            rows.append({"method": label, "budget": budget, **scores, "texts": len(texts)})
    finally:
        for block, core in zip(blocks, own, strict=True):
            block.attention.core = core
    frame = pd.DataFrame(rows)
    frame["budget"] = frame["budget"].astype("Int64")
    return frame


def fidelity_texts(cfg: DictConfig) -> list[str]:
    """The texts of ``fidelity.path`` (paragraphs of a text file, or the rows of a table
    file's ``task.text_column``; at most ``fidelity.max_texts``); one-line errors for a run
    that cannot have them."""
    if cfg.source != "checkpoint":
        raise UserInputError(
            f"fidelity.path={cfg.fidelity.path} needs source=checkpoint (an encoder whose "
            f"embeddings to compare); source={cfg.source} has none"
        )
    count, path = int(cfg.fidelity.max_texts), str(cfg.fidelity.path)
    if is_table(path):
        texts = table_texts(cfg, path, "fidelity.path", count, TEXT_BYTES_PER_TOKEN * seq_len(cfg))
    else:
        limit = TEXT_BYTES_PER_TOKEN * seq_len(cfg) * count
        texts = paragraphs(read_text_file(Path(path), "fidelity.path", limit_bytes=limit), count)
    if len(texts) < 2:
        raise UserInputError(
            f"fidelity.path={cfg.fidelity.path} holds {len(texts)} text; nearest neighbours "
            "need at least 2 (texts are separated by blank lines, or one a row of a table)"
        )
    return texts


def measure_fidelity(
    cfg: DictConfig, cores: Mapping[tuple[str, int | None], nn.Module]
) -> pd.DataFrame:
    """``fidelity`` of every core on the texts of ``fidelity.path``, read by the checkpoint's
    encoder in the run's dtype."""
    from nyscli.checkpoints.capture import load_encoder

    texts = fidelity_texts(cfg)
    encoder, tokenizer = load_encoder(str(cfg.checkpoint))
    encoder = encoder.to(DTYPES[cfg.dtype])
    total = len(cores) + 1
    done = iter(range(1, total + 1))
    with heartbeat(log, "approx-error: fidelity") as beat:
        return fidelity(
            encoder, tokenizer, texts, seq_len(cfg), cores,
            lambda label: beat.say(f"fidelity {next(done)}/{total}: {label}"),
        )  # fmt: skip


def fidelity_table(frame: pd.DataFrame, symbol: str = "m") -> Table:
    """The fidelity rows as a table (cosine to exact, nearest-neighbour agreement, exact's
    neighbour among the top 3); ``symbol`` heads the budget column, as in the error tables."""
    texts = int(frame.texts.iloc[0])
    top = min(TOP, texts - 1)
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


def write_fidelity(
    cfg: DictConfig,
    cores: Mapping[tuple[str, int | None], nn.Module],
    run_dir: Path,
    console: Console,
    symbol: str,
) -> None:
    """``measure_fidelity`` into ``fidelity.csv``, and its table on the console and in the log."""
    frame = measure_fidelity(cfg, cores)
    with atomic_writer(run_dir / "fidelity.csv", "w") as handle:
        frame.to_csv(handle, index=False)
    table = fidelity_table(frame, symbol)
    console.print(table)
    log_to_file(table)
