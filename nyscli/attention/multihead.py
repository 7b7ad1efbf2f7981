"""Multi-head self-attention around any registered core: projections and a conv skip on V."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nyscli.attention.errors import AttentionConfigError
from nyscli.attention.masking import zero_padded
from nyscli.attention.registry import build_attention, check_wrapper_options

CHANNELS_LAST = torch.channels_last


def window_left(kernel_size: int) -> int:
    """Taps of the conv skip's window before each token (the rest lie after it)."""
    return (kernel_size - 1) // 2


class ValueConvSkip(nn.Module):
    """Depthwise convolution of V along the sequence, one filter per head (Nyströmformer's skip).

    v: (B, H, n, d) -> (B, H, n, d). Padded tokens are zeroed first so they never leak in.
    The filter (``conv.weight``, (H, 1, k, 1)) is run as a depthwise conv over the H*d channels
    in channels-last layout: oneDNN's depthwise kernels vectorise over channels, and with only
    the H channels of a per-head conv (H = 2 in LRA) most of each vector was padding, which made
    the skip several times slower than the attention core in training.
    """

    def __init__(self, num_heads: int, kernel_size: int) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.conv = nn.Conv2d(num_heads, num_heads, (kernel_size, 1), groups=num_heads, bias=False)

    def init_for_conversion(self) -> None:
        """Zero filter: a model converted from a checkpoint without the skip starts as its core.

        PyTorch's default init would add a random local mix of V to every pretrained layer.
        """
        nn.init.zeros_(self.conv.weight)

    def forward(self, v: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        v = zero_padded(v, key_padding_mask)
        b, h, n, d = v.shape
        left = window_left(self.kernel_size)
        right = self.kernel_size - 1 - left  # = left, or left + 1 for an even kernel
        # (B, H, n, d) -> (B, H*d, n, 1) stored as (B, n, H*d): channels last.
        x = v.transpose(2, 3).reshape(b, h * d, n, 1).contiguous(memory_format=CHANNELS_LAST)
        weight = self.conv.weight.repeat_interleave(d, dim=0)  # (H*d, 1, k, 1)
        y = F.conv2d(x, weight, padding=(right, 0), groups=h * d)  # (B, H*d, n + right-left, 1)
        y = y[:, :, right - left : right - left + n, 0]  # the window centred as today's
        return y.unflatten(1, (h, d)).transpose(2, 3)  # (B, H, n, d), a view


def check_width(dim: int, num_heads: int) -> None:
    """The one-line error unless ``dim`` splits into ``num_heads`` equal heads."""
    if dim % num_heads:
        raise AttentionConfigError(f"hidden size {dim} is not divisible by num_heads={num_heads}")


class MultiHeadAttention(nn.Module):
    """x: (B, n, dim) -> (B, n, dim): project to heads, run the core, add the conv skip, project.

    Args:
        dim: model width; must be divisible by ``num_heads``.
        num_heads: number of heads H (head_dim = dim / H).
        attention: the core's config, e.g. ``{"name": "nystrom", "num_landmarks": 64}``;
            ``conv_kernel_size`` (> 0 enables the skip) is read here, the rest by the core.
    """

    def __init__(self, dim: int, num_heads: int, attention: Mapping[str, Any]) -> None:
        super().__init__()
        check_width(dim, num_heads)
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.core = build_attention(attention)  # checks the core's own options
        check_wrapper_options(attention)
        kernel = int(attention.get("conv_kernel_size", 0) or 0)
        self.conv_skip = ValueConvSkip(num_heads, kernel) if kernel else None

    def split_heads(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """x: (B, n, dim) -> q, k, v each (B, H, n, head_dim)."""
        b, n, _ = x.shape
        qkv = self.qkv(x).view(b, n, 3, self.num_heads, self.head_dim)
        # Unbinding dim 2 before transposing lets backward stack the three gradients straight
        # into qkv's layout; permuting first made it stack them head-major and then copy the
        # (B, n, 3, H, d) gradient once more into place (~40 ms a layer at ListOps' shapes).
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(2))
        return q, k, v

    def forward(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """x: (B, n, dim); key_padding_mask: (B, n), True = real token -> (B, n, dim)."""
        q, k, v = self.split_heads(x)
        context = self.core(q, k, v, key_padding_mask)  # (B, H, n, head_dim)
        if self.conv_skip is not None:
            context = context + self.conv_skip(v, key_padding_mask)
        b, _, n, _ = context.shape
        return self.out(context.transpose(1, 2).reshape(b, n, -1))
