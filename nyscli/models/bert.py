"""BERT on the shared pre-LN encoder: the encoder alone, and with its MLM + SOP heads.

``BertEncoder`` is what a pre-training run hands to fine-tuning (``nyscli.checkpoints.pretrained``);
``BertForPretraining`` adds the masked-language-model head (dense + GELU + LayerNorm, decoder
tied to the token embeddings, own bias) and the sentence-order head (tanh pooler on the
[CLS] position, then Linear(dim, 2)), as in ALBERT/the Nyströmformer BERT runs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nyscli.attention.dropout import Dropout
from nyscli.models.encoder import Encoder, EncoderConfig

# The paper's BERT-small: the sizes ``BertConfig.create`` takes where none are given.
BERT_SMALL: dict[str, Any] = {
    "max_len": 512,
    "dim": 512,
    "depth": 4,
    "num_heads": 8,
    "ffn_dim": 2048,
    "dropout": 0.1,
    "type_vocab_size": 2,
}
# The encoder fields a BERT's config.json holds (a ``pretrained/`` folder's format, unchanged
# since the first checkpoint: cls_token and init_std are the encoder defaults for BERT).
SAVED_FIELDS = (
    "vocab_size",
    "max_len",
    "dim",
    "depth",
    "num_heads",
    "ffn_dim",
    "dropout",
    "attention",
    "type_vocab_size",
    "norm",
    "layer_norm_eps",
    "activation",
)


@dataclass(frozen=True)
class BertConfig:
    """A BERT: the sizes of its encoder (one :class:`EncoderConfig`, the one source of every
    size) and how it is saved. ``config.dim`` and the like read the encoder's fields."""

    encoder: EncoderConfig

    @classmethod
    def create(cls, vocab_size: int, **sizes: Any) -> BertConfig:
        """A BERT of ``vocab_size`` tokens; sizes not given are BERT-small's
        (:data:`BERT_SMALL`), pre-LN (``norm="pre"``) unless ``norm="post"`` is given."""
        return cls(EncoderConfig(vocab_size=vocab_size, **{**BERT_SMALL, **sizes}))

    def __getattr__(self, name: str) -> Any:
        # Only the encoder's fields read through; anything else is a real AttributeError
        # (also while unpickling, before ``encoder`` exists).
        if name != "encoder" and name in _ENCODER_FIELDS:
            return getattr(self.encoder, name)
        raise AttributeError(name)

    def replace(self, **changes: Any) -> BertConfig:
        """A copy with some encoder fields changed (e.g. ``max_len`` for longer inputs)."""
        return BertConfig(dataclasses.replace(self.encoder, **changes))

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready values (``attention`` copied into a dict)."""
        values = {key: getattr(self.encoder, key) for key in SAVED_FIELDS}
        values["attention"] = dict(self.encoder.attention)
        return values

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> BertConfig:
        """Inverse of :meth:`to_dict`; unknown keys raise ValueError naming them."""
        unknown = sorted(set(values) - set(SAVED_FIELDS))
        if unknown:
            raise ValueError(f"unknown BertConfig keys: {', '.join(unknown)}")
        values = dict(values)
        if "attention" in values:
            values["attention"] = dict(values["attention"])
        return cls.create(**values)


_ENCODER_FIELDS = frozenset(f.name for f in dataclasses.fields(EncoderConfig))


class BertEncoder(nn.Module):
    """ids (B, n) int64, mask (B, n) bool (True = real), segments (B, n) | None -> (B, n, dim).

    Position embeddings: ``self.encoder.embeddings.positions`` (nn.Embedding(max_len, dim)).
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.encoder = Encoder(config.encoder)

    @property
    def config(self) -> BertConfig:
        """The BERT's config, read from its encoder's (the one copy of the sizes)."""
        return BertConfig(self.encoder.config)

    def forward(self, ids: Tensor, mask: Tensor, segments: Tensor | None = None) -> Tensor:
        hidden, _ = self.encoder(ids, mask, segments)
        return hidden

    @property
    def token_embeddings(self) -> nn.Embedding:
        return self.encoder.embeddings.tokens


# Parameters an attention variant brings itself (Linformer's projections, the Nyström conv
# skip): a checkpoint trained with another attention has none, so they start from the
# variant's ``init_for_conversion`` where it has one (else from their fresh init).
ATTENTION_OWN = (".attention.core.", ".attention.conv_skip.")


def is_attention_own(key: str) -> bool:
    """True for a state-dict key that belongs to an attention variant's own parameters."""
    return any(part in key for part in ATTENTION_OWN)


def load_across_attention(module: nn.Module, state: Mapping[str, Tensor]) -> list[str]:
    """Load ``state`` into ``module`` whose attention may differ from the one it was saved with.

    Only the attention variants' own parameters may be missing or left over (returned, sorted);
    anything else that does not fit raises ValueError naming up to three keys. A submodule whose
    own parameters were missing is given its ``init_for_conversion()``, if it has one.
    """
    missing, unexpected = module.load_state_dict(state, strict=False)
    wrong = [k for k in (*missing, *unexpected) if not is_attention_own(k)]
    if wrong:
        raise ValueError(f"weights do not fit the model ({', '.join(wrong[:3])})")
    for name, sub in module.named_modules():
        if hasattr(sub, "init_for_conversion") and any(k.startswith(f"{name}.") for k in missing):
            sub.init_for_conversion()
    return sorted((*missing, *unexpected))


def with_attention(encoder: BertEncoder, attention: Mapping[str, Any]) -> BertEncoder:
    """A copy of ``encoder`` with ``attention`` as its core (attention surgery), same weights.

    The new variant's own parameters (if any) start from its conversion init; the result is in
    the same train/eval mode as ``encoder``.
    """
    config = encoder.config.replace(attention=dict(attention))
    swapped = BertEncoder(config)
    load_across_attention(swapped, encoder.state_dict())
    return swapped.train(encoder.training)


class BlockOutputs(nn.Module):
    """ids, mask, segments (B, n) -> every block's output of ``encoder``, (depth, B, n, dim).

    The targets and predictions of hidden-state distillation; forward hooks collect what the
    blocks return, so the encoder runs exactly as it does everywhere else. With
    ``dropout=False`` its dropout stays off in training mode too: a student learning a
    deterministic teacher's outputs would otherwise chase dropout noise.
    """

    def __init__(self, encoder: BertEncoder, dropout: bool = True) -> None:
        super().__init__()
        self.encoder = encoder
        self.dropout = dropout

    def train(self, mode: bool = True) -> BlockOutputs:
        super().train(mode)
        if not self.dropout:
            for module in self.modules():
                if isinstance(module, Dropout | nn.Dropout):
                    module.eval()
        return self

    def forward(self, ids: Tensor, mask: Tensor, segments: Tensor | None = None) -> Tensor:
        outputs: list[Tensor] = []
        hooks = [
            block.register_forward_hook(lambda _module, _args, out: outputs.append(out))
            for block in self.encoder.encoder.blocks
        ]
        try:
            self.encoder(ids, mask, segments)
        finally:
            for hook in hooks:
                hook.remove()
        return torch.stack(outputs)


class MaskedLMHead(nn.Module):
    """hidden (..., dim), decoder (V, dim) -> logits (..., V): dense + GELU + LayerNorm, decoder.

    The decoder weight is passed in (the token embedding table: tied), the bias is its own.
    """

    def __init__(self, dim: int, vocab_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.dense = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim, eps=eps)
        self.bias = nn.Parameter(torch.zeros(vocab_size))

    def forward(self, hidden: Tensor, decoder: Tensor) -> Tensor:
        return F.linear(self.norm(F.gelu(self.dense(hidden))), decoder, self.bias)


class SentenceOrderHead(nn.Module):
    """hidden (B, n, dim) -> logits (B, 2) from the [CLS] position: dense + tanh, Linear."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.pooler = nn.Linear(dim, dim)
        self.classifier = nn.Linear(dim, 2)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.classifier(self.pooler(hidden[:, 0]).tanh())


class BertForPretraining(nn.Module):
    """BertEncoder + MLM head (tied decoder) + SOP head.

    forward(ids, mask, segments) -> (mlm_logits (B, n, V), sop_logits (B, 2)). With
    ``mlm_positions`` (B, n) bool, mlm_logits are only those positions' (k, V), in row-major
    order: the V-wide decoder is the largest matrix product, and only ~15% of tokens need it.
    """

    def __init__(self, config: BertConfig) -> None:
        super().__init__()
        self.bert = BertEncoder(config)
        self.mlm = MaskedLMHead(config.dim, config.vocab_size, config.layer_norm_eps)
        self.sop = SentenceOrderHead(config.dim)
        init_std = self.bert.encoder.config.init_std
        for module in (self.mlm.dense, self.sop.pooler, self.sop.classifier):
            nn.init.normal_(module.weight, std=init_std)
            nn.init.zeros_(module.bias)

    @property
    def config(self) -> BertConfig:
        return self.bert.config

    def forward(
        self,
        ids: Tensor,
        mask: Tensor,
        segments: Tensor | None = None,
        mlm_positions: Tensor | None = None,
    ) -> tuple[Tensor, Tensor]:
        hidden = self.bert(ids, mask, segments)
        selected = hidden if mlm_positions is None else hidden[mlm_positions]
        return self.mlm(selected, self.bert.token_embeddings.weight), self.sop(hidden)
