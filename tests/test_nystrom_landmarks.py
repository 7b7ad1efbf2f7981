"""Landmark selection options of the Nyström core: segment means, random tokens, k-means."""

from __future__ import annotations

import pytest
import torch

from nyscli.attention import AttentionConfigError, build_attention
from nyscli.attention.landmarks import LANDMARK_METHODS, kmeans_groups, random_tokens

B, H, N, D = 2, 3, 50, 8
REAL = 30  # real tokens of the second (padded) sequence


def qkv_mask() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, H, N, D, generator=g, dtype=torch.float64) for _ in range(3))
    mask = torch.ones(B, N, dtype=torch.bool)
    mask[1, REAL:] = False
    return q, k, v, mask


@pytest.mark.parametrize("method", LANDMARK_METHODS)
def test_padding_never_changes_real_outputs(method: str) -> None:
    q, k, v, mask = qkv_mask()
    core = build_attention({"name": "nystrom", "num_landmarks": 7, "landmarks": method})
    out = core(q, k, v, mask)
    q2, k2, v2 = q.clone(), k.clone(), v.clone()
    for x, junk in ((q2, 50.0), (k2, -30.0), (v2, 1e3)):
        x[1, :, REAL:] = junk
    out2 = core(q2, k2, v2, mask)
    assert torch.equal(out[0], out2[0])
    assert torch.allclose(out[1, :, :REAL], out2[1, :, :REAL], atol=1e-12)


@pytest.mark.parametrize("method", LANDMARK_METHODS)
def test_as_many_landmarks_as_real_tokens_is_exact(method: str) -> None:
    # 40 landmarks >= 30 real tokens of sequence 1: every real token is its own landmark.
    q, k, v, mask = qkv_mask()
    config = {"name": "nystrom", "num_landmarks": 40, "landmarks": method, "pinv": "exact"}
    out = build_attention(config)(q, k, v, mask)
    exact = build_attention({"name": "softmax_naive"})(q, k, v, mask)
    assert torch.allclose(out[1, :, :REAL], exact[1, :, :REAL], atol=1e-10)


def test_random_landmarks_are_distinct_real_tokens_and_seeded() -> None:
    q, k, _, mask = qkv_mask()
    q_land, k_land, exists = random_tokens(q, k, 40, mask, seed=3)
    assert exists is not None and exists.sum(dim=1).tolist() == [40, REAL]
    picked = q_land[1, 0, exists[1]]  # (REAL, D): must be exactly the real tokens, any order
    match = (picked[:, None, :] == q[1, 0, None, :REAL, :]).all(dim=-1)
    assert match.sum(dim=1).eq(1).all() and match.sum(dim=0).eq(1).all()
    again, _, _ = random_tokens(q, k, 40, mask, seed=3)
    other, _, _ = random_tokens(q, k, 40, mask, seed=4)
    assert torch.equal(q_land, again) and not torch.equal(q_land[0], other[0])


def test_lloyd_steps_lower_the_quantisation_error_of_the_random_start() -> None:
    q, k, _, _ = qkv_mask()
    x = torch.cat([q, k], dim=-1)

    def quantisation_error(iterations: int) -> float:
        q_land, k_land, _ = kmeans_groups(q, k, 6, None, iterations, seed=0)
        centres = torch.cat([q_land, k_land], dim=-1)
        return torch.cdist(x, centres).amin(dim=-1).square().sum().item()

    errors = [quantisation_error(i) for i in (0, 1, 3)]
    assert errors[0] > errors[1] >= errors[2]


def test_bad_landmark_options_are_one_line_errors() -> None:
    with pytest.raises(AttentionConfigError, match="attention.landmarks=grid"):
        build_attention({"name": "nystrom", "landmarks": "grid"})
    with pytest.raises(AttentionConfigError, match="kmeans_iterations=-1"):
        build_attention({"name": "nystrom", "kmeans_iterations": -1})


def test_query_kmeans_is_lloyd_on_a_sample_of_the_queries_then_means_over_all_tokens(
    monkeypatch,
) -> None:
    """Written out for one head with loops: Lloyd's steps from the queries' segment means on
    every s-th token, then each token to its nearest centre, q~ and k~ the clusters' means."""
    from nyscli.attention import landmarks

    monkeypatch.setattr(landmarks, "QUERY_KMEANS_SAMPLE", 2)  # 50 tokens, m 5: every 5th
    q, k, _, _ = qkv_mask()
    q_land, k_land, exists = landmarks.query_kmeans(q, k, 5, None, iterations=3)
    assert exists is None
    for b, h in ((0, 0), (1, 2)):
        x, y = q[b, h], k[b, h]
        centres = torch.stack([x[10 * i : 10 * i + 10].mean(0) for i in range(5)])
        sample = x[::5]
        for _ in range(3):
            near = torch.cdist(sample, centres).argmin(-1)
            centres = torch.stack([sample[near == c].mean(0) if (near == c).any() else centres[c]
                                   for c in range(5)])  # fmt: skip
        near = torch.cdist(x, centres).argmin(-1)
        for c in range(5):
            if (near == c).any():
                torch.testing.assert_close(q_land[b, h, c], x[near == c].mean(0))
                torch.testing.assert_close(k_land[b, h, c], y[near == c].mean(0))
    # deterministic: no draw
    again = landmarks.query_kmeans(q, k, 5, None, iterations=3)[0]
    assert torch.equal(q_land, again)


def test_group_sums_by_index_add_equal_the_one_hot_product_of_cuda() -> None:
    # The CPU adds rows by index_add; CUDA, whose index_add adds in no fixed order, by a
    # one-hot product. Both give each group's sum and count; group m is no group (padding).
    from nyscli.attention.landmarks import group_sums, one_hot_sums

    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, 50, 7, generator=g, dtype=torch.float64)
    group = torch.randint(0, 6, (2, 3, 50), generator=g)  # 0..4 and 5 = m: no group
    sums, counts = group_sums(x, group, 5)
    want_sums, want_counts = one_hot_sums(x, group, 5)
    assert sums.shape == (2, 3, 5, 7) and counts.shape == (2, 3, 5, 1)
    assert torch.allclose(sums, want_sums, atol=1e-12) and torch.equal(counts, want_counts)
    for c in range(5):  # the formula itself, group by group
        inside = (group == c)[..., None]
        assert torch.allclose(sums[:, :, c], (x * inside).sum(2), atol=1e-12)
        assert torch.equal(counts[:, :, c, 0], inside.sum((2, 3)).double())
