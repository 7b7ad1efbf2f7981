"""The approximations compared at one budget m, and the attention matrix each one implies.

Every core is linear in V, so the n x n matrix it implicitly applies is Ŝ = core(q, k, I_n);
``implied_columns`` gives it a block of columns at a time to bound memory, for any registered
core (``implied_matrix`` assembles the blocks; the matrix error needs only the blocks).
Budget m means: Nyström landmarks, and for every other method m scored query-key pairs per
query (the cores' own rule, ``config_at_pairs``: Linformer projected length k, Performer random
features, Longformer window m + 1, the Nyström-local hybrid's band, landmarks and heavy keys),
and rank m for the truncated SVD. ``budget_unit=pairs`` puts Nyström on the same scale (m/2
landmarks), so every method of a row costs the same.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from nyscli.attention import budget_key, build_attention, config_at_pairs, core_class
from nyscli.attention.nystrom_local import NystromLocalAttention
from nyscli.errors import UserInputError
from nyscli.experiments.approx_error.rules import BUDGET_UNITS
from nyscli.rules import show

# Nyström variants: method name -> landmark selection (None = as in the attention config).
NYSTROM_VARIANTS: dict[str, str | None] = {
    "nystrom": None,
    "nystrom_segment_means": "segment_means",
    "nystrom_random": "random",
    "nystrom_kmeans": "kmeans",
}
RIVALS = ("linformer", "performer", "longformer", "nystrom_local", "linear")


def _band_heavy(pairs: int) -> dict[str, Any]:
    """The hybrid without its far field at ``pairs``: a sixteenth to the landmarks that pick
    the heavy keys (1 pair each), half the rest to the band, the rest to heavy keys."""
    m = max(1, pairs // 16)
    neighbours = max(2, (pairs - m) // 4 * 2)  # even, so the window is odd
    heavy = max(0, pairs - m - neighbours)
    return {"window": neighbours + 1, "num_landmarks": m, "heavy_keys": heavy, "far_field": False}


def _landmarks_heavy(pairs: int) -> dict[str, Any]:
    """The hybrid without its band (a window of the token itself) at ``pairs``: half to the
    landmarks (2 pairs each), half to heavy keys."""
    m = max(1, pairs // 4)
    return {"window": 1, "num_landmarks": m, "heavy_keys": max(0, pairs - 2 * m)}


# Other forms of the hybrid at the same budget: its parts without the third (what each part
# buys; the band alone is longformer), and its routed design (k-means landmarks, each query
# scoring its routed keys).
HYBRID_FORMS = {
    "hybrid_band_heavy": _band_heavy,
    "hybrid_landmarks_heavy": _landmarks_heavy,
    "hybrid_routed": NystromLocalAttention.routed_at_pairs,
}
DEFAULT_UNIT = BUDGET_UNITS[0]  # of a config or a caller that names no unit
BASELINES = ("uniform", "svd")
# Methods with no budget knob: one row, whatever m.
UNBUDGETED = ("linear", "uniform")
METHODS = (*NYSTROM_VARIANTS, *RIVALS, *HYBRID_FORMS)
# What a row is, where its error is not the method's best: its rivals run untrained here (a
# trained model would learn Linformer's projections; Performer's features are a random draw),
# a window sees only nearby keys (on a smooth source most of the mass lies outside it), and the
# baselines bracket every method. Shown beside the rows and in the figure's legend.
NOTES = {
    "linformer": "untrained: random projections",
    "performer": "random features",
    "longformer": "window: misses far keys",
    "linear": "elu+1 kernel, not softmax",
    "hybrid_band_heavy": "ablation: no far field",
    "hybrid_landmarks_heavy": "ablation: no band",
    "hybrid_routed": "routed keys",
    "uniform": "trivial baseline",
    "svd": "best rank m (needs S)",
}
FOOTNOTES = {
    "untrained: random projections": "Linformer's E, F projections are random (untrained); "
    "training would fit them",
    "random features": "Performer: m random features (one draw per seed), unbiased but noisy",
    "window: misses far keys": "Longformer: each query sees its m + 1 neighbours; the "
    "attention mass beyond the window is lost",
    "trivial baseline": "uniform: every query gets the mean of V; a method above it is worse "
    "than no attention",
    "ablation: no far field": "hybrid_band_heavy: the hybrid's band and heavy keys alone "
    "(landmarks only pick the heavy keys), at the same budget",
    "ablation: no band": "hybrid_landmarks_heavy: the hybrid's landmarks and heavy keys, no "
    "band, at the same budget",
    "routed keys": "hybrid_routed: the hybrid with k-means landmarks, each "
    "query scoring the keys its nearest landmark favours, a narrow band, at the same budget",
    "pinv floor": "pinv floor: an exact pinv would more than halve the error; raise "
    "attention.pinv_iterations or set attention.pinv_tolerance",
    "exact pinv unstable": "exact pinv unstable: '… with exact pinv' is over 10x the row's "
    "error: in some heads the landmark kernel A is near-singular, and torch.linalg.pinv inverts "
    "its tiny singular values, which swamp those heads' output (they make its mean and spread); "
    "the iterative pinv stays bounded there",
}
# ``implied_columns`` sizes its core calls: one n x 4 d_v intermediate has about this many entries
# (268 MB in float64). Wider calls repeat the q, k work fewer times: at the defaults (n = 4,096)
# 2,048 columns a call measured ~12% faster than 1,024, same peak (the source's draw sets it).
BLOCK_ENTRIES = 1 << 25


def pairs_asked(method: str, budget: int, unit: str) -> int:
    """The scored pairs per query a row at ``budget`` stands for: with ``unit="landmarks"`` a
    Nyström row's budget is m landmarks, 2 m pairs; every other budget is pairs. A core whose
    options cannot meet it exactly (the hybrid's split at 1-4 pairs, odd budgets for
    Nyström and Longformer in pairs) scores another count, which approx-error records."""
    return 2 * budget if unit == "landmarks" and method in NYSTROM_VARIANTS else budget


def core_name(method: str) -> str:
    """The registered attention core a method runs on (``nystrom`` for every variant,
    ``nystrom_local`` for its ablations)."""
    if method in HYBRID_FORMS:
        return "nystrom_local"
    return "nystrom" if method in NYSTROM_VARIANTS else method


def method_label(method: str, attention: Mapping[str, Any]) -> str:
    """Row label: ``nystrom`` names its landmark selection unless it is the paper's; every
    Nyström row also names the settings of ``attention`` that differ from the core's defaults
    (``nystrom (pinv_iterations=12)``), so jobs of a sweep over them never share a label."""
    if method not in NYSTROM_VARIANTS:
        return method
    selection = NYSTROM_VARIANTS[method] or attention.get("landmarks", "segment_means")
    label = "nystrom" if selection == "segment_means" else f"nystrom_{selection}"
    settings = changed_settings(attention)
    return f"{label} ({', '.join(settings)})" if settings else label


def changed_settings(attention: Mapping[str, Any]) -> list[str]:
    """``key=value`` for each Nyström option in ``attention`` that is not the core's default,
    leaving out the budget (its own column) and the landmark selection (in the label)."""
    defaults = inspect.signature(core_class("nystrom")).parameters
    skip = {"name", "landmarks", budget_key({"name": "nystrom"})}
    return [
        f"{key}={show(value)}"
        for key, value in attention.items()
        if key in defaults and key not in skip and value != defaults[key].default
    ]


def check_distinct(methods: Sequence[str], attention: Mapping[str, Any]) -> None:
    """Refuse two methods that would compute the same rows (e.g. ``nystrom`` and
    ``nystrom_random`` under ``attention.landmarks=random``): one line naming both."""
    seen: dict[str, str] = {}
    for method in methods:
        label = method_label(method, attention)
        if label in seen:
            others = [m for m in methods if m not in NYSTROM_VARIANTS or m == "nystrom"]
            raise UserInputError(
                f"methods={seen[label]} and methods={method} compute the same rows with "
                f"attention.landmarks={attention.get('landmarks')} (nystrom uses it); to sweep "
                "attention.landmarks leave the landmark variants out, "
                f"e.g. methods=[{','.join(others)}]"
            )
        seen[label] = method


def core_config(
    method: str,
    budget: int,
    n: int,
    attention: Mapping[str, Any],
    seed: int,
    unit: str = DEFAULT_UNIT,
) -> dict[str, Any]:
    """The ``build_attention`` config of ``method`` at budget m for sequences of length n.

    Nyström variants take every key of ``attention`` (pinv settings, k-means steps, ...) and
    override the number and selection of landmarks: m, or with ``unit="pairs"`` the landmarks
    that cost m pairs. Every other method gets m pairs (``config_at_pairs``).
    """
    if method in NYSTROM_VARIANTS:
        landmarks = budget
        if unit == "pairs":
            landmarks = config_at_pairs("nystrom", budget)[budget_key(attention)]
        config = {**attention, budget_key(attention): landmarks}
        if NYSTROM_VARIANTS[method] is not None:
            config["landmarks"] = NYSTROM_VARIANTS[method]
        return config
    if method in HYBRID_FORMS:
        return {"name": "nystrom_local", **HYBRID_FORMS[method](budget)}
    if method not in METHODS:
        raise ValueError(f"unknown approximation method {method!r}")
    config: dict[str, Any] = {"name": method}
    if budget_key(config) is not None:
        config = config_at_pairs(method, budget)
    if method == "linformer":
        config["max_seq_len"] = n
    if method == "performer":
        config["seed"] = seed
    return config


def build_core(config: Mapping[str, Any], seed: int) -> nn.Module:
    """Build a core in eval mode with the global RNG seeded, then restored.

    Cores that draw parameters at construction (Linformer's projections) get the same draw
    for the same seed; their forward is deterministic in eval mode.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build_attention(config).eval()


@functools.lru_cache(maxsize=1)
def _identity(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """I_n, made once for the many cores and heads of a run (134 MB at n = 4,096 in float64);
    read only."""
    return torch.eye(n, dtype=dtype, device=device)


def implied_columns(
    core: nn.Module, q: Tensor, k: Tensor, key_padding_mask: Tensor | None
) -> Iterator[tuple[slice, Tensor]]:
    """Ŝ a block of columns at a time: (cols, Ŝ[..., cols]: (B, H, n, w)), left to right.

    Ŝ = core(q, k, I_n), the identity's columns given to the core as one wide v per call
    (every core takes v wider than q): what depends only on q and k (landmarks, the landmark
    kernel and its pinv, k-means's Lloyd steps, the band's scores) runs once per call, not
    once per d columns. Calls take ``BLOCK_ENTRIES // (B H n 4)`` columns at a time, so one
    n x 4 d_v intermediate has about ``BLOCK_ENTRIES`` entries.
    """
    b, h, n, d = q.shape
    width = max(d, BLOCK_ENTRIES // (b * h * n * 4))
    eye = _identity(n, q.dtype, q.device)
    for start in range(0, n, width):
        cols = slice(start, min(start + width, n))
        v = eye[:, cols].expand(b, h, n, -1)  # (B, H, n, w): I[:, cols]
        yield cols, core(q, k, v, key_padding_mask)


def implied_matrix(
    core: nn.Module, q: Tensor, k: Tensor, key_padding_mask: Tensor | None
) -> Tensor:
    """Ŝ: (B, H, n, n), the matrix with core(q, k, v) = Ŝ v for every v: (B, H, n, d_v),
    assembled from ``implied_columns`` (each block written once into Ŝ, no list and cat)."""
    b, h, n, _ = q.shape
    s_hat = None
    for cols, block in implied_columns(core, q, k, key_padding_mask):
        if cols.stop - cols.start == n:
            return block
        if s_hat is None:
            s_hat = block.new_empty(b, h, n, n)
        s_hat[..., cols] = block
    return s_hat


def implied_row_sums(
    core: nn.Module, q: Tensor, k: Tensor, key_padding_mask: Tensor | None
) -> Tensor:
    """Ŝ 1: (B, H, n), the row sums of the implied matrix, without forming it (v = ones)."""
    return core(q, k, torch.ones_like(q), key_padding_mask)[..., 0]
