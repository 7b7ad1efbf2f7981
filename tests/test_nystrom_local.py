"""The Nyström-local hybrid against its formula written out with n x n matrices (float64)."""

from __future__ import annotations

import math

import pytest
import torch

from nyscli.attention import (
    build_attention,
    config_at_pairs,
    nystrom_local,
    nystrom_local_parts,
    pairs_per_query,
)
from nyscli.attention.pinv import iterative_pinv
from nyscli.experiments.approx_error.methods import implied_matrix


def qkv(b: int, h: int, n: int, d: int, seed: int = 0):
    """Position-correlated q, k (a random walk along n) so landmarks carry information."""
    g = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(b, h, n, d, generator=g, dtype=torch.float64).cumsum(2) / 4 for _ in "qk")
    return q, k, torch.randn(b, h, n, d, generator=g, dtype=torch.float64)


def hybrid(**options):
    return build_attention({"name": "nystrom_local", **options}).double()


def reference(
    q, k, v, m: int, window: int, g: int, iterations: int = 6, far: bool = True,
    routed: int = 0, landmarks=None,
):  # fmt: skip
    """One head, no padding, m dividing n: the formula of the class doc with dense matrices.

    W = exp(S) on the band, the g heavy keys and the ``routed`` keys of each query (the
    largest B' entries of the landmark query nearest it), K~ = F pinv(A) B elsewhere
    (zeroed for a query whose K~ mass off the support is not positive, and everywhere without
    the far field); out = W v / W 1. ``landmarks``: (q~, k~), segment means if None.
    """
    n, d = q.shape
    s = q @ k.T / math.sqrt(d)
    q_land = q.view(m, n // m, d).mean(1)
    k_land = k.view(m, n // m, d).mean(1)
    if landmarks is not None:
        q_land, k_land = landmarks
    land = q_land @ k.T / math.sqrt(d)
    shift = land.amax(-1, keepdim=True)
    b = torch.exp(land - shift)
    a = torch.exp(q_land @ k_land.T / math.sqrt(d) - shift)
    kernel = torch.exp(q @ k_land.T / math.sqrt(d)) @ iterative_pinv(a, iterations) @ b
    pos = torch.arange(n)
    support = (pos[:, None] - pos[None, :]).abs() <= (window - 1) // 2
    support[:, b.amax(0).topk(g).indices] = True
    if routed:
        nearest = torch.cdist(q, q_land).argmin(-1)
        support[torch.arange(n)[:, None], b.topk(routed).indices[nearest]] = True
    outside = torch.where(support, 0.0, kernel)
    outside = outside * (outside.sum(-1, keepdim=True) > 0) * far
    w = torch.where(support, torch.exp(s), outside)
    return w @ v / w.sum(-1, keepdim=True), w / w.sum(-1, keepdim=True)


@pytest.mark.parametrize(("m", "window", "g"), [(4, 5, 0), (4, 9, 3), (8, 3, 6), (2, 1, 0)])
@pytest.mark.parametrize("chunk", [None, 40])
def test_output_equals_the_dense_formula(m, window, g, chunk, monkeypatch):
    """Also with the band cut into chunks of 1-2 query blocks (40 entries), as at large n."""
    if chunk:  # a band this small is otherwise done in one go
        monkeypatch.setattr(nystrom_local_parts, "CPU_SMALL_BAND", 0)
        monkeypatch.setattr(nystrom_local_parts, "CPU_CHUNK_ENTRIES", chunk)
    q, k, v = qkv(1, 2, 32, 6, seed=1)
    out = hybrid(num_landmarks=m, window=window, heavy_keys=g)(q, k, v)
    for h in range(2):
        expected, _ = reference(q[0, h], k[0, h], v[0, h], m, window, g)
        torch.testing.assert_close(out[0, h], expected, rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("chunk", [None, 40])
def test_without_the_far_field_it_is_softmax_over_the_band_and_heavy_keys(chunk, monkeypatch):
    """far_field=false (the ablation): every query attends over its band and the g heavy keys
    alone, exactly; the landmarks only pick the heavy keys. Costs m pairs less a query."""
    if chunk:
        monkeypatch.setattr(nystrom_local_parts, "CPU_SMALL_BAND", 0)
        monkeypatch.setattr(nystrom_local_parts, "CPU_CHUNK_ENTRIES", chunk)
    q, k, v = qkv(1, 2, 32, 6, seed=4)
    core = hybrid(num_landmarks=4, window=5, heavy_keys=3, far_field=False)
    out = core(q, k, v)
    for h in range(2):
        expected, weights = reference(q[0, h], k[0, h], v[0, h], 4, 5, 3, far=False)
        torch.testing.assert_close(out[0, h], expected, rtol=1e-11, atol=1e-12)
        assert ((weights > 0).sum(-1) <= 5 + 3).all()  # no weight off the band and heavy keys
    assert (
        core.pairs() == 4 + 4 + 3
        and hybrid(num_landmarks=4, window=5, heavy_keys=3).pairs() == 4 + 8 + 3
    )
    assert core.label() == "nystrom_local-w5-m4-g3-no_far_field"


def test_a_query_with_no_positive_mass_estimate_off_its_support_keeps_its_exact_part():
    """Peaky scores (q, k x 3): one query's Nyström estimate of the mass off its band and
    heavy keys is negative; it then attends over those keys alone, and the rest as before."""
    q, k, v = (x[0, 0] for x in qkv(1, 1, 32, 6, seed=2))
    q, k = 3 * q, 3 * k
    out = hybrid(num_landmarks=4, window=5, heavy_keys=3)(*(x[None, None] for x in (q, k, v)))
    expected, weights = reference(q, k, v, 4, 5, 3)
    torch.testing.assert_close(out[0, 0], expected, rtol=1e-11, atol=1e-12)
    sparse_only = (weights > 0).sum(-1) == 5 + 3  # the band (5 here) and 3 heavy keys
    assert sparse_only.sum() == 1  # the guarded query, and only it


@pytest.mark.parametrize(("n", "m", "window"), [(9, 4, 9), (9, 4, 65), (6, 8, 3), (6, 6, 1)])
@pytest.mark.parametrize("masked", [False, True])
def test_window_or_landmarks_covering_n_is_exact_softmax(n, m, window, masked):
    q, k, v = qkv(2, 3, n, 5, seed=2)
    mask = torch.ones(2, n, dtype=torch.bool)
    if masked:
        mask[1, n // 2 :] = False
    out = hybrid(num_landmarks=m, window=window)(q, k, v, mask if masked else None)
    s = (q @ k.transpose(-1, -2) / math.sqrt(5)).masked_fill(~mask[:, None, None, :], -math.inf)
    torch.testing.assert_close(out, torch.softmax(s, -1) @ v, rtol=0, atol=1e-12)


@pytest.mark.parametrize("g", [0, 3])
def test_band_entries_are_exact_attention_restricted_to_the_band(g):
    """Within a query's band the implied weights are exp(s_ij) / one normaliser: renormalised
    over the band they equal softmax attention with the band mask (Longformer's formula)."""
    n, window = 40, 9
    q, k, _ = qkv(1, 2, n, 4, seed=3)
    s_hat = implied_matrix(hybrid(num_landmarks=4, window=window, heavy_keys=g), q, k, None)
    pos = torch.arange(n)
    band = (pos[:, None] - pos[None, :]).abs() <= (window - 1) // 2
    s = (q @ k.transpose(-1, -2) / math.sqrt(4)).masked_fill(~band, -math.inf)
    on_band = s_hat * band
    torch.testing.assert_close(
        on_band / on_band.sum(-1, keepdim=True), torch.softmax(s, -1), rtol=0, atol=1e-12
    )
    assert (s_hat * ~band).abs().max() > 1e-3  # the rest is really estimated, not zero


@pytest.mark.parametrize("masked", [False, True])
def test_implied_matrix_rows_sum_to_one(masked):
    n = 45  # m does not divide n: unequal segments
    q, k, _ = qkv(2, 2, n, 4, seed=4)
    mask = torch.ones(2, n, dtype=torch.bool)
    mask[1, 30:] = False
    core = hybrid(num_landmarks=4, window=7, heavy_keys=3)
    s_hat = implied_matrix(core, q, k, mask if masked else None)
    rows = s_hat.sum(-1)
    real = mask[:, None, :].expand_as(rows) if masked else torch.ones_like(rows, dtype=torch.bool)
    torch.testing.assert_close(rows[real], torch.ones_like(rows[real]), rtol=0, atol=1e-12)
    if masked:  # padded keys get exactly zero weight
        assert s_hat[1][..., 30:].abs().max() == 0


def test_padding_never_changes_a_sequence():
    """A sequence right-padded inside a longer batch gives its unpadded output on real rows,
    whether its batch neighbour takes the approximate path or the exact one."""
    core = hybrid(num_landmarks=4, window=7, heavy_keys=3)
    q, k, v = qkv(3, 2, 50, 4, seed=5)
    lengths = (50, 37, 6)  # 6 <= window: exact softmax
    mask = torch.arange(50)[None, :] < torch.tensor(lengths)[:, None]
    batched = core(q, k, v, mask)
    for i, n in enumerate(lengths):
        alone = core(q[i : i + 1, :, :n], k[i : i + 1, :, :n], v[i : i + 1, :, :n])
        torch.testing.assert_close(batched[i : i + 1, :, :n], alone, rtol=1e-10, atol=1e-12)


def test_gradients_match_finite_differences_on_the_approximate_path():
    q, k, v = (x.requires_grad_() for x in qkv(1, 2, 24, 3, seed=6))
    mask = torch.ones(1, 24, dtype=torch.bool)
    mask[0, 20:] = False
    core = hybrid(num_landmarks=3, window=5, heavy_keys=2)
    assert torch.autograd.gradcheck(lambda a, b, c: core(a, b, c, mask), (q, k, v))


@pytest.mark.parametrize("pairs", [32, 64, 128, 256])
@pytest.mark.parametrize("name", ["nystrom", "longformer", "nystrom_local", "linformer"])
def test_a_budget_in_pairs_gives_that_many_pairs(name, pairs):
    assert pairs_per_query(config_at_pairs(name, pairs)) == pairs


def test_budget_128_is_nystrom_64_longformer_129_and_the_measured_hybrid_split():
    assert config_at_pairs("nystrom", 128)["num_landmarks"] == 64
    assert config_at_pairs("longformer", 128)["window"] == 129
    assert config_at_pairs("nystrom_local", 128) == {
        "name": "nystrom_local",
        "window": 65,
        "num_landmarks": 16,
        "heavy_keys": 32,
    }
    assert pairs_per_query({"name": "nystrom_local", "window": 65, "num_landmarks": 32}) == 160
    assert pairs_per_query({"name": "softmax"}) is None


@pytest.mark.parametrize("pairs", [16, 32, 64, 128, 256])
@pytest.mark.parametrize("method", ["hybrid_band_heavy", "hybrid_landmarks_heavy", "hybrid_routed"])
def test_the_hybrid_forms_cost_the_budget_and_drop_their_part(method, pairs):
    """approx-error's other hybrid rows, each at exactly the budget's pairs: without its far
    field (band + heavy keys), without its band (landmarks + heavy keys), and routed (k-means
    landmarks, routed keys in place of heavy keys, w 9, m 24, K 72 at 128)."""
    from nyscli.experiments.approx_error.methods import core_config

    config = core_config(method, pairs, 512, {}, seed=0, unit="pairs")
    assert pairs_per_query(config) == pairs
    if method == "hybrid_band_heavy":
        assert config["far_field"] is False and config["window"] > 1 and config["heavy_keys"] > 0
    elif method == "hybrid_landmarks_heavy":
        assert config["window"] == 1 and config.get("far_field", True)
    else:
        assert config["heavy_keys"] == 0 and config["routed_keys"] > 0
        assert config["landmarks"] == "query_kmeans"
    if method == "hybrid_routed" and pairs == 128:
        assert (config["window"], config["num_landmarks"], config["routed_keys"]) == (9, 24, 72)
    assert config["name"] == "nystrom_local"


@pytest.mark.parametrize(
    ("m", "window", "g", "routed"), [(4, 5, 0, 6), (4, 1, 3, 8), (8, 3, 2, 4), (2, 1, 0, 30)]
)
@pytest.mark.parametrize("chunk", [None, 40])
def test_routed_keys_output_equals_the_dense_formula(m, window, g, routed, chunk, monkeypatch):
    """Each query also scores exactly its nearest landmark's favourite keys (in B'), once
    where they fall in its band or among the heavy keys; the far field covers the rest.
    Also in chunks, and with 30 routed keys of 32 (nearly every key)."""
    if chunk:
        monkeypatch.setattr(nystrom_local_parts, "CPU_SMALL_BAND", 0)
        monkeypatch.setattr(nystrom_local_parts, "CPU_CHUNK_ENTRIES", chunk)
    q, k, v = qkv(1, 2, 32, 6, seed=7)
    core = hybrid(num_landmarks=m, window=window, heavy_keys=g, routed_keys=routed)
    out = core(q, k, v)
    for h in range(2):
        expected, weights = reference(q[0, h], k[0, h], v[0, h], m, window, g, routed=routed)
        torch.testing.assert_close(out[0, h], expected, rtol=1e-11, atol=1e-12)
    assert core.pairs() == window - 1 + 2 * m + g + routed
    assert core.label() == f"nystrom_local-w{window}-m{m}" + (f"-g{g}" if g else "") + f"-r{routed}"


def test_routed_keys_follow_k_means_landmarks():
    """landmarks=kmeans: the landmarks (and so the groups and their favourites) are
    ``kmeans_groups``' of the same seed and steps."""
    from nyscli.attention.landmarks import kmeans_groups

    q, k, v = qkv(1, 2, 40, 5, seed=8)
    core = hybrid(num_landmarks=5, window=3, heavy_keys=2, routed_keys=6, landmarks="kmeans",
                  kmeans_iterations=3, seed=4)  # fmt: skip
    out = core(q, k, v)
    q_land, k_land, _ = kmeans_groups(q, k, 5, None, iterations=3, seed=4)
    for h in range(2):
        expected, _ = reference(q[0, h], k[0, h], v[0, h], 5, 3, 2, routed=6,
                                landmarks=(q_land[0, h], k_land[0, h]))  # fmt: skip
        torch.testing.assert_close(out[0, h], expected, rtol=1e-11, atol=1e-12)
    assert core.label() == "nystrom_local-w3-m5-kmeans-g2-r6"


@pytest.mark.parametrize("landmarks", ["segment_means", "kmeans", "query_kmeans"])
def test_routed_keys_padding_never_changes_a_sequence_and_rows_sum_to_one(landmarks):
    # g >= m: each landmark's favourite weighs exactly 1 in B', and fewer heavy keys than
    # landmarks would break that tie by rounding, which padding moves.
    core = hybrid(num_landmarks=4, window=3, heavy_keys=4, routed_keys=7, landmarks=landmarks)
    q, k, v = qkv(3, 2, 50, 4, seed=9)
    lengths = (50, 37, 6)
    mask = torch.arange(50)[None, :] < torch.tensor(lengths)[:, None]
    batched = core(q, k, v, mask)
    for i, n in enumerate(lengths):
        alone = core(q[i : i + 1, :, :n], k[i : i + 1, :, :n], v[i : i + 1, :, :n])
        torch.testing.assert_close(batched[i : i + 1, :, :n], alone, rtol=1e-10, atol=1e-12)
    s_hat = implied_matrix(core, q, k, mask)
    rows = s_hat.sum(-1)[mask[:, None, :].expand(-1, 2, -1)]
    torch.testing.assert_close(rows, torch.ones_like(rows), rtol=0, atol=1e-12)
    assert s_hat[1][..., 37:].abs().max() == 0  # padded keys get no weight


def test_routed_keys_gradients_match_finite_differences():
    q, k, v = (x.requires_grad_() for x in qkv(1, 2, 24, 3, seed=10))
    mask = torch.ones(1, 24, dtype=torch.bool)
    mask[0, 20:] = False
    core = hybrid(num_landmarks=3, window=3, heavy_keys=2, routed_keys=5)
    assert torch.autograd.gradcheck(lambda a, b, c: core(a, b, c, mask), (q, k, v))


def test_the_routing_layout_gives_each_token_one_slot_in_a_block_of_its_group():
    from nyscli.attention.routing import Layout

    group = torch.randint(0, 5, (2, 3, 37), generator=torch.Generator().manual_seed(0))
    group[0, 0] = 2  # one group only
    layout = Layout.of(group, 5, block=4)
    tokens = layout.slot_token.gather(2, layout.dest)
    assert torch.equal(tokens, torch.arange(37).expand(2, 3, 37))  # each token in its slot
    filled = layout.slot_token < 37
    assert filled.sum(-1).eq(37).all()  # no token twice
    block_of = layout.dest // 4
    assert torch.equal(layout.block_group.gather(2, block_of), group)  # blocks of one group
    x = torch.randn(2, 3, 37, 2, dtype=torch.float64)
    assert torch.equal(layout.tokens(layout.rows(x)), x)


def test_the_routed_attention_config_is_the_routed_split_at_128_pairs():
    """attention=nystrom_local_routed (for training and deployment) is approx-error's
    hybrid_routed at 128 pairs: one rule, ``routed_at_pairs``."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    with initialize_config_module("nyscli.conf", version_base=None):
        cfg = compose("finetune", overrides=["attention=nystrom_local_routed"])
    attention = OmegaConf.to_container(cfg.attention)
    expected = config_at_pairs(
        "nystrom_local", 128
    ) | nystrom_local.NystromLocalAttention.routed_at_pairs(128)
    assert {key: attention[key] for key in expected} == expected
    assert pairs_per_query(attention) == 128
