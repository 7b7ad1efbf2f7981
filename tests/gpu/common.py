"""What the GPU op tests share: inputs, the error measure, the hybrid's two paths."""

from __future__ import annotations

import torch

from nyscli.attention import build_attention
from nyscli.attention.gpu import gates, reference

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def landmarks(
    b: int, h: int, m: int, d: int, seed: int, dtype: torch.dtype = torch.float64
) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (b, h, m, d)
    return [
        torch.randn(shape, generator=g, dtype=torch.float64).to(DEVICE, dtype) for _ in range(3)
    ]


def formula(
    q_land: torch.Tensor, k_land: torch.Tensor, bv: torch.Tensor, exists, iterations: int
) -> torch.Tensor:
    """W = pinv(A) bv by the landmark op's torch reference (float64, autograd)."""
    return reference.landmark_weights(q_land, k_land, bv, exists, iterations)


def relative(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm()).item()


def qkv(b: int, h: int, n: int, d: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (b, h, n, d)
    return [torch.randn(shape, generator=g, dtype=torch.float64).to(DEVICE) for _ in range(3)]


def padded_with_junk(tensors, start: int, value: float) -> list[torch.Tensor]:
    """Copies of (B, H, n, d) tensors whose sequence 1 holds ``value`` from token ``start``
    on: what padding may hold, which must change nothing."""
    junk = [x.clone() for x in tensors]
    for x in junk:
        x[1, :, start:] = value
    return junk


def forward_backward(core, q, k, v, mask):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = core(q, k, v, mask)
    grad = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    return out, torch.autograd.grad(out, (q, k, v), grad)


def hybrid(options: dict):
    return build_attention({"name": "nystrom_local", **options})


def both_paths(core, q, k, v, mask):
    """(GPU path, torch path) outputs of ``core`` at inference."""
    results = []
    for on in (True, False):
        with gates.override(testing=on, triton=on), torch.no_grad():
            results.append(core(q, k, v, mask))
    return results
