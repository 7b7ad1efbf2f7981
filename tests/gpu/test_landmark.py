"""The landmark weights op (``nyscli.attention.gpu.landmark``): W = pinv(A) Bk V's Triton
programs, forward and backward, and the pinv program, against the float64 reference (compiled
on a GPU where there is one, otherwise on the CPU under Triton's interpreter, which conftest.py
switches on); the core's Triton training path against its torch path."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from nyscli.attention import build_attention
from nyscli.attention.gpu import landmark, ops
from nyscli.attention.nystrom import NystromAttention
from tests.gpu.common import (
    DEVICE,
    formula,
    forward_backward,
    landmarks,
    padded_with_junk,
    qkv,
    relative,
)


@pytest.mark.parametrize(
    "m, d, partial",
    [(64, 64, False), (24, 40, True), (16, 16, True)],
    ids=["m64-d64", "m24-d40-some-empty", "m16-d16-some-empty"],
)
def test_landmark_weights_equal_the_float64_formula(interpret, m, d, partial) -> None:
    q_land, k_land, bv = (x.requires_grad_() for x in landmarks(3, 2, m, d, seed=m + d))
    exists = None
    if partial:
        exists = torch.ones(3, m, dtype=torch.bool, device=DEVICE)
        exists[1, m - 5 :] = False
        exists[2] = False  # a sequence with no landmark at all: A = 0, W = 0
    w = landmark.landmark_weights(q_land, k_land, bv, exists, 6)
    ref = formula(q_land, k_land, bv, exists, 6)
    assert relative(w, ref) < 1e-12
    if partial:
        assert torch.equal(w[2], torch.zeros_like(w[2]))
    grad = torch.randn(w.shape, generator=torch.Generator().manual_seed(1), dtype=w.dtype)
    grad = grad.to(DEVICE)
    got = torch.autograd.grad(w, (q_land, k_land, bv), grad)
    want = torch.autograd.grad(ref, (q_land, k_land, bv), grad)
    for g_got, g_want in zip(got, want, strict=True):
        assert relative(g_got, g_want) < 1e-11


@pytest.mark.parametrize("iterations", [1, 3])
def test_other_iteration_counts(interpret, iterations) -> None:
    q_land, k_land, bv = (x.requires_grad_() for x in landmarks(1, 2, 32, 16, seed=7))
    w = landmark.landmark_weights(q_land, k_land, bv, None, iterations)
    ref = formula(q_land, k_land, bv, None, iterations)
    assert relative(w, ref) < 1e-12
    got = torch.autograd.grad(w.sum(), q_land)[0]
    want = torch.autograd.grad(ref.sum(), q_land)[0]
    assert relative(got, want) < 1e-11


@pytest.mark.parametrize("products", ["tf32x3", "tf32"])
@pytest.mark.parametrize("dtype, bound", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_low_precision_inputs_compute_in_float32(
    gated, interpret, monkeypatch, dtype, bound, products
) -> None:
    # Against the float64 formula on the same (rounded) inputs: only float32 arithmetic and
    # the output's rounding to the input dtype separate them. (The interpreter multiplies in
    # float32 whatever the products' setting: a GPU measures tf32's own error, gpu_profile.)
    gated(products=dict.fromkeys(("16-bit", "32-bit"), products))
    q_land, k_land, bv = landmarks(2, 3, 64, 64, seed=3, dtype=dtype)
    w = landmark.landmark_weights(q_land, k_land, bv, None, 6)
    assert w.dtype == dtype and torch.isfinite(w).all()
    ref = formula(q_land.double(), k_land.double(), bv.double(), None, 6)
    assert relative(w, ref) < bound


def test_core_under_autocast_keeps_the_landmark_side_in_float32(interpret) -> None:
    # bench's bf16 rows: fp32 inputs under autocast. The custom op is not autocast: the
    # landmarks arrive in fp32 and W leaves in Bk V's bf16, as the torch path's W does.
    q, k, v = (x.float() for x in qkv(2, 2, 256, 64, seed=4))
    core = NystromAttention(num_landmarks=64)
    reference = core(q.double(), k.double(), v.double())
    with torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16):
        assert core.triton_serves(q, v)
        out = core(q, k, v)
    assert out.dtype == torch.bfloat16 and relative(out, reference) < 1e-2


@pytest.mark.parametrize("n, m, padded", [(96, 64, False), (50, 24, True), (70, 16, True)])
def test_core_on_the_gpu_path_equals_the_torch_path(gated, monkeypatch, n, m, padded) -> None:
    q, k, v = qkv(3, 2, n, 32, seed=n)
    mask = None
    if padded:
        mask = torch.ones(3, n, dtype=torch.bool, device=DEVICE)
        mask[1, n - 9 :] = False
        mask[2, m - 3 :] = False  # at most m real tokens: exact attention, on either path
    core = NystromAttention(num_landmarks=m)
    gated(fused_cpu=False)  # CPU training would take its own fused path
    gated(testing=True)
    assert core.triton_serves(q, v)
    got = forward_backward(core, q, k, v, mask)
    gated(triton=False)  # the torch ops, on any device
    assert not core.triton_serves(q, v)
    want = forward_backward(core, q, k, v, mask)
    assert relative(got[0], want[0]) < 1e-12
    for g_got, g_want in zip(got[1], want[1], strict=True):
        assert relative(g_got, g_want) < 1e-11
    if padded:  # pads never count: junk there changes nothing
        junk = padded_with_junk((q, k, v), n - 9, 1e3)
        gated(triton=True)
        again = core(*junk, mask)
        assert torch.allclose(again[1, :, : n - 9], got[0][1, :, : n - 9], atol=1e-12)
        exact = build_attention({"name": "softmax_naive"})(q, k, v, mask)
        assert torch.allclose(got[0][2, :, : m - 3], exact[2, :, : m - 3], atol=1e-12)


@pytest.mark.parametrize(
    "dtype, autocast, products",
    [
        (torch.float32, False, "tf32x3"),
        (torch.float32, True, "tf32"),  # bench's bf16 rows: float32 inputs under autocast
        (torch.bfloat16, False, "tf32"),
    ],
)
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_landmark_products_follow_the_attention_operands(
    gated, interpret, monkeypatch, dtype, autocast, products, grad
) -> None:
    # bf16/fp16 work multiplies the landmark side's float32 tiles once in tf32 (H200: 17 us
    # against 100 forward), float32 work in three (float32's accuracy): on the fused inference
    # op (whose Bk V is float32 whatever the operands) as on the training path (SDPA's Bk V).
    seen = []
    how = landmark.settings

    def spy(kernel: str, operands: torch.dtype) -> dict:
        seen.append((kernel, how(kernel, operands)["PREC"]))
        return how(kernel, operands)

    monkeypatch.setattr(landmark, "settings", spy)
    q, k, v = (x.to(dtype).requires_grad_(grad) for x in qkv(1, 2, 128, 16, seed=5))
    core = NystromAttention(num_landmarks=16)
    gated(fused_cpu=False)  # CPU training would take its own fused path
    with torch.set_grad_enabled(grad), torch.autocast(DEVICE, torch.bfloat16, enabled=autocast):
        out = core(q, k, v)
    if grad:
        out.float().sum().backward()
    assert seen == [("forward", products)] + [("backward", products)] * grad


@pytest.mark.parametrize(
    "options",
    [
        {"pinv": "exact"},
        {"pinv_init": "original"},
        {"pinv_tolerance": 1e-3},
        {"num_landmarks": ops.MAX_LANDMARKS + 1},
    ],
)
def test_the_gpu_path_serves_only_what_it_computes(interpret, options) -> None:
    q, _, v = qkv(1, 1, 200, 16, seed=0)
    assert NystromAttention(num_landmarks=16).triton_serves(q, v)
    assert not NystromAttention(**{"num_landmarks": 16, **options}).triton_serves(q, v)


def test_cpu_tensors_take_the_cpu_path() -> None:
    # The interpreter is on in this process (conftest.py), and still a user's CPU run keeps
    # the CPU path: only tests send CPU tensors to the kernels.
    q, _, v = (x.cpu() for x in qkv(1, 1, 200, 16, seed=0))
    assert not NystromAttention(num_landmarks=16).triton_serves(q, v)


def test_torch_compile_keeps_the_kernels_whole(gated, interpret) -> None:
    # Custom ops: one graph, no break, the same numbers (aot_eager: no C++ compiler needed).
    q, k, v = (x.float().requires_grad_() for x in qkv(2, 2, 64, 32, seed=5))
    core = NystromAttention(num_landmarks=16)
    gated(fused_cpu=False)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(core)(q, k, v, None)
    assert explained.graph_break_count == 0
    compiled = torch.compile(core, backend="aot_eager", fullgraph=True)
    out = compiled(q, k, v, None)
    (grad_q,) = torch.autograd.grad(out.square().sum(), q)
    ref = core(q, k, v, None)
    (ref_grad_q,) = torch.autograd.grad(ref.square().sum(), q)
    assert relative(out, ref.double()) < 1e-6 and relative(grad_q, ref_grad_q.double()) < 1e-5


@pytest.mark.parametrize("m", [16, 40])
def test_pinv_kernel_equals_the_iterative_pinv(interpret, m) -> None:
    from nyscli.attention.pinv import iterative_pinv

    g = torch.Generator().manual_seed(m)
    a = torch.rand(2, 3, m, m, generator=g, dtype=torch.float64).exp().to(DEVICE)
    a[1, 2, :, m - 3 :] = 0  # empty landmarks: zero rows and columns
    a[1, 2, m - 3 :, :] = 0
    want = iterative_pinv(a, 6)
    assert relative(landmark.iterative_pinv(a, 6), want) < 1e-12
    got32 = landmark.iterative_pinv(a.float(), 6)
    assert got32.dtype == torch.float32 and relative(got32, want) < 1e-4
