"""``nys lra``'s config keys and what each may hold; torch-free (see
:mod:`nyscli.experiments`).
"""

from __future__ import annotations

from omegaconf import DictConfig

from nyscli.data.choices import DIFFICULTY_CONTOUR_LENGTH
from nyscli.experiments import schema
from nyscli.models.choices import INITS, POOLINGS

# The split sizes and seed of a generated task (data.generate of ListOps and Pathfinder).
GENERATED: dict[str, schema.Rule] = {
    "n_train": schema.COUNT,
    "n_val": schema.COUNT,
    "n_test": schema.COUNT,
    "seed": schema.SEED,
}
# The keys of conf/task/*.yaml (each task has some of them) and the LRA model's pooling.
RULES: dict[str, schema.Rule] = {
    **schema.prefixed("data.generate", GENERATED),
    "task.max_len": schema.TOKENS,
    "task.test_examples": schema.OPTIONAL_COUNT,
    "task.pooling": schema.Choice(values=POOLINGS),
    **schema.prefixed(
        "data",
        {
            "path": schema.Text(null=True),
            "generate.min_len": schema.COUNT,
            "generate.max_len": schema.COUNT,
            "generate.max_depth": schema.COUNT,
            "generate.max_args": schema.Int(low=2),
            "generate.image_size": schema.Int(low=8),
            "val_fraction": schema.PROBABILITY,
            "test_fraction": schema.Float(low=0.0, high=1.0, low_open=True, high_open=True),
            "seed": schema.SEED,
            "split_seed": schema.SEED,
            "pairs_per_document": schema.COUNT,
            "difficulty": schema.Choice(values=tuple(DIFFICULTY_CONTOUR_LENGTH)),
            "workers": schema.OPTIONAL_COUNT,
        },
    ),
    "model.pooling": schema.Choice(values=POOLINGS),
    "model.init": schema.Choice(values=INITS),
}

# The attention configs the full check checks: every one a job holds.
attentions = schema.attentions_of


def check(cfg: DictConfig) -> None:
    schema.check_training(cfg, RULES)
