"""Nyström attention (Xiong et al., AAAI 2021): softmax attention through m landmarks in O(n m)."""

from __future__ import annotations

import functools
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from nyscli.attention.chunking import DEFAULT_BUDGET, by_length, in_head_groups
from nyscli.attention.core import Core, Path, backward_follows, configure
from nyscli.attention.errors import not_causal
from nyscli.attention.gpu import gates, graphs, inference, landmark, ops, reference
from nyscli.attention.landmarks import (
    LANDMARK_METHODS,
    select_landmarks,
    shared_segment_means,
)
from nyscli.attention.masking import check_qkv, masked_softmax
from nyscli.attention.nystrom_cpu import fused_path_applies, fused_segment_means_nystrom
from nyscli.attention.pinv import PINV_INITS, PINV_METHODS, exact_pinv, iterative_pinv
from nyscli.attention.registry import register
from nyscli.attention.softmax import SoftmaxAttention
from nyscli.attention.threads import one_thread
from nyscli.rules import Bool, Choice, Float, Int

# Inference runs the general path a few heads at a time within this many temporary elements.
INFERENCE_BUDGET = DEFAULT_BUDGET


@register("nystrom")
class NystromAttention(Core):
    """S V ~= softmax(Q K~^T) pinv(softmax(Q~ K~^T)) softmax(Q~ K^T) V with landmark Q~, K~.

    Args:
        num_landmarks: m, the number of landmarks. If m >= n at run time the approximation
            would be exact anyway, so exact attention is used.
        pinv: ``"iterative"`` (the paper's) or ``"exact"`` (``torch.linalg.pinv``).
        pinv_iterations: iterations of the iterative pseudo-inverse (paper: 6).
        pinv_tolerance: None (run ``pinv_iterations``), or a residual ||AZA - A||/||A|| in
            (0, 1): the iterative pseudo-inverse then runs until every landmark kernel meets
            it (at most ``PINV_MAX_ITERATIONS`` steps), and ``pinv_iterations`` is unused.
        pinv_init: ``"per_matrix"`` (convergent for every matrix) or ``"original"`` (the
            reference code's one scale for the whole batch).
        landmarks: how landmarks are chosen: ``"segment_means"`` (the paper's), ``"random"``
            (m real tokens drawn with ``seed``, the same draw on every call, so the implied
            matrix is well defined), ``"kmeans"`` (means of k-means clusters of the tokens'
            [q, k] features, ``kmeans_iterations`` Lloyd steps from the random draw) or
            ``"query_kmeans"`` (means of k-means clusters of the queries alone, Lloyd steps on
            about 16 m evenly spaced tokens from the queries' segment means; no draw).
        kmeans_iterations: Lloyd steps for ``landmarks="kmeans"`` or ``"query_kmeans"``.
        seed: random seed for ``landmarks="random"`` and the k-means start.
        recompute: in training with padding (the general path), keep only q, k, v for
            backward and compute the product again there: the bytes kept fall below SDPA's
            (MiniLM, batch 16, n 512: 0 vs 12 MB a layer beyond q, k, v; 36 MB kept
            otherwise), for ~1.3-1.4x the core's training time (about 1.04x a MiniLM step;
            docs/results/training-profile.md). Off by default: at ListOps' and bert_mini's
            shapes the core is a large share of the step and the memory is small.
        causal: not supported; landmarks mix future tokens into every query.
    """

    options = {
        "num_landmarks": Int(low=1),
        "pinv": Choice(PINV_METHODS),
        "pinv_iterations": Int(low=1),
        "pinv_tolerance": Float(low=0.0, high=1.0, low_open=True, high_open=True, null=True),
        "pinv_init": Choice(PINV_INITS),
        "landmarks": Choice(LANDMARK_METHODS),
        "kmeans_iterations": Int(low=0),  # 0: the random draw itself (no Lloyd step)
        "seed": Int(),
        "recompute": Bool(),
        "causal": not_causal("nystrom", "its landmarks average over future tokens"),
    }
    budget_key = "num_landmarks"

    def __init__(
        self,
        num_landmarks: int = 64,
        pinv: str = "iterative",
        pinv_iterations: int = 6,
        pinv_tolerance: float | None = None,
        pinv_init: str = "per_matrix",
        landmarks: str = "segment_means",
        kmeans_iterations: int = 5,
        seed: int = 0,
        recompute: bool = False,
        causal: bool = False,
    ) -> None:
        super().__init__()
        configure(self, locals())  # every argument checked against options
        self.exact = SoftmaxAttention()
        self.graphs = graphs.Graphs()  # CUDA graphs of this core's launch-bound inference calls
        self.train_graphs = graphs.Graphs(size=4, training=True)  # ... and training calls

    def label(self) -> str:
        suffix = "" if self.landmarks == "segment_means" else f"-{self.landmarks}"
        return f"nystrom-{self.num_landmarks}{suffix}"

    def pairs(self) -> int:
        return 2 * self.num_landmarks

    @classmethod
    def at_pairs(cls, pairs: int) -> dict[str, Any]:
        return {"num_landmarks": max(1, pairs // 2)}

    def pseudo_inverse(self, a: Tensor) -> Tensor:
        """pinv of the landmark kernel a: (B, H, m, m), in float32 or wider."""
        if self.pinv == "exact":
            return exact_pinv(a)
        return iterative_pinv(a, self.pinv_iterations, self.pinv_init, self.pinv_tolerance)

    def pick_landmarks(
        self, q: Tensor, k: Tensor, key_padding_mask: Tensor | None
    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]:
        """(q, k, q~, k~, exists): landmarks q~, k~ (B,H,m,d) and which exist ((B,m) or None).

        q and k come back with the same values; for unpadded segment means they are views of
        the tensors the means were summed from (see ``shared_segment_means``), which spares
        a copy per input in backward, so use the returned ones downstream.
        """
        m = self.num_landmarks
        if self.unpadded_segments(q, key_padding_mask):
            q, q_land = shared_segment_means(q, m)
            k, k_land = shared_segment_means(k, m)
            return q, k, q_land, k_land, None
        selected = select_landmarks(
            q, k, m, key_padding_mask, self.landmarks, self.kmeans_iterations, self.seed
        )
        return q, k, *selected

    def landmark_kernel(self, q_land: Tensor, k_land: Tensor, exists: Tensor | None) -> Tensor:
        """A = softmax(q~ k~^T/√d): (B,H,m,m) from landmarks (B,H,m,d).

        Empty landmarks (fewer real tokens than m) get zero rows and columns in A, which the
        pseudo-inverse maps to zero, so they drop out of the product.
        """
        return reference.landmark_kernel(q_land, k_land, exists)

    def kernels(
        self, q: Tensor, k: Tensor, key_padding_mask: Tensor | None = None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """The three softmax kernels F (B,H,n,m), A (B,H,m,m), Bk (B,H,m,n) of the paper,
        written out (for analysis; ``forward`` never forms F or Bk)."""
        scale = 1.0 / math.sqrt(q.shape[-1])
        q, k, q_land, k_land, exists = self.pick_landmarks(q, k, key_padding_mask)
        a = self.landmark_kernel(q_land, k_land, exists)
        land_cols = None if exists is None else exists[:, None, None, :]
        land_rows = 1.0 if exists is None else exists[:, None, :, None].to(q.dtype)
        token_cols = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
        f = masked_softmax(q @ k_land.transpose(-1, -2) * scale, land_cols)
        b = masked_softmax(q_land @ k.transpose(-1, -2) * scale, token_cols) * land_rows
        return f, a, b

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None
    ) -> Tensor:
        """q, k, v: (B, H, n, d); key_padding_mask: (B, n), True = real token -> (B, H, n, d).

        A sequence with at most m real tokens gets exact attention: every real token would be
        its own landmark, where Nyström equals softmax attention (Lemma 2) but the iterative
        pseudo-inverse leaves a few % of error (see ``by_length``).
        """
        check_qkv(q, k, v, key_padding_mask)
        return by_length(
            self.approximate, self.exact, q, k, v, key_padding_mask, self.num_landmarks
        )

    def path(self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None = None) -> Path:
        """The code that serves this call, for sequences longer than m (shorter ones take
        exact attention, ``by_length``). The rules, first match wins:

        | path | when |
        |---|---|
        | fused CPU | CPU training, unpadded segment means, m divides n (``nystrom_cpu``) |
        | recompute | training with ``recompute=True`` |
        | CUDA graph | the inference op's call, unpadded segment means, launch-bound |
        | inference op | inference on the Triton path, the op checked on this GPU |
        | CUDA graph (training) | training on the Triton path, unpadded segment means |
        | head groups | inference on the torch path, heads independent of each other |
        | Triton | the landmark side as one program per head (GPU, iterative pinv) |
        | torch | everything else |
        """
        if q.shape[2] <= self.num_landmarks:
            return Path.EXACT
        training = backward_follows(q, k, v)
        triton = self.triton_serves(q, v)
        if (
            gates.current().fused_cpu
            and self.unpadded_segments(q, key_padding_mask)
            and fused_path_applies(q, k, v)
        ):
            return Path.FUSED_CPU
        if self.recompute and training:
            return Path.RECOMPUTE
        if triton and not training and inference.serves(q):
            # the other landmark choices draw on the host: no capture
            graphed = self.landmarks == "segment_means" and graphs.serves(q, key_padding_mask)
            return Path.GRAPH if graphed else Path.INFERENCE
        if (
            triton
            and training
            and self.landmarks == "segment_means"
            and graphs.serves_training(q, key_padding_mask)
        ):
            return Path.GRAPH_TRAIN
        if not training and self.heads_independent() and not triton:
            return Path.HEAD_GROUPS
        return Path.TRITON if triton else Path.TORCH

    def approximate(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None
    ) -> Tensor:
        """The Nyström product for q, k, v: (B, H, n, d) -> (B, H, n, d), whatever the lengths,
        by ``path``.

        F (pinv(A) (Bk V)) is computed as two fused attentions, Bk V = SDPA(q~, k, v) and
        F W = SDPA(q, k~, W): the n x m and m x n kernels are never stored, so memory beyond
        the output is O(m d) and the softmaxes run in PyTorch's fused kernels.
        """
        path = self.path(q, k, v, key_padding_mask)
        if path is Path.FUSED_CPU:
            return fused_segment_means_nystrom(q, k, v, self.num_landmarks, self.landmark_inverse)
        if path is Path.RECOMPUTE:
            return self.recomputed_approximation(q, k, v, key_padding_mask)
        if path is Path.GRAPH:
            # launch-bound: the same call replayed from a CUDA graph (gpu/graphs.py)
            return self.graphs(
                lambda *qkv: self.approximate_all(*qkv, None, Path.INFERENCE), q, k, v
            )
        if path is Path.GRAPH_TRAIN:
            # launch-bound in training too: forward and backward replayed (gpu/graphs.py)
            return self.train_graphs(
                lambda *qkv: self.approximate_all(*qkv, None, Path.TRITON), q, k, v
            )
        if path is Path.HEAD_GROUPS:
            # At inference the landmark side's (m, m) temporaries (kernel, pseudo-inverse
            # iterates: ~8 m^2 a head) outgrow SDPA's whole layer at large batches (MiniLM,
            # batch 64, n 512: 134 vs 52 MB): a few heads at a time, the same values.
            m, d = self.num_landmarks, q.shape[-1]
            per_head = 8 * m * m + 3 * m * d
            return in_head_groups(
                functools.partial(self.approximate_all, path=Path.TORCH),
                q, k, v, key_padding_mask, per_head, INFERENCE_BUDGET,
            )  # fmt: skip
        return self.approximate_all(q, k, v, key_padding_mask, path)

    def unpadded_segments(self, q: Tensor, key_padding_mask: Tensor | None) -> bool:
        """Whether the landmarks are segment means of equal segments with no padding."""
        return (
            self.landmarks == "segment_means"
            and key_padding_mask is None
            and q.shape[2] % self.num_landmarks == 0
        )

    def heads_independent(self) -> bool:
        """Whether each head's result depends on its own q, k, v alone. Not with the original
        pinv start (one scale over the whole batch) or a pinv tolerance (the iteration count
        is the worst matrix's): grouping heads would change those results."""
        return self.pinv == "exact" or (
            self.pinv_init == "per_matrix" and self.pinv_tolerance is None
        )

    def triton_serves(self, q: Tensor, v: Tensor) -> bool:
        """Whether the landmark side can run as ``gpu.landmark``'s one program per head: on a
        GPU (or under Triton's interpreter in tests), for the iterative pseudo-inverse from
        its per-matrix start with a fixed number of steps, up to its tile's size."""
        return (
            self.pinv == "iterative"
            and self.pinv_init == "per_matrix"
            and self.pinv_tolerance is None
            and ops.kernels_serve(q, v, self.num_landmarks)
        )

    def approximate_all(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Tensor | None,
        path: Path = Path.TORCH,
    ) -> Tensor:
        """:meth:`approximate` over all of q's heads in one go, by ``path``: the inference op,
        the Triton landmark side, or torch."""
        q, k, q_land, k_land, exists = self.pick_landmarks(q, k, key_padding_mask)
        if path is Path.INFERENCE:
            return inference.nystrom_inference(
                q, k, v, q_land, k_land, exists, key_padding_mask, self.pinv_iterations
            )
        w = self.landmark_values(q_land, k_land, exists, k, v, key_padding_mask, path)
        del q_land  # the last attention needs only k~ and W: at inference this frees m x d
        land_keep = None
        if exists is not None:
            # A sequence with no landmark at all would get an all-masked row (NaN); its W is
            # zero, so letting it attend to the empty landmarks gives the right zeros.
            land_keep = (exists | ~exists.any(dim=1, keepdim=True))[:, None, None, :]
        return F.scaled_dot_product_attention(q, k_land, w, attn_mask=land_keep)

    def landmark_inverse(self, q_land: Tensor, k_land: Tensor) -> Tensor:
        """pinv(A): (B, H, m, m) for landmarks (B, H, m, d) that all exist."""
        return self.pseudo_inverse(self.landmark_kernel(q_land, k_land, None))

    def landmark_values(
        self,
        q_land: Tensor,
        k_land: Tensor,
        exists: Tensor | None,
        k: Tensor,
        v: Tensor,
        key_padding_mask: Tensor | None,
        path: Path = Path.TORCH,
    ) -> Tensor:
        """W = pinv(A) (Bk V): (B, H, m, d), the values the queries attend to over k~, the
        landmark side as one Triton program per head if ``path`` is TRITON.

        Its own function so that A, pinv(A) and Bk V are freed before the last attention runs:
        the forward's peak stays at the output plus O(m d).
        """
        token_keep = None if key_padding_mask is None else key_padding_mask[:, None, None, :]
        bv = F.scaled_dot_product_attention(q_land, k, v, attn_mask=token_keep)  # (B,H,m,d)
        if exists is not None:
            bv = bv * exists[:, None, :, None].to(bv.dtype)
        if path is Path.TRITON:
            # fp32 inside whatever the dtypes (a custom op: autocast leaves it alone).
            w = landmark.landmark_weights(q_land, k_land, bv, exists, self.pinv_iterations)
            return w.to(v.dtype)
        with one_thread(q_land):  # (B, H, m, m) work: a second thread only waits
            a = self.landmark_kernel(q_land, k_land, exists)
            with torch.autocast(device_type=q_land.device.type, enabled=False):
                # pinv(A) can have large entries: multiply in at least fp32 even under autocast.
                z = self.recomputed_pseudo_inverse(a)
                return (z @ bv.to(z.dtype)).to(v.dtype)

    def recomputed_approximation(
        self, q: Tensor, k: Tensor, v: Tensor, key_padding_mask: Tensor | None
    ) -> Tensor:
        """:meth:`approximate_all` in training (``recompute=True``), keeping only q, k, v.

        Autograd would keep the landmark side (kernel, pinv input, Bk V, W, memberships) and
        the last attention's output: ~3x what SDPA keeps beyond q, k, v (MiniLM, batch 16,
        n 512: 36 vs 12 MB a layer), so the product runs again in backward: O(n m d + m^3) a
        head. The pseudo-inverse inside keeps its own recomputation, so no layer's iterates
        are held at once even while its backward runs.
        """
        path = Path.TRITON if self.triton_serves(q, v) else Path.TORCH
        return checkpoint(
            self.approximate_all,
            q,
            k,
            v,
            key_padding_mask,
            path,
            use_reentrant=False,
            preserve_rng_state=False,
        )

    def recomputed_pseudo_inverse(self, a: Tensor) -> Tensor:
        """:meth:`pseudo_inverse` of a (B, H, m, m) that keeps only ``a`` for backward.

        Autograd would keep every iterate's products (six m x m tensors an iteration:
        ~110 MB a layer for MiniLM at batch 16, more than SDPA keeps for a whole softmax layer
        at n = 512), so in training the iteration runs again in backward: O(m^3) a head, small
        next to the core's O(n m d) products.
        """
        if self.pinv == "exact" or not backward_follows(a):
            return self.pseudo_inverse(a)
        return checkpoint(self.pseudo_inverse, a, use_reentrant=False, preserve_rng_state=False)
