"""The math of the exact and Nyström cores, in float64 against plain references."""

from __future__ import annotations

import math

import pytest
import torch

from nyscli.attention import (
    AttentionConfigError,
    MultiHeadAttention,
    attention_label,
    available,
    build_attention,
)
from nyscli.attention.core import Path
from nyscli.attention.gpu import gates
from nyscli.attention.landmarks import segment_means
from nyscli.attention.multihead import ValueConvSkip
from nyscli.attention.nystrom import NystromAttention
from nyscli.attention.pinv import exact_pinv, iterative_pinv
from tests.helpers import smooth_qkv


def reference_attention(q, k, v, keep=None):
    """softmax(q k^T / sqrt(d)) v with the n x n matrix written out; keep: (B, n) bool."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if keep is not None:
        scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def nystrom(**kwargs):
    return build_attention({"name": "nystrom", **kwargs})


@pytest.mark.parametrize("name", ["softmax", "softmax_naive"])
def test_exact_cores_match_reference(name):
    q, k, v = smooth_qkv(2, 3, 37, 8)
    keep = torch.ones(2, 37, dtype=torch.bool)
    keep[1, 30:] = False
    core = build_attention({"name": name})
    torch.testing.assert_close(core(q, k, v), reference_attention(q, k, v), rtol=0, atol=1e-12)
    masked = core(q, k, v, keep)
    torch.testing.assert_close(masked, reference_attention(q, k, v, keep), rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["softmax", "softmax_naive"])
def test_causal_exact_cores(name):
    q, k, v = smooth_qkv(1, 2, 19, 4)
    out = build_attention({"name": name, "causal": True})(q, k, v)
    scores = q @ k.transpose(-1, -2) / 2.0
    scores = scores.masked_fill(~torch.ones(19, 19, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(out, torch.softmax(scores, -1) @ v, rtol=0, atol=1e-12)


def dropped_reference(q, k, v, allowed, p, seed, rows):
    """(softmax(q k^T / sqrt(d)) * M / (1 - p)) v written out, M joined from the masks that
    nyscli.attention.dropout draws for each block of ``rows`` query rows from (seed, start)."""
    from nyscli.attention.dropout import LEVELS, drop_threshold, seeded_keep_mask

    scores = (q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])).masked_fill(~allowed, -math.inf)
    probs = torch.softmax(scores, dim=-1)
    n = q.shape[2]
    shape = (*q.shape[:2], None, k.shape[2])
    mask = torch.cat(
        [
            seeded_keep_mask((*shape[:2], min(rows, n - i), shape[3]), p, (seed, i))
            for i in range(0, n, rows)
        ],
        dim=2,
    ).double()
    return (probs * mask * LEVELS / (LEVELS - drop_threshold(p))) @ v, mask


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("rows", [5, 23])
def test_softmax_attention_dropout_is_the_probabilities_times_the_mask(causal, rows, monkeypatch):
    """Training with dropout p: (softmax(q k^T / sqrt(d)) * M / (1 - p)) v, computed a block of
    query rows at a time (5: five blocks, 23: one); masked keys keep zero weight; eval mode is
    exact attention whatever p is."""
    from nyscli.attention import softmax
    from nyscli.attention.dropout import draw_seed

    monkeypatch.setattr(softmax, "DEFAULT_BUDGET", 2 * 3 * 23 * rows)
    p = 0.3
    q, k, v = smooth_qkv(2, 3, 23, 8, seed=4)
    keep = torch.ones(2, 23, dtype=torch.bool)
    keep[1, 17:] = False
    core = build_attention({"name": "softmax", "dropout": p, "causal": causal}).train()
    torch.manual_seed(7)
    out = core(q, k, v, keep)
    torch.manual_seed(7)
    seed = draw_seed()
    allowed = keep[:, None, None, :].expand(2, 1, 23, 23)
    if causal:
        allowed = allowed & torch.ones(23, 23, dtype=torch.bool).tril()
    expected, mask = dropped_reference(q, k, v, allowed, p, seed, rows)
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-12)
    assert 0.25 < 1 - mask.mean() < 0.35  # the mask drops about p of the entries
    core.eval()
    reference = build_attention({"name": "softmax", "causal": causal})(q, k, v, keep)
    torch.testing.assert_close(core(q, k, v, keep), reference, rtol=0, atol=1e-12)


@pytest.mark.parametrize("padded", [False, True])
def test_softmax_attention_dropout_gradients(padded, monkeypatch):
    """The blockwise backward (probabilities recomputed from the saved log-sum-exp, each block's
    mask drawn again from its seed) against finite differences, over three blocks of rows;
    and equal to autograd through the written-out formula."""
    from nyscli.attention import softmax

    monkeypatch.setattr(softmax, "DEFAULT_BUDGET", 2 * 2 * 11 * 4)
    q, k, v = (t.clone().requires_grad_() for t in smooth_qkv(2, 2, 11, 3, seed=8))
    keep = None
    allowed = torch.ones(2, 1, 11, 11, dtype=torch.bool)
    if padded:
        pad = torch.ones(2, 11, dtype=torch.bool)
        pad[0, 8:] = False
        keep = pad[:, None, None, :]
        allowed = keep.expand(2, 1, 11, 11)

    def run(q, k, v):
        return softmax._DroppedSoftmax.apply(q, k, v, keep, 0.4, 1234)

    assert torch.autograd.gradcheck(run, (q, k, v))
    grads = torch.autograd.grad(run(q, k, v).square().sum(), (q, k, v))
    expected, _ = dropped_reference(q, k, v, allowed, 0.4, 1234, 4)
    wanted = torch.autograd.grad(expected.square().sum(), (q, k, v))
    for got, want in zip(grads, wanted, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_softmax_attention_dropout_in_bfloat16_is_the_fp32_result_rounded():
    """bf16 inputs run the blockwise kernel in fp32 (as SDPA's CPU kernels accumulate): the
    same masks, the output within bf16's rounding of the fp32 one."""
    q, k, v = (t.float() for t in smooth_qkv(2, 2, 40, 8, seed=6))
    core = build_attention({"name": "softmax", "dropout": 0.2}).train()
    torch.manual_seed(3)
    wide = core(q, k, v)
    torch.manual_seed(3)
    low = core(q.bfloat16(), k.bfloat16(), v.bfloat16())
    assert low.dtype == torch.bfloat16
    torch.testing.assert_close(low.float(), wide, rtol=0.02, atol=0.02)
    assert (low.float() - wide).abs().max() > 0  # it did round


def test_softmax_attention_dropout_averages_to_exact_attention():
    """Inverted dropout keeps the expectation: the mean of 2,000 training outputs is exact
    attention within the Monte-Carlo error (~1/sqrt(2000) of the spread)."""
    q, k, v = smooth_qkv(1, 2, 16, 4, seed=5)
    core = build_attention({"name": "softmax", "dropout": 0.5}).train()
    torch.manual_seed(0)
    mean = torch.stack([core(q, k, v) for _ in range(2000)]).mean(0)
    exact = reference_attention(q, k, v)
    assert (mean - exact).abs().max() < 0.05 * v.abs().max()
    assert (core(q, k, v) - exact).abs().max() > 0.05 * v.abs().max()  # one draw is not exact


@pytest.mark.parametrize("n", [64, 50])
def test_lemma2_unit_segments_exact_pinv_reproduce_softmax(n):
    """m = n: every token is its own landmark and F A^+ B = S exactly (the paper's Lemma 2)."""
    q, k, v = smooth_qkv(2, 2, n, 8)
    core = nystrom(num_landmarks=n, pinv="exact")
    f, a, b = core.kernels(q, k)
    approx = f @ exact_pinv(a) @ b @ v
    assert (approx - reference_attention(q, k, v)).abs().max() <= 1e-6


def test_landmarks_at_least_n_is_exact_attention():
    q, k, v = smooth_qkv(1, 2, 40, 8)
    out = nystrom(num_landmarks=64)(q, k, v)
    torch.testing.assert_close(out, reference_attention(q, k, v), rtol=0, atol=1e-12)


def test_segment_means_uneven_segments_match_manual_split():
    """n = 10, m = 4: segments of sizes 3, 2, 3, 2 (sizes differ by at most one)."""
    x = torch.arange(10, dtype=torch.float64).reshape(1, 1, 10, 1)
    landmarks, exists = segment_means(x, 4, None)
    expected = torch.tensor(
        [1.0, 3.5, 6.0, 8.5], dtype=torch.float64
    )  # means of 0-2, 3-4, 5-7, 8-9
    torch.testing.assert_close(landmarks.flatten(), expected)
    assert exists is None


def test_segment_means_ignore_padding():
    x = torch.arange(10, dtype=torch.float64).reshape(1, 1, 10, 1).repeat(2, 1, 1, 1)
    keep = torch.ones(2, 10, dtype=torch.bool)
    keep[1, 6:] = False  # second sequence: 6 real tokens -> segments 0-2, 3-5
    landmarks, exists = segment_means(x, 2, keep)
    torch.testing.assert_close(
        landmarks[1].flatten(), torch.tensor([1.0, 4.0], dtype=torch.float64)
    )
    torch.testing.assert_close(
        landmarks[0].flatten(), torch.tensor([2.0, 7.0], dtype=torch.float64)
    )
    assert exists.all()


def test_iterative_pinv_approaches_exact_pinv():
    """Landmark kernels here have condition numbers up to ~2e5; the third-order iteration
    needs ~30 steps to reach them, so the distance to pinv is checked up to 40."""
    q, k, _ = smooth_qkv(2, 3, 256, 16, seed=1)
    _, a, _ = nystrom(num_landmarks=16).kernels(q, k)
    exact = torch.linalg.pinv(a)
    errors = [
        ((iterative_pinv(a, iters) - exact).norm() / exact.norm()).item()
        for iters in (1, 2, 4, 8, 16, 24, 32, 40)
    ]
    assert all(later <= earlier + 1e-12 for earlier, later in zip(errors, errors[1:], strict=False))
    assert errors[-1] < 1e-8 and errors[0] > 0.5


@pytest.mark.parametrize(
    "options", [{}, {"init": "original"}, {"tolerance": 1e-6}], ids=["per_matrix", "orig", "tol"]
)
def test_pinv_without_autograd_is_the_expression_bit_for_bit(options):
    """The in-place loop (no backward to follow) gives exactly the values of the autograd
    path's expression Z/4 (13 I - AZ (15 I - AZ (7 I - AZ)))."""
    q, k, _ = smooth_qkv(2, 3, 256, 16, seed=3)
    _, a, _ = nystrom(num_landmarks=16).kernels(q, k)
    with torch.no_grad():
        in_place = iterative_pinv(a, 6, **options)
    expression = iterative_pinv(a.clone().requires_grad_(), 6, **options)
    assert torch.equal(in_place, expression.detach())


@pytest.mark.parametrize("landmarks", ["segment_means", "random", "kmeans"])
def test_nystrom_inference_a_head_at_a_time_equals_one_call(monkeypatch, landmarks):
    """Without autograd the general path runs in head groups (bounded temporaries): the same
    output as all heads in one call, padded sequences included."""
    from nyscli.attention import nystrom as nystrom_module

    q, k, v = smooth_qkv(3, 4, 96, 8, seed=4)
    mask = torch.arange(96)[None] < torch.tensor([[96], [70], [40]])
    core = nystrom(num_landmarks=8, landmarks=landmarks)
    with torch.no_grad():
        whole = core.approximate_all(q, k, v, mask)
        monkeypatch.setattr(nystrom_module, "INFERENCE_BUDGET", 1)  # one head per group
        grouped = core.approximate(q, k, v, mask)
    torch.testing.assert_close(grouped, whole, rtol=1e-12, atol=1e-14)


def test_original_init_also_converges_and_residual_falls():
    q, k, _ = smooth_qkv(2, 3, 256, 16, seed=2)
    _, a, _ = nystrom(num_landmarks=32).kernels(q, k)
    residuals = []
    for iters in (2, 6, 10, 25):
        z = iterative_pinv(a, iters, init="original")
        residuals.append(((a @ z @ a - a).norm() / a.norm()).item())
    assert residuals == sorted(residuals, reverse=True)
    assert residuals[-1] < 1e-6


def test_nystrom_error_falls_as_landmarks_grow():
    """With the paper's 6-step iterative pinv. (The exact pinv is not monotone here: the
    landmark kernels are ill-conditioned and their exact inverse amplifies the residual.)"""
    q, k, v = smooth_qkv(1, 4, 512, 32, seed=3)
    exact = reference_attention(q, k, v)
    errors = []
    for m in (4, 16, 64, 256):
        out = nystrom(num_landmarks=m)(q, k, v)
        errors.append(((out - exact).norm() / exact.norm()).item())
    assert errors == sorted(errors, reverse=True)
    assert errors[0] > 0.2 and errors[-1] < 0.06


@pytest.mark.parametrize(
    "name,kwargs",
    [
        ("softmax", {}),
        ("softmax_naive", {}),
        ("nystrom", {"num_landmarks": 8}),
        ("nystrom", {"num_landmarks": 8, "pinv": "exact"}),
    ],
)
def test_masked_tokens_never_change_unmasked_outputs(name, kwargs):
    q, k, v = smooth_qkv(2, 2, 45, 8, seed=4)
    keep = torch.ones(2, 45, dtype=torch.bool)
    keep[0, 31:] = False
    keep[1, 5:9] = False  # padding in the middle too
    core = build_attention({"name": name, **kwargs})
    before = core(q, k, v, keep)
    q2, k2, v2 = (t.clone() for t in (q, k, v))
    for t in (q2, k2, v2):
        t[~keep[:, None, :, None].expand_as(t)] = 1e3 * torch.randn(
            int((~keep).sum()) * 2 * 8, dtype=t.dtype
        )
    after = core(q2, k2, v2, keep)
    real = keep[:, None, :, None].expand_as(before)
    assert (
        torch.equal(before[real], after[real]) or (before[real] - after[real]).abs().max() < 1e-10
    )


def test_masked_nystrom_equals_nystrom_on_the_unpadded_sequence():
    q, k, v = smooth_qkv(1, 2, 50, 8, seed=5)
    keep = torch.ones(1, 50, dtype=torch.bool)
    keep[0, 37:] = False
    core = nystrom(num_landmarks=6)
    padded = core(q, k, v, keep)[:, :, :37]
    trimmed = core(q[:, :, :37], k[:, :, :37], v[:, :, :37])
    torch.testing.assert_close(padded, trimmed, rtol=0, atol=1e-10)


def test_padding_a_short_sequence_past_m_keeps_it_exact():
    """44 real tokens, m = 64: exact attention whether the batch is padded to 44 or to 100."""
    q, k, v = smooth_qkv(1, 2, 100, 8, seed=12)
    keep = torch.ones(1, 100, dtype=torch.bool)
    keep[0, 44:] = False
    core = nystrom(num_landmarks=64)
    unpadded = core(q[:, :, :44], k[:, :, :44], v[:, :, :44])
    padded = core(q, k, v, keep)[:, :, :44]
    torch.testing.assert_close(padded, unpadded, rtol=0, atol=1e-12)
    exact = reference_attention(q[:, :, :44], k[:, :, :44], v[:, :, :44])
    torch.testing.assert_close(padded, exact, rtol=0, atol=1e-12)


def test_mixed_batch_decides_exactness_per_sequence():
    """A short sequence is exact and a long one is Nyström, each as if alone in its batch."""
    q, k, v = smooth_qkv(3, 2, 100, 8, seed=13)
    keep = torch.ones(3, 100, dtype=torch.bool)
    keep[0, 30:] = False  # 30 real tokens <= m: exact
    keep[2, 90:] = False  # 90 real tokens > m: Nystrom
    core = nystrom(num_landmarks=32)
    out = core(q, k, v, keep)
    alone_0 = core(q[:1, :, :30], k[:1, :, :30], v[:1, :, :30])
    torch.testing.assert_close(out[:1, :, :30], alone_0, rtol=0, atol=1e-12)
    torch.testing.assert_close(out[1:2], core(q[1:2], k[1:2], v[1:2]), rtol=0, atol=1e-12)
    alone_2 = core(q[2:, :, :90], k[2:, :, :90], v[2:, :, :90])
    torch.testing.assert_close(out[2:, :, :90], alone_2, rtol=0, atol=1e-10)
    exact_2 = reference_attention(q[2:, :, :90], k[2:, :, :90], v[2:, :, :90])
    assert (alone_2 - exact_2).abs().max() > 1e-6  # sequence 2 really is approximated
    small = [t[:2, :1, :9, :4].clone().requires_grad_() for t in (q, k, v)]
    mask = keep[:2, :9].clone()
    mask[0, 3:] = False  # 3 real tokens <= 4 landmarks: exact; the other 9 > 4: Nystrom
    assert torch.autograd.gradcheck(lambda a, b, c: nystrom(num_landmarks=4)(a, b, c, mask), small)


@pytest.mark.parametrize("n,m", [(1000, 64), (1, 64), (7, 64), (65, 64), (129, 32)])
def test_odd_lengths(n, m):
    q, k, v = smooth_qkv(1, 2, n, 8, seed=6)
    out = nystrom(num_landmarks=m)(q, k, v)
    assert out.shape == (1, 2, n, 8) and torch.isfinite(out).all()
    # Rows of the implied attention sum to ~1, so outputs stay within v's range.
    assert out.abs().max() <= 1.5 * v.abs().max()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("name", ["softmax", "softmax_naive", "nystrom"])
def test_low_precision_is_finite_and_close(dtype, name):
    q, k, v = smooth_qkv(1, 2, 256, 16, seed=7, dtype=torch.float32)
    core = build_attention(
        {"name": name} if name != "nystrom" else {"name": name, "num_landmarks": 32}
    )
    reference = core(q, k, v)
    low = core(q.to(dtype), k.to(dtype), v.to(dtype))
    assert low.dtype == dtype and torch.isfinite(low).all()
    assert ((low.float() - reference).norm() / reference.norm()) < 0.05


def test_pinv_runs_in_fp32_under_autocast():
    q, k, _ = smooth_qkv(1, 2, 128, 16, seed=8, dtype=torch.float32)
    _, a, _ = nystrom(num_landmarks=16).kernels(q, k)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        z = iterative_pinv(a.to(torch.bfloat16))
    assert z.dtype == torch.float32


def test_gradcheck_nystrom_and_multihead():
    q, k, v = (t.requires_grad_() for t in smooth_qkv(1, 1, 9, 2, seed=9))
    core = nystrom(num_landmarks=4)
    assert torch.autograd.gradcheck(lambda a, b, c: core(a, b, c), (q, k, v))
    mha = MultiHeadAttention(
        8, 2, {"name": "nystrom", "num_landmarks": 3, "conv_kernel_size": 3}
    ).double()
    x = torch.randn(1, 7, 8, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(mha, (x,))


def test_masked_training_recomputes_the_product_and_keeps_less_than_sdpa(monkeypatch):
    """With recompute=True the masked path keeps only q, k, v and computes the product again (the
    pinv inside it under its own recomputation): the same output and gradients in float64
    as autograd through every op, and fewer bytes kept beyond q, k, v than SDPA keeps for the
    same inputs (exact bytes, not a timing)."""
    q, k, v = (t.requires_grad_() for t in smooth_qkv(2, 3, 96, 8, seed=11))
    mask = torch.ones(2, 96, dtype=torch.bool)
    mask[1, 70:] = False
    weights = torch.randn(
        2, 3, 96, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(4)
    )
    inputs = {t.untyped_storage().data_ptr() for t in (q, k, v)}

    def run(core: torch.nn.Module) -> tuple[list[torch.Tensor], int]:
        kept: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            storage = t.untyped_storage()
            if storage.data_ptr() not in inputs:
                kept[storage.data_ptr()] = storage.nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            out = core(q, k, v, mask)
        return [out, *torch.autograd.grad((out * weights).sum(), (q, k, v))], sum(kept.values())

    recomputed, kept_bytes = run(nystrom(num_landmarks=16, recompute=True))
    _, sdpa_bytes = run(build_attention({"name": "softmax"}))
    core = nystrom(num_landmarks=16)  # the default: only the pinv's iterates recomputed
    pinv_only, pinv_only_bytes = run(core)
    cls = type(core)
    monkeypatch.setattr(cls, "recomputed_pseudo_inverse", cls.pseudo_inverse)
    plain, plain_bytes = run(core)
    for got, want in zip([*recomputed, *pinv_only], plain * 2, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    assert kept_bytes < sdpa_bytes
    # Each of the 6 pinv iterations keeps six (B, H, m, m) tensors for autograd (36 in all).
    iterate = 2 * 3 * 16 * 16 * 8
    assert plain_bytes - pinv_only_bytes >= 6 * 6 * iterate
    assert pinv_only_bytes > sdpa_bytes  # what the whole product's recomputation removes


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_fused_cpu_training_path_equals_plain_autograd(dtype):
    """Unpadded segment means with m | n train through one autograd node on CPU: same output
    and the same gradients of q, k and v as autograd through the unfused ops."""
    q, k, v = (t.requires_grad_() for t in smooth_qkv(2, 3, 96, 8, seed=10, dtype=dtype))
    weights = torch.randn(2, 3, 96, 8, dtype=dtype, generator=torch.Generator().manual_seed(3))
    core = nystrom(num_landmarks=16)
    results = []
    for fused in (True, False):
        with gates.override(fused_cpu=fused):
            assert (core.path(q, k, v) is Path.FUSED_CPU) == fused
            out = core(q, k, v)
        assert ("Fused" in type(out.grad_fn).__name__) == fused
        results.append((out, *torch.autograd.grad((out * weights).sum(), (q, k, v))))
    for got, want in zip(*results, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)


def test_gradcheck_fused_cpu_training_path():
    q, k, v = (t.requires_grad_() for t in smooth_qkv(1, 2, 12, 3, seed=11))
    core = nystrom(num_landmarks=4)
    assert "Fused" in type(core(q, k, v).grad_fn).__name__
    assert torch.autograd.gradcheck(lambda a, b, c: core(a, b, c), (q, k, v))


def test_conv_skip_ignores_padding_and_matches_manual_depthwise_conv():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 2, {"name": "softmax", "conv_kernel_size": 5}).double()
    v = torch.randn(1, 2, 9, 4, dtype=torch.float64)
    weight = mha.conv_skip.conv.weight  # (H, 1, 5, 1)
    out = mha.conv_skip(v)
    padded = torch.nn.functional.pad(v, (0, 0, 2, 2))
    manual = (
        torch.stack(
            [
                sum(weight[h, 0, j, 0] * padded[:, h, i + j] for j in range(5))
                for i in range(9)
                for h in range(2)
            ],
            dim=1,
        )
        .reshape(1, 9, 2, 4)
        .transpose(1, 2)
    )
    torch.testing.assert_close(out, manual)
    keep = torch.ones(1, 9, dtype=torch.bool)
    keep[0, 7:] = False
    v2 = v.clone()
    v2[:, :, 7:] += 100
    torch.testing.assert_close(mha.conv_skip(v, keep)[:, :, :7], mha.conv_skip(v2, keep)[:, :, :7])


def per_head_conv(v: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The skip as first written: a Conv2d over H channels with a (k, 1) kernel."""
    k = weight.shape[2]
    left = (k - 1) // 2
    padded = torch.nn.functional.pad(v, (0, 0, left, k - 1 - left))
    return torch.nn.functional.conv2d(padded, weight, groups=v.shape[1])


@pytest.mark.parametrize("kernel", [35, 33, 4, 1])
def test_conv_skip_forward_and_backward_equal_the_per_head_conv(kernel):
    torch.manual_seed(kernel)
    skip = ValueConvSkip(3, kernel).double()
    v = torch.randn(2, 3, 50, 8, dtype=torch.float64, requires_grad=True)
    keep = torch.rand(2, 50) > 0.2
    out = skip(v, keep)
    expected = per_head_conv(v * keep[:, None, :, None], skip.conv.weight)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, (v, skip.conv.weight), grad)
    want = torch.autograd.grad(expected, (v, skip.conv.weight), grad)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    small = torch.randn(1, 3, 6, 2, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: skip(x), (small,))


@pytest.mark.parametrize(
    "config,fragment",
    [
        ({"name": "nystrom", "causal": True}, "cannot be causal"),
        ({"name": "nystrom", "num_landmarks": 0}, "num_landmarks=0"),
        ({"name": "nystrom", "pinv": "svd"}, "pinv=svd"),
        ({"name": "nystrom", "pinv_init": "x"}, "pinv_init=x"),
        ({"name": "nope"}, "unknown attention 'nope'"),
        ({"name": "softmax", "landmarks": 3}, "has no option landmarks"),
        ({"name": "softmax", "dropout": 1.0}, "dropout=1"),
        ({"name": "softmax", "dropout": -0.1}, "dropout=-0.1"),
        ({"name": "softmax", "dropout": float("nan")}, "dropout=nan"),
    ],
)
def test_bad_configs_raise_one_line_errors(config, fragment):
    with pytest.raises(AttentionConfigError, match=fragment) as info:
        build_attention(config)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("padded", [False, True])
@pytest.mark.parametrize("n,m", [(96, 8), (100, 7)])
def test_fused_forward_equals_explicit_kernel_product(n, m, padded):
    """forward() runs F (pinv(A) (Bk V)) as two fused SDPA calls; it must equal the product of
    the written-out kernels."""
    q, k, v = smooth_qkv(2, 3, n, 8, seed=10)
    keep = None
    if padded:
        keep = torch.ones(2, n, dtype=torch.bool)
        keep[1, n // 2 :] = False
    core = nystrom(num_landmarks=m)
    f, a, b = core.kernels(q, k, keep)
    explicit = f @ (iterative_pinv(a) @ (b @ v))
    torch.testing.assert_close(core(q, k, v, keep), explicit, rtol=0, atol=1e-10)


def test_head_groups_give_the_same_result_as_one_call():
    from nyscli.attention.chunking import in_head_groups

    q, k, v = smooth_qkv(2, 5, 70, 8, seed=11)
    keep = torch.ones(2, 70, dtype=torch.bool)
    keep[0, 60:] = False
    core = build_attention({"name": "longformer", "window": 9, "global_tokens": 1})
    whole = core._attend(q, k, v, keep)
    grouped = in_head_groups(core._attend, q, k, v, keep, elements_per_head=70 * 20, budget=1)
    torch.testing.assert_close(grouped, whole, rtol=0, atol=0)
    torch.testing.assert_close(core(q, k, v, keep), whole, rtol=0, atol=0)
    # With a backward to follow the groups are joined by a cat: same values, same gradients.
    for x in (q, k, v):
        x.requires_grad_()
    weights = torch.randn(whole.shape, dtype=whole.dtype)
    grads = torch.autograd.grad((core._attend(q, k, v, keep) * weights).sum(), (q, k, v))
    grouped = in_head_groups(core._attend, q, k, v, keep, elements_per_head=70 * 20, budget=1)
    torch.testing.assert_close(grouped, whole, rtol=0, atol=0)
    grouped_grads = torch.autograd.grad((grouped * weights).sum(), (q, k, v))
    for got, expected in zip(grouped_grads, grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    "config",
    [{"name": name, **extra} for name in available() for extra in ({}, {"conv_kernel_size": 33})]
    + [{"name": "nystrom", "num_landmarks": 8, "landmarks": "kmeans"}],
)
def test_attention_label_matches_built_core(config: dict) -> None:
    label = build_attention(config).label()
    kernel = config.get("conv_kernel_size")
    assert attention_label(config) == (f"{label}+conv{kernel}" if kernel else label)


@pytest.mark.parametrize("training", [False, True])
def test_the_landmark_side_runs_on_one_thread_and_the_rest_keeps_them(monkeypatch, training):
    # Tens of (B, H, m, m) ops a call: a second thread only waits (on a busy machine, for a
    # descheduled one); the n-sized work keeps every thread, and the count comes back.
    seen = []
    inverse = NystromAttention.pseudo_inverse

    def spy(self, a):
        seen.append(torch.get_num_threads())
        return inverse(self, a)

    monkeypatch.setattr(NystromAttention, "pseudo_inverse", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        q, k, v = (t.requires_grad_(training) for t in smooth_qkv(1, 2, 64, 8, seed=3))
        out = nystrom(num_landmarks=16)(q, k, v)
        if training:  # the fused CPU path's backward recomputes pinv(A) on one thread too
            out.sum().backward()
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
    assert seen and set(seen) == {1}


def test_the_fused_cpu_training_path_compiles_without_a_graph_break():
    import torch._dynamo

    q, k, v = (t.float().requires_grad_() for t in smooth_qkv(1, 2, 64, 8, seed=4))
    torch._dynamo.reset()
    explained = torch._dynamo.explain(nystrom(num_landmarks=16))(q, k, v, None)
    assert explained.graph_break_count == 0
