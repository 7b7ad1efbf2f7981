"""The BERT-style WordPiece tokenizer shared by ``pretrain`` and ``finetune`` (text-classification
readers live in ``nyscli.data.text``)."""

from nyscli.tokenizers.tokenizer import SPECIAL_TOKENS, WordPieceTokenizer

__all__ = ["SPECIAL_TOKENS", "WordPieceTokenizer"]
