"""Training path of unpadded segment-means Nyström on CPU: one autograd node over the flash kernels.

Through plain autograd, the landmarks' gradient (a broadcast over each segment) meets the flash
kernel's gradient of q (and of k) in autograd's input buffer, which adds them out of place, and
the view that shares q with its segments copies the gradient once more: two extra passes and an
extra n x d buffer per input. Here the backward calls the same flash backward kernels and adds
the landmarks' gradient into their output in place, so training needs only the three
gradients themselves. The m x m part (landmark kernel and pseudo-inverse) is small and is
differentiated by autograd, recomputed in backward.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from nyscli.attention.core import backward_follows
from nyscli.attention.landmarks import shared_segment_means
from nyscli.attention.threads import one_thread

_flash_forward = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
_flash_backward = getattr(
    torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None
)

LandmarkInverse = Callable[[Tensor, Tensor], Tensor]


def fused_path_applies(q: Tensor, k: Tensor, v: Tensor) -> bool:
    """Whether ``fused_segment_means_nystrom`` serves q, k, v: (B, H, n, d) in this context."""
    return (
        _flash_forward is not None
        and _flash_backward is not None
        and q.device.type == "cpu"
        and backward_follows(q, k, v)
        # Autocast casts inside F.scaled_dot_product_attention, not inside these raw kernels.
        and not torch.is_autocast_enabled("cpu")
        and q.dtype == k.dtype == v.dtype
    )


class _FusedNystrom(torch.autograd.Function):
    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, m: int, inverse: LandmarkInverse
    ) -> Tensor:
        q_land, k_land = shared_segment_means(q, m)[1], shared_segment_means(k, m)[1]
        with one_thread(q_land):  # (B, H, m, m) work: a second thread only waits
            z = inverse(q_land, k_land)  # (B, H, m, m)
        bv, lse_land = _flash_forward(q_land, k, v)  # (B, H, m, d), (B, H, m)
        with one_thread(bv):
            w = (z @ bv.to(z.dtype)).to(v.dtype)
        out, lse = _flash_forward(q, k_land, w)  # (B, H, n, d), (B, H, n)
        ctx.save_for_backward(q, k, v, q_land, k_land, bv, lse_land, w, out, lse)
        ctx.m, ctx.inverse = m, inverse
        return out

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, q_land, k_land, bv, lse_land, w, out, lse = ctx.saved_tensors
        grad_q, grad_k_land, grad_w = _flash_backward(grad_out, q, k_land, w, out, lse, 0.0, False)
        with torch.enable_grad(), one_thread(q_land):
            q_small = q_land.detach().requires_grad_()
            k_small = k_land.detach().requires_grad_()
            bv_small = bv.detach().requires_grad_()
            z = ctx.inverse(q_small, k_small)
            w_again = z @ bv_small.to(z.dtype)
            grad_q_small, grad_k_small, grad_bv = torch.autograd.grad(
                w_again, (q_small, k_small, bv_small), grad_w.to(w_again.dtype)
            )
        grad_q_land, grad_k, grad_v = _flash_backward(
            grad_bv, q_land, k, v, bv, lse_land, 0.0, False
        )
        b, h, n, d = q.shape
        segment = n // ctx.m
        grad_q_land = (grad_q_land + grad_q_small.to(grad_q_land.dtype)) / segment
        grad_k_land = (grad_k_land + grad_k_small.to(grad_k_land.dtype)) / segment
        grad_q.view(b, h, ctx.m, segment, d).add_(grad_q_land.unsqueeze(-2))
        grad_k.view(b, h, ctx.m, segment, d).add_(grad_k_land.unsqueeze(-2))
        return grad_q, grad_k, grad_v, None, None


def fused_segment_means_nystrom(
    q: Tensor, k: Tensor, v: Tensor, m: int, inverse: LandmarkInverse
) -> Tensor:
    """Nyström with segment-means landmarks, no padding, m dividing n: (B, H, n, d) -> same.

    ``inverse(q~, k~)`` gives pinv(A) (B, H, m, m) for landmarks q~, k~ (B, H, m, d), built
    from differentiable torch ops. Same numbers as the autograd path, forward and backward.
    """
    return _FusedNystrom.apply(q, k, v, m, inverse)
