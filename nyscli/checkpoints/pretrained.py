"""A pre-trained BERT on disk: ``config.json`` + ``model.pt`` (encoder weights) + tokenizer.

``nys pretrain`` writes ``<run_dir>/pretrained/`` with :func:`save_pretrained`;
``nys finetune init=<folder>`` reads it back with :func:`load_pretrained` (a run folder is
accepted too: its ``pretrained/`` is used).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from nyscli.errors import UserInputError
from nyscli.files import atomic_writer, write_json
from nyscli.models.bert import BertConfig, BertEncoder
from nyscli.tokenizers.tokenizer import FILE_NAME as TOKENIZER_FILE
from nyscli.tokenizers.tokenizer import WordPieceTokenizer
from nyscli.train.checkpoint import shape_mismatch

PRETRAINED_DIR = "pretrained"
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.pt"
EXPECTED = f"a folder with {CONFIG_FILE}, {WEIGHTS_FILE} and {TOKENIZER_FILE} (nys pretrain)"


def save_pretrained(folder: Path, encoder: BertEncoder, tokenizer: WordPieceTokenizer) -> Path:
    """Write the encoder's config, weights (state_dict only) and tokenizer into ``folder``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if encoder.config.vocab_size != tokenizer.vocab_size:
        raise ValueError(
            f"encoder vocab_size {encoder.config.vocab_size} != tokenizer's {tokenizer.vocab_size}"
        )
    state = {k: v.detach().cpu() for k, v in encoder.state_dict().items()}
    with atomic_writer(folder / WEIGHTS_FILE, "wb") as handle:
        torch.save(state, handle)
    tokenizer.save(folder / TOKENIZER_FILE)
    write_json(encoder.config.to_dict(), folder / CONFIG_FILE)  # last: marks the folder complete
    return folder


def resolve_pretrained(folder: Path) -> Path:
    """``folder`` if it holds config.json, else its ``pretrained/`` subfolder (a run folder)."""
    folder = Path(folder).expanduser()
    if not (folder / CONFIG_FILE).is_file() and (folder / PRETRAINED_DIR / CONFIG_FILE).is_file():
        return folder / PRETRAINED_DIR
    return folder


def load_setup(folder: Path) -> tuple[BertConfig, WordPieceTokenizer]:
    """The encoder config and tokenizer saved in ``folder``, without the weights (what
    ``finetune scratch.like`` copies)."""
    try:
        config = BertConfig.from_dict(json.loads((folder / CONFIG_FILE).read_text("utf-8")))
    except (ValueError, TypeError) as error:
        raise UserInputError(f"{folder / CONFIG_FILE} is corrupt ({error})") from None
    return config, WordPieceTokenizer.load(folder / TOKENIZER_FILE)


def load_pretrained(folder: Path) -> tuple[BertEncoder, WordPieceTokenizer]:
    """The encoder (eval mode, CPU) and tokenizer saved in ``folder`` (or a run folder)."""
    folder = resolve_pretrained(folder)
    if not folder.is_dir():
        raise UserInputError(f"pretrained checkpoint {folder} does not exist; expected {EXPECTED}")
    for name in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE):
        if not (folder / name).is_file():
            raise UserInputError(
                f"pretrained checkpoint {folder} has no {name}; expected {EXPECTED}"
            )
    config, tokenizer = load_setup(folder)
    encoder = BertEncoder(config)
    state = None
    try:
        state = torch.load(folder / WEIGHTS_FILE, map_location="cpu", weights_only=True)
        encoder.load_state_dict(state)
    except Exception as error:  # truncated file, foreign pickle or mismatched shapes
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0][:120]
        if isinstance(state, dict):
            reason = shape_mismatch(encoder, state) or reason
        raise UserInputError(
            f"{folder / WEIGHTS_FILE} is corrupt or does not fit ({reason})"
        ) from None
    if config.vocab_size != tokenizer.vocab_size:
        raise UserInputError(
            f"pretrained checkpoint {folder}: config vocab_size {config.vocab_size} != "
            f"tokenizer's {tokenizer.vocab_size}"
        )
    return encoder.eval(), tokenizer
