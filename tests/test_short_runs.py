"""Short runs (a --steps cap below the planned budget) spend their time training: evaluation
subsets, the log interval, checkpoints and generated data are sized to the run; evaluation
has its own progress bar; tokens/s leaves out the warm-up updates; sweeps over several
attentions give each option to the attentions that have it."""

from __future__ import annotations

import io
import time

import pandas as pd
import torch
from rich.console import Console

from nyscli.launch.plan import plan_launch
from nyscli.launch.sweepers.grid import per_attention
from nyscli.train.checkpoint import BEST, CHECKPOINT_DIR, LAST, load_checkpoint
from nyscli.train.config import TrainerConfig
from nyscli.train.loop import throughput_warmup
from tests.helpers import LRA_TINY, make_trainer, run_folders


def test_a_short_run_scales_log_interval_dev_subset_and_checkpoints():
    # ListOps' plan: 5000 steps, warm-up 1000, eval every 500 on all 2000 dev examples, a
    # train row every 50 steps; --steps 30 used to log no train row and evaluate 20,000
    # dev examples against 960 trained.
    listops = TrainerConfig(
        max_steps=30, batch_size=32, planned_steps=5000, warmup_steps=1000, eval_every=500
    )
    short, note = listops.fit_budget()
    assert (short.warmup_steps, short.eval_every, short.log_every) == (6, 3, 1)
    assert short.eval_examples == 3 * 32  # what the run trains between two evaluations
    assert short.checkpoint_every == 500  # saves keep their planned cadence: at the end
    assert short.capped and short.run_examples == 960
    assert short.held_out_size(None) == 960 and short.held_out_size(100) == 100
    assert "log_every 50 -> 1" in note and "eval_examples all -> 96" in note
    assert "trainer.planned_steps=null for none" in note
    # Accumulation and ranks count: an update sees batch x accumulate x ranks examples.
    wide = TrainerConfig(
        max_steps=30, batch_size=8, accumulate=2, nproc_per_node=2, planned_steps=5000,
        eval_every=500, eval_examples=1000,
    )  # fmt: skip
    assert wide.fit_budget()[0].eval_examples == 3 * 32
    # What the user set is kept; a full run and a run without a plan are unchanged.
    kept, _ = listops.fit_budget(fixed={"eval_examples", "log_every", "checkpoint_every"})
    assert (kept.eval_examples, kept.log_every, kept.checkpoint_every) == (None, 50, None)
    full = TrainerConfig(max_steps=5000, batch_size=32, planned_steps=5000, eval_every=500)
    assert full.fit_budget() == (full, None) and not full.capped
    assert full.held_out_size(None) is None


def test_short_lra_run_generates_trains_logs_and_tests_at_its_own_size(run_nys, tmp_path):
    # The ListOps task file's plan (5000 steps, 96,000/2,000/2,000 examples) and only the
    # tiny model and lengths of LRA_TINY: --steps 4 at batch 8 draws 32 training examples.
    keep = ("data.generate.min_len", "data.generate.max_len", "task.max_len", "attention.",
            "model.", "threads", "--steps", "4", "--batch-size", "8")  # fmt: skip
    args = [a for a in LRA_TINY if a.startswith(keep)]
    done = run_nys("lra", *args, f"data_cache={tmp_path / 'cache'}")
    assert done.returncode == 0, done.stdout + done.stderr
    text = " ".join(done.stdout.split())
    assert "generated 32 of 96000 train / 32 of 2000 val / 32 of 2000 test" in text
    [run] = run_folders(tmp_path / "outputs" / "lra")
    metrics = pd.read_csv(run / "metrics.csv")
    assert list(metrics[metrics.split == "train"].step) == [1, 2, 3, 4]  # log_every 50 -> 1
    row = pd.read_csv(run / "results.csv").iloc[0]
    assert row.test_examples == 32 and row.steps == 4
    [cached] = (tmp_path / "cache").rglob("basic_train-*.tsv")
    assert cached.name == "basic_train-32.tsv"


def test_best_weights_wait_in_memory_until_the_next_checkpoint(tmp_path):
    # Evaluations every step, checkpoints every 4: best.pt is written with last.pt, never
    # newer than it, and holds the weights of the best evaluation, not of the save.
    trainer, train, dev = make_trainer(tmp_path, eval_every=1, checkpoint_every=4, max_steps=8)
    seen: dict[int, dict[str, torch.Tensor]] = {}
    evaluate = trainer.evaluate

    def remember(batches, name="evaluate"):
        seen[trainer.step] = {k: v.clone() for k, v in trainer.model.state_dict().items()}
        return evaluate(batches, name)

    trainer.evaluate = remember
    saves: list[tuple[int, bool]] = []
    save_last = trainer._save_last

    def record():
        saves.append((trainer.step, (tmp_path / CHECKPOINT_DIR / BEST).exists()))
        save_last()

    trainer._save_last = record
    fit = trainer.fit(train, dev)
    assert [s for s, _ in saves] == [4, 8]  # not after every evaluation
    best = load_checkpoint(tmp_path / CHECKPOINT_DIR / BEST)
    assert (
        best["step"] == fit.best_step <= load_checkpoint(tmp_path / CHECKPOINT_DIR / LAST)["step"]
    )
    for key, value in best["model"].items():
        assert torch.equal(value, seen[fit.best_step][key])


def test_tokens_per_s_leaves_out_the_warmup_updates(tmp_path):
    trainer, train, dev = make_trainer(tmp_path, max_steps=20, eval_every=20)
    objective = trainer.objective
    calls = []

    def slow_start(model, batch):
        calls.append(1)
        if len(calls) == 1:
            time.sleep(0.5)  # the first update pays for a warm-up
        return objective(model, batch)

    trainer.objective = slow_start
    fit = trainer.fit(train, dev)
    assert throughput_warmup(20) == 2
    assert fit.train_seconds - fit.steady_seconds >= 0.5  # the slow update is left out
    assert fit.steady_tokens < fit.train_tokens
    assert fit.tokens_per_s == fit.steady_tokens / fit.steady_seconds
    assert fit.tokens_per_s > fit.train_tokens / fit.train_seconds


def test_evaluation_has_its_own_progress_bar(tmp_path):
    trainer, train, dev = make_trainer(tmp_path, progress=True)
    out = io.StringIO()
    trainer.console = Console(file=out, force_terminal=True, width=120)
    seen: list[tuple[bool, list[str]]] = []
    objective = trainer.objective

    def watch(model, batch):
        if trainer._live is not None:
            seen.append((model.training, [t.description for t in trainer._live.tasks]))
        return objective(model, batch)

    trainer.objective = watch
    trainer.fit(train, dev)
    # While dev is evaluated its bar sits below training's; it is gone once that is done.
    assert {training for training, _ in seen} == {True, False}
    for training, bars in seen:
        assert bars == (["train"] if training else ["train", "dev"])
    trainer.test(dev)  # after fit: a bar of its own
    assert "test" in out.getvalue()


def test_sweep_options_go_to_the_attentions_that_have_them(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = plan_launch(
        "bench",
        ["attention_set=none", "attention=nystrom,softmax", "attention.num_landmarks=32,64"],
        True,
    )
    assert [list(j)[-2:] for j in plan.jobs] == [
        ["attention=nystrom", "attention.num_landmarks=32"],
        ["attention=nystrom", "attention.num_landmarks=64"],
        ["attention_set=none", "attention=softmax"],
    ]
    assert (
        "attention.num_landmarks not for softmax" in plan.note
        and "3 jobs instead of 4" in plan.note
    )
    # Unit level: an option no attention of the sweep has is left for the usual refusal.
    keys = {"a": {"kind", "x"}, "b": {"kind"}}
    jobs = [["attention=a", "attention.y=1"], ["attention=b", "attention.y=1"]]
    assert per_attention(jobs, lambda job: keys[job[0][-1]]).jobs == jobs


def test_cfg_with_multirun_prints_every_job_and_a_typo_names_the_option(nys_here):
    done = nys_here("bench", "-m", "attention=nystrom,softmax", "attention.num_landmarks=32,64",
                   "--cfg", "job")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("# job ") == 3 and "Traceback" not in done.stderr
    assert "num_landmarks: 64" in done.stdout
    typo = nys_here("bench", "attention=softmax", "attention.num_landmarks=32")
    assert typo.returncode == 2
    assert typo.stdout.strip().splitlines() == [
        "error: attention.num_landmarks is not an option of the chosen attention (of none in "
        "a sweep); --cfg job shows the options it has"
    ]
