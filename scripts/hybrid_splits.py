#!/usr/bin/env python3
"""How far a per-head split of the hybrid's budget can go on MiniLM's real attention.

The hybrid (``attention=nystrom_local``) spends its budget of scored pairs per query on a band
(w - 1), landmarks (2 m) and heavy keys (g). This script scores every split of one budget on
every head of MiniLM reading seeded IMDB test reviews, in float64, against exact attention.
It then picks a split per head (and per layer) on the first sequences, the calibration ones,
and measures the choice on the others, the held-out ones. No gradient step; nothing is
written into the project.

    .venv/bin/python scripts/hybrid_splits.py --out /tmp/splits   # about 2 minutes, 2 cores
    .venv/bin/python scripts/hybrid_splits.py --routed --out /tmp/routed   # about 6 minutes

``--routed`` scores the routed design's splits instead: k-means landmarks of the queries, each
query also scoring its nearest landmark's K favourite keys (``routed_keys``), w - 1 + 2 m + g + K
= budget
for w in 1, 9, 17, 33, m in 16, 24, 32 and g in 0, 8 (24 splits); the best of them on the
calibration sequences is ``NystromLocalAttention.routed_at_pairs``.

Prints one table, last: the pooled output error (mean over heads of ||SV - ŜV|| / ||SV||,
as ``nys approx-error`` reports it) of the default split, the best split for all heads, a
split per layer and a split per head, each on the held-out sequences; and the oracle, a split
per head and sequence chosen on the held-out sequences themselves (a bound on what any split
choice can reach); and each query's own best budget + 1 keys with nothing for the rest (the
best any sparse support of that size does without a far-field estimate). Writes
``errors.csv`` (every head × split) and ``choice.csv`` under --out.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from nyscli.attention.nystrom_local import NystromLocalAttention  # noqa: E402
from nyscli.attention.softmax import SoftmaxAttention  # noqa: E402
from nyscli.experiments.approx_error.sources import minilm  # noqa: E402

IMDB = ROOT.parent / "shared" / "data" / "imdb" / "aclImdb_v1_labeled.csv.gz"
LANDMARKS = (1, 4, 8, 12, 16, 24, 32, 48, 64)  # m >= 1: the heavy keys come from its kernel
KEYS = ["layer", "head", "w", "m", "g", "r"]


def imdb_text(reviews: int, seed: int) -> str:
    """``reviews`` IMDB test reviews drawn with pandas' ``sample(random_state=seed)``, as
    docs/results/hybrid.md draws them."""
    frame = pd.read_csv(IMDB)
    test = frame[frame.split == "test"].sample(n=reviews, random_state=seed)
    return "\n\n".join(text.replace("<br />", " ") for text in test.review)


def splits(budget: int, step: int) -> list[tuple[int, int, int, int]]:
    """(w, m, g, 0) with w - 1 + 2 m + g = budget: the band in steps of ``step`` pairs."""
    out = []
    for band in range(0, budget + 1, step):
        for m in LANDMARKS:
            g = budget - band - 2 * m
            if g >= 0:
                out.append((band + 1, m, g, 0))
    return out


def routed_splits(budget: int) -> list[tuple[int, int, int, int]]:
    """(w, m, g, K) with w - 1 + 2 m + g + K = budget, K > 0 routed keys (budget 128: 24)."""
    out = []
    for band in (0, budget // 16, budget // 8, budget // 4):
        for m in (budget // 8, budget * 3 // 16, budget // 4):
            for g in (0, budget // 16):
                routed = budget - band - 2 * m - g
                if routed > 0:
                    out.append((band + 1, m, g, routed))
    return out


# Not a split: each query's own best keys (its largest scores, itself included), exact
# softmax over them, nothing for the rest. No sparse support of that size does better, so it
# says what the far field (the landmarks' part) must add.
TOP_KEYS = (0, 0, 0, 0)


def top_keys(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
             keys: int) -> torch.Tensor:  # fmt: skip
    """Softmax attention of each query over its ``keys`` largest scores only (B, H, n, d)."""
    scores = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).masked_fill(
        ~mask[:, None, None, :], float("-inf")
    )
    kept = scores.topk(min(keys, scores.shape[-1]), dim=-1).indices
    top = torch.full_like(scores, float("-inf")).scatter(-1, kept, scores.gather(-1, kept))
    return top.softmax(-1) @ v


def score(
    budget: int, step: int, sequences: int, reviews: int, seed: int, routed: bool = False
) -> pd.DataFrame:
    """One row per layer, sequence, head and split: its relative output error."""
    rows = []
    started = time.monotonic()
    for layer, inputs in enumerate(minilm(imdb_text(reviews, seed), 512, sequences)):
        q, k, v = (x.double() for x in (inputs.q, inputs.k, inputs.v))
        mask = inputs.key_padding_mask
        exact = SoftmaxAttention()(q, k, v, mask)
        real = mask[:, None, :, None].double()  # (B, 1, n, 1): pads are no rows
        norm = (exact * real).pow(2).sum(dim=(2, 3)).sqrt()  # (B, H)
        family = routed_splits(budget) if routed else splits(budget, step)
        landmarks = "query_kmeans" if routed else "segment_means"
        candidates = {(w, m, g, r): NystromLocalAttention(num_landmarks=m, window=w, heavy_keys=g,
                                                          routed_keys=r, landmarks=landmarks)
                      for w, m, g, r in family}  # fmt: skip
        candidates[TOP_KEYS] = lambda q, k, v, mask: top_keys(q, k, v, mask, budget + 1)
        for (w, m, g, r), attention in candidates.items():
            out = attention(q, k, v, mask)
            error = ((out - exact) * real).pow(2).sum(dim=(2, 3)).sqrt() / norm
            for b, h in torch.cartesian_prod(torch.arange(q.shape[0]), torch.arange(q.shape[1])):
                rows.append((layer, int(b), int(h), w, m, g, r, float(error[b, h])))
        print(f"layer {layer}: {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
    return pd.DataFrame(rows, columns=["layer", "sequence", "head", "w", "m", "g", "r", "error"])


def chosen(calibration: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """The split of least mean error over the calibration rows, per ``by`` group (one split
    for all heads when ``by`` is empty)."""
    mean = calibration.groupby([*by, "w", "m", "g", "r"]).error.mean().reset_index()
    if not by:
        return mean.nsmallest(1, "error")[["w", "m", "g", "r"]]
    return mean.loc[mean.groupby(by).error.idxmin(), [*by, "w", "m", "g", "r"]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=int, default=128, help="scored pairs per query")
    parser.add_argument("--step", type=int, default=16, help="the band's step, in pairs")
    parser.add_argument("--reviews", type=int, default=24, help="seeded IMDB test reviews")
    parser.add_argument("--sequences", type=int, default=13, help="512-token sequences read")
    parser.add_argument("--calibration", type=int, default=6, help="the first N calibrate")
    parser.add_argument("--seed", type=int, default=0, help="the reviews' random_state")
    parser.add_argument("--routed", action="store_true", help="the routed design's splits")
    parser.add_argument("--out", type=Path, required=True, help="folder for the CSVs")
    args = parser.parse_args()
    if not IMDB.is_file():
        print(f"error: {IMDB} is missing (the IMDB data beside the checkout)", file=sys.stderr)
        return 2
    errors = score(args.budget, args.step, args.sequences, args.reviews, args.seed, args.routed)
    args.out.mkdir(parents=True, exist_ok=True)
    errors.to_csv(args.out / "errors.csv", index=False)
    bound = errors[(errors.w == 0) & (errors.m == 0) & (errors.g == 0) & (errors.r == 0)]
    errors = errors.drop(bound.index)
    calibration = errors[errors.sequence < args.calibration]
    held = errors[errors.sequence >= args.calibration]
    if args.routed:
        default = NystromLocalAttention.routed_at_pairs(args.budget)
        name = "routed_at_pairs split"
    else:
        default = NystromLocalAttention.at_pairs(args.budget)
        name = "default split"
    split = (default["window"], default["num_landmarks"], default["heavy_keys"],
             default.get("routed_keys", 0))  # fmt: skip
    rows = {f"{name} w{split[0]} m{split[1]} g{split[2]} K{split[3]}": held[
        (held.w == split[0]) & (held.m == split[1]) & (held.g == split[2])
        & (held.r == split[3])]}  # fmt: skip
    per_head = chosen(calibration, ["layer", "head"])
    per_head.to_csv(args.out / "choice.csv", index=False)
    for label, choice in (
        ("one split for all heads (calibrated)", chosen(calibration, [])),
        ("a split per layer (calibrated)", chosen(calibration, ["layer"])),
        ("a split per head (calibrated)", per_head),
    ):
        rows[label] = held.merge(choice, on=[k for k in KEYS if k in choice.columns])
    best = held.groupby(["layer", "sequence", "head"]).error.idxmin()
    rows["oracle: a split per head and sequence (held-out's own)"] = held.loc[best]
    rows[f"bound: each query's best {args.budget + 1} keys, no far field"] = bound[
        bound.sequence >= args.calibration]  # fmt: skip
    table = pd.DataFrame(
        {
            label: {"pooled": f.error.mean(), **f.groupby("layer").error.mean().to_dict()}
            for label, f in rows.items()
        }  # fmt: skip
    ).T.round(3)
    held_out = held.sequence.nunique()
    family = f"{len(LANDMARKS)} landmark counts x bands in steps of {args.step}"
    if args.routed:
        family = f"{len(routed_splits(args.budget))} routed splits (query k-means landmarks)"
    best = chosen(calibration, []).iloc[0]
    print(f"budget {args.budget}; {family}; held-out: {held_out} sequences x 6 layers x 12 "
          f"heads; best on the calibration sequences: w {best.w}, m {best.m}, g {best.g}, "
          f"K {best.r}")  # fmt: skip
    print(table.to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
