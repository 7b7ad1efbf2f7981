"""The one trainer shared by ``lra``, ``pretrain`` and ``finetune``.

Pieces: :class:`~nyscli.train.config.TrainerConfig` (the ``trainer`` config group and its
rules), :class:`~nyscli.train.batches.ShuffledBatches` (resumable seeded batches), an
objective returning :class:`~nyscli.train.metrics.BatchResult`, and
:class:`~nyscli.train.loop.Trainer` (AdamW + warm-up/linear decay, accumulation, clipping,
AMP, dev evaluation, best/last checkpoints, resume, NaN stop, ``metrics.csv``).

This file imports nothing, so ``nyscli.train.config`` loads without torch (the command line
checks a config against its rules before torch is imported).
"""
