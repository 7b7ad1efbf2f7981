"""Nyström's landmark side in one Triton program per head: W = pinv(A) (Bk V), forward and backward.

On a GPU the landmark side is otherwise tens of small kernels (the landmark kernel, its
softmax, six Newton-Schulz steps of four products each, the product with Bk V) and their
backward three times as many, bound by launches, not arithmetic (docs/results/gpu-notes.md).
Here one program per (sequence, head) holds q~, k~ (m x d) and the m x m iterates in
registers and does all of it; the backward is one more program per head that keeps the
iterates in a scratch buffer of its own and walks them back. Kernels: ``landmark_kernels.py``.

Reference: ``reference.landmark_weights`` (``NystromAttention.landmark_values``' function with
the iterative pseudo-inverse from its per-matrix start), computed here in float32 (float64 for
float64 inputs) whatever the input dtype; ``tests/gpu/test_landmark.py`` holds the two together.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from functools import cache
from typing import Any

import torch
from torch import Tensor

from nyscli.attention.gpu import gates, ops
from nyscli.attention.gpu.dtypes import block, compute_dtype, products, triton_dtype


def settings(kernel: str, operands: torch.dtype) -> dict[str, Any]:
    """The products and warps of landmark kernel ``kernel`` in work on ``operands``."""
    prec = products(operands)
    return {"PREC": prec, "num_warps": gates.current().warps[prec][kernel]}


@cache
def _tile(m: int, wide: bool) -> dict[str, Any]:
    """What a program holding m x m iterates needs besides tensors: the floor of the pinv's
    start, the padded tile, the compute dtype (cached: at small n a call's time is its
    Python)."""
    dtype = torch.float64 if wide else torch.float32
    return {"tiny": torch.finfo(dtype).tiny, "BM": block(m), "DT": triton_dtype(dtype)}


@cache
def _constants(h: int, m: int, d: int, wide: bool, has_e: bool, prec: str) -> dict[str, Any]:
    """The arguments the forward and backward programs share besides their tensors."""
    shape = {"heads": h, "scale": 1.0 / math.sqrt(d), "M": m, "D": d, "BD": block(d)}
    return {**shape, "HAS_E": has_e, "PREC": prec, **_tile(m, wide)}


def _shared(q_land: Tensor, flags: Tensor | None, how: dict[str, Any]) -> dict[str, Any]:
    h, m, d = q_land.shape[1:]
    wide = q_land.dtype == torch.float64
    return _constants(h, m, d, wide, flags is not None, how["PREC"])


def _flags(exists: Tensor | None) -> Tensor | None:
    return None if exists is None else exists.to(torch.int8).contiguous()


def forward_launch(
    q_land: Tensor,
    k_land: Tensor,
    bv: Tensor,
    exists: Tensor | None,
    iterations: int,
    operands: torch.dtype,
) -> tuple[ops.Launch, Tensor]:
    """The forward program's launch for W = pinv(A) bv (its products chosen for work on
    ``operands``) and W (B, H, m, d), in bv's dtype, which the launch fills."""
    flags = _flags(exists)
    bv = bv.contiguous()
    w = torch.empty_like(bv)  # contiguous, as the program writes it
    b, h = q_land.shape[:2]
    how = settings("forward", operands)
    args = {
        "ql_ptr": q_land.contiguous(),
        "kl_ptr": k_land.contiguous(),
        "e_ptr": flags,
        "bv_ptr": bv,
        "w_ptr": w,
        "ITERS": iterations,
        **_shared(q_land, flags, how),
    }
    launch = ops.Launch(
        "nyscli.attention.gpu.landmark_kernels:forward",
        (b * h,),
        args,
        {"num_warps": how["num_warps"]},
    )
    return launch, w


def backward_launch(
    q_land: Tensor,
    k_land: Tensor,
    bv: Tensor,
    exists: Tensor | None,
    grad_w: Tensor,
    iterations: int,
) -> tuple[ops.Launch, tuple[Tensor, Tensor, Tensor]]:
    """The backward program's launch and the gradients of q~, k~, bv it fills (float32, or
    float64 for float64 inputs)."""
    flags = _flags(exists)
    b, h = q_land.shape[:2]
    dtype = compute_dtype(q_land)
    grads = [torch.empty(x.shape, dtype=dtype, device=x.device) for x in (q_land, k_land, bv)]
    how = settings("backward", bv.dtype)
    shared = _shared(q_land, flags, how)
    # The iterates Z_0 .. Z_{T-1} of each head, written and read back by its own program.
    scratch = torch.empty(b * h * iterations * shared["BM"] ** 2, dtype=dtype, device=bv.device)
    args = {
        "ql_ptr": q_land.contiguous(),
        "kl_ptr": k_land.contiguous(),
        "e_ptr": flags,
        "bv_ptr": bv.contiguous(),
        "gw_ptr": grad_w.contiguous(),
        "gql_ptr": grads[0],
        "gkl_ptr": grads[1],
        "gbv_ptr": grads[2],
        "scratch_ptr": scratch,
        "ITERS": iterations,
        **shared,
    }
    options = {"num_warps": how["num_warps"]}
    launch = ops.Launch("nyscli.attention.gpu.landmark_kernels:backward", (b * h,), args, options)
    return launch, tuple(grads)


def _forward(*inputs: Any) -> Tensor:
    """W from (q~, k~, Bk V, exists, iterations), ``landmark_weights``' arguments, without
    autograd; products for work on Bk V's dtype (SDPA's, in the attention's operand dtype)."""
    launch, w = forward_launch(*inputs, operands=inputs[2].dtype)
    launch()
    return w


def _backward(*inputs: Any) -> tuple[Tensor, Tensor, Tensor]:
    """The gradients of q~, k~, Bk V in their own dtypes from (q~, k~, Bk V, exists, grad_w,
    iterations)."""
    launch, grads = backward_launch(*inputs)
    launch()
    return tuple(g.to(x.dtype) for g, x in zip(grads, inputs[:3], strict=True))


_forward_op = ops.custom_op(
    "nystrom_landmark_weights",
    "(Tensor q_land, Tensor k_land, Tensor bv, Tensor? exists, int iterations) -> Tensor",
    _forward,
    lambda q_land, k_land, bv, exists, iterations: torch.empty_like(bv),
)
_backward_op = ops.custom_op(
    "nystrom_landmark_weights_backward",
    "(Tensor q_land, Tensor k_land, Tensor bv, Tensor? exists, Tensor grad_w, int iterations)"
    " -> (Tensor, Tensor, Tensor)",
    _backward,
    lambda q_land, k_land, bv, exists, grad_w, iterations: (
        torch.empty_like(q_land),
        torch.empty_like(k_land),
        torch.empty_like(bv),
    ),  # fmt: skip
)


def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    q_land, k_land, bv, exists, iterations = inputs
    ctx.save_for_backward(q_land, k_land, bv, exists)
    ctx.iterations = iterations


def _grad(ctx: Any, grad_w: Tensor) -> tuple[Tensor | None, ...]:
    q_land, k_land, bv, exists = ctx.saved_tensors
    grads = _backward_op(q_land, k_land, bv, exists, grad_w, ctx.iterations)
    return *grads, None, None


if ops.HAS_CUSTOM_OPS:
    _forward_op.register_autograd(_grad, setup_context=_setup_context)


def landmark_weights(
    q_land: Tensor, k_land: Tensor, bv: Tensor, exists: Tensor | None, iterations: int
) -> Tensor:
    """W = pinv(A) bv: (B, H, m, d_v) from landmarks q~, k~ (B, H, m, d), Bk V (B, H, m, d_v)
    and the (B, m) mask of landmarks that exist (None: all do).

    A = softmax(q~ k~^T / sqrt(d)) with empty landmarks' rows and columns zero; pinv by
    ``iterations`` Newton-Schulz steps from Z_0 = A^T / (||A||_1 ||A||_inf). W comes back in
    bv's dtype; differentiable in q~, k~ and bv. Requires ``ops.kernels_serve`` (d_v = d).
    """
    return _forward_op(q_land, k_land, bv, exists, iterations)


def pinv_launch(a: Tensor, iterations: int) -> tuple[ops.Launch, Tensor]:
    """The launch of one program per (m, m) matrix of a (..., m, m) and the Z it fills."""
    m = a.shape[-1]
    dtype = compute_dtype(a)
    how = settings("pinv", a.dtype)
    a = a.to(dtype).contiguous()
    z = torch.empty_like(a)
    args = {
        "a_ptr": a,
        "z_ptr": z,
        "M": m,
        "ITERS": iterations,
        "PREC": how["PREC"],
        **_tile(m, dtype == torch.float64),
    }
    options = {"num_warps": how["num_warps"]}
    launch = ops.Launch(
        "nyscli.attention.gpu.landmark_kernels:pinv", (a.numel() // (m * m),), args, options
    )
    return launch, z


def iterative_pinv(a: Tensor, iterations: int) -> Tensor:
    """``pinv.iterative_pinv(a, iterations)`` (per-matrix start) for a: (..., m, m), m <=
    MAX_LANDMARKS, in one program per matrix: in fp32 (fp64 for fp64), no autograd."""
    launch, z = pinv_launch(a, iterations)
    launch()
    return z


def _examples() -> Iterator[tuple[str, ops.Launch]]:
    """bf16 work at m = d = 64, 12 heads, some landmarks empty; the hybrid's pinv at m = 16."""
    q_land, k_land, bv = (ops.meta(1, 12, 64, 64) for _ in range(3))
    exists = ops.meta(1, 64, dtype=torch.bool)
    yield "landmark forward", forward_launch(q_land, k_land, bv, exists, 6, bv.dtype)[0]
    yield "landmark backward", backward_launch(q_land, k_land, bv, exists, bv, 6)[0]
    yield "pinv (hybrid, m = 16)", pinv_launch(ops.meta(1, 12, 16, 16), 6)[0]


ops.register("landmark weights", None, _examples)
