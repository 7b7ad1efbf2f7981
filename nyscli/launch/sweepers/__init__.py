"""The sweepers' logic: the grid with per-attention options (``grid``) and the resumable
Optuna search of ``hparams_search=`` (``search``, ``optuna_search``). Hydra loads them through
the shims in ``hydra_plugins/``."""
