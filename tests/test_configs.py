"""The config tree: the shared base every command includes, the experiment= recipes of the
paper's settings, and a user's own config folder (--config-dir)."""

from __future__ import annotations

import pytest
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict

from nyscli.errors import UserInputError
from nyscli.experiments import COMMANDS
from nyscli.launch.compose import compose_job, composer
from nyscli.launch.plan import JobComposer, plan_launch


def compose(command: str, overrides: list[str], config_dir: str | None = None) -> DictConfig:
    """The job's config with its hydra node, as the run will see it."""
    with composer(command, config_dir) as hydra:
        return hydra.compose_config(
            config_name=command,
            overrides=overrides,
            run_mode=RunMode.RUN,
            with_log_configuration=False,
        )


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_takes_the_shared_base(command):
    cfg = compose(command, [])
    assert cfg.hydra.callbacks.sweep_summary._target_.endswith("summary.SweepSummary")
    assert cfg.hydra.job_logging.handlers.console["class"].endswith("ConsoleLogHandler")
    assert cfg.hydra.launcher._target_.endswith("BasicLauncher")  # cluster=local
    assert cfg.hydra.job.name == command and cfg.command == command
    assert cfg.seed == 0 and cfg.threads is None
    # A command's own file still wins over the base (approx-error's exact matrices: CPU).
    assert cfg.device == ("cpu" if command == "approx_error" else "auto")
    assert compose(command, ["cluster=slurm"]).hydra.mode == RunMode.MULTIRUN


LRA_SCHEDULES = {  # DESIGN §6: batch, warm-up, steps, length
    "listops": (32, 1000, 5000, 2000),
    "text": (32, 8000, 20000, 4000),
    "retrieval": (32, 800, 30000, 4000),
    "image": (256, 175, 35000, 1024),
    "pathfinder": (256, 312, 62400, 1024),
}


@pytest.mark.parametrize("task", sorted(LRA_SCHEDULES))
def test_lra_recipes_hold_the_papers_schedule(task):
    plan_launch("lra", [f"experiment=lra_{task}"], multirun=False)
    cfg = compose("lra", [f"experiment=lra_{task}", "attention=softmax"])
    trainer = OmegaConf.to_container(cfg.trainer, resolve=True)
    batch, warmup, steps, length = LRA_SCHEDULES[task]
    assert cfg.task.name == task and cfg.task.max_len == length
    assert (trainer["batch_size"], trainer["warmup_steps"], trainer["max_steps"]) == (
        batch,
        warmup,
        steps,
    )
    assert trainer["lr"] == 1e-4 and trainer["decay"] == "linear"
    assert (cfg.model.dim, cfg.model.depth, cfg.model.num_heads, cfg.model.ffn_dim) == (
        64,
        2,
        2,
        128,
    )
    assert cfg.attention.name == "softmax"  # the command line picks the attention


def test_bert_small_recipe_is_the_papers_pretraining_with_conv_33():
    plan_launch("pretrain", ["experiment=bert_small"], multirun=False)
    cfg = compose("pretrain", ["experiment=bert_small"])
    resolved = {k: OmegaConf.to_container(cfg[k], resolve=True) for k in ("model", "attention")}
    resolved["trainer"] = OmegaConf.to_container(cfg.trainer, resolve=True)
    assert {k: resolved["model"][k] for k in ("dim", "depth", "num_heads", "ffn_dim")} == {
        "dim": 512,
        "depth": 4,
        "num_heads": 8,
        "ffn_dim": 2048,
    }
    assert resolved["attention"]["name"] == "nystrom"
    assert resolved["attention"]["conv_kernel_size"] == 33
    assert resolved["attention"]["num_landmarks"] == 64
    trainer = resolved["trainer"]
    assert (trainer["lr"], trainer["warmup_steps"], trainer["batch_size"]) == (1e-4, 10000, 256)
    assert (trainer["max_steps"], trainer["weight_decay"], trainer["decay"]) == (
        100000,
        0.01,
        "linear",
    )
    # The softmax baseline of the same recipe has no conv skip.
    softmax = compose("pretrain", ["experiment=bert_small", "attention=softmax"])
    assert OmegaConf.to_container(softmax.attention, resolve=True)["conv_kernel_size"] == 0


def test_table1_recipe_is_the_papers_grid():
    plan_launch("bench", ["experiment=table1"], multirun=False)
    cfg = compose("bench", ["experiment=table1"])
    assert list(cfg.seq_lens) == [512, 1024, 2048, 4096, 8192]
    assert (cfg.batch_size, cfg.hidden, cfg.num_heads) == (1, 768, 12)
    assert (cfg.scope, cfg.mode, cfg.dtype) == ("module", "forward", "fp32")
    rows = [(r.name, r.get("num_landmarks"), r.get("proj_dim"), r.get("window"))
            for r in cfg.attention_rows]  # fmt: skip
    assert rows == [
        ("softmax_naive", None, None, None),
        ("softmax", None, None, None),
        ("linformer", None, 256, None),
        ("longformer", None, None, 257),
        ("nystrom", 64, None, None),
        ("nystrom", 32, None, None),
    ]


def test_a_recipe_of_another_command_is_one_line(nys_here):
    done = nys_here("lra", "experiment=bert_small")
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout.strip() == (
        "error: experiment=bert_small is a recipe for nys pretrain, not for nys lra; "
        "see nyscli/conf/experiment/"
    )
    assert "Traceback" not in done.stderr


def test_a_user_config_folder_adds_options_beside_the_packaged_ones(tmp_path):
    user = tmp_path / "mine"
    (user / "experiment").mkdir(parents=True)
    (user / "attention").mkdir()
    (user / "attention" / "tiny_nystrom.yaml").write_text("name: nystrom\nnum_landmarks: 4\n")
    (user / "experiment" / "short.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /attention: tiny_nystrom\n"
        "command: bench\nseq_lens: [32, 64]\n"
    )
    plan_launch("bench", ["experiment=short"], multirun=False, config_dir=str(user))
    cfg = compose("bench", ["experiment=short"], str(user))
    assert list(cfg.seq_lens) == [32, 64] and cfg.attention.num_landmarks == 4
    # The packaged options are all still there.
    assert compose("bench", ["attention=softmax"], str(user)).attention.name == "softmax"
    with pytest.raises(UserInputError, match="is not a directory"):
        plan_launch("bench", [], multirun=False, config_dir=str(tmp_path / "nope"))


def test_linformer_projections_are_sized_for_the_commands_longest_input():
    assert compose("lra", ["task=listops", "attention=linformer"]).attention.max_seq_len == 2000
    lra_text = compose("lra", ["task=text", "task.max_len=1000", "attention=linformer"])
    assert lra_text.attention.max_seq_len == 1000
    assert compose("finetune", ["attention=linformer"]).attention.max_seq_len == 128
    assert compose("pretrain", ["attention=linformer"]).attention.max_seq_len == 512
    assert compose("bench", ["attention=linformer"]).attention.max_seq_len == 16384
    chosen = compose("lra", ["attention=linformer", "attention.max_seq_len=300"])
    assert chosen.attention.max_seq_len == 300


def test_a_launch_composes_each_job_once_before_hydra_runs_it(monkeypatch):
    """One composition checks a single run and finds its folder (Hydra composes once more when
    it runs it); a sweep composes its hydra node, then once per distinct set of group choices
    (JobComposer): 2 for seed=1,2 (the base has none), 3 for attention=softmax,nystrom."""
    from hydra._internal.hydra import Hydra

    calls = []
    original = Hydra.compose_config
    monkeypatch.setattr(
        Hydra, "compose_config", lambda self, *a, **kw: calls.append(1) or original(self, *a, **kw)
    )
    plan = plan_launch("bench", ["seq_lens=[64]"], multirun=False)
    assert (len(calls), plan.multirun) == (1, False)
    calls.clear()
    plan = plan_launch("bench", ["seq_lens=[64]", "seed=1,2"], multirun=True)
    assert (len(calls), plan.multirun) == (2, True)
    calls.clear()
    overrides = ["attention_set=none", "attention=softmax,nystrom", "seed=1,2,3"]
    plan = plan_launch("bench", overrides, multirun=True)
    assert (len(calls), len(plan.jobs)) == (3, 6)


@pytest.mark.parametrize(
    ("command", "jobs"),
    [
        ("finetune", [["finetune_task=mrpc", "trainer.lr=2e-5", "seed=3"],
                      ["finetune_task=mrpc", "seed=4"],
                      ["finetune_task=imdb", "task.max_len=1024", "trainer.batch_size=8"]]),
        ("lra", [["task=text", "attention=softmax", "model.dropout=0.2"],
                 ["task=text", "attention=softmax", "trainer.eval_examples=null"],
                 ["task=listops", "attention.num_landmarks=32", "experiment=lra_listops"]]),
        ("approx_error", [["seed=1", "budgets=[8,16]"], ["seed=2", "methods=[nystrom]"],
                          ["attention.landmarks=random", "seq_len=128"]]),
        ("bench", [["attention_set=none", "attention=softmax", "seq_lens=[64]"],
                   ["seq_lens=[64,128]", "threads=1"]]),
    ],
)  # fmt: skip
def test_a_sweeps_jobs_composed_from_a_cached_base_equal_hydras_own_composition(command, jobs):
    """JobComposer (the fast check of a big sweep) gives every job exactly the config
    Hydra composes for it: the same values, choices and task overrides."""
    with composer(command) as composing:
        cached = JobComposer(composing, command)
        for job in jobs:
            fast, full = cached.compose(job), compose_job(composing, command, job)
            assert list(fast.hydra.overrides.task) == list(full.hydra.overrides.task)
            assert fast.hydra.runtime.choices == full.hydra.runtime.choices
            for cfg in (fast, full):
                with open_dict(cfg):
                    del cfg["hydra"]
            assert OmegaConf.to_container(fast, resolve=True) == OmegaConf.to_container(
                full, resolve=True
            )
