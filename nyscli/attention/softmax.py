"""Exact softmax attention: PyTorch's fused SDPA and the explicit n x n version."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from nyscli.attention.chunking import DEFAULT_BUDGET
from nyscli.attention.core import CausalOnlyCore, Core, Path, configure
from nyscli.attention.dropout import LEVELS, draw_seed, drop_threshold, seeded_keep_mask
from nyscli.attention.masking import check_qkv, masked_softmax
from nyscli.attention.registry import register
from nyscli.rules import PROBABILITY, Bool, Rule


def keep_mask(
    key_padding_mask: Tensor | None, n: int, causal: bool, device: torch.device
) -> Tensor | None:
    """Bool (B or 1, 1, n or 1, n): True where query i may attend key j."""
    keep = None
    if key_padding_mask is not None:
        keep = key_padding_mask[:, None, None, :]
    if causal:
        tril = torch.ones(n, n, dtype=torch.bool, device=device).tril()[None, None]
        keep = tril if keep is None else keep & tril
    return keep


def _block_probs(
    q: Tensor, kt: Tensor, keep: Tensor | None, rows: slice, lse: Tensor | None, buffer: Tensor
) -> tuple[Tensor, Tensor]:
    """The attention probabilities of query rows ``rows``: (B, H, r, n_k), written into
    ``buffer``, and their log-sum-exp (B, H, r), computed when ``lse`` is None (forward;
    backward passes the block's saved one, so it recomputes the same probabilities). ``q``
    comes scaled by 1 / sqrt(d), ``kt`` is k^T (B, H, d, n_k). Masked keys get zero weight;
    a row with none to attend is all zeros."""
    qb = q[:, :, rows]
    scores = block_view(buffer, (*qb.shape[:3], kt.shape[-1]))
    torch.matmul(qb, kt, out=scores)
    allowed = None
    if keep is not None:
        allowed = keep[:, :, rows] if keep.shape[2] > 1 else keep
        scores.masked_fill_(~allowed, torch.finfo(scores.dtype).min)
    if lse is None:  # in place, one pass fewer than torch.logsumexp + exp
        top = scores.amax(dim=-1, keepdim=True)
        probs = scores.sub_(top).exp_()
        total = probs.sum(dim=-1, keepdim=True)
        probs.div_(total)
        lse = (top + total.log()).squeeze(-1)
    else:
        probs = scores.sub_(lse[..., None]).exp_()
    if allowed is not None:
        probs.mul_(allowed)
    return probs, lse


def block_view(buffer: Tensor, shape: tuple[int, ...]) -> Tensor:
    """A contiguous ``shape`` at the start of ``buffer`` (the last block may be smaller)."""
    return buffer.view(-1)[: math.prod(shape)].view(shape)


class _DroppedSoftmax(torch.autograd.Function):
    """(softmax(q k^T / sqrt(d)) * M / (1 - p)) v a block of query rows at a time, as a
    flash kernel does: the n x n probabilities exist one block of ~DEFAULT_BUDGET entries at
    a time, and backward recomputes them from the saved log-sum-exp. The 0/1 mask M of a
    block is drawn from (seed, first row), so backward draws the same one instead of keeping
    an n x n mask. The scalars (1 / sqrt(d), 1 / (1 - p)) go on the (n, d) tensors, not on
    the blocks, and the blocks' products reuse one buffer each: a fresh 16 MB tensor a
    block costs more in page faults than its arithmetic."""

    @staticmethod
    def forward(
        ctx: Any, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, p: float, seed: int
    ) -> Tensor:
        b, h, n, _ = q.shape
        step = max(1, DEFAULT_BUDGET // (b * h * k.shape[2]))
        scaled = q * (1.0 / math.sqrt(q.shape[-1]))
        kt = k.transpose(-1, -2)
        buffer = q.new_empty(b, h, min(step, n), k.shape[2])
        out = q.new_empty(b, h, n, v.shape[-1])
        lse = q.new_empty(b, h, n)
        for start in range(0, n, step):
            rows = slice(start, min(n, start + step))
            probs, lse[:, :, rows] = _block_probs(scaled, kt, keep, rows, None, buffer)
            probs.mul_(seeded_keep_mask(probs.shape, p, (seed, start), q.device, probs.dtype))
            out[:, :, rows] = probs @ v
        out.mul_(LEVELS / (LEVELS - drop_threshold(p)))
        ctx.save_for_backward(scaled, k, v, keep, out, lse)
        ctx.p, ctx.seed, ctx.step = p, seed, step
        return out

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        scaled, k, v, keep, out, lse = ctx.saved_tensors
        scale = LEVELS / (LEVELS - drop_threshold(ctx.p))
        # D_i = sum_j P_ij dP_ij = grad_i . out_i: the softmax backward's row term, here
        # divided by the dropout scale, which multiplies dq, dk and dv at the end instead.
        row_term = (grad * out).sum(-1, keepdim=True).div_(scale)
        dq, dk, dv = torch.empty_like(scaled), torch.zeros_like(k), torch.zeros_like(v)
        b, h, n, _ = scaled.shape
        kt, vt = k.transpose(-1, -2), v.transpose(-1, -2)
        buffers = [scaled.new_empty(b, h, min(ctx.step, n), k.shape[2]) for _ in range(2)]
        for start in range(0, n, ctx.step):
            rows = slice(start, min(n, start + ctx.step))
            probs, _ = _block_probs(scaled, kt, keep, rows, lse[:, :, rows], buffers[0])
            mask = seeded_keep_mask(probs.shape, ctx.p, (ctx.seed, start), k.device, k.dtype)
            g = grad[:, :, rows]
            dscores = block_view(buffers[1], probs.shape)
            torch.matmul(g, vt, out=dscores)
            dscores.mul_(mask).sub_(row_term[:, :, rows]).mul_(probs)
            dv += probs.mul_(mask).transpose(-1, -2) @ g
            dq[:, :, rows] = dscores @ k
            dk += dscores.transpose(-1, -2) @ scaled[:, :, rows]
        dq.mul_(scale / math.sqrt(k.shape[-1]))
        return dq, dk.mul_(scale), dv.mul_(scale), None, None, None


@register("softmax")
class SoftmaxAttention(Core):
    """Exact attention through ``torch.nn.functional.scaled_dot_product_attention``.

    PyTorch picks a fused (flash / memory-efficient) kernel where it can, so memory is O(n)
    without a mask; with a mask it may fall back to the math kernel.

    ``dropout`` p drops each attention probability with probability p in training and scales
    the rest by 1 / (1 - p) (``softmax(q k^T / sqrt(d)) * M / (1 - p) @ v``), as BERT's
    attention_probs_dropout_prob and the paper's LRA code (attention_dropout 0.1) do. Training
    with p > 0 on the CPU runs :class:`_DroppedSoftmax` (blocks of query rows, O(n) memory
    besides one block) instead of SDPA, whose CPU dropout draws torch's slow one-thread masks
    and writes the whole n x n matrix out; on a GPU, SDPA's fused kernels drop themselves.
    In eval mode p has no effect.
    """

    options: ClassVar[dict[str, Rule]] = {
        "causal": Bool(),
        "dropout": PROBABILITY,
    }
    budget_key: ClassVar[str | None] = None

    def __init__(self, causal: bool = False, dropout: float = 0.0) -> None:
        super().__init__()
        configure(self, locals())

    def label(self) -> str:
        return "softmax (SDPA)" + (f"+drop{self.dropout:g}" if self.dropout else "")

    def path(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None) -> Path:
        """SDPA, but for training with dropout on a CPU (query blocks in torch)."""
        dropped = self.dropout and self.training and q.device.type == "cpu"
        return Path.TORCH if dropped else Path.SDPA

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        """q, k, v: (B, H, n, d); key_padding_mask: (B, n), True = real token -> (B, H, n, d)."""
        check_qkv(q, k, v, key_padding_mask)
        keep = None
        if key_padding_mask is not None:
            keep = keep_mask(key_padding_mask, q.shape[2], self.causal, q.device)
            # Padded queries would see an all-False row only if the sequence is empty;
            # attending to all its (padded) keys keeps such rows finite instead of NaN.
            empty = ~key_padding_mask.any(dim=1)
            if empty.any():
                keep = keep | empty[:, None, None, None]
        dropout = self.dropout if self.training else 0.0
        if self.path(q, k, v, key_padding_mask) is Path.TORCH:
            if keep is None and self.causal:
                keep = keep_mask(None, q.shape[2], True, q.device)
            # Half precisions run it in fp32, as SDPA's CPU kernels accumulate.
            wide = torch.promote_types(q.dtype, torch.float32)
            out = _DroppedSoftmax.apply(
                q.to(wide), k.to(wide), v.to(wide), keep, dropout, draw_seed()
            )
            return out.to(q.dtype)
        # Elsewhere SDPA's fused kernels drop inside themselves (their own RNG, the same law).
        causal = self.causal and keep is None  # a mask already holds the causal part
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=keep, dropout_p=dropout, is_causal=causal
        )


@register("softmax_naive")
class NaiveSoftmaxAttention(CausalOnlyCore):
    """Exact attention with the n x n matrix written out (the paper's "Transformer" row)."""

    def label(self) -> str:
        return "softmax_naive"

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        """q, k, v: (B, H, n, d); key_padding_mask: (B, n), True = real token -> (B, H, n, d)."""
        check_qkv(q, k, v, key_padding_mask)
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # (B, H, n, n)
        keep = keep_mask(key_padding_mask, q.shape[2], self.causal, q.device)
        return masked_softmax(scores, keep) @ v
