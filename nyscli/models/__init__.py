"""Models built on the attention core (``nn.Module`` code only): a pre-LN encoder, the BERT
encoder with its pre-training and classification heads, pooling, classification heads.
Checkpoints on disk (pretrained folders, HF imports) live in ``nyscli.checkpoints``.

``SequenceClassifier`` (one sequence -> logits) and ``DualEncoderClassifier`` (two sequences
through one shared encoder -> logits, LRA retrieval) both take padding masks from the collate.
``choices`` holds the names a model's config chooses among. This file imports nothing, so
``nyscli.models.choices`` loads without torch.
"""
