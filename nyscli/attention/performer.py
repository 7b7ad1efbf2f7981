"""Performer attention (Choromanski et al., ICLR 2021): FAVOR+ positive orthogonal features."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from nyscli.attention.core import Core, configure
from nyscli.attention.errors import AttentionConfigError
from nyscli.attention.kernelized import kernelized_attention
from nyscli.attention.masking import check_qkv
from nyscli.attention.registry import register
from nyscli.rules import Bool, Int


def orthogonal_gaussian(num_rows: int, dim: int, generator: torch.Generator) -> Tensor:
    """W: (num_rows, dim), float64 on the CPU, each row marginally N(0, I_dim).

    Rows come in blocks of ``dim`` mutually orthogonal directions (Haar-random, from QR with the
    sign fix), each scaled by the norm of an independent Gaussian vector, so every row has the
    Gaussian's length distribution and E[exp(w.x)] stays exp(|x|^2 / 2): the estimator is still
    unbiased, with lower variance than i.i.d. rows.
    """
    n_blocks = -(-num_rows // dim)
    gauss = torch.randn(n_blocks, dim, dim, generator=generator, dtype=torch.float64)
    basis, upper = torch.linalg.qr(gauss)
    basis = basis * torch.sign(torch.diagonal(upper, dim1=-2, dim2=-1))[:, None, :]
    directions = basis.transpose(-1, -2).reshape(n_blocks * dim, dim)[:num_rows]
    lengths = torch.randn(num_rows, dim, generator=generator, dtype=torch.float64).norm(dim=1)
    return directions * lengths[:, None]


def favor_features(
    x: Tensor, projection: Tensor, is_query: bool, key_padding_mask: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """Stabilised positive random features of x: (B, H, n, d) with projection W: (m, d).

    phi(x) = exp(W x' - |x'|^2 / 2) / sqrt(m) with x' = x / d^(1/4), so that
    E[phi(q) . phi(k)] = exp(q . k / sqrt(d)). To keep exp in range the largest exponent is
    subtracted first: per query row for queries, one value over all real keys of a sequence for
    keys (a per-row constant would not cancel between keys). Returns the features (B, H, n, m)
    and that subtracted offset (B, H, n, 1) or (B, H, 1, 1): phi = features * exp(offset).
    Padded keys get zero features. Computed in at least float32.
    """
    m, d = projection.shape
    dtype = torch.promote_types(x.dtype, torch.float32)
    x = x.to(dtype) * d**-0.25
    logits = x @ projection.to(dtype).T  # (B, H, n, m)
    # In-place updates keep one (n, m) buffer alive: no backward below needs overwritten values.
    logits.sub_((x * x).sum(dim=-1, keepdim=True) / 2)
    if not is_query and key_padding_mask is not None:
        logits.masked_fill_(~key_padding_mask[:, None, :, None], -torch.inf)  # zero features
    # The offset cancels between numerator and normaliser: no gradient needs to flow through it.
    with torch.no_grad():
        if is_query:
            offset = logits.amax(dim=-1, keepdim=True)
        else:
            offset = logits.amax(dim=(-1, -2), keepdim=True)
            # A sequence with no real key has offset -inf; any finite value will do there.
            offset = torch.where(offset.isfinite(), offset, torch.zeros_like(offset))
    features = logits.sub_(offset + 0.5 * math.log(m)).exp_()
    return features, offset


@register("performer")
class PerformerAttention(Core):
    """softmax attention estimated with FAVOR+: phi(Q) (phi(K)^T V) / phi(Q) (phi(K)^T 1).

    The projection W is a buffer (saved with the model), drawn from a generator seeded with
    ``seed`` when the head size is first seen; every layer built from the same config therefore
    starts from the same features.

    Args:
        num_features: m, the number of random features (paper row: 256).
        redraw: draw a fresh W (the next draw of the seeded generator) on every forward in
            training mode; evaluation always uses the current W.
        seed: seed of the feature generator, so runs are reproducible.
        causal: query i sees keys j <= i only (chunked prefix sums).
    """

    options = {"num_features": Int(low=1), "redraw": Bool(), "seed": Int(), "causal": Bool()}
    budget_key = "num_features"

    def __init__(
        self, num_features: int = 256, redraw: bool = False, seed: int = 0, causal: bool = False
    ) -> None:
        super().__init__()
        configure(self, locals())  # every argument checked against options
        self.generator = torch.Generator().manual_seed(seed)
        # Sized by the head dimension, known only at the first forward (or from a checkpoint).
        self.register_buffer("projection", None)

    def label(self) -> str:
        return f"performer-{self.num_features}"

    def pairs(self) -> int:
        return self.num_features

    @classmethod
    def at_pairs(cls, pairs: int) -> dict[str, Any]:
        return {"num_features": pairs}

    def redraw_features(self, head_dim: int, device: torch.device | None = None) -> None:
        """Replace W by the generator's next draw, (num_features, head_dim) in float32."""
        w = orthogonal_gaussian(self.num_features, head_dim, self.generator)
        self.projection = w.to(device=device, dtype=torch.float32)

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
        # The buffer starts as None, which load_state_dict would skip; give it a slot first.
        saved = state_dict.get(prefix + "projection")
        if saved is not None and self.projection is None:
            self.projection = torch.empty_like(saved)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        """q, k, v: (B, H, n, d); key_padding_mask: (B, n), True = real token -> (B, H, n, d)."""
        check_qkv(q, k, v, key_padding_mask)
        d = q.shape[-1]
        if self.projection is None or (self.training and self.redraw):
            self.redraw_features(d, q.device)
        if self.projection.shape[1] != d:
            raise AttentionConfigError(
                f"performer features were drawn for head_dim={self.projection.shape[1]}, "
                f"but the input has head_dim={d}"
            )
        with torch.autocast(device_type=q.device.type, enabled=False):
            phi_q, _ = favor_features(q, self.projection, is_query=True)
            phi_k, _ = favor_features(k, self.projection, False, key_padding_mask)
            out = kernelized_attention(phi_q, phi_k, v.to(phi_q.dtype), self.causal)
        return out.to(q.dtype)
