"""``nys approx-error``'s config keys and what each may hold; torch-free (see
:mod:`nyscli.experiments`).
"""

from __future__ import annotations

from omegaconf import DictConfig

from nyscli.experiments import schema

SOURCES = ("gaussian", "smooth", "minilm", "checkpoint")  # where Q, K, V come from (sources.py)
# landmarks: a budget is Nyström's m (the paper's axis); pairs: scored pairs per query for all.
BUDGET_UNITS = ("landmarks", "pairs")
# dtype= -> the name of its torch dtype (settings.DTYPES holds the dtypes themselves).
DTYPES = {"fp64": "float64", "fp32": "float32"}

RULES: dict[str, schema.Rule] = {
    "source": schema.Choice(values=SOURCES),
    "seq_len": schema.OPTIONAL_COUNT,
    "head_dim": schema.WIDTH,
    "heads": schema.COUNT,
    "max_sequences": schema.COUNT,
    "svd_max_seq_len": schema.COUNT,
    "scale": schema.Float(low=0.0, low_open=True),
    "correlation_length": schema.Float(low=0.0, low_open=True),
    "max_matrix_mb": schema.Float(low=0.0, low_open=True),
    "seed": schema.SEED,
    "threads": schema.THREADS,
    "plot_layer": schema.Int(low=0),
    "plot_head": schema.Int(low=0),
    "budgets": schema.IntList(low=1, null=True),
    "budget_unit": schema.Choice(values=BUDGET_UNITS),
    "data.path": schema.Text(null=True),
    "dtype": schema.Choice(values=tuple(DTYPES)),
    "device": schema.DEVICE,
    "plots": schema.Bool(),
    "checkpoint": schema.Text(null=True),
    "fidelity.path": schema.Text(null=True),
    "fidelity.max_texts": schema.Int(low=2),
    "task.text_column": schema.Text(),
}

# The attention configs the full check checks: every one a job holds.
attentions = schema.attentions_of


def check(cfg: DictConfig) -> None:
    schema.check(cfg, RULES)
