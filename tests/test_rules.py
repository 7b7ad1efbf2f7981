"""One source per rule: what the CLI checks before a run is what the code enforces.

Each attention core declares its options and its budget key once; the config check of every
command (``schema.check_attentions``) and the core's constructor read the same rules, the
trainer's ranges live in ``nyscli.train.config.TRAINER`` and are read by both
``TrainerConfig.check`` and the CLI's check.
"""

from __future__ import annotations

import dataclasses
import inspect
import math

import pytest
from omegaconf import OmegaConf

from nyscli.attention import (
    AttentionConfigError,
    available,
    budget,
    budget_key,
    build_attention,
    core_class,
)
from nyscli.errors import UserInputError
from nyscli.experiments import schema
from nyscli.experiments.finetune.evaluate import _budget
from nyscli.rules import Choice, Fixed, Float, Int
from nyscli.train.config import TRAINER, TrainerConfig

PROBES = (-1, 0, 1, 2, 3, True, False, 2.5, "x", None)


def outcome(call) -> bool:
    try:
        call()
    except UserInputError:
        return False
    return True


@pytest.mark.parametrize("name", available())
def test_cli_check_and_core_constructor_accept_the_same_values(name):
    """For every option of every core, every probe value: the CLI's check (nothing built)
    accepts it exactly when the core's constructor does."""
    cls = core_class(name)
    for key in cls.options:
        for value in PROBES:
            config = {"name": name, key: value}
            if name == "linformer":  # keep the projections small; the rule is what is tested
                config.setdefault("max_seq_len", 8)
            cli = outcome(lambda c=config: schema.check_attentions([("attention", c)]))
            core = outcome(lambda c=config: build_attention(c))
            assert cli == core, (name, key, value, cli, core)


def test_kmeans_iterations_zero_is_accepted_by_both():
    """Once refused by the CLI's own table while the core accepted it: 0 Lloyd steps is the
    random draw itself."""
    config = {"name": "nystrom", "landmarks": "kmeans", "kmeans_iterations": 0}
    schema.check_attentions([("attention", OmegaConf.create(config))])
    assert build_attention(config).kmeans_iterations == 0
    with pytest.raises(AttentionConfigError, match=r"kmeans_iterations=-1 .* integer >= 0"):
        schema.check_attentions([("attention", {**config, "kmeans_iterations": -1})])


def test_every_core_declares_its_options_and_budget_key():
    """The declared options are exactly the constructor's keyword arguments, and the budget
    key is one of them (None for exact attention)."""
    knobs = {}
    for name in available():
        cls = core_class(name)
        params = [p for p in inspect.signature(cls.__init__).parameters if p != "self"]
        assert sorted(cls.options) == sorted(params)
        knobs[name] = cls.budget_key
    assert knobs == {
        "linear": None,
        "linformer": "proj_dim",
        "longformer": "window",
        "nystrom": "num_landmarks",
        "nystrom_local": "num_landmarks",
        "performer": "num_features",
        "reformer": "n_hashes",
        "softmax": None,
        "softmax_naive": None,
    }
    not_causal = {n for n in available() if isinstance(core_class(n).options["causal"], Fixed)}
    assert not_causal == {"nystrom", "nystrom_local", "linformer", "reformer"}
    assert isinstance(core_class("nystrom").options["pinv"], Choice)


def test_deployment_budget_is_scored_pairs_per_query_reformer_included():
    """The deployment report once looked for num_hashes (Reformer's key is n_hashes): NaN.
    Its budget axis is scored pairs per query, so methods sit at equal cost."""
    assert _budget({"name": "reformer", "n_hashes": 4}) == 4 * 2 * 64.0  # chunk + previous
    assert _budget({"name": "reformer"}) == 2 * 2 * 64.0  # the class default
    assert _budget({"name": "nystrom", "num_landmarks": 32}) == 64.0
    assert _budget({"name": "longformer", "window": 129}) == 128.0
    assert _budget({"name": "nystrom_local"}) == 128.0
    assert math.isnan(_budget({"name": "softmax"}))
    assert budget_key({"name": "longformer"}) == "window" and budget({"name": "linear"}) is None


def test_trainer_rules_are_the_trainer_config_fields_and_checked_by_both():
    fields = {f.name for f in dataclasses.fields(TrainerConfig)}
    assert set(TRAINER) == fields
    assert schema.TRAINING["trainer.lr"] is TRAINER["lr"]
    assert isinstance(TRAINER["lr"], Float) and isinstance(TRAINER["warmup_steps"], Int)
    for key, bad in (("lr", 0.0), ("warmup_steps", -1), ("precision", "fp8"), ("bucket", 0)):
        values = {"max_steps": 10, "batch_size": 2, key: bad}
        with pytest.raises(UserInputError, match=rf"^trainer\.{key}={bad} is not allowed"):
            TrainerConfig.from_mapping(values)
        with pytest.raises(UserInputError, match=rf"^trainer\.{key}={bad} is not allowed"):
            schema.check(OmegaConf.create({"trainer": values}), schema.TRAINING)


@pytest.mark.parametrize(
    "command, old, new",
    [
        ("finetune", "data.dir=/x", "data.path=/x"),
        ("finetune", "task.lr=1e-3", "trainer.lr=1e-3"),
        ("finetune", "task.steps=5", "trainer.max_steps=5"),
        ("lra", "task.data_dir=/x", "data.path=/x"),
        ("lra", "task.data.val_fraction=0.1", "data.val_fraction=0.1"),
        ("lra", "task.generate.n_train=9", "data.generate.n_train=9"),
        ("lra", "+task.warmup_steps=3", "trainer.warmup_steps=3"),
        ("approx_error", "text_path=a.txt", "data.path=a.txt"),
    ],
)
def test_old_key_names_are_refused_naming_the_new_one(command, old, new, tmp_path, monkeypatch,
                                                      capsys):  # fmt: skip
    """One name for a data location, schedules as trainer.*: an old key stops the launch in
    one line (exit 2) that names the key to give instead, and no run folder is made."""
    from nyscli.launch.run import launch

    monkeypatch.chdir(tmp_path)
    assert launch(command, [old]) == 2
    out = capsys.readouterr()
    lines = [line for line in (out.out + out.err).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and f"give {new}" in lines[0]
    assert not (tmp_path / "outputs").exists()


def test_an_attention_option_added_since_a_run_reads_at_the_value_that_run_had(tmp_path):
    """A Nyström run recorded before ``attention.recompute`` existed resumes without a
    change of settings (it ran as recompute=false); giving recompute=true is a change."""
    from nyscli.experiments.renamed import upgrade_recorded
    from nyscli.train.resume import setup_changes

    today = OmegaConf.create({"attention": {"name": "nystrom", "num_landmarks": 8,
                                            "recompute": False}})  # fmt: skip
    old = OmegaConf.create({"attention": {"name": "nystrom", "num_landmarks": 8}})
    assert setup_changes(upgrade_recorded(old, "finetune"), today) == []
    today.attention.recompute = True
    [change] = setup_changes(upgrade_recorded(old, "finetune"), today)
    assert (change.key, change.old, change.new) == ("attention.recompute", False, True)
    softmax = OmegaConf.create({"attention": {"name": "softmax", "causal": False}})
    assert "recompute" not in upgrade_recorded(softmax, "finetune").attention
    # A hybrid recorded before far_field existed ran with its far field.
    hybrid = OmegaConf.create({"attention": {"name": "nystrom_local", "window": 65}})
    upgraded = upgrade_recorded(hybrid, "lra").attention
    assert upgraded.far_field is True and upgraded.routed_keys == 0
    assert upgraded.landmarks == "segment_means"


def test_a_setting_added_since_a_run_reads_at_the_value_that_run_had():
    """lra's model.init is new, with a default (torch) other than what earlier runs did: their
    records read as normal; other commands' records get no such key."""
    from nyscli.experiments.renamed import upgrade_recorded

    old = OmegaConf.create({"model": {"dim": 64}})
    assert upgrade_recorded(old, "lra").model.init == "normal"
    torch_run = OmegaConf.create({"model": {"dim": 64, "init": "torch"}})
    assert upgrade_recorded(torch_run, "lra").model.init == "torch"
    assert "init" not in upgrade_recorded(old, "pretrain").model
    assert upgrade_recorded(old, "lra").model.softmax_attention_dropout == 0.0


def test_a_softmax_run_recorded_before_attention_dropout_reads_without_it():
    """softmax's dropout option is new (default 0, what earlier runs did): a record without it
    reads as 0 in every command; one that has it keeps its value; other cores get no key."""
    from nyscli.experiments.renamed import upgrade_recorded

    old = OmegaConf.create({"attention": {"name": "softmax", "causal": False}})
    assert upgrade_recorded(old, "finetune").attention.dropout == 0.0
    kept = OmegaConf.create({"attention": {"name": "softmax", "dropout": 0.1}})
    assert upgrade_recorded(kept, "lra").attention.dropout == 0.1
    nystrom = OmegaConf.create({"attention": {"name": "nystrom"}})
    assert "dropout" not in upgrade_recorded(nystrom, "lra").attention


def test_a_run_recorded_before_the_renames_reads_in_todays_names():
    """resume= and eval_only= read an old run's .hydra/config.yaml through the same table the
    command line refuses old keys with: values move to the new names, interpolations of the
    record resolve first, and a trainer value the record holds (a --steps cap) is kept."""
    from nyscli.experiments.renamed import upgrade_recorded

    old_lra = OmegaConf.create(
        {
            "command": "lra",
            "task": {"name": "listops", "max_len": 40, "steps": 5000, "batch_size": 32,
                     "eval_every": 2, "data_dir": None, "generate": {"n_train": 48}},
            "trainer": {"max_steps": 4, "batch_size": "${oc.select:task.batch_size,16}",
                        "eval_every": "${oc.select:task.eval_every,500}"},
        }
    )  # fmt: skip
    new = upgrade_recorded(old_lra, "lra")
    assert OmegaConf.to_container(new) == {
        "command": "lra",
        "task": {"name": "listops", "max_len": 40},
        "trainer": {"max_steps": 4, "batch_size": 32, "eval_every": 2},
        "data": {"path": None, "generate": {"n_train": 48}},
        # ADDED_SETTINGS: what runs before the options ran
        "model": {"init": "normal", "softmax_attention_dropout": 0.0},
    }
    old_finetune = OmegaConf.create({"task": {"name": "sst2", "lr": 3e-5}, "data": {"dir": "x"},
                                     "trainer": {"lr": "${oc.select:task.lr,1e-4}"}})  # fmt: skip
    assert OmegaConf.to_container(upgrade_recorded(old_finetune, "finetune")) == {
        "task": {"name": "sst2"},
        "data": {"path": "x"},
        "trainer": {"lr": 3e-5},
    }
