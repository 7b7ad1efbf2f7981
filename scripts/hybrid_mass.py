#!/usr/bin/env python3
"""Where exact attention puts its mass, per layer, among the hybrid's parts (MiniLM, IMDB).

For the default hybrid (band w 65, 32 heavy keys, segment-means landmarks) and the routed design
(``attention=nystrom_local_routed``: band w 9, query k-means landmarks, 72 routed keys), this
script reads MiniLM's exact attention S on seeded IMDB test reviews (float64) and splits each
query's mass among the keys each part scores exactly (the band, then the heavy or routed keys
not in the band) and the rest, which only the far field (Nyström's estimate) covers. The
shares are averaged over the real queries of each head, then over the heads of a layer (the
figure's bars).

    .venv/bin/python scripts/hybrid_mass.py --out /tmp/mass   # about a minute, 2 cores

Writes ``mass.csv`` and ``mass.png`` (one panel per design, a stacked bar per layer) and
prints the table last. Nothing is written into the project.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from hybrid_splits import IMDB, imdb_text  # noqa: E402

from nyscli.attention import build_attention  # noqa: E402
from nyscli.experiments.approx_error.sources import minilm  # noqa: E402
from nyscli.output.plots import pyplot, save_figure  # noqa: E402

DESIGNS = {
    "default hybrid (w 65, m 16, g 32)": {"name": "nystrom_local"},
    "routed (w 9, m 24, K 72)": {"name": "nystrom_local", "window": 9, "num_landmarks": 24,
                                 "heavy_keys": 0, "routed_keys": 72,
                                 "landmarks": "query_kmeans"},
}  # fmt: skip
PARTS = ("band", "heavy keys", "routed keys", "far field only")


def supports(core, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each part's exact keys as (B, H, n, n) bool: the band, then heavy and routed keys
    outside it (each pair in one part, as the core counts it)."""
    b, h, n, _ = q.shape
    real = mask
    q_land, _, _, b_kernel, exists = core.landmark_side(q, k, mask, real)
    pos = torch.arange(n)
    band = ((pos[:, None] - pos[None, :]).abs() <= (core.window - 1) // 2).expand(b, h, n, n)
    heavy = torch.zeros(b, h, n, n, dtype=torch.bool)
    if core.heavy_keys:  # the same keys for every query of a head
        index, _ = core.heavy(b_kernel, real)
        is_heavy = torch.zeros(b, h, n, dtype=torch.bool).scatter(2, index, True)
        heavy = is_heavy[:, :, None, :].expand(b, h, n, n).clone()
    routed = torch.zeros(b, h, n, n, dtype=torch.bool)
    if core.routed_keys:
        group, favourites = core.routes(q, q_land, b_kernel, exists)  # (B, H, n), (B, H, m, K)
        chosen = favourites.gather(2, group[..., None].expand(-1, -1, -1, core.routed_keys))
        routed.scatter_(3, chosen, True)
    heavy &= ~band
    routed &= ~band & ~heavy
    return {"band": band, "heavy keys": heavy, "routed keys": routed}


def shares(sequences: int, reviews: int, seed: int) -> pd.DataFrame:
    rows = []
    for layer, inputs in enumerate(minilm(imdb_text(reviews, seed), 512, sequences)):
        q, k = inputs.q.double(), inputs.k.double()
        mask = inputs.key_padding_mask
        scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        s = scores.masked_fill(~mask[:, None, None, :], float("-inf")).softmax(-1)
        real = mask[:, None, :].double()  # (B, 1, n): real queries
        for design, config in DESIGNS.items():
            core = build_attention(config).double()
            found = supports(core, q, k, mask)
            covered = torch.zeros(s.shape[:-1], dtype=s.dtype)  # (B, H, n)
            for part in PARTS[:-1]:
                mass = (s * found[part]).sum(-1)  # each query's mass on the part's keys
                covered += mass
                per_head = (mass * real).sum(-1) / real.sum(-1)
                rows.append((design, layer, part, float(per_head.mean())))
            per_head = ((1 - covered) * real).sum(-1) / real.sum(-1)
            rows.append((design, layer, PARTS[-1], float(per_head.mean())))
        print(f"layer {layer} done", file=sys.stderr, flush=True)
    return pd.DataFrame(rows, columns=["design", "layer", "part", "share"])


def figure(frame: pd.DataFrame, path: Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, len(DESIGNS), figsize=(11, 4), sharey=True)
    colours = {"band": "#4c72b0", "heavy keys": "#dd8452", "routed keys": "#55a868",
               "far field only": "#c7c7c7"}  # fmt: skip
    for ax, design in zip(axes, DESIGNS, strict=True):
        table = frame[frame.design == design].pivot(index="layer", columns="part", values="share")
        bottom = pd.Series(0.0, index=table.index)
        for part in PARTS:
            if table[part].max() > 0:
                ax.bar(table.index, table[part], bottom=bottom, color=colours[part], label=part)
                bottom += table[part]
        ax.set_title(design, fontsize=10)
        ax.set_xlabel("layer")
        ax.set_ylim(0, 1)
    axes[0].set_ylabel("share of exact attention mass")
    handles = {h.get_label(): h for ax in axes for h in ax.get_legend_handles_labels()[0]}
    fig.legend(handles.values(), handles.keys(), loc="upper center", ncol=4, fontsize=9)
    fig.suptitle("MiniLM on IMDB: what each part of the hybrid scores exactly", y=1.04)
    save_figure(fig, path)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reviews", type=int, default=24, help="seeded IMDB test reviews")
    parser.add_argument("--sequences", type=int, default=13, help="512-token sequences read")
    parser.add_argument("--seed", type=int, default=0, help="the reviews' random_state")
    parser.add_argument("--out", type=Path, required=True, help="folder for the CSV and PNG")
    args = parser.parse_args()
    if not IMDB.is_file():
        print(f"error: {IMDB} is missing (the IMDB data beside the checkout)", file=sys.stderr)
        return 2
    frame = shares(args.sequences, args.reviews, args.seed)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "mass.csv", index=False)
    figure(frame, args.out / "mass.png")
    table = frame.pivot_table(index=["design", "part"], columns="layer", values="share")
    print(table.round(3).to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
