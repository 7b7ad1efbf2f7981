"""The Nyström-local hybrid's forward in one Triton program per block of queries
(``hybrid_kernels.py``): the band, the heavy keys and the landmarks under one normaliser, with
nothing of the band's size in memory. Inference only (no backward).

Reference: ``NystromLocalAttention.approximate`` (the torch path, in chunks of query blocks);
``tests/gpu/test_hybrid.py`` holds the two together in float64.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import torch
from torch import Tensor

from nyscli.attention.gpu import gates, ops
from nyscli.attention.gpu.dtypes import HALF, block, compute_dtype, operand_dtype, triton_dtype
from nyscli.attention.gpu.dtypes import width as operand_width

# The heavy keys share a register tile with the landmarks' scores.
MAX_HEAVY_KEYS = 64
HYBRID_BLOCK = 64  # queries per program, and keys per band tile


def gate(q: Tensor) -> str:
    """The hybrid's gate for q's work: it is checked per operand width, since its bf16/fp16
    products are not its float32 ones."""
    return f"hybrid-{operand_width(operand_dtype(q))}"


def serves(q: Tensor, v: Tensor, m: int, g: int) -> bool:
    """Whether the kernel serves the hybrid with m landmarks and g heavy keys for q: (B, H,
    n, d), v: (B, H, n, d_v) here (the caller checks that no gradient follows)."""
    return (
        gates.current().allows(gate(q), q.is_cuda)
        and ops.kernels_serve(q, v, m)
        and g <= MAX_HEAVY_KEYS
    )


def launch(
    q: Tensor, k: Tensor, v: Tensor, parts: Any, radius: int, operands: torch.dtype
) -> tuple[ops.Launch, Tensor]:
    """The kernel's launch and the output (B, H, n, d) it fills; arguments as
    ``hybrid_forward``'s, ``operands`` the band's products' dtype (half), or not half."""
    b, h, n, d = q.shape
    m, g = parts.z.shape[-1], parts.heavy_b.shape[-1]
    dtype = compute_dtype(q)
    operands = operands if operands in HALF else dtype
    out = torch.empty(v.shape, dtype=operands if operands in HALF else v.dtype, device=v.device)
    settings = gates.current().hybrid_launch
    args = {
        "q_ptr": q.contiguous(),
        "k_ptr": k.contiguous(),
        "v_ptr": v.contiguous(),
        "keys_ptr": parts.band_keys.reshape(b * h, n).contiguous(),
        "b_ptr": parts.b_kernel.contiguous(),
        "z_ptr": parts.z.contiguous(),
        "sk_ptr": parts.small_k.contiguous(),
        "sv_ptr": parts.small_v.contiguous(),
        "hb_ptr": parts.heavy_b.contiguous(),
        "hr_ptr": parts.heavy_real.reshape(b * h, g).contiguous(),
        "mass_ptr": parts.b_mass.reshape(b * h, m).contiguous(),
        "out_ptr": out,
        "n": n,
        "R": radius,
        "M": m,
        "G": g,
        "D": d,
        "scale": 1.0 / math.sqrt(d),
        "tiny": torch.finfo(dtype).tiny,
        "BQ": HYBRID_BLOCK,
        "BK": HYBRID_BLOCK,
        "BM": block(max(m, settings["min_tile"])),
        "BG": block(max(g, settings["min_tile"])),
        "BD": block(d),
        "OP": triton_dtype(operands),
        "DT": triton_dtype(dtype),
        "NATIVE": not gates.current().interpreting,
    }
    options = {"num_warps": settings["num_warps"], "num_stages": settings["num_stages"]}
    grid = (b * h, -(-n // HYBRID_BLOCK))
    return ops.Launch(
        "nyscli.attention.gpu.hybrid_kernels:hybrid_forward", grid, args, options
    ), out


def hybrid_forward(q: Tensor, k: Tensor, v: Tensor, parts: Any, radius: int) -> Tensor:
    """The hybrid's output (B, H, n, d) from q, k, v (B, H, n, d) and the parts every query
    block shares (``nystrom_local_parts.Parts``: Z, B', B' 1, heavy keys, [heavy; k~] keys and
    [heavy; B' V] values, the keys the band may score); the band |i - j| <= radius.

    Under autocast (or for bf16/fp16 inputs) the band's products run on the tensor cores in
    that dtype with float32 sums, the tiles rounded as they are read (no cast copies of q, k,
    v); the output is in that dtype. Everything else is float32 (float64 for float64 inputs).
    """
    run, out = launch(q, k, v, parts, radius, operand_dtype(q))
    run()
    return out


def _examples() -> Iterator[tuple[str, ops.Launch]]:
    """bf16 q, k, v at budget 128 (m = 16 landmarks, g = 32 heavy keys), n = 4,096, d = 64."""
    b, h, n, d, m, g = 1, 12, 4096, 64, 16, 32
    f32 = {"dtype": torch.float32}
    parts = SimpleNamespace(
        z=ops.meta(b, h, m, m, **f32),
        b_kernel=ops.meta(b, h, m, n, **f32),
        b_mass=ops.meta(b, h, m, 1, **f32),
        heavy_b=ops.meta(b, h, m, g, **f32),
        heavy_real=ops.meta(b, h, 1, 1, g, **f32),
        small_k=ops.meta(b, h, g + m, d, **f32),
        small_v=ops.meta(b, h, g + m, d, **f32),
        band_keys=ops.meta(b, h, n, 1, **f32),
    )
    q, k, v = (ops.meta(b, h, n, d) for _ in range(3))
    yield "hybrid forward (budget 128)", launch(q, k, v, parts, 8, torch.bfloat16)[0]


ops.register("hybrid", "hybrid", _examples)
