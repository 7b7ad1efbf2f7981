"""The one trainer shared by ``lra``, ``pretrain`` and ``finetune``.

Pieces: :class:`TrainerConfig` (the ``trainer`` config group), :class:`ShuffledBatches`
(resumable seeded batches), an objective returning :class:`BatchResult`, and
:class:`Trainer` (AdamW + warm-up/linear decay, accumulation, clipping, AMP, dev evaluation,
best/last checkpoints, resume, NaN stop, ``metrics.csv``).
"""

from nyscli.train import distributed
from nyscli.train.batches import ShuffledBatches, eval_batches
from nyscli.train.checkpoint import BEST, CHECKPOINT_DIR, LAST, load_checkpoint, save_checkpoint
from nyscli.train.config import PRECISIONS, TrainerConfig
from nyscli.train.errors import CheckpointError, TrainingDiverged
from nyscli.train.loop import FitResult, Trainer, to_device
from nyscli.train.metrics import METRICS_FILE, BatchResult, MetricsLog
from nyscli.train.resources import peak_memory_mb, reset_peak_memory, resolve_device
from nyscli.train.seed import seed_everything

__all__ = [
    "BEST",
    "CHECKPOINT_DIR",
    "LAST",
    "METRICS_FILE",
    "PRECISIONS",
    "BatchResult",
    "CheckpointError",
    "FitResult",
    "MetricsLog",
    "ShuffledBatches",
    "Trainer",
    "TrainerConfig",
    "TrainingDiverged",
    "distributed",
    "eval_batches",
    "load_checkpoint",
    "peak_memory_mb",
    "reset_peak_memory",
    "resolve_device",
    "save_checkpoint",
    "seed_everything",
    "to_device",
]
