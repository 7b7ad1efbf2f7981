"""Per-head evaluation: exact reference, then every approximation's metrics at every budget.

A "head" is one attention head of one sequence of one layer: q, k, v (1, 1, n, d) and its
padding mask. Metrics compare only the rows of real query tokens; the columns of padded keys
stay in, so weight an approximation puts on padding counts as error.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from nyscli.attention.masking import masked_softmax
from nyscli.attention.pinv import exact_pinv
from nyscli.attention.softmax import SoftmaxAttention
from nyscli.experiments.approx_error.methods import (
    implied_columns,
    implied_matrix,
    implied_row_sums,
)
from nyscli.experiments.approx_error.metrics import (
    pinv_residual,
    relative_error,
    relative_error_of_blocks,
    rowsum_deviation,
    svd_tail_errors,
)
from nyscli.experiments.approx_error.sources import AttentionInputs

Record = dict[str, Any]
Entry = dict[str, Tensor]  # what ``fetch`` stores per head: named tensors
Fetch = Callable[[str, Callable[[], Entry]], Entry]


@dataclass
class Head:
    """One head of one sequence and its exact attention.

    q, k, v: (1, 1, n, d); key_padding_mask: (1, n) or None; real: (n,) bool query/key mask;
    exact_output: (n_real, d) = S V on real rows; exact_matrix: (n_real, n) = S on real rows,
    or None when n x n is too large to form; svd: U (n_real, n_real), sigma (n_real,), V^T
    (n_real, n_real) of S's real block when known beforehand (a sweep's shared work), else
    ``svd_metrics`` computes them.
    """

    q: Tensor
    k: Tensor
    v: Tensor
    key_padding_mask: Tensor | None
    real: Tensor
    exact_output: Tensor
    exact_matrix: Tensor | None
    layer: int = 0
    sequence: int = 0
    head: int = 0
    svd: tuple[Tensor, Tensor, Tensor] | None = None  # of S's real block (``svd_factors``)

    @property
    def n_real(self) -> int:
        return int(self.real.sum())

    @functools.cached_property
    def matrix_norm(self) -> Tensor:
        """||S||_F of the real rows (every method's matrix error divides by it)."""
        return self.exact_matrix.norm()

    def ident(self) -> Record:
        return {"layer": self.layer, "sequence": self.sequence, "head": self.head, "n": self.n_real}


def exact_attention(
    q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, with_matrix: bool
) -> Entry:
    """Exact softmax attention of one head, q, k, v: (1, 1, n, d), mask (1, n) or None, on its
    real rows: ``output`` (n_real, d) = S V and, ``with_matrix``, ``matrix`` (n_real, n) = S."""
    real = real_tokens(q, key_padding_mask)
    if with_matrix:
        keep = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        s = real_part(masked_softmax(scores, keep)[0, 0], real)  # (n_real, n)
        return {"output": s @ v[0, 0], "matrix": s}
    return {"output": real_part(SoftmaxAttention()(q, k, v, key_padding_mask)[0, 0], real)}


def real_tokens(q: Tensor, key_padding_mask: Tensor | None) -> Tensor:
    """(n,) bool: the head's real tokens (all of them without a mask); q: (1, 1, n, d)."""
    if key_padding_mask is not None:
        return key_padding_mask[0]
    return torch.ones(q.shape[2], dtype=torch.bool, device=q.device)


def real_part(x: Tensor, real: Tensor, dim: int = 0) -> Tensor:
    """``x``'s entries at the real tokens along ``dim`` (0 or 1); real: (n,) bool. Without
    padding that is ``x`` itself, not a copy: at n = 4,096 each copy of an n x n matrix is
    134 MB written, several per method and head of a sweep."""
    if bool(real.all()):
        return x
    return x[real] if dim == 0 else x[:, real]


def exact_head(
    q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None, with_matrix: bool
) -> Head:
    """Exact softmax attention of one head; q, k, v: (1, 1, n, d), mask (1, n) or None."""
    exact = exact_attention(q, k, v, key_padding_mask, with_matrix)
    real = real_tokens(q, key_padding_mask)
    return Head(q, k, v, key_padding_mask, real, exact["output"], exact.get("matrix"))


def svd_factors(head: Head) -> tuple[Tensor, Tensor, Tensor]:
    """U (n_real, n_real), sigma (n_real,), V^T (n_real, n_real): the SVD of S's real block
    (padded columns of S are zero). Needs ``head.exact_matrix``."""
    u, sigma, vh = torch.linalg.svd(real_part(head.exact_matrix, head.real, 1), full_matrices=False)
    # Stored row-major: a sweep's cache checksums and writes them without another copy.
    return u.contiguous(), sigma, vh.contiguous()


def iter_heads(
    layers: list[AttentionInputs],
    with_matrix: bool,
    with_svd: bool = False,
    fetch: Fetch | None = None,
    say: Callable[[str], None] = lambda what: None,
) -> Iterator[Head]:
    """Every (layer, sequence, head) of the inputs as a ``Head`` with its exact attention and,
    ``with_svd`` (and S formed), the SVD of S. ``fetch(name, compute)`` returns a per-head
    entry, computing it only if a sweep's earlier job has not (``cache.SourceCache.fetch``);
    without it every entry is computed here. ``say(what)`` hears which head and which part of
    it (a minute each at n = 4,096) is being made."""
    fetch = fetch or (lambda name, compute: compute())
    suffix = "" if with_matrix else "-output"  # an entry without S serves no job that needs S
    total = sum(x.q.shape[0] * x.q.shape[1] for x in layers)
    count = 0
    for inputs in layers:
        b, h = inputs.q.shape[:2]
        for i in range(b):
            mask = None if inputs.key_padding_mask is None else inputs.key_padding_mask[i : i + 1]
            for j in range(h):
                q, k, v = (x[i : i + 1, j : j + 1] for x in (inputs.q, inputs.k, inputs.v))
                ids = f"{inputs.layer}-{i}-{j}"
                count += 1
                say(f"head {count}/{total}: exact attention{' matrix' if with_matrix else ''}")
                exact = fetch(
                    f"exact{suffix}-{ids}",
                    lambda q=q, k=k, v=v, mask=mask: exact_attention(q, k, v, mask, with_matrix),
                )
                real = real_tokens(q, mask)
                head = Head(q, k, v, mask, real, exact["output"], exact.get("matrix"))
                head.layer, head.sequence, head.head = inputs.layer, i, j
                if with_svd and with_matrix:
                    say(f"head {count}/{total}: SVD of the exact matrix")
                    factors = fetch(f"svd-{ids}", lambda head=head: svd_entry(head))
                    head.svd = (factors["u"], factors["sigma"], factors["vh"])
                yield head


def svd_entry(head: Head) -> Entry:
    """``svd_factors`` as a cache entry (u, sigma, vh)."""
    return dict(zip(("u", "sigma", "vh"), svd_factors(head), strict=True))


def core_metrics(
    core: nn.Module, head: Head, keep: bool = False
) -> tuple[dict[str, float], Tensor | None]:
    """Metrics of one core on one head and, ``keep`` and S known, its implied matrix
    (n_real, n); otherwise the matrix error is measured a block of Ŝ's columns at a time and
    Ŝ is never formed (n x n at n = 4,096: 134 MB allocated per method and head)."""
    mask, real = head.key_padding_mask, head.real
    out = real_part(core(head.q, head.k, head.v, mask)[0, 0], real)
    rows = real_part(implied_row_sums(core, head.q, head.k, mask)[0, 0], real)
    metrics = {
        "output_error": relative_error(out, head.exact_output),
        "rowsum_deviation": rowsum_deviation(rows),
    }
    s_hat = None
    if head.exact_matrix is not None and keep:
        s_hat = real_part(implied_matrix(core, head.q, head.k, mask)[0, 0], real)
        metrics["matrix_error"] = relative_error(s_hat, head.exact_matrix, head.matrix_norm)
    elif head.exact_matrix is not None:
        blocks = (
            (real_part(block[0, 0], real), head.exact_matrix[:, cols])
            for cols, block in implied_columns(core, head.q, head.k, mask)
        )
        metrics["matrix_error"] = relative_error_of_blocks(blocks, head.matrix_norm)
    # Nyström only, and only when it approximates (m >= n runs exact attention).
    if hasattr(core, "kernels") and core.num_landmarks < head.q.shape[2]:
        metrics.update(pinv_metrics(core, head))
    return metrics, s_hat


def pinv_metrics(core: nn.Module, head: Head) -> dict[str, float]:
    """Nyström's pinv residual ||AZA - A||/||A||, and (iterative pinv) its output error with
    an exact pinv in its place: the error the landmarks alone would leave."""
    f, a, b = core.kernels(head.q, head.k, head.key_padding_mask)
    z = core.pseudo_inverse(a)
    metrics = {"pinv_residual": pinv_residual(a.to(z.dtype), z).item()}
    if core.pinv == "iterative":
        exact = exact_pinv(a)
        out = f.to(exact.dtype) @ (exact @ (b.to(exact.dtype) @ head.v.to(exact.dtype)))
        out = out[0, 0][head.real].to(head.exact_output.dtype)
        metrics["exact_pinv_error"] = relative_error(out, head.exact_output)
    return metrics


def uniform_metrics(head: Head, keep: bool = False) -> tuple[dict[str, float], Tensor | None]:
    """Uniform attention over the real keys: every query gets the mean of V. Its matrix, one
    row repeated, is formed (n_real, n) only if ``keep``; the error broadcasts the row."""
    v_real = head.v[0, 0][head.real]
    out = v_real.mean(dim=0).expand_as(v_real)
    metrics = {"output_error": relative_error(out, head.exact_output), "rowsum_deviation": 0.0}
    s_hat = None
    if head.exact_matrix is not None:
        row = head.exact_matrix.new_zeros(head.exact_matrix.shape[1])
        row[head.real] = 1.0 / head.n_real
        metrics["matrix_error"] = relative_error(row, head.exact_matrix, head.matrix_norm)
        if keep:
            s_hat = row.expand_as(head.exact_matrix).clone()
    return metrics, s_hat


def svd_metrics(
    head: Head, ranks: list[int], keep_rank: int | None
) -> tuple[list[dict[str, float]], Tensor | None]:
    """Best rank-r approximations of S (truncated SVD of its real block), one dict per rank.

    Needs ``head.exact_matrix``; uses ``head.svd`` when known. Also returns the
    rank-``keep_rank`` matrix (n_real, n) if asked.
    """
    u, sigma, vh = head.svd if head.svd is not None else svd_factors(head)
    v_proj = vh @ head.v[0, 0][head.real]  # (n_real, d)
    ones_proj = vh.sum(dim=-1)  # (n_real,)
    errors = svd_tail_errors(sigma, ranks)
    results, kept = [], None
    for rank, error in zip(ranks, errors, strict=True):
        r = min(rank, len(sigma))
        out = u[:, :r] @ (sigma[:r, None] * v_proj[:r])
        rows = u[:, :r] @ (sigma[:r] * ones_proj[:r])
        results.append(
            {
                "output_error": relative_error(out, head.exact_output),
                "rowsum_deviation": rowsum_deviation(rows),
                "matrix_error": error,
            }
        )
        if rank == keep_rank:
            kept = torch.zeros_like(head.exact_matrix)
            kept[:, head.real] = u[:, :r] @ (sigma[:r, None] * vh[:r])
    return results, kept


def evaluate_head(
    head: Head,
    cores: dict[tuple[str, int | None], nn.Module],
    budgets: list[int],
    baselines: list[str],
    keep_budget: int | None = None,
    on_step: Callable[[str, int | None], None] | None = None,
) -> tuple[list[Record], dict[str, Tensor]]:
    """Long-format records (method, budget, metric, value + head ids) for one head.

    ``cores`` maps (label, budget) to a built core (budget None: no budget knob). Baselines
    ``uniform`` and ``svd`` (only where S is known). Returns also the implied matrices at
    ``keep_budget`` (real rows, real columns) by label, with the exact one under ``"exact"``.
    ``on_step(label, budget)`` is called after each core and each baseline (progress).
    """
    step = on_step or (lambda label, budget: None)
    records: list[Record] = []
    kept: dict[str, Tensor] = {}

    def kept_at(budget: int | None) -> bool:
        return keep_budget is not None and budget in (keep_budget, None)

    def add(label: str, budget: int | None, metrics: dict[str, float], s_hat: Tensor | None):
        for metric, value in metrics.items():
            records.append(
                {
                    **head.ident(),
                    "method": label,
                    "budget": budget,
                    "metric": metric,
                    "value": value,
                }
            )
        if s_hat is not None and kept_at(budget):
            kept[label] = real_part(s_hat, head.real, 1)

    for (label, budget), core in cores.items():
        add(label, budget, *core_metrics(core, head, kept_at(budget)))
        step(label, budget)
    if "uniform" in baselines:
        add("uniform", None, *uniform_metrics(head, kept_at(None)))
        step("uniform", None)
    if "svd" in baselines and head.exact_matrix is not None:
        results, s_hat = svd_metrics(head, budgets, keep_budget)
        for budget, metrics in zip(budgets, results, strict=True):
            add("svd", budget, metrics, s_hat if budget == keep_budget else None)
        step("svd", None)
    if keep_budget is not None and head.exact_matrix is not None:
        kept["exact"] = real_part(head.exact_matrix, head.real, 1)
    return records, kept
