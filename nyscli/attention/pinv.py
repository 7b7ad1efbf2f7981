"""Moore-Penrose pseudo-inverses of batched small matrices: iterative (Razavi et al.) and exact.

Both run in at least float32, with autocast off, because the iterative scheme loses its
convergence in bf16/fp16.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nyscli.attention.core import backward_follows
from nyscli.attention.errors import AttentionConfigError

PINV_METHODS = ("iterative", "exact")
PINV_INITS = ("per_matrix", "original")
# With a residual tolerance the iteration stops once it is met, or after this many steps: the
# scheme converges for every matrix from the per_matrix start, but a tolerance below the
# working precision (fp32: ~1e-6) is never met, and the cap bounds what that costs.
PINV_MAX_ITERATIONS = 100


def _working_dtype(a: Tensor) -> torch.dtype:
    return torch.promote_types(a.dtype, torch.float32)


def iterative_pinv(
    a: Tensor, iterations: int = 6, init: str = "per_matrix", tolerance: float | None = None
) -> Tensor:
    """Approximate pinv of a: (..., m, m) by the third-order Newton-Schulz-type iteration

    Z_{j+1} = 1/4 Z_j (13 I - A Z_j (15 I - A Z_j (7 I - A Z_j))).

    ``init="per_matrix"``: Z_0 = A^T / (||A||_1 ||A||_inf) for each matrix, which guarantees
    convergence for every matrix. ``init="original"``: the Nyströmformer code's single scale,
    the largest column sum times the largest row sum over the whole batch.

    ``tolerance``: instead of ``iterations`` steps, iterate until the residual
    ||A Z A - A||_F / ||A||_F of every matrix is at most ``tolerance`` (at most
    ``PINV_MAX_ITERATIONS`` steps).
    """
    if init not in PINV_INITS:
        raise AttentionConfigError(
            f"pinv_init '{init}' is not allowed; choose one of: {', '.join(PINV_INITS)}"
        )
    with torch.autocast(device_type=a.device.type, enabled=False):
        a = a.to(_working_dtype(a))
        tiny = torch.finfo(a.dtype).tiny
        if init == "per_matrix":
            norm_1 = a.abs().sum(dim=-2).amax(dim=-1)  # max column sum, (...)
            norm_inf = a.abs().sum(dim=-1).amax(dim=-1)  # max row sum, (...)
            scale = (norm_1 * norm_inf).clamp_min(tiny)[..., None, None]
        else:
            scale = (a.sum(dim=-2).max() * a.sum(dim=-1).max()).clamp_min(tiny)
        z = a.transpose(-1, -2) / scale
        steps = iterations if tolerance is None else PINV_MAX_ITERATIONS
        if not backward_follows(a):
            return _iterate_in_place(a, z, steps, tolerance)
        eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
        for _ in range(steps):
            az = a @ z
            if tolerance is not None and _residual(az, a).max().item() <= tolerance:
                break
            z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
        return z


def _iterate_in_place(a: Tensor, z: Tensor, steps: int, tolerance: float | None) -> Tensor:
    """:func:`iterative_pinv`'s loop without autograd, in five buffers of a's size: the
    expression form allocates ~13 per step, which at inference set Nyström's peak memory
    (MiniLM at batch 64, n 512: 175 MB for a 12 MB A, against SDPA's whole layer at ~50).
    The same values bit for bit: c I - X is -X with c added to its diagonal, and the factor
    1/4 (a power of two) is exact wherever it is applied."""
    # z keeps its layout (its first value is A^T's view scaled): another layout would change
    # which BLAS kernel multiplies it, and the last bits of the sums.
    az, t, u, spare = (torch.empty(a.shape, dtype=a.dtype, device=a.device) for _ in range(4))
    for _ in range(steps):
        torch.matmul(a, z, out=az)
        if tolerance is not None and _residual(az, a).max().item() <= tolerance:
            break
        _from_identity(t.copy_(az), 7)
        _from_identity(torch.matmul(az, t, out=u), 15)
        _from_identity(torch.matmul(az, u, out=t), 13)
        torch.matmul(z.mul_(0.25), t, out=spare)
        # The first z is A^T's layout: as an out= buffer it would make matmul write the
        # transposed product, another summation order. A row-major buffer takes its place.
        z, spare = spare, (z if z.is_contiguous() else torch.empty_like(spare))
    return z


def _from_identity(x: Tensor, c: float) -> Tensor:
    """c I - x, in place over x: (..., m, m)."""
    x.neg_().diagonal(dim1=-2, dim2=-1).add_(c)
    return x


def _residual(az: Tensor, a: Tensor) -> Tensor:
    """||A Z A - A||_F / ||A||_F per matrix, from A Z (the product each step forms anyway)."""
    norm = a.norm(dim=(-2, -1)).clamp_min(torch.finfo(a.dtype).tiny)
    return (az @ a - a).norm(dim=(-2, -1)) / norm


def exact_pinv(a: Tensor) -> Tensor:
    """pinv of a: (..., m, m) by SVD (``torch.linalg.pinv``)."""
    with torch.autocast(device_type=a.device.type, enabled=False):
        return torch.linalg.pinv(a.to(_working_dtype(a)))
