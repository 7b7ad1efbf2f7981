"""Any encoder checkpoint by name: an imported BERT (``minilm``, ``hf:<...>``), a ``nys
pretrain`` folder (or run folder), or a ``nys finetune`` run folder (its best.pt, else
last.pt, on the encoder it started from, with the attention it was trained with).

Used where only the encoder matters (``approx-error source=checkpoint``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import torch
from omegaconf import OmegaConf

from nyscli.checkpoints.hf_import import import_bert, is_checkpoint_spec
from nyscli.checkpoints.pretrained import CONFIG_FILE, load_pretrained, resolve_pretrained
from nyscli.errors import UserInputError
from nyscli.models.bert import BertEncoder, load_across_attention, with_attention
from nyscli.models.bert_classifier import extend_positions
from nyscli.overrides import override_keys
from nyscli.tokenizers.tokenizer import WordPieceTokenizer

TRAINER_CHECKPOINTS = ("checkpoints/best.pt", "checkpoints/last.pt")
EXPECTED = "minilm, hf:<folder or hub id>, a nys pretrain folder or a nys finetune run folder"


def names_attention(overrides: Iterable[str]) -> bool:
    """True if command-line ``overrides`` choose an attention (attention=x or attention.k=v)."""
    keys = override_keys(overrides)
    return any(key.split(".", 1)[0] == "attention" for key in keys)


def load_encoder(spec: str) -> tuple[BertEncoder, WordPieceTokenizer]:
    """The encoder (eval mode) and tokenizer ``spec`` names (module doc); one-line errors."""
    if is_checkpoint_spec(spec):
        imported = import_bert(spec, {"name": "softmax"})
        return imported.encoder, imported.tokenizer
    folder = Path(spec).expanduser()
    if (resolve_pretrained(folder) / CONFIG_FILE).is_file():
        return load_pretrained(folder)
    config_file = folder / ".hydra" / "config.yaml"
    weights = next((folder / p for p in TRAINER_CHECKPOINTS if (folder / p).is_file()), None)
    if not config_file.is_file() or weights is None:
        raise UserInputError(f"checkpoint={spec} is not a checkpoint; expected {EXPECTED}")
    run = OmegaConf.load(config_file)
    if run.get("command") != "finetune":
        raise UserInputError(
            f"checkpoint={spec} is a {run.get('command')} run; expected {EXPECTED}"
        )
    if str(run.init) == "scratch":
        raise UserInputError(
            f"checkpoint={spec} was fine-tuned from scratch; give its init checkpoint's kind of "
            "run (minilm, hf:..., or from a nys pretrain folder)"
        )
    encoder, tokenizer = load_encoder(str(run.init))
    overrides_file = folder / ".hydra" / "overrides.yaml"
    overrides = [str(o) for o in OmegaConf.load(overrides_file)] if overrides_file.exists() else []
    if names_attention(overrides):
        encoder = with_attention(encoder, OmegaConf.to_container(run.attention, resolve=True))
    try:
        state = torch.load(weights, map_location="cpu", weights_only=False)["model"]
    except Exception as error:  # truncated or foreign file
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:120]
        raise UserInputError(f"{weights} is corrupt or unreadable ({reason})") from None
    prefix = "bert."
    encoder_state = {k[len(prefix) :]: v for k, v in state.items() if k.startswith(prefix)}
    rows = encoder_state["encoder.embeddings.positions.weight"].shape[0]
    if rows > encoder.config.max_len:  # the run grew the position table (task.max_len)
        extend_positions(encoder, rows)
    try:
        load_across_attention(encoder, encoder_state)
    except ValueError as error:
        raise UserInputError(f"{weights}: {error}") from None
    return encoder.eval(), tokenizer
