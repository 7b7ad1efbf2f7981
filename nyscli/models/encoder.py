"""A Transformer encoder whose self-attention is any core from ``nyscli.attention``.

``norm="pre"`` (default) is the layout of the Nyströmformer LRA code (``mlpen/Nystromformer``,
``LRA/code/model.py``): token + learned position embeddings, dropout, then per block
``x = x + drop(attn(LN(x)))`` and ``x = x + drop(W2 drop(act(W1 LN(x))))``, a final LayerNorm.

``norm="post"`` is original BERT's (and every BERT-family checkpoint's, see
``nyscli.checkpoints.hf_import``): embeddings -> LayerNorm -> dropout, then per block
``x = LN(x + drop(attn(x)))`` and ``x = LN(x + drop(W2 drop(act(W1 x))))``, no final norm.

Either way padded positions are zeroed in the output.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from nyscli.attention import MultiHeadAttention
from nyscli.attention.dropout import Dropout
from nyscli.models.choices import INITS


@dataclass(frozen=True)
class EncoderConfig:
    """Sizes of the encoder; defaults are the paper's LRA model (2 layers, 64 wide, 2 heads)."""

    vocab_size: int
    max_len: int
    dim: int = 64
    depth: int = 2
    num_heads: int = 2
    ffn_dim: int = 128
    dropout: float = 0.1
    attention: Mapping[str, Any] = field(default_factory=lambda: {"name": "softmax"})
    cls_token: bool = False  # prepend a learned [CLS] vector (for CLS pooling)
    init_std: float = 0.02
    init: str = "normal"  # normal | torch: how Linear layers start (see ``INITS``)
    type_vocab_size: int = 0  # > 0: add segment embeddings (BERT's sentence A/B); 0 = none
    norm: str = "pre"  # pre | post (LayerNorm placement, see the module docstring)
    layer_norm_eps: float = 1e-5  # BERT checkpoints: 1e-12
    activation: str = "gelu"  # FFN activation: one of ACTIVATIONS

    def __post_init__(self) -> None:
        if self.norm not in NORMS:
            raise ValueError(
                f"norm={self.norm!r} is not allowed; choose one of: {', '.join(NORMS)}"
            )
        if self.init not in INITS:
            raise ValueError(
                f"init={self.init!r} is not allowed; choose one of: {', '.join(INITS)}"
            )
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"activation={self.activation!r} is not allowed; choose one of: "
                f"{', '.join(ACTIVATIONS)}"
            )


NORMS = ("pre", "post")
# Hugging Face's hidden_act names: "gelu" is the exact (erf) GELU, the others its tanh form.
ACTIVATIONS = {
    "gelu": lambda: nn.GELU(),
    "gelu_new": lambda: nn.GELU(approximate="tanh"),
    "gelu_pytorch_tanh": lambda: nn.GELU(approximate="tanh"),
    "relu": lambda: nn.ReLU(),
}


class Embeddings(nn.Module):
    """ids (B, n) -> (B, n', dim): token + learned position (+ segment) embeddings.

    n' = n + 1 with a learned CLS slot. Segment embeddings exist only with type_vocab_size > 0.
    """

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.tokens = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.positions = nn.Embedding(cfg.max_len + int(cfg.cls_token), cfg.dim)
        self.cls = nn.Parameter(torch.zeros(1, 1, cfg.dim)) if cfg.cls_token else None
        self.dropout = Dropout(cfg.dropout)
        # Created last so models without segments draw the same initial weights as before.
        self.segments = (
            nn.Embedding(cfg.type_vocab_size, cfg.dim) if cfg.type_vocab_size > 0 else None
        )
        post = cfg.norm == "post"
        self.norm = nn.LayerNorm(cfg.dim, eps=cfg.layer_norm_eps) if post else None

    def forward(
        self, ids: Tensor, mask: Tensor, segments: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """ids, mask, segments: (B, n) -> x (B, n', dim), mask (B, n') with True = real token.

        ``segments`` (int64 segment ids) needs type_vocab_size > 0; None means all segment 0.
        """
        x = self.tokens(ids)
        if self.segments is not None:
            x = x + self.segments(torch.zeros_like(ids) if segments is None else segments)
        elif segments is not None:
            raise ValueError("segment ids given but the encoder has type_vocab_size=0")
        if self.cls is not None:
            x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1)
            mask = torch.cat([mask.new_ones(mask.shape[0], 1), mask], dim=1)
        n = x.shape[1]
        if n > self.positions.num_embeddings:
            raise ValueError(
                f"sequence of {n} tokens is longer than the model's max_len "
                f"{self.positions.num_embeddings}"
            )
        x = x + self.positions(torch.arange(n, device=ids.device))
        if self.norm is not None:
            x = self.norm(x)
        return self.dropout(x), mask


class FeedForward(nn.Module):
    """(B, n, dim) -> (B, n, dim): Linear -> activation -> dropout -> Linear -> dropout."""

    def __init__(self, dim: int, hidden: int, dropout: float, activation: str = "gelu") -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(dim, hidden),
            ACTIVATIONS[activation](),
            Dropout(dropout),
            nn.Linear(hidden, dim),
            Dropout(dropout),
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.net(x)


class Block(nn.Module):
    """One pre-LN or post-LN block: (B, n, dim), mask (B, n) or None (no padding) -> (B, n, dim)."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.post = cfg.norm == "post"
        self.norm1 = nn.LayerNorm(cfg.dim, eps=cfg.layer_norm_eps)
        self.attention = MultiHeadAttention(cfg.dim, cfg.num_heads, cfg.attention)
        self.dropout = Dropout(cfg.dropout)
        self.norm2 = nn.LayerNorm(cfg.dim, eps=cfg.layer_norm_eps)
        self.ffn = FeedForward(cfg.dim, cfg.ffn_dim, cfg.dropout, cfg.activation)

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        if self.post:
            x = self.norm1(x + self.dropout(self.attention(x, mask)))
            return self.norm2(x + self.ffn(x))
        x = x + self.dropout(self.attention(self.norm1(x), mask))
        return x + self.ffn(self.norm2(x))


class Encoder(nn.Module):
    """ids, mask (B, n) -> hidden states (B, n', dim) (zero at padding) and mask (B, n')."""

    def __init__(self, cfg: EncoderConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embeddings = Embeddings(cfg)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.depth))
        # Post-LN blocks end in a LayerNorm already; a pre-LN stack needs a final one.
        self.norm = nn.LayerNorm(cfg.dim) if cfg.norm == "pre" else nn.Identity()
        self.apply(self._init_weights)

    def _init_weights(self, module: nn.Module) -> None:
        # ``INITS``: embeddings always N(0, init_std); Linear layers too unless init=torch
        # leaves them as PyTorch made them. LayerNorms keep their (1, 0) init.
        normal = isinstance(module, nn.Embedding) or (
            isinstance(module, nn.Linear) and self.config.init == "normal"
        )
        if normal:
            nn.init.normal_(module.weight, std=self.config.init_std)
            if isinstance(module, nn.Linear) and module.bias is not None:
                nn.init.zeros_(module.bias)

    def forward(
        self, ids: Tensor, mask: Tensor, segments: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        x, mask = self.embeddings(ids, mask, segments)
        # A batch without padding (images, full-length text) tells attention so: the cores
        # then take their unmasked paths (one check per batch, not per layer).
        key_mask = None if bool(mask.all()) else mask
        for block in self.blocks:
            x = block(x, key_mask)
        # Zeroing padded rows keeps anything downstream from reading them by accident.
        return self.norm(x) * mask.unsqueeze(-1), mask
