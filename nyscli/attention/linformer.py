"""Linformer (Wang et al., 2020): learned low-rank projections of K and V along the sequence."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from nyscli.attention.core import Core, configure
from nyscli.attention.errors import AttentionConfigError, not_causal
from nyscli.attention.masking import check_qkv, zero_padded
from nyscli.attention.registry import register
from nyscli.rules import Int


@register("linformer")
class LinformerAttention(Core):
    """softmax(Q (E K)^T / sqrt(d)) (F V) with learned E, F: (k, max_seq_len), shared by heads.

    An input of length n <= max_seq_len uses the first n columns of E and F (position j of the
    sequence always meets column j). Padded tokens' K and V rows are zeroed before projecting,
    so they add nothing to the k projected keys and values.

    Args:
        proj_dim: k, the projected length (paper: 256).
        max_seq_len: the longest input the projections are sized for. E and F hold
            2 * k * max_seq_len parameters (32 MiB in fp32 for the defaults 256 x 16384).
        causal: not supported; every projected key mixes the whole sequence.
    """

    options = {
        "proj_dim": Int(low=1),
        "max_seq_len": Int(low=1),
        "causal": not_causal("linformer", "each projected key and value mixes all positions"),
    }
    budget_key = "proj_dim"

    def __init__(self, proj_dim: int = 256, max_seq_len: int = 16384, causal: bool = False) -> None:
        super().__init__()
        configure(self, locals())  # every argument checked against options
        # The Linformer paper initialises the projections from N(0, 1/k).
        std = 1.0 / math.sqrt(proj_dim)
        self.proj_k = nn.Parameter(torch.randn(proj_dim, max_seq_len) * std)
        self.proj_v = nn.Parameter(torch.randn(proj_dim, max_seq_len) * std)

    def label(self) -> str:
        return f"linformer-{self.proj_dim}"

    def pairs(self) -> int:
        return self.proj_dim

    @classmethod
    def at_pairs(cls, pairs: int) -> dict[str, Any]:
        return {"proj_dim": pairs}

    @torch.no_grad()
    def init_for_conversion(self) -> None:
        """E = F = segment averaging, for a model converted from a softmax checkpoint.

        Row i averages the i-th of ``proj_dim`` near-equal runs of ``max_seq_len`` positions, so
        the converted model starts from softmax attention over averaged neighbouring keys and
        values (exact softmax attention when ``proj_dim == max_seq_len``). The paper's random
        N(0, 1/k) start mixes every token into every key: a pretrained model's attention is lost
        and fine-tuning from it stayed at chance on IMDB.
        """
        bounds = torch.linspace(0, self.max_seq_len, self.proj_dim + 1).round().long()
        position = torch.arange(self.max_seq_len)
        rows = (position >= bounds[:-1, None]) & (position < bounds[1:, None])  # (k, max_seq_len)
        rows = rows.to(self.proj_k.dtype)
        average = rows / rows.sum(dim=1, keepdim=True).clamp(min=1)
        self.proj_k.copy_(average)
        self.proj_v.copy_(average)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        """q, k, v: (B, H, n, d); key_padding_mask: (B, n), True = real token -> (B, H, n, d)."""
        check_qkv(q, k, v, key_padding_mask)
        n = q.shape[2]
        if n > self.max_seq_len:
            raise AttentionConfigError(
                f"linformer got a sequence of length {n} but attention.max_seq_len="
                f"{self.max_seq_len}; raise max_seq_len to at least {n}"
            )
        e = self.proj_k[:, :n].to(k.dtype)  # (k, n)
        f = self.proj_v[:, :n].to(v.dtype)
        k_low = e @ zero_padded(k, key_padding_mask)  # (B, H, k, d)
        v_low = f @ zero_padded(v, key_padding_mask)
        scores = q @ k_low.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, n, k)
        return torch.softmax(scores, dim=-1) @ v_low
