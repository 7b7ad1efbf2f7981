"""Config keys renamed when every command got one name for a data location (``data.path``)
and task files began to set ``trainer.*`` directly: old -> new per command, a prefix renaming
every key below it.

On the command line an old key is refused in one line naming the new one. In a run folder
written before the renames (``.hydra/config.yaml``), the old keys are read under their new
names, so ``resume=`` and ``eval_only=`` keep working on such runs. Likewise an attention
option added since a run was recorded is read at the value that does what that run did
(:data:`ADDED_OPTIONS`, :data:`ADDED_SETTINGS`), so resuming it is not a change of settings.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from nyscli.errors import UserInputError

_SCHEDULE = {
    "task.batch_size": "trainer.batch_size",
    "task.eval_every": "trainer.eval_every",
    "task.eval_examples": "trainer.eval_examples",
    "task.lr": "trainer.lr",
    "task.steps": "trainer.max_steps",
}
RENAMED: dict[str, dict[str, str]] = {
    "approx_error": {"text_path": "data.path"},
    "finetune": {"data.dir": "data.path", **_SCHEDULE, "task.weight_decay": "trainer.weight_decay"},
    "lra": {
        "task.data_dir": "data.path",
        "task.data": "data",
        "task.generate": "data.generate",
        **_SCHEDULE,
        "task.warmup_steps": "trainer.warmup_steps",
    },
}
# Attention options added after runs were recorded without them, at the value that behaves
# as those runs did (a new option's default is always that value).
ADDED_OPTIONS: dict[str, dict[str, object]] = {
    "nystrom": {"recompute": False},
    "softmax": {"dropout": 0.0},
    "nystrom_local": {
        "far_field": True,
        "routed_keys": 0,
        "landmarks": "segment_means",
        "kmeans_iterations": 5,
        "seed": 0,
    },
}
# Other settings added since, per command, at the value the runs recorded without them ran
# with. Unlike an attention option, such a default may differ: lra's model.init is torch.
ADDED_SETTINGS: dict[str, dict[str, object]] = {
    "lra": {"model.init": "normal", "model.softmax_attention_dropout": 0.0}
}
_ABSENT = object()


def refuse_renamed(command: str, overrides: list[str]) -> None:
    """An override of a renamed key: the one-line error naming the key to give instead."""
    for override in overrides:
        key, _, value = override.lstrip("+~").partition("=")
        for old, new in RENAMED.get(command, {}).items():
            if key == old or key.startswith(old + "."):
                now = new + key[len(old) :]
                raise UserInputError(f"{key} is now {now}: give {now}={value}")


def upgrade_recorded(cfg: DictConfig, command: str) -> DictConfig:
    """A run folder's recorded config in today's key names: resolved first (its own
    interpolations, e.g. ``trainer.lr: ${oc.select:task.lr,1e-4}``, read the old keys), then
    each old key's value moved to its new name, unless the record already holds a value there
    (a trainer.* value such as a --steps cap is never overwritten); the old key goes. An
    attention option of :data:`ADDED_OPTIONS` or setting of :data:`ADDED_SETTINGS` that the
    record lacks is added at its value."""
    cfg = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    for old, new in RENAMED.get(command, {}).items():
        value = OmegaConf.select(cfg, old, default=_ABSENT)
        if value is _ABSENT:
            continue
        if OmegaConf.select(cfg, new, default=_ABSENT) is _ABSENT:
            OmegaConf.update(cfg, new, value, force_add=True)
        parent, _, leaf = old.rpartition(".")
        node = OmegaConf.select(cfg, parent) if parent else cfg
        node.pop(leaf)
    attention = cfg.get("attention")
    if isinstance(attention, DictConfig):
        for key, value in ADDED_OPTIONS.get(str(attention.get("name")), {}).items():
            if key not in attention:
                attention[key] = value
    for key, value in ADDED_SETTINGS.get(command, {}).items():
        if OmegaConf.select(cfg, key, default=_ABSENT) is _ABSENT:
            OmegaConf.update(cfg, key, value, force_add=True)
    return cfg
