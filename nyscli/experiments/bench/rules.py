"""``nys bench``'s config keys and what each may hold; torch-free (see
:mod:`nyscli.experiments`).
"""

from __future__ import annotations

from omegaconf import DictConfig

from nyscli.experiments import schema
from nyscli.train.config import DEVICES

# dtype= -> the name of its torch dtype (worker.DTYPES holds the dtypes themselves).
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}

SCOPES = ("module", "core", "projections")
MODES = ("forward", "train")

RULES: dict[str, schema.Rule] = {
    "seq_lens": schema.IntList(low=1),
    "batch_size": schema.BATCH,
    "hidden": schema.WIDTH,
    "num_heads": schema.LAYERS,
    "scope": schema.ChoiceList(values=SCOPES),
    "mode": schema.Choice(values=MODES),
    "dtype": schema.Choice(values=tuple(DTYPES)),
    "device": schema.Choice(values=DEVICES),
    "baseline": schema.Text(null=True),
    "warmup": schema.Int(low=0),
    "repeats": schema.COUNT,
    "min_repeats": schema.COUNT,
    "time_budget_s": schema.Float(low=0.0, low_open=True),
    "timeout_s": schema.Float(low=0.0, low_open=True),
    "noise_threshold": schema.Float(low=0.0, low_open=True),
    "memory_limit_mb": schema.Float(low=0.0, low_open=True, null=True),
    "threads": schema.THREADS,
    "seed": schema.SEED,
}

# The attention configs the full check checks: every one a job holds.
attentions = schema.attentions_of


def check(cfg: DictConfig) -> None:
    schema.check(cfg, RULES)
