"""Linear attention (Katharopoulos et al., ICML 2020): the ELU+1 feature map and its normaliser."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from nyscli.attention.core import CausalOnlyCore
from nyscli.attention.kernelized import kernelized_attention
from nyscli.attention.masking import check_qkv, zero_padded
from nyscli.attention.registry import register


def elu_feature_map(x: Tensor) -> Tensor:
    """phi(x) = elu(x) + 1 > 0 elementwise, x: (..., d) -> (..., d)."""
    return F.elu(x) + 1.0


@register("linear")
class LinearAttention(CausalOnlyCore):
    """out_i = phi(q_i)^T sum_j phi(k_j) v_j^T / phi(q_i)^T sum_j phi(k_j), phi = elu + 1.

    No 1/sqrt(d) scale: the kernel phi(q).phi(k) replaces exp(q.k / sqrt(d)) altogether.

    Args:
        causal: query i sees keys j <= i only (prefix sums over the sequence).
    """

    def label(self) -> str:
        return "linear"

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        """q, k, v: (B, H, n, d); key_padding_mask: (B, n), True = real token -> (B, H, n, d)."""
        check_qkv(q, k, v, key_padding_mask)
        phi_k = zero_padded(elu_feature_map(k), key_padding_mask)
        return kernelized_attention(elu_feature_map(q), phi_k, v, self.causal)
