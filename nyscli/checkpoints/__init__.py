"""Encoder checkpoints on disk: the ``nys pretrain`` folder format (``pretrained``), imported
Hugging Face BERTs (``hf_import``), and any encoder checkpoint by name (``capture``)."""
