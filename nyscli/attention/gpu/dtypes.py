"""The dtype rules every GPU op follows, on the torch side (no triton import at load).

- operands: the dtype a core's products of q take: autocast's (not for float64), else q's.
- compute: what sums, softmaxes and pseudo-inverse iterates are held in: float64 for float64
  inputs, float32 otherwise, whatever the operands.
- rounding: what a kernel rounds the q, k, v and landmark tiles it reads to: the half dtype of
  half work (also for float32 landmarks beside bf16 q: a compiled dot refuses bf16 by
  float32), none for float32/float64 work.
- products: how float32 tiles are multiplied (``gates``: by the operands' width).
"""

from __future__ import annotations

from functools import cache
from typing import Any

import torch
from torch import Tensor

from nyscli.attention.gpu import gates

HALF = (torch.bfloat16, torch.float16)


def block(size: int) -> int:
    """The power-of-two tile (at least 16) that holds ``size``."""
    return max(16, 1 << (size - 1).bit_length())


def compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def operand_dtype(q: Tensor) -> torch.dtype:
    """The dtype a core's products of q take: autocast's (not for float64), else q's."""
    if torch.is_autocast_enabled(q.device.type) and q.dtype != torch.float64:
        return torch.get_autocast_dtype(q.device.type)
    return q.dtype


def width(operands: torch.dtype) -> str:
    """ "16-bit" for half work, "32-bit" otherwise: the key of per-width gates and products."""
    return "16-bit" if operands in HALF else "32-bit"


def products(operands: torch.dtype) -> str:
    """How float32 tiles are multiplied in work on ``operands`` ("tf32" or "tf32x3")."""
    return gates.current().products[width(operands)]


@cache
def triton_dtype(dtype: torch.dtype) -> Any:
    """Triton's name for a torch dtype the kernels take."""
    import triton.language as tl

    names = {torch.float64: tl.float64, torch.float32: tl.float32}
    return {**names, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[dtype]


def rounding(operands: torch.dtype) -> Any:
    """The Triton dtype kernels round their q, k, v and landmark tiles to in work on
    ``operands``: the half dtype itself, else float32 (``helpers.rounded`` keeps such tiles
    as they are)."""
    return triton_dtype(operands if operands in HALF else torch.float32)
