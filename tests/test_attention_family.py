"""The attention family against plain references written out here (float64, n x n is fine)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from nyscli.attention import AttentionConfigError, available, build_attention
from nyscli.attention.linformer import LinformerAttention
from nyscli.attention.longformer import Band
from nyscli.attention.performer import PerformerAttention, favor_features, orthogonal_gaussian
from nyscli.attention.reformer import ReformerAttention

# Configs small enough that every approximation is really exercised at n of a few dozen.
SMALL = {
    "nystrom": {"num_landmarks": 4},
    "nystrom_local": {"num_landmarks": 2, "window": 3, "heavy_keys": 1},
    "linformer": {"proj_dim": 4, "max_seq_len": 64},
    "longformer": {"window": 5, "global_tokens": 1},
    "performer": {"num_features": 16},
    "reformer": {"bucket_size": 4},
}
NOT_CAUSAL = ("nystrom", "nystrom_local", "linformer", "reformer")
CAUSAL_OK = ("softmax", "softmax_naive", "longformer", "linear", "performer")


def qkv(b: int, h: int, n: int, d: int, seed: int = 0, scale: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, generator=g, dtype=torch.float64) for _ in range(3))
    return q * scale, k * scale, v


def padding(b: int, n: int, seed: int = 1) -> torch.Tensor:
    """(b, n) mask with some pads; the first sequence keeps at least one real token."""
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(b, n, generator=g) > 0.3
    mask[0, 0] = True
    return mask


def reference_attention(scores: torch.Tensor, keep: torch.Tensor, v: torch.Tensor):
    """softmax over the kept entries of each row of scores (..., n, n), then @ v; empty rows 0."""
    weights = torch.exp(scores - scores.amax(dim=-1, keepdim=True)) * keep
    total = weights.sum(dim=-1, keepdim=True)
    return torch.where(total > 0, weights / total, 0.0) @ v


def build(name: str, small: bool = True, **extra):
    config = {"name": name, **(SMALL.get(name, {}) if small else {}), **extra}
    return build_attention(config).double()


# ----------------------------------------------------------------------------- longformer


@pytest.mark.parametrize("n", [1, 7, 16, 23, 40])
@pytest.mark.parametrize("window", [1, 5, 9, 257])
@pytest.mark.parametrize("n_global", [0, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_longformer_equals_softmax_with_the_band_mask(n, window, n_global, causal):
    q, k, v = qkv(2, 3, n, 6, seed=n)
    mask = padding(2, n, seed=n + window)
    core = build("longformer", window=window, global_tokens=n_global, causal=causal)
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    radius = (window - 1) // 2
    allowed = ((i - j).abs() <= radius) | (i < n_global) | (j < n_global)
    if causal:
        allowed &= j <= i
    keep = allowed & mask[:, None, None, :]
    expected = reference_attention(q @ k.transpose(-1, -2) / math.sqrt(6), keep, v)
    torch.testing.assert_close(core(q, k, v, mask), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("n", [1, 7, 16, 23, 40, 100])
@pytest.mark.parametrize("window", [1, 5, 9, 33, 65, 257])
def test_band_windows_are_the_padded_keys_of_each_block(n, window):
    # Keys of a block are [t block - radius, (t + 1) block + radius), zero beyond [0, n).
    band = Band.of(n, window)
    x = torch.randn(2, 3, n, 4, dtype=torch.float64)
    padded = F.pad(x, (0, 0, band.radius, band.n_blocks * band.block - n + band.radius))
    expected = torch.stack(
        [padded[:, :, t * band.block : t * band.block + band.span] for t in range(band.n_blocks)],
        dim=2,
    )
    torch.testing.assert_close(band.keys(x), expected, rtol=0, atol=0)
    for first, stop in ((0, 1), (band.n_blocks // 2, band.n_blocks)):
        assert torch.equal(band.keys(x, first, stop), expected[:, :, first:stop])


@pytest.mark.parametrize(("n", "window"), [(64, 9), (45, 7), (40, 33), (9, 65)])
def test_flat_band_windows_equal_the_padded_ones_where_a_sequence_has_keys(n, window):
    # flat_keys: 2 x 3 sequences end to end, so a window beyond a sequence's ends holds its
    # neighbour's rows where keys has zeros; inside [0, n) both are the same rows. Its own
    # backward (slices added) against the padded windows' (autograd through pad and cat;
    # the hybrid's and Longformer's gradchecks run through it too).
    band = Band.of(n, window)
    x = torch.randn(2, 3, n, 4, dtype=torch.float64, requires_grad=True)
    inside = band.keys(torch.ones(1, 1, n, 1, dtype=torch.float64)).bool()  # (1,1,blocks,span,1)
    flat, padded = band.flat_keys(x), band.keys(x)
    assert flat.shape == padded.shape
    torch.testing.assert_close(flat * inside, padded * inside, rtol=0, atol=0)
    assert (flat * ~inside).abs().sum() > 0 or n <= band.radius  # neighbours' rows really there
    weights = torch.randn(padded.shape, dtype=torch.float64) * inside
    (grad_flat,) = torch.autograd.grad((flat * weights).sum(), x)
    (grad_padded,) = torch.autograd.grad((padded * weights).sum(), x)
    torch.testing.assert_close(grad_flat, grad_padded, rtol=0, atol=1e-12)


# --------------------------------------------------------------------------------- linear


@pytest.mark.parametrize("n", [1, 9, 130, 300])  # 130 and 300 cross the 128-token chunks
@pytest.mark.parametrize("causal", [False, True])
def test_linear_equals_its_explicit_formula(n, causal):
    q, k, v = qkv(2, 2, n, 5, seed=n)
    mask = padding(2, n)
    phi_q, phi_k = F.elu(q) + 1, F.elu(k) + 1
    keep = mask[:, None, None, :].expand(-1, -1, n, -1)
    if causal:
        keep = keep & torch.ones(n, n, dtype=torch.bool).tril()
    kernel = (phi_q @ phi_k.transpose(-1, -2)) * keep  # (B, H, n, n)
    total = kernel.sum(dim=-1, keepdim=True)
    expected = torch.where(total > 0, kernel / total, 0.0) @ v
    out = build("linear", causal=causal)(q, k, v, mask)
    torch.testing.assert_close(out, expected, rtol=1e-10, atol=1e-12)


# ------------------------------------------------------------------------------ performer


def test_performer_kernel_estimate_is_unbiased():
    """Mean over 200 independent draws of m = 128 orthogonal features vs exp(q.k / sqrt(d)).

    Each draw's estimate is an independent sample, so the mean's standard error is the sample
    std / sqrt(draws). The mean must sit within 4 standard errors of the truth (a 4-sigma band:
    seeds are fixed, so this is deterministic, and a biased estimator such as one without the
    -|x|^2/2 term or the d^-1/4 scaling misses by tens of standard errors), and the standard
    error must itself be below 1.5% of the truth, so the band is tight enough to mean something.
    """
    d, m, draws = 4, 128, 200
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 1, 5, d, generator=g, dtype=torch.float64) * 0.4
    k = torch.randn(1, 1, 5, d, generator=g, dtype=torch.float64) * 0.4
    truth = torch.exp(q @ k.transpose(-1, -2) / math.sqrt(d))[0, 0]
    estimates = []
    for _ in range(draws):
        w = orthogonal_gaussian(m, d, g)
        phi_q, off_q = favor_features(q, w, is_query=True)
        phi_k, off_k = favor_features(k, w, is_query=False)
        kernel = (phi_q @ phi_k.transpose(-1, -2)) * torch.exp(off_q + off_k.transpose(-1, -2))
        estimates.append(kernel[0, 0])
    estimates = torch.stack(estimates)
    mean = estimates.mean(dim=0)
    stderr = estimates.std(dim=0) / math.sqrt(draws)
    assert (stderr / truth).max() < 0.015
    assert ((mean - truth).abs() / stderr).max() < 4.0
    # Within one block the directions are orthogonal (m = 128 = 32 blocks of d = 4 rows).
    block = F.normalize(w[:d], dim=1)
    torch.testing.assert_close(block @ block.T, torch.eye(d, dtype=torch.float64))


@pytest.mark.parametrize("causal", [False, True])
def test_performer_error_falls_as_features_grow(causal):
    """Relative output error vs exact softmax, averaged over 4 seeds, for 16, 256, 2048 features.

    The estimator's error scales like m^-1/2 (4x from 16 to 256, 2.8x from 256 to 2048) once m
    is large against the features' heavy tail; at these sizes the measured steps are about 3.2x
    and 2.3x, so each step must shrink the error by at least 2x and 1.8x. At 2048 features the
    estimate must also clearly beat uniform attention, the trivial approximation.
    """
    n, d = 48, 8
    q, k, v = qkv(1, 2, n, d, seed=3, scale=0.5)
    mask = torch.ones(1, n, dtype=torch.bool)
    mask[0, -5:] = False
    keep = mask[:, None, None, :].expand(-1, -1, n, -1)
    if causal:
        keep = keep & torch.ones(n, n, dtype=torch.bool).tril()
    exact = reference_attention(q @ k.transpose(-1, -2) / math.sqrt(d), keep, v)
    uniform = reference_attention(torch.zeros(n, n, dtype=q.dtype), keep, v)
    errors = []
    for m in (16, 256, 2048):
        per_seed = []
        for seed in range(4):
            core = build("performer", num_features=m, seed=seed, causal=causal).eval()
            out = core(q, k, v, mask)
            per_seed.append(((out - exact).norm() / exact.norm()).item())
        errors.append(sum(per_seed) / len(per_seed))
    assert errors[0] > 2.0 * errors[1]
    assert errors[1] > 1.8 * errors[2]
    assert errors[2] < 0.06
    assert errors[2] < ((uniform - exact).norm() / exact.norm()).item() / 3


def test_performer_key_stabiliser_ignores_padded_keys():
    """A padded key with a huge exponent must not shift the real keys' features: otherwise it
    could underflow all of them in low precision (the shift cancels only in exact arithmetic)."""
    g = torch.Generator().manual_seed(2)
    w = orthogonal_gaussian(16, 4, g)
    k = torch.randn(1, 1, 6, 4, generator=g, dtype=torch.float64)
    mask = torch.tensor([[True, True, True, True, False, False]])
    features, offset = favor_features(k, w, is_query=False, key_padding_mask=mask)
    k_far = k.clone()
    longest = w[w.norm(dim=1).argmax()]
    k_far[0, 0, 4] = longest * 4**0.25  # exponent |w|^2 / 2 = 2.9, above the real keys' 1.7
    features_far, offset_far = favor_features(k_far, w, is_query=False, key_padding_mask=mask)
    torch.testing.assert_close(features_far, features)
    torch.testing.assert_close(offset_far, offset)
    assert features[0, 0, 4:].eq(0).all() and features[0, 0, :4].amax() == pytest.approx(0.25)


def test_performer_features_are_seeded_redrawn_and_saved():
    q, k, v = qkv(1, 2, 10, 4)
    a = build("performer", seed=5).train()
    b = build("performer", seed=5).train()
    a(q, k, v)
    b(q, k, v)
    torch.testing.assert_close(a.projection, b.projection)  # same seed, same draw
    first = a.projection.clone()
    a(q, k, v)
    assert torch.equal(a.projection, first)  # redraw off: the draw stays
    c = build("performer", seed=5, redraw=True).train()
    c(q, k, v)
    drawn = c.projection.clone()
    c(q, k, v)
    assert not torch.allclose(c.projection, drawn)  # training with redraw: a new draw
    c.eval()
    out = c(q, k, v)
    torch.testing.assert_close(c(q, k, v), out)  # evaluation keeps it
    fresh = PerformerAttention(seed=99).double()
    fresh.load_state_dict(c.state_dict())
    torch.testing.assert_close(fresh.eval()(q, k, v), out)


# ------------------------------------------------------------------------------ linformer


@pytest.mark.parametrize("n", [1, 6, 17])
def test_linformer_with_identity_projections_is_exact(n):
    q, k, v = qkv(2, 2, n, 5, seed=n)
    core = LinformerAttention(proj_dim=n, max_seq_len=n + 7).double()
    with torch.no_grad():
        # Only the first n columns may be used: junk after them must not matter.
        junk = torch.randn(n, 7, dtype=torch.float64)
        core.proj_k.copy_(torch.cat([torch.eye(n, dtype=torch.float64), junk], dim=1))
        core.proj_v.copy_(torch.cat([torch.eye(n, dtype=torch.float64), -junk], dim=1))
    keep = torch.ones(n, n, dtype=torch.bool)
    expected = reference_attention(q @ k.transpose(-1, -2) / math.sqrt(5), keep, v)
    torch.testing.assert_close(core(q, k, v), expected, rtol=1e-10, atol=1e-12)


def test_linformer_refuses_inputs_longer_than_max_seq_len():
    q, k, v = qkv(1, 1, 9, 4)
    with pytest.raises(AttentionConfigError, match=r"length 9 .*max_seq_len=8"):
        build("linformer", proj_dim=2, max_seq_len=8)(q, k, v)


@pytest.mark.parametrize(("n", "k", "extra"), [(12, 12, 0), (12, 6, 0), (12, 4, 0), (9, 3, 6)])
def test_linformer_conversion_init_averages_segments(n, k, extra):
    """E = F = averages of k equal runs of max_seq_len positions: softmax over averaged K, V.

    With extra columns (max_seq_len > n) the runs are those of max_seq_len; n = 9 of 15
    positions fill the first 3 of 3 runs of 5 only partly, so the expected keys are sums / 5.
    """
    q, k_, v = qkv(2, 2, n, 5, seed=n + k)
    core = LinformerAttention(proj_dim=k, max_seq_len=n + extra).double()
    core.init_for_conversion()
    width = (n + extra) // k
    pooled = [
        torch.nn.functional.pad(x, (0, 0, 0, width * k - n)).unflatten(2, (k, width)).sum(3) / width
        for x in (k_, v)
    ]
    keep = torch.ones(n, k, dtype=torch.bool)
    expected = reference_attention(q @ pooled[0].transpose(-1, -2) / math.sqrt(5), keep, pooled[1])
    torch.testing.assert_close(core(q, k_, v), expected, rtol=1e-10, atol=1e-12)


def test_linformer_conversion_init_with_k_equal_n_is_exact_softmax():
    q, k, v = qkv(1, 3, 10, 4, seed=3)
    core = LinformerAttention(proj_dim=10, max_seq_len=10).double()
    core.init_for_conversion()
    expected = F.scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(core(q, k, v), expected, rtol=1e-10, atol=1e-12)


def test_linformer_default_init_is_n_0_1_over_k():
    core = build("linformer", small=False)
    assert core.proj_k.shape == (256, 16384)
    assert abs(core.proj_k.std().item() - 1 / 16) < 1e-3


# ------------------------------------------------------------------------------- reformer


def shared_qk_scores(q: torch.Tensor) -> torch.Tensor:
    keys = q / q.norm(dim=-1, keepdim=True)
    return q @ keys.transpose(-1, -2) / math.sqrt(q.shape[-1])


@pytest.mark.parametrize("n", [1, 2, 9, 16])
def test_reformer_with_one_bucket_is_exact_shared_qk_attention(n):
    q, k, v = qkv(2, 2, n, 5, seed=n)
    mask = padding(2, n, seed=n)
    eye = torch.eye(n, dtype=torch.bool)
    keep = mask[:, None, None, :] & ~eye  # never itself ...
    expected = reference_attention(shared_qk_scores(q), keep, v)
    alone = ~keep.any(dim=-1, keepdim=True)  # ... unless nobody else is there
    expected = torch.where(alone, v, expected)
    core = build("reformer", bucket_size=16, n_hashes=2)
    torch.testing.assert_close(core(q, k, v, mask), expected, rtol=1e-10, atol=1e-12)


def lsh_reference(core: ReformerAttention, q, v, mask) -> torch.Tensor:
    """The LSH procedure with loops: sort by (bucket, position), chunk, attend to own and
    previous chunk except self, combine rounds by their logsumexp, fall back to self."""
    b, h, n, _ = q.shape
    ids = core.buckets(q, mask)
    chunk = min(core.bucket_size, n)
    scores = shared_qk_scores(q)
    out = torch.zeros_like(v)
    for bi in range(b):
        for hi in range(h):
            outs, lses = [], []
            for r in range(core.n_hashes):
                order = sorted(range(n), key=lambda i, r=r: (ids[bi, hi, r, i].item(), i))
                where = {pos: slot // chunk for slot, pos in enumerate(order)}
                keep = torch.tensor(
                    [
                        [
                            bool(mask[bi, j]) and j != i and 0 <= where[i] - where[j] <= 1
                            for j in range(n)
                        ]
                        for i in range(n)
                    ]
                )
                s = scores[bi, hi]
                outs.append(reference_attention(s, keep, v[bi, hi]))
                lse = torch.logsumexp(s.masked_fill(~keep, -math.inf), dim=-1)
                lses.append(lse)
            lse = torch.stack(lses)  # (R, n); -inf where a round had nobody
            weights = torch.softmax(lse, dim=0).nan_to_num(0.0)
            combined = (weights[..., None] * torch.stack(outs)).sum(dim=0)
            alone = torch.isinf(lse).all(dim=0)[:, None]
            out[bi, hi] = torch.where(alone, v[bi, hi], combined)
    return out


@pytest.mark.parametrize("n_hashes", [1, 2, 3])
@pytest.mark.parametrize("n", [13, 27])
@pytest.mark.parametrize("padded", [False, True])
def test_reformer_equals_the_lsh_procedure_written_with_loops(n_hashes, n, padded):
    q, k, v = qkv(2, 2, n, 6, seed=n)
    mask = padding(2, n, seed=n_hashes) if padded else torch.ones(2, n, dtype=torch.bool)
    core = build("reformer", bucket_size=4, n_hashes=n_hashes, seed=n)
    ids = core.buckets(q, mask)
    assert ids[~mask[:, None, None, :].expand_as(ids)].eq(core.num_buckets(n)).all()
    assert ids.max() <= core.num_buckets(n) and len(ids[0, 0, 0].unique()) > 2
    torch.testing.assert_close(core(q, k, v, mask), lsh_reference(core, q, v, mask))


def test_reformer_buckets_under_bf16_autocast_equal_fp32():
    """The hash is computed in fp32 with autocast off: precision must not move tokens."""
    torch.manual_seed(0)
    q = torch.randn(2, 2, 2048, 32)  # fp32, as the projections hand it over before autocast
    core = build("reformer", bucket_size=32, n_hashes=2)
    ids = core.buckets(q)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ids_bf16 = core.buckets(q)
        out_bf16 = core(q, q, q)
    assert torch.equal(ids_bf16, ids)
    assert len(ids.unique()) == core.num_buckets(2048)
    # Same buckets, so the bf16 output differs from fp32 only by bf16 rounding.
    torch.testing.assert_close(out_bf16.float(), core(q, q, q), rtol=0.05, atol=0.05)


# ------------------------------------------------------------------------- every variant


@pytest.mark.parametrize("name", available())
@pytest.mark.parametrize("small", [True, False])
def test_masked_tokens_do_not_change_real_outputs(name, small):
    n = 13
    q, k, v = qkv(2, 2, n, 8, seed=4)
    mask = padding(2, n, seed=7)
    core = build(name, small=small).eval()
    base = core(q, k, v, mask)
    pads = ~mask[:, None, :, None]
    g = torch.Generator().manual_seed(8)
    q2, k2, v2 = (
        x + pads * 5 * torch.randn(x.shape, generator=g, dtype=x.dtype) for x in (q, k, v)
    )
    changed = core(q2, k2, v2, mask)
    real = mask[:, None, :, None].expand_as(base)
    torch.testing.assert_close(changed[real], base[real], rtol=1e-9, atol=1e-11)
    assert not torch.allclose(q2, q)  # the pads really were changed


@pytest.mark.parametrize("name", CAUSAL_OK)
def test_causal_outputs_ignore_the_future(name):
    n = 13
    q, k, v = qkv(1, 2, n, 8, seed=5)
    core = build(name, causal=True).eval()
    base = core(q, k, v)
    later = torch.arange(n)[None, None, :, None] >= 9
    q2, k2, v2 = (torch.where(later, x + 3.0, x) for x in (q, k, v))
    changed = core(q2, k2, v2)
    torch.testing.assert_close(changed[:, :, :9], base[:, :, :9], rtol=1e-9, atol=1e-11)
    assert not torch.allclose(changed[:, :, 9:], base[:, :, 9:])


@pytest.mark.parametrize("name", available())
def test_a_single_token_returns_its_value(name):
    q, k, v = qkv(2, 2, 1, 6)
    out = build(name, small=False).eval()(q, k, v)
    if name == "linformer":  # softmax over k projections of one token: a multiple of v
        ratio = out / v
        torch.testing.assert_close(ratio, ratio[..., :1].expand_as(ratio))
    else:
        torch.testing.assert_close(out, v)


@pytest.mark.parametrize("name", available())
def test_bf16_is_finite_and_close_to_fp32(name):
    n = 37
    q, k, v = (x.to(torch.bfloat16) for x in qkv(2, 2, n, 16, seed=6))
    mask = padding(2, n)
    core = build(name).float().eval()
    out = core(q, k, v, mask)
    assert out.dtype == torch.bfloat16 and out.isfinite().all()
    reference = core(q.float(), k.float(), v.float(), mask)  # same rounded inputs
    assert (out.float() - reference).abs().max() < 0.1


@pytest.mark.parametrize(
    "name, causal", [(name, False) for name in available()] + [(name, True) for name in CAUSAL_OK]
)
def test_gradients_flow_and_match_finite_differences(name, causal):
    q, k, v = (x.requires_grad_() for x in qkv(1, 1, 7, 4, seed=9))
    mask = torch.tensor([[True, True, True, False, True, True, False]])
    core = build(name, causal=causal).eval()
    out = core(q, k, v, mask)
    (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
    for x in (q, v) if name == "reformer" else (q, k, v):
        assert x.grad.isfinite().all() and x.grad.abs().max() > 1e-6
    if name == "reformer":  # shared-QK: the keys are the normalised queries
        assert k.grad is None
    assert torch.autograd.gradcheck(lambda a, b, c: core(a, b, c, mask), (q, k, v), fast_mode=True)


@pytest.mark.parametrize("name", NOT_CAUSAL)
def test_causal_is_refused_where_the_method_looks_ahead(name):
    refusal = rf"causal=true is not allowed; it must be false \({name} attention cannot be causal"
    with pytest.raises(AttentionConfigError, match=refusal):
        build_attention({"name": name, "causal": True})


@pytest.mark.parametrize(
    "config, message",
    [
        ({"name": "longformer", "window": 4}, r"attention.window=4 .* odd"),
        ({"name": "longformer", "window": 0}, r"attention.window=0 .* >= 1"),
        ({"name": "longformer", "global_tokens": -1}, r"global_tokens=-1 .* >= 0"),
        ({"name": "performer", "num_features": 0}, r"num_features=0 .* >= 1"),
        ({"name": "performer", "seed": "x"}, r"seed=x .* integer"),
        ({"name": "reformer", "bucket_size": 0}, r"bucket_size=0 .* >= 1"),
        ({"name": "reformer", "n_hashes": True}, r"n_hashes=true .* integer"),
        ({"name": "linformer", "proj_dim": 2.5}, r"proj_dim=2.5 .* integer"),
    ],
)
def test_bad_options_name_the_value_and_what_is_allowed(config, message):
    with pytest.raises(AttentionConfigError, match=message):
        build_attention(config)


@pytest.mark.parametrize(
    "name", ["linear", "linformer", "longformer", "nystrom_local", "performer", "reformer"]
)
def test_yaml_lists_exactly_the_options(name):
    import inspect
    from pathlib import Path

    from omegaconf import OmegaConf

    path = Path(__file__).resolve().parents[1] / "conf" / "attention" / f"{name}.yaml"
    # Resolved in a config without task or model: defaults that follow them fall back.
    root = OmegaConf.create({"attention": OmegaConf.load(path)})
    config = OmegaConf.to_container(root.attention, resolve=True)
    cls = type(build_attention(config))
    options = set(inspect.signature(cls.__init__).parameters) - {"self", "causal"}
    assert set(config) - {"name", "conv_kernel_size", "causal"} == options
    assert config["conv_kernel_size"] == 0 and config["name"] == name
    for key in options:
        assert config[key] == inspect.signature(cls.__init__).parameters[key].default


def test_reformer_hash_is_argmax_over_plus_minus_rotations(monkeypatch):
    """Buckets = argmax([xR, -xR]) with R drawn from the seed, also when hashed in slices."""
    from nyscli.attention import reformer

    monkeypatch.setattr(reformer, "HASH_SLICE", 5)  # 27 tokens: six slices, the last partial
    q, _, _ = qkv(2, 3, 27, 6, seed=11)
    core = build("reformer", bucket_size=4, n_hashes=2, seed=3)
    n_buckets = core.num_buckets(27)
    assert n_buckets == 14
    rotations = torch.randn((3, 6, 2, n_buckets // 2), generator=torch.Generator().manual_seed(3))
    rotated = torch.einsum("bhnd,hdrk->bhrnk", q.float(), rotations)
    expected = torch.cat([rotated, -rotated], dim=-1).argmax(dim=-1)
    assert torch.equal(core.buckets(q), expected)
    assert core.buckets(q * 3.0).equal(expected)  # angular: the length does not matter


@pytest.mark.parametrize("name", available())
def test_every_variant_trains_inside_the_multi_head_module_under_bf16_autocast(name):
    from nyscli.attention import MultiHeadAttention

    torch.manual_seed(0)
    mha = MultiHeadAttention(32, 4, {"name": name, **SMALL.get(name, {})})
    x = torch.randn(2, 19, 32, requires_grad=True)
    mask = padding(2, 19)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = mha(x, mask)
    out.float().square().mean().backward()
    assert out.shape == x.shape and out.float().isfinite().all()
    assert x.grad.isfinite().all() and x.grad.abs().max() > 0


@pytest.mark.parametrize("name", available())
def test_value_width_may_differ_from_query_width(name):
    """The interface allows v: (B, H, n, d_v) with d_v != d; with one token every core
    returns that token's value (reformer/linformer: a multiple of it at most)."""
    q, k = torch.randn(2, 1, 2, 1, 8, dtype=torch.float64)
    v = torch.randn(1, 2, 1, 5, dtype=torch.float64)
    out = build_attention({"name": name})(q, k, v)
    assert out.shape == (1, 2, 1, 5)
    q, k = torch.randn(2, 1, 2, 40, 8, dtype=torch.float64)
    v = torch.randn(1, 2, 40, 5, dtype=torch.float64)
    wide = torch.cat([v, torch.randn(1, 2, 40, 3, dtype=torch.float64)], dim=-1)
    core = build_attention({"name": name})
    # The first 5 output columns depend only on the first 5 value columns.
    torch.testing.assert_close(core(q, k, v), core(q, k, wide)[..., :5])
