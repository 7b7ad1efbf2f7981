"""Landmark selection for Nyström attention: segment means, random tokens, k-means groups.

Every selector returns landmarks q~, k~: (B, H, m, d) and a (B, m) bool mask of the landmarks
that exist (None when all do). Each landmark pair (q~_i, k~_i) averages the same group of real
tokens: a contiguous segment (the paper), a single random token, or a k-means cluster. Padded
tokens (key_padding_mask False) never move a landmark.
"""

from __future__ import annotations

import torch
from torch import Tensor

LANDMARK_METHODS = ("segment_means", "random", "kmeans", "query_kmeans")
# query_kmeans runs Lloyd's steps on about this many tokens per landmark, evenly spaced: its
# cost per step is then O(m^2 d) whatever n (at n = 8,192 and m = 24, k-means of [q, k] over
# every token took more time than the rest of the Nyström-local hybrid).
QUERY_KMEANS_SAMPLE = 16


def segment_ids(n: int, m: int, key_padding_mask: Tensor | None, device: torch.device) -> Tensor:
    """The landmark each token averages into: (B or 1, n) ids in 0..m-1, padded tokens m.

    The real tokens of each sequence, in order, are cut into m contiguous segments whose sizes
    differ by at most one (any n, divisible or not). If a sequence has fewer than m real tokens,
    every token is its own segment and the remaining landmarks are empty.
    """
    if key_padding_mask is None:
        real = torch.ones(1, n, dtype=torch.bool, device=device)
    else:
        real = key_padding_mask
    rank = real.long().cumsum(dim=1) - 1  # (B, n): position among the real tokens
    n_real = real.long().sum(dim=1, keepdim=True).clamp_min(1)  # (B, 1)
    segment = torch.div(rank.clamp_min(0) * m, n_real, rounding_mode="floor")  # (B, n)
    return segment.masked_fill(~real, m)


def shared_segment_means(x: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """(x', landmarks) for x: (B, H, n, d) with m dividing n: landmarks (B, H, m, d) are the
    means of m equal segments and x' equals x, both views of one (B, H, m, n/m, d) tensor.

    Using x' instead of x downstream matters in training: autograd then adds the landmarks'
    gradient (a broadcast over each segment) straight onto x's other gradient, instead of
    first copying it out to a (B, H, n, d) tensor, one full pass over n x d saved per input.
    """
    b, h, n, d = x.shape
    segments = x.view(b, h, m, n // m, d)
    return segments.view(b, h, n, d), segments.sum(dim=-2) / (n // m)


def segment_means(
    x: Tensor, m: int, key_padding_mask: Tensor | None
) -> tuple[Tensor, Tensor | None]:
    """Landmarks (B, H, m, d) of x: (B, H, n, d), and the (B, m) mask of non-empty landmarks.

    Without padding and with m dividing n this is a reshape and sum (no extra memory; ``mean``
    over a middle dim is ~2x slower than ``sum`` on CPU); the mask is then None because every
    landmark exists.
    """
    b, h, n, d = x.shape
    if key_padding_mask is None and n % m == 0:
        return shared_segment_means(x, m)[1], None
    # Sums as a matmul with the (B, m, n) segment-membership matrix, shared by the heads
    # (padded tokens belong to no segment). On CPU this and its backward (the transposed
    # matmul) take about half the time of scatter_add and its gather at ListOps' shapes,
    # despite the m-fold FLOPs.
    segment = segment_ids(n, m, key_padding_mask, x.device)  # (B or 1, n)
    slots = torch.arange(m, device=x.device)[:, None]
    member = (segment[:, None, :] == slots).to(x.dtype).expand(b, m, n)
    sums = torch.einsum("bmn,bhnd->bhmd", member, x)
    counts = member.sum(dim=-1)  # (B, m)
    landmarks = sums / counts[:, None, :, None].clamp_min(1)  # (B, H, m, d)
    if key_padding_mask is None:
        return landmarks, None
    return landmarks, counts > 0


def random_tokens(
    q: Tensor, k: Tensor, m: int, key_padding_mask: Tensor | None, seed: int
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Landmarks = m distinct real tokens per sequence, drawn uniformly with ``seed``.

    q, k: (B, H, n, d) -> q~, k~ (B, H, m, d) taken at the same positions (shared by the heads
    of a sequence), and the (B, m) existence mask (None without padding and m <= n). The draw
    depends only on ``seed``, n and the sequence's padding, so repeated calls pick the same
    tokens.
    """
    b, h, n, d = q.shape
    generator = torch.Generator(device=q.device).manual_seed(seed)
    # One draw for the whole batch: a sequence's landmarks depend on its own mask and the seed
    # only, never on which other sequences share its batch.
    priority = torch.rand(n, generator=generator, device=q.device).expand(b, n)
    if key_padding_mask is not None:
        priority = priority.masked_fill(~key_padding_mask, 2.0)  # padded tokens drawn last
    picked = min(m, n)
    index = priority.argsort(dim=1)[:, :picked].sort(dim=1).values  # (B, picked), in order
    gather = index[:, None, :, None].expand(b, h, picked, d)
    q_land, k_land = q.gather(2, gather), k.gather(2, gather)
    if key_padding_mask is None and picked == m:
        return q_land, k_land, None
    real = torch.ones(b, n, dtype=torch.bool, device=q.device)
    if key_padding_mask is not None:
        real = key_padding_mask
    exists = real.gather(1, index)  # (B, picked): a padded pick means too few real tokens
    if picked < m:  # more landmarks than tokens: the rest are empty placeholders
        pad = (0, 0, 0, m - picked)
        q_land, k_land = torch.nn.functional.pad(q_land, pad), torch.nn.functional.pad(k_land, pad)
        exists = torch.nn.functional.pad(exists, (0, m - picked), value=False)
    return q_land, k_land, exists


def kmeans_groups(
    q: Tensor, k: Tensor, m: int, key_padding_mask: Tensor | None, iterations: int, seed: int
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Landmarks = means of m k-means clusters of the tokens' joint features [q, k].

    Lloyd's algorithm, ``iterations`` steps per (sequence, head), started from the ``random``
    landmarks of the same ``seed`` (Forgy initialisation): the landmarks follow content, not
    position. (Started from the segment means instead, Lloyd barely moves on smooth inputs.)
    Clustering [q, k] jointly keeps each (q~_i, k~_i) the mean of one token group. A cluster
    that loses all its tokens keeps its previous centre. q, k: (B, H, n, d) -> q~, k~
    (B, H, m, d) and the (B, m) existence mask (None when every landmark exists).
    """
    d = q.shape[-1]
    q_land, k_land, exists = random_tokens(q, k, m, key_padding_mask, seed)
    centres = torch.cat([q_land, k_land], dim=-1)  # (B, H, m, 2d)
    x = torch.cat([q, k], dim=-1)  # (B, H, n, 2d)
    for _ in range(iterations):
        sums, counts = group_sums(x, groups(x, centres, exists, key_padding_mask), m)
        centres = torch.where(counts > 0, sums / counts.clamp_min(1), centres)
    return centres[..., :d], centres[..., d:], exists


def groups(x: Tensor, centres: Tensor, exists: Tensor | None, real: Tensor | None) -> Tensor:
    """Each row's nearest centre (``nearest_centre``), m for the rows ``real`` (B, rows) marks
    False (padding, in no group)."""
    group = nearest_centre(x, centres, exists)
    return group if real is None else group.masked_fill(~real[:, None, :], centres.shape[2])


def group_sums(x: Tensor, group: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """The sums (B, H, m, c) of the rows of x (B, H, rows, c) in each group, and their counts
    (B, H, m, 1); group (B, H, rows) in 0..m, m: in no group. On a CPU summed by ``index_add``
    (the rows added in order): a one-hot (rows, m) product cost 6x the time there (n = 512,
    m = 24, 12 heads), and m times the arithmetic. On CUDA ``index_add`` adds with atomics, in
    no fixed order, so the landmarks would change from run to run: the product there."""
    if x.is_cuda:
        return one_hot_sums(x, group, m)
    b, h, rows, c = x.shape
    base = torch.arange(b * h, device=x.device).view(b, h, 1) * (m + 1)
    index = (group + base).flatten()
    sums = x.new_zeros(b * h * (m + 1), c).index_add(0, index, x.reshape(-1, c))
    ones = x.new_ones(()).expand(index.shape[0])
    counts = x.new_zeros(b * h * (m + 1)).index_add(0, index, ones)
    return sums.view(b, h, m + 1, c)[:, :, :m], counts.view(b, h, m + 1, 1)[:, :, :m]


def one_hot_sums(x: Tensor, group: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """``group_sums`` as a product with the (B, H, rows, m) one-hot of the groups."""
    member = torch.nn.functional.one_hot(group, m + 1)[..., :m].to(x.dtype)
    return member.transpose(-1, -2) @ x, member.sum(dim=-2)[..., None]


def nearest_centre(x: Tensor, centres: Tensor, exists: Tensor | None) -> Tensor:
    """Each row's nearest centre (B, H, rows) in squared Euclidean distance, never an empty
    one. x: (B, H, rows, d); centres: (B, H, m, d); exists: (B, m) or None (all exist)."""
    # |x - c|^2 = |x|^2 - 2 x.c + |c|^2; |x|^2 is the same for every c. The 2 scales the m
    # centres, not the rows (exact either way: a power of two).
    dist = centres.square().sum(-1)[..., None, :] - x @ (2 * centres).transpose(-1, -2)
    if exists is not None:
        dist = dist.masked_fill(~exists[:, None, None, :], float("inf"))
    return dist.argmin(dim=-1)


def query_kmeans(
    q: Tensor, k: Tensor, m: int, key_padding_mask: Tensor | None, iterations: int
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Landmarks = means of q and of k over m k-means clusters of the queries alone.

    Lloyd's algorithm on every s-th real token (s: about ``QUERY_KMEANS_SAMPLE`` m of them
    sampled; all of them at n <= 16 m), ``iterations`` steps from the segment means of the
    queries (deterministic: no draw); then every real token joins its nearest centre, and each
    landmark pair (q~_i, k~_i) is the mean of its cluster's q and k. A cluster with no token
    keeps its centre as q~ and gets the segment's k~ (B, m existence mask: all exist where
    the sequence has at least m real tokens). q, k: (B, H, n, d) -> q~, k~ (B, H, m, d).
    """
    b, h, n, d = q.shape
    centres, exists = segment_means(q, m, key_padding_mask)
    k_segments, _ = segment_means(k, m, key_padding_mask)
    real = (
        torch.ones(b, n, dtype=torch.bool, device=q.device)
        if key_padding_mask is None
        else key_padding_mask
    )
    stride = max(1, n // (QUERY_KMEANS_SAMPLE * m))
    sample, sample_real = q[:, :, ::stride], real[:, ::stride]
    for _ in range(iterations):
        sums, counts = group_sums(sample, groups(sample, centres, exists, sample_real), m)
        centres = torch.where(counts > 0, sums / counts.clamp_min(1), centres)
    group = groups(q, centres, exists, real)
    q_sums, counts = group_sums(q, group, m)
    k_sums, _ = group_sums(k, group, m)
    q_land = torch.where(counts > 0, q_sums / counts.clamp_min(1), centres)
    k_land = torch.where(counts > 0, k_sums / counts.clamp_min(1), k_segments)
    return q_land, k_land, exists


def select_landmarks(
    q: Tensor,
    k: Tensor,
    m: int,
    key_padding_mask: Tensor | None,
    method: str = "segment_means",
    kmeans_iterations: int = 5,
    seed: int = 0,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """q, k: (B, H, n, d) -> q~, k~ (B, H, m, d) and the (B, m) mask of existing landmarks.

    ``method`` is one of ``LANDMARK_METHODS``; see the selector functions above.
    """
    if method == "segment_means":
        q_land, exists = segment_means(q, m, key_padding_mask)
        k_land, _ = segment_means(k, m, key_padding_mask)
        return q_land, k_land, exists
    if method == "random":
        return random_tokens(q, k, m, key_padding_mask, seed)
    if method == "kmeans":
        return kmeans_groups(q, k, m, key_padding_mask, kmeans_iterations, seed)
    if method == "query_kmeans":
        return query_kmeans(q, k, m, key_padding_mask, kmeans_iterations)
    raise ValueError(f"unknown landmark method {method!r}; choose one of {LANDMARK_METHODS}")
