"""Reformer LSH attention (Kitaev et al., ICLR 2020): shared-QK, sorted into chunks by hash."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from nyscli.attention.core import Core, configure
from nyscli.attention.errors import not_causal
from nyscli.attention.masking import check_qkv, masked_softmax
from nyscli.attention.registry import register
from nyscli.rules import Int

# Tokens hashed at a time: bounds the (tokens x n_buckets) rotated vectors.
HASH_SLICE = 1024


def _take_rows(x: Tensor, index: Tensor) -> Tensor:
    """Rows of x: (B, H, R or 1, n, d) picked per round by index (B, H, R, L) -> (B, H, R, L, d)."""
    x = x.expand(*index.shape[:3], *x.shape[3:])
    return x.gather(3, index[..., None].expand(*index.shape, x.shape[-1]))


def _angular_hash(x: Tensor, rotations: Tensor) -> Tensor:
    """Bucket ids (B, H, R, n) = argmax over [xW, -xW] for x: (B, H, n, d), W: (H, d, R, k).

    In float32 with autocast off: under bf16 autocast the rotation's rounding flips near-ties of
    the argmax, so the buckets (and the output) would depend on the precision setting.
    """
    with torch.autocast(device_type=x.device.type, enabled=False):
        rotated = torch.einsum("bhnd,hdrk->bhrnk", x.detach().float(), rotations)
    # argmax over [xW, -xW] without building it: the largest |xW|, shifted by k if negative.
    best = rotated.abs().argmax(dim=-1, keepdim=True)
    negative = rotated.gather(-1, best) < 0
    return (best + negative * rotations.shape[-1]).squeeze(-1)


def _with_previous_chunk(x: Tensor) -> Tensor:
    """x: (B, H, R, C, c, ...) -> (B, H, R, C, 2c, ...): each chunk preceded by the one before.

    Chunk 0 gets the last chunk in front (a wrap-around); callers mask that half out.
    """
    return torch.cat([x.roll(1, dims=3), x], dim=4)


@register("reformer")
class ReformerAttention(Core):
    """Softmax attention over the tokens that share a chunk after sorting by an LSH bucket.

    Keys are the queries themselves, normalised to unit length (shared-QK), so the ``k`` input
    is not used. Per hash round: angular LSH (random rotation, argmax over [xR, -xR]) into
    2 n / bucket_size buckets, tokens sorted by (bucket, position), cut into chunks of
    ``bucket_size``; each chunk attends to itself and the chunk before it. Memory is
    O(n_hashes * n * bucket_size). Rounds are combined weighted by their softmax normalisers
    (logsumexp), as in the paper; a key found in several rounds is not de-duplicated.

    Self-attention convention (the Reformer's): a token never attends to itself while any
    other real key is available to it in any round; only if none is does it attend to itself
    (so n = 1, or a sequence with one real token, returns its own v). Padded tokens are hashed
    into an extra last bucket, so their values never change where real tokens are sorted.

    Args:
        n_hashes: hash rounds (paper row: 2).
        bucket_size: chunk length; with n <= bucket_size all tokens share one chunk and this is
            exact shared-QK attention.
        seed: seed of the random rotations (one per head, a function of seed and shapes).
        causal: not supported.
    """

    options = {
        "n_hashes": Int(low=1),
        "bucket_size": Int(low=1),
        "seed": Int(),
        "causal": not_causal("reformer", "sorting by hash bucket mixes future tokens into chunks"),
    }
    budget_key = "n_hashes"

    def __init__(
        self, n_hashes: int = 2, bucket_size: int = 64, seed: int = 0, causal: bool = False
    ) -> None:
        super().__init__()
        configure(self, locals())  # every argument checked against options

    def label(self) -> str:
        return f"reformer-{self.n_hashes}"

    def pairs(self) -> int:
        return 2 * self.bucket_size * self.n_hashes  # its chunk and the one before, per round

    @classmethod
    def at_pairs(cls, pairs: int) -> dict[str, Any]:
        return {"n_hashes": max(1, pairs // (2 * 64)), "bucket_size": 64}

    def num_buckets(self, n: int) -> int:
        """Buckets per round: 1 if one chunk holds everything, else 2 n / bucket_size (even)."""
        if n <= self.bucket_size:
            return 1
        return 2 * -(-n // self.bucket_size)

    def buckets(self, x: Tensor, key_padding_mask: Tensor | None = None) -> Tensor:
        """Bucket ids (B, H, n_hashes, n) of x: (B, H, n, d); padded tokens get the extra one."""
        b, h, n, d = x.shape
        n_buckets = self.num_buckets(n)
        if n_buckets == 1:
            ids = torch.zeros(b, h, self.n_hashes, n, dtype=torch.long, device=x.device)
        else:
            generator = torch.Generator().manual_seed(self.seed)
            shape = (h, d, self.n_hashes, n_buckets // 2)
            rotations = torch.randn(shape, generator=generator).to(x.device)
            # Slices of the sequence: the rotated vectors are (n x n_buckets), which grows as n^2.
            ids = torch.cat(
                [
                    _angular_hash(x[:, :, start : start + HASH_SLICE], rotations)
                    for start in range(0, n, HASH_SLICE)
                ],
                dim=-1,
            )
        if key_padding_mask is not None:
            ids = ids.masked_fill(~key_padding_mask[:, None, None, :], n_buckets)
        return ids

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        """q, k, v: (B, H, n, d); key_padding_mask: (B, n), True = real token -> (B, H, n, d).

        ``k`` is checked but unused (shared-QK: the keys are the normalised queries).
        """
        check_qkv(q, k, v, key_padding_mask)
        b, h, n, d = q.shape
        chunk = min(self.bucket_size, n)
        n_chunks = -(-n // chunk)
        filler = n_chunks * chunk - n
        positions = torch.arange(n, device=q.device)
        # Sorting by bucket * n + position keeps each bucket in sequence order.
        order = (self.buckets(q, key_padding_mask) * n + positions).argsort(dim=-1)
        # Filler slots at the end of each round make the length a whole number of chunks.
        slot_pos = F.pad(order, (0, filler))  # (B, H, R, n_chunks * chunk)
        slot_real = torch.ones(n, dtype=torch.bool, device=q.device)
        slot_real = F.pad(slot_real, (0, filler), value=False).expand_as(slot_pos)
        if key_padding_mask is not None:
            real = key_padding_mask[:, None, None, :].expand(b, h, self.n_hashes, n)
            slot_real = slot_real & F.pad(real.gather(-1, order), (0, filler), value=False)

        chunked = (b, h, self.n_hashes, n_chunks, chunk)
        q_s = _take_rows(q[:, :, None], slot_pos).view(*chunked, d)
        v_s = _take_rows(v[:, :, None], slot_pos).view(*chunked, v.shape[-1])
        keys = q_s / q_s.norm(dim=-1, keepdim=True).clamp_min(torch.finfo(q.dtype).tiny)
        keys = _with_previous_chunk(keys)  # (B, H, R, C, 2c, d)
        key_real = _with_previous_chunk(slot_real.reshape(chunked))  # (B, H, R, C, 2c)
        key_real[..., 0, :chunk] = False  # chunk 0 has no chunk before it
        query_pos = slot_pos.reshape(chunked)
        is_self = query_pos[..., :, None] == _with_previous_chunk(query_pos)[..., None, :]

        scores = q_s @ keys.transpose(-1, -2) / math.sqrt(d)  # (B, H, R, C, c, 2c)
        keep = key_real[..., None, :] & ~is_self
        has_other = keep.any(dim=-1)
        # In place, so one score-sized buffer lives besides the weights. A row with nothing kept
        # comes out uniform but finite; its round gets weight 0 below.
        log_norm = torch.logsumexp(scores.masked_fill_(~keep, torch.finfo(scores.dtype).min), -1)
        weights = (scores - log_norm[..., None]).exp_()
        out = weights @ _with_previous_chunk(v_s)  # (B, H, R, C, c, d)

        # Back to sequence order: (B, H, R, n, ...).
        unsort = order.argsort(dim=-1)
        out = _take_rows(out.reshape(b, h, self.n_hashes, -1, v.shape[-1])[..., :n, :], unsort)
        log_norm = log_norm.reshape(b, h, self.n_hashes, -1)[..., :n].gather(-1, unsort)
        has_other = has_other.reshape(b, h, self.n_hashes, -1)[..., :n].gather(-1, unsort)

        # Rounds in which the token saw nobody else carry no weight.
        round_weights = masked_softmax(log_norm.transpose(-1, -2), has_other.transpose(-1, -2))
        combined = torch.einsum("bhnr,bhrnd->bhnd", round_weights, out)
        alone = ~has_other.any(dim=2)  # (B, H, n): nothing but itself in any round
        return combined + alone[..., None].to(v.dtype) * v
