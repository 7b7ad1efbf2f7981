"""Text pieces shared by ``pretrain`` and ``finetune``: the BERT-style WordPiece tokenizer."""

from nyscli.text.tokenizer import SPECIAL_TOKENS, WordPieceTokenizer

__all__ = ["SPECIAL_TOKENS", "WordPieceTokenizer"]
