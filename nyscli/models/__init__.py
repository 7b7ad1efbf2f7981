"""Models built on the attention core (``nn.Module`` code only): a pre-LN encoder, the BERT
encoder with its pre-training and classification heads, pooling, classification heads.
Checkpoints on disk (pretrained folders, HF imports) live in ``nyscli.checkpoints``.

``SequenceClassifier`` (one sequence -> logits) and ``DualEncoderClassifier`` (two sequences
through one shared encoder -> logits, LRA retrieval) both take padding masks from the collate.
"""

from nyscli.models.classifier import DualEncoderClassifier, SequenceClassifier, build_classifier
from nyscli.models.encoder import INITS, Encoder, EncoderConfig
from nyscli.models.heads import ClassifierHead, DualHead
from nyscli.models.pooling import POOLINGS, pool

__all__ = [
    "INITS",
    "POOLINGS",
    "ClassifierHead",
    "DualEncoderClassifier",
    "DualHead",
    "Encoder",
    "EncoderConfig",
    "SequenceClassifier",
    "build_classifier",
    "pool",
]
