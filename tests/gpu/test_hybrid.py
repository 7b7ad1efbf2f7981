"""The hybrid's kernel (``nyscli.attention.gpu.hybrid``) against the hybrid's torch path in
float64 (under the interpreter without a GPU)."""

from __future__ import annotations

import pytest
import torch

from nyscli.attention.gpu import gates, hybrid, ops
from tests.gpu.common import DEVICE, both_paths, padded_with_junk, qkv, relative
from tests.gpu.common import hybrid as hybrid_core

HYBRID_CASES = [
    (200, {}, False, 16),
    (150, {"window": 17, "num_landmarks": 8, "heavy_keys": 5}, True, 16),
    (150, {"window": 17, "num_landmarks": 8, "heavy_keys": 5}, True, 64),  # padded tiles
    (300, {"heavy_keys": 0}, True, 16),
    (130, {"window": 129, "num_landmarks": 24, "heavy_keys": 40}, False, 16),
]


@pytest.mark.parametrize("n, options, padded, min_tile", HYBRID_CASES)
def test_hybrid_kernel_equals_the_torch_path_in_float64(
    gated, monkeypatch, n, options, padded, min_tile
) -> None:
    # min_tile 64: the landmark and heavy-key tiles padded far past m and g, masked out
    gated(hybrid_launch={**gates.current().hybrid_launch, "min_tile": min_tile})
    q, k, v = qkv(2, 3, n, 24, seed=n)
    mask = None
    if padded:
        mask = torch.ones(2, n, dtype=torch.bool, device=DEVICE)
        mask[1, n - 37 :] = False
    core = hybrid_core(options)
    gated(testing=True)
    assert hybrid.serves(q, v, core.num_landmarks, core.heavy_keys)
    got, want = both_paths(core, q, k, v, mask)
    assert relative(got, want) < 1e-12
    if padded:  # pads never count
        junk = padded_with_junk((q, k, v), n - 37, 50.0)
        again, _ = both_paths(core, *junk, mask)
        assert torch.allclose(again[1, :, : n - 37], got[1, :, : n - 37], atol=1e-12)


def test_hybrid_kernel_gates_like_the_torch_path(monkeypatch) -> None:
    # Queries whose Nyström estimate of the mass outside their exact support is not positive
    # keep the exact part alone. Random inputs never trigger it, so the shared parts of one
    # head are altered (30% of the low-rank mass: some queries gated, some not) on both paths alike.
    q, k, v = qkv(1, 2, 200, 24, seed=3)
    core = hybrid_core({})
    parts_of, weights_of = core.parts, core._weights
    gate_on = []

    def less_mass(*args, **kwargs):
        parts = parts_of(*args, **kwargs)
        parts.b_mass[:, 0] *= 0.3
        return parts

    def weights(*args):  # the torch path's gate (its last result), recorded
        result = weights_of(*args)
        gate_on.append(result[-1].flatten(2).double().mean(dim=(0, 2)))
        return result

    monkeypatch.setattr(core, "parts", less_mass)
    monkeypatch.setattr(core, "_weights", weights)
    got, want = both_paths(core, q, k, v, None)
    assert relative(got, want) < 1e-12
    altered, untouched = torch.stack(gate_on).mean(dim=0).tolist()
    assert 0.05 < altered < 0.95 and untouched == 1.0, (altered, untouched)


def test_hybrid_kernel_under_autocast_and_in_float32(gated, monkeypatch) -> None:
    q, k, v = (x.float() for x in qkv(2, 2, 256, 64, seed=11))
    core = hybrid_core({})
    exact = core(q.double(), k.double(), v.double())
    gated(testing=True)
    with torch.no_grad():
        fp32 = core(q, k, v)
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            bf16 = core(q, k, v)
    assert fp32.dtype == torch.float32 and relative(fp32, exact) < 1e-5
    # bf16 band and weights, shared parts in the inputs' float32: a bf16-sized error.
    assert bf16.dtype == torch.bfloat16 and relative(bf16, exact) < 1e-2


def test_hybrid_training_keeps_the_torch_path(gated, monkeypatch) -> None:
    q, k, v = (x.requires_grad_() for x in qkv(1, 2, 150, 16, seed=2))
    core = hybrid_core({"window": 17, "num_landmarks": 8, "heavy_keys": 5})
    gated(testing=True)
    out = core(q, k, v)
    out.sum().backward()  # the kernel has no backward: a training call must not reach it
    assert q.grad is not None and torch.isfinite(q.grad).all()
    assert relative(out.detach(), both_paths(core, q, k, v, None)[1]) < 1e-12


def test_the_hybrid_kernel_is_checked_per_operand_width(gated, monkeypatch) -> None:
    # bf16/fp16 work (inputs, or float32 under autocast) and float32 work are switched on apart
    q = torch.zeros(1, 1, 256, 16)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(ops, "kernels_serve", lambda q, v, m: True)
    gated(checked={"hybrid-16-bit"})
    assert hybrid.serves(q.bfloat16(), q, 16, 32)
    assert not hybrid.serves(q, q, 16, 32)
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda device_type: True)
    monkeypatch.setattr(torch, "get_autocast_dtype", lambda device_type: torch.bfloat16)
    assert hybrid.serves(q, q, 16, 32)
