"""The shared trainer on a tiny synthetic task: resume is exact, NaN stops, bad checkpoints."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from nyscli.data.common import ClassificationCollate
from nyscli.experiments.lra.tasks import classification_objective
from nyscli.train import splits
from nyscli.train.batches import ShuffledBatches
from nyscli.train.checkpoint import LAST, load_checkpoint
from nyscli.train.errors import CheckpointError, TrainingDiverged
from nyscli.train.metrics import MetricsLog
from nyscli.train.schedule import warmup_decay_factor
from tests.helpers import make_trainer, toy_dataset


def metrics(run_dir: Path) -> pd.DataFrame:
    return pd.read_csv(run_dir / "metrics.csv")[["step", "split", "loss", "accuracy", "lr"]]


def test_resumed_run_matches_an_uninterrupted_one(tmp_path):
    straight, train, dev = make_trainer(tmp_path / "straight")
    result = straight.fit(train, dev)
    assert result.completed and result.step == 8
    straight_test = straight.test(dev)

    first, train, dev = make_trainer(tmp_path / "first", stop_at_step=4)
    half = first.fit(train, dev)
    assert not half.completed and half.step == 4
    second, train, dev = make_trainer(tmp_path / "second")
    resumed = second.fit(train, dev, resume_from=tmp_path / "first" / "checkpoints" / LAST)
    assert resumed.completed and resumed.best_step == result.best_step
    resumed_test = second.test(dev)

    a, b = metrics(tmp_path / "straight"), metrics(tmp_path / "second")
    assert len(a) == len(b) == 7  # 4 train rows, 2 dev rows, 1 test row
    pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=0, atol=1e-6)
    assert straight_test == pytest.approx(resumed_test, abs=1e-6)


def test_a_time_limit_stops_at_a_saved_step_and_the_resume_matches_a_straight_run(tmp_path):
    straight, train, dev = make_trainer(tmp_path / "straight")
    straight.fit(train, dev)
    # A limit already spent when the first update ends: one update, then a save.
    first, train, dev = make_trainer(tmp_path / "first", stop_after_minutes=1e-9)
    cut = first.fit(train, dev)
    assert not cut.completed and cut.step == 1
    assert load_checkpoint(tmp_path / "first" / "checkpoints" / LAST)["step"] == 1
    second, train, dev = make_trainer(tmp_path / "second", stop_after_minutes=60.0)
    done = second.fit(train, dev, resume_from=tmp_path / "first" / "checkpoints" / LAST)
    assert done.completed and done.step == 8
    a, b = metrics(tmp_path / "straight"), metrics(tmp_path / "second")
    pd.testing.assert_frame_equal(a, b, check_exact=False, rtol=0, atol=1e-6)


def test_compile_sends_only_training_steps_through_torch_compile(tmp_path, monkeypatch):
    # A real compile takes minutes on this model (it recompiles for each padded length): the
    # wiring is what is tested here, with a compile that records the module and its calls.
    compiled, calls = [], []

    def record(module):
        compiled.append(module)
        return lambda *args: calls.append(args) or module(*args)

    monkeypatch.setattr(torch, "compile", record)
    trainer, train, dev = make_trainer(tmp_path / "compiled", compile=True)
    trainer.fit(train, dev)
    assert compiled == [trainer.parallel] and len(calls) == 8  # 8 updates, no evaluation
    plain, train, dev = make_trainer(tmp_path / "plain")
    plain.fit(train, dev)
    pd.testing.assert_frame_equal(metrics(tmp_path / "compiled"), metrics(tmp_path / "plain"))
    saved = load_checkpoint(tmp_path / "compiled" / "checkpoints" / LAST)["model"]
    assert list(saved) == list(plain.model.state_dict())  # no "_orig_mod." prefixes


def test_nan_loss_stops_with_a_message_and_keeps_the_last_good_checkpoint(tmp_path):
    trainer, train, dev = make_trainer(tmp_path, eval_every=2)
    calls = {"n": 0}

    def poisoned(model, batch):
        result = classification_objective(model, batch)
        if model.training:
            calls["n"] += 1
            if calls["n"] == 5:  # the 5th update: after the checkpoint of step 4
                result.loss = result.loss * float("nan")
        return result

    trainer.objective = poisoned
    with pytest.raises(TrainingDiverged, match=r"loss became nan at step 5 .*step 4\)"):
        trainer.fit(train, dev)
    state = load_checkpoint(tmp_path / "checkpoints" / LAST)
    assert state["step"] == 4
    assert all(torch.isfinite(p).all() for p in state["model"].values())


def test_huge_learning_rate_diverges_cleanly(tmp_path):
    trainer, train, dev = make_trainer(tmp_path, lr=1e30, warmup_steps=0, clip_grad_norm=None)
    with pytest.raises(TrainingDiverged, match="became"):
        trainer.fit(train, dev)


def test_corrupt_checkpoint_is_a_one_line_error(tmp_path):
    trainer, train, dev = make_trainer(tmp_path / "a", max_steps=2, eval_every=2)
    trainer.fit(train, dev)
    last = tmp_path / "a" / "checkpoints" / LAST
    last.write_bytes(last.read_bytes()[:100])  # truncated, as after a crash mid-copy
    with pytest.raises(CheckpointError, match="corrupt or unreadable") as info:
        load_checkpoint(last)
    assert "\n" not in str(info.value)
    other, train, dev = make_trainer(tmp_path / "b")
    with pytest.raises(CheckpointError):
        other.fit(train, dev, resume_from=last)


def test_schedule_warms_up_then_decays_linearly_to_zero():
    factors = [warmup_decay_factor(s, 2, 6, "linear", 0.0) for s in range(7)]
    assert factors == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0])


def test_batches_resume_mid_epoch_with_the_same_order():
    data = toy_dataset(10, seed=3)
    loader = ShuffledBatches(data, 3, ClassificationCollate(12), seed=5)
    it = iter(loader)
    seen = [next(it)[2].tolist() for _ in range(4)]  # crosses an epoch (3 batches each)
    state = loader.state_dict()
    rest = [next(it)[2].tolist() for _ in range(3)]
    again = ShuffledBatches(data, 3, ClassificationCollate(12), seed=5)
    again.load_state_dict(state)
    it2 = iter(again)
    assert [next(it2)[2].tolist() for _ in range(3)] == rest
    assert len(seen) == 4


def test_bf16_autocast_and_accumulation_train_on_cpu(tmp_path):
    trainer, train, dev = make_trainer(
        tmp_path, precision="bf16", accumulate=2, max_steps=2, eval_every=2
    )
    result = trainer.fit(train, dev)
    assert result.completed and train.position == 4  # 2 updates x 2 micro-batches
    assert pd.read_csv(tmp_path / "metrics.csv").loss.notna().all()


def test_the_dev_split_is_dev_and_runs_written_as_val_read_and_resume_the_same(tmp_path):
    """The trainer's periodic held-out rows are ``dev`` (they were ``val``); a metrics.csv
    written before reads with today's names, its final-model rows kept apart, and a resumed
    run copies its rows under today's names."""
    trainer, train, dev = make_trainer(tmp_path / "new")
    trainer.fit(train, dev)
    written = pd.read_csv(tmp_path / "new" / "metrics.csv")
    assert sorted(set(written.split)) == sorted({splits.TRAIN, splits.DEV}) == ["dev", "train"]
    old = tmp_path / "old.csv"
    pd.DataFrame({"step": [2, 4, 4, 4], "split": ["train", "val", "dev", "test"],
                  "loss": [1.0, 0.9, 0.8, 0.7]}).to_csv(old, index=False)  # fmt: skip
    read = splits.read_metrics(old)
    assert list(read.split) == ["train", "dev", "dev (final)", "test"]
    copied = MetricsLog(tmp_path / "resumed.csv", ())
    copied.start(keep_until=4, source=old)
    assert list(pd.read_csv(tmp_path / "resumed.csv").split) == list(read.split)


def test_the_optimizer_is_fused_adamw_and_one_step_is_the_formula():
    """build_optimizer takes torch's fused AdamW kernel on CPU; its update is AdamW's formula
    (decoupled decay on matrices only) in float64."""
    from nyscli.train.optim import build_optimizer

    torch.manual_seed(0)
    model = torch.nn.Linear(5, 3).double()
    start = {name: p.detach().clone() for name, p in model.named_parameters()}
    grads = {name: torch.randn_like(p) for name, p in model.named_parameters()}
    lr, decay, (b1, b2), eps = 1e-2, 0.1, (0.9, 0.99), 1e-8
    optimizer = build_optimizer(model, lr, decay, (b1, b2), eps)
    assert all(group["fused"] for group in optimizer.param_groups)
    for step in (1, 2):
        for name, p in model.named_parameters():
            p.grad = grads[name] * step
        optimizer.step()
    for name, p in model.named_parameters():
        wd = decay if p.ndim >= 2 else 0.0
        expected, m, v = start[name].clone(), 0.0, 0.0
        for step in (1, 2):
            g = grads[name] * step
            m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
            expected = expected * (1 - lr * wd)
            m_hat, v_hat = m / (1 - b1**step), v / (1 - b2**step)
            expected = expected - lr * m_hat / (v_hat.sqrt() + eps)
        torch.testing.assert_close(p.detach(), expected, rtol=0, atol=1e-12)


def test_bucketed_batches_mix_at_random_and_pad_less():
    """trainer.bucket=8 (fine-tuning's default): every example once an epoch, batches from
    sorted windows in random order; on skewed lengths far less padding than random batches."""
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, 128, 4096) ** 2 // 128 + 3  # many short, a few long (as GLUE)
    data = list(range(lengths.size))

    def padding(bucket: int) -> tuple[float, list]:
        batches = ShuffledBatches(data, 32, lambda x: x, 0, lengths, bucket).epoch_batches(0)
        padded = sum(lengths[b].max() * b.size for b in batches)
        return padded / sum(lengths[b].sum() for b in batches), batches

    plain, plain_batches = padding(1)
    bucketed, batches = padding(8)
    assert sorted(np.concatenate(batches).tolist()) == data
    assert plain > 2.0 and bucketed < 1.3  # measured: 2.65 and 1.17
    starts = [lengths[b].min() for b in batches[:16]]
    assert starts != sorted(starts)  # the windows' batches are shuffled, not shortest first
