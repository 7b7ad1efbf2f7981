"""Nyström's output at inference in four kernels and no SDPA (``inference_kernels.py``).

Bk V split over the keys (enough programs to fill the GPU), the splits combined, W = pinv(A)
Bk V (the landmark forward program, ``landmark.py``) and softmax(q k~^T / sqrt(d)) W. One
custom op, which torch.compile keeps whole. Reference: ``reference.nystrom_inference``
(``NystromAttention.approximate_all``' torch path); ``tests/gpu/test_inference.py``.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from functools import cache
from typing import Any

import torch
from torch import Tensor

from nyscli.attention.gpu import gates, landmark, ops
from nyscli.attention.gpu.dtypes import (
    block,
    compute_dtype,
    operand_dtype,
    products,
    rounding,
    triton_dtype,
)

GATE = "inference"
INFERENCE_BLOCK = 64  # keys per tile of Bk V's splits, and queries per program of F W
# Keys per split of Bk V at least: each split leaves an m x d float32 partial, which was the
# whole of the op's memory over SDPA's (docs/results/gpu-notes.md, "splits").
MIN_SPLIT_KEYS = 1024


def serves(q: Tensor) -> bool:
    """Whether the op may serve q: (B, H, n, d) where the landmark programs do (the caller
    checks ``ops.kernels_serve`` and that no gradient follows): checked on this GPU."""
    return gates.current().allows(GATE, q.is_cuda)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@cache
def _programs_wanted(device: torch.device) -> int:
    """Bk V's programs to aim for: two per multiprocessor (a few under the interpreter)."""
    if device.type != "cuda":
        return 4
    return 2 * torch.cuda.get_device_properties(device).multi_processor_count


def _key_splits(n: int, heads: int, device: torch.device) -> tuple[int, int]:
    """(splits, keys per split) of Bk V over n keys in each of ``heads`` (sequence, head)
    pairs: enough to fill the GPU, each at least MIN_SPLIT_KEYS (but one) and a whole number
    of key tiles."""
    splits = max(1, min(_ceil(_programs_wanted(device), heads), n // MIN_SPLIT_KEYS))
    chunk = _ceil(_ceil(n, splits), INFERENCE_BLOCK) * INFERENCE_BLOCK
    return _ceil(n, chunk), chunk


def launches(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_land: Tensor,
    k_land: Tensor,
    exists: Tensor | None,
    key_padding_mask: Tensor | None,
    iterations: int,
    operands: torch.dtype,
) -> tuple[list[ops.Launch], Tensor]:
    """The op's four launches, in order, and the output (B, H, n, d) in ``operands`` that the
    last fills; arguments as ``nystrom_inference``'s, ``operands`` the products' dtype."""
    b, h, n, d = q.shape
    m = q_land.shape[2]
    # The kernels round the tiles as they read them, so no cast copies of q, k, v (SDPA's path
    # casts k, v, then q: three copies at once were most of the op's memory over SDPA's).
    q, k, v, q_land, k_land = (x.contiguous() for x in (q, k, v, q_land, k_land))
    dtype = compute_dtype(q)
    splits, chunk = _key_splits(n, b * h, q.device)
    acc = torch.empty(b * h * splits, m, d, dtype=dtype, device=q.device)
    top = torch.empty(b * h * splits, m, dtype=dtype, device=q.device)
    total = torch.empty_like(top)
    keep = None if key_padding_mask is None else key_padding_mask.to(torch.int8).contiguous()
    flags = None if exists is None else exists.to(torch.int8).contiguous()
    shape = {"heads": h, "scale": 1.0 / math.sqrt(d), "M": m, "D": d, "BM": block(m)}
    tiles = {**shape, "BD": block(d), "PREC": products(operands), "OP": rounding(operands)}
    native = not gates.current().interpreting
    split = ops.Launch(
        "nyscli.attention.gpu.inference_kernels:landmark_attention_split",
        (b * h, splits),
        {
            "ql_ptr": q_land, "k_ptr": k, "v_ptr": v, "keep_ptr": keep, "acc_ptr": acc,
            "top_ptr": top, "total_ptr": total, "n": n, "chunk": chunk,
            "BK": INFERENCE_BLOCK, "HAS_KEEP": keep is not None, "DT": triton_dtype(dtype),
            "NATIVE": native, **tiles,
        },
    )  # fmt: skip
    bv = torch.empty(b, h, m, d, dtype=dtype, device=q.device)
    combine = ops.Launch(
        "nyscli.attention.gpu.inference_kernels:landmark_attention_combine",
        (b * h,),
        {
            "acc_ptr": acc, "top_ptr": top, "total_ptr": total, "e_ptr": flags, "bv_ptr": bv,
            "heads": h, "splits": splits, "M": m, "D": d, "BM": tiles["BM"], "BD": tiles["BD"],
            "HAS_E": flags is not None,
        },
    )  # fmt: skip
    # W = pinv(A) Bk V: (B, H, m, d), float32/64
    weights, w = landmark.forward_launch(q_land, k_land, bv, exists, iterations, operands)
    out = torch.empty(q.shape, dtype=operands, device=q.device)
    output = ops.Launch(
        "nyscli.attention.gpu.inference_kernels:landmark_output",
        (b * h, _ceil(n, INFERENCE_BLOCK)),
        {
            "q_ptr": q, "kl_ptr": k_land, "w_ptr": w, "e_ptr": flags, "out_ptr": out, "n": n,
            "BQ": INFERENCE_BLOCK, "HAS_E": flags is not None, "NATIVE": native, **tiles,
        },
    )  # fmt: skip
    return [split, combine, weights, output], out


def _inference(*inputs: Any) -> Tensor:
    """Nyström's output (B, H, n, d) at inference from (q, k, v, q~, k~, exists,
    key_padding_mask, iterations): q, k, v (B, H, n, d), landmarks q~, k~ (B, H, m, d), which
    exist ((B, m) or None), key_padding_mask (B, n), True = real (None: all are). Under
    autocast its products take autocast's dtype, as SDPA's would, and so does the output. No
    autograd (the caller checks ``serves``)."""
    steps, out = launches(*inputs, operands=operand_dtype(inputs[0]))
    for launch in steps:
        launch()
    return out


nystrom_inference = ops.custom_op(
    "nystrom_inference",
    "(Tensor q, Tensor k, Tensor v, Tensor q_land, Tensor k_land, Tensor? exists,"
    " Tensor? key_padding_mask, int iterations) -> Tensor",
    _inference,
    lambda q, k, v, q_land, k_land, exists, mask, iterations: q.new_empty(
        q.shape, dtype=operand_dtype(q)
    ),
)


def _examples() -> Iterator[tuple[str, ops.Launch]]:
    """bf16 work at m = d = 64, 12 heads, n = 4,096: float32 landmarks beside bf16 q, k, v
    with padding (padded segment means under CUDA autocast: the LRA Text step), bf16
    landmarks, and float32 q, k, v rounded to bf16 in the kernels (autocast)."""
    q, k, v = (ops.meta(1, 12, 4096, 64) for _ in range(3))
    f32 = [ops.meta(1, 12, 64, 64, dtype=torch.float32) for _ in range(2)]
    exists, mask = ops.meta(1, 64, dtype=torch.bool), ops.meta(1, 4096, dtype=torch.bool)
    padded, _ = launches(q, k, v, *f32, exists, mask, 6, torch.bfloat16)
    half, _ = launches(q, k, v, q[:, :, :64], k[:, :, :64], exists, None, 6, torch.bfloat16)
    wide = [x.float() for x in (q, k, v)]
    autocast, _ = launches(*wide, *f32, exists, None, 6, torch.bfloat16)
    yield "Bk V split (inference, float32 q~)", padded[0]
    yield "Bk V combine (inference)", padded[1]
    yield "F W (inference)", half[3]
    yield "F W (inference, float32 k~)", padded[3]
    yield "F W (inference, autocast)", autocast[3]


ops.register("inference", GATE, _examples)
