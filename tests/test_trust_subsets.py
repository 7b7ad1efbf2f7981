"""Evaluation subsets are seeded, label-stratified samples; trivial results are flagged;
schedules scale with a --steps cap; the tables show the trivial rates and the paper's rows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
from rich.console import Console

from nyscli.data.common import ClassificationCollate, RaggedSequences, SequenceClassificationDataset
from nyscli.data.subsets import ClassBalance, evaluation_subset, subset_indices
from nyscli.experiments.bench import command as bench
from nyscli.experiments.finetune import command as finetune
from nyscli.experiments.lra import command as lra
from nyscli.experiments.pretrain.objectives import frozen_batches
from nyscli.experiments.training import baseline_fields, fit_schedule
from nyscli.train.batches import eval_batches
from nyscli.train.config import TrainerConfig
from tests.helpers import LRA_TINY as TINY
from tests.helpers import run_folders


def sorted_dataset(n_per_class: int, classes: int = 2) -> SequenceClassificationDataset:
    """Label-sorted like the IMDB CSV: every example of class 1 first, then class 0, ..."""
    labels = np.repeat(np.arange(classes)[::-1], n_per_class)
    seqs = RaggedSequences.from_list([np.full(3, i + 1, np.uint16) for i in range(labels.size)])
    return SequenceClassificationDataset(seqs, labels)


def cells(line: str) -> list[str]:
    return [t for t in line.split() if t != "│"]


def render_text(renderable) -> str:
    console = Console(width=250, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


def test_subset_of_label_sorted_data_is_stratified_seeded_and_not_a_prefix():
    labels = np.array([1] * 50 + [0] * 50)
    index = subset_indices(100, 20, labels)
    assert np.bincount(labels[index]).tolist() == [10, 10]
    assert index.tolist() == sorted(index.tolist()) and len(set(index.tolist())) == 20
    assert index.tolist() != list(range(20))
    assert subset_indices(100, 20, labels).tolist() == index.tolist()  # same for every run
    uneven = np.array([2] * 60 + [0] * 30 + [1] * 10)
    assert np.bincount(uneven[subset_indices(100, 10, uneven)]).tolist() == [3, 1, 6]
    assert np.bincount(uneven[subset_indices(100, 7, uneven)]).tolist() == [2, 1, 4]
    assert subset_indices(5, None).tolist() == [0, 1, 2, 3, 4]
    assert subset_indices(5, 9).tolist() == [0, 1, 2, 3, 4]


def test_a_constant_predictor_scores_the_majority_rate_not_100_percent():
    dataset = sorted_dataset(50)
    batches = eval_batches(dataset, 8, ClassificationCollate(3), limit=20)
    labels = torch.cat([b[2] for b in batches])
    constant = (labels == 1).float().mean().item()  # a model that always says "positive"
    assert len(labels) == 20 and constant == 0.5  # first-20 would have given 1.0
    subset = evaluation_subset(dataset, 20)
    balance = ClassBalance.of(subset.labels, num_classes=2)
    assert (balance.majority_rate, balance.chance_rate, balance.classes_present) == (0.5, 0.5, 2)
    assert balance.flag(constant) == "= majority"
    # 20 examples: one more right answer than a constant predictor is luck, not skill
    assert balance.flag(0.55) == "≈ majority" and balance.flag(0.75) == ""
    large = ClassBalance.of(np.arange(5000) % 2, num_classes=2)  # s.e. of 50% on 5,000: 0.71%
    assert large.flag(0.5048) == "≈ majority" and large.flag(0.52) == ""
    prefix = ClassBalance.of(dataset.labels[:20], num_classes=2)
    assert prefix.flag(1.0) == "single class, = majority"


def test_pretraining_validation_sample_is_drawn_not_the_first_pairs():
    pairs = [(torch.tensor([5 + i]), torch.tensor([6 + i])) for i in range(40)]

    def collate(items, generator=None):
        return torch.stack([a for a, _ in items])

    drawn = torch.cat(frozen_batches(pairs, 4, collate, seed=0, limit=8)).flatten().tolist()
    assert drawn == [5 + i for i in subset_indices(40, 8)] and drawn != list(range(5, 13))


def test_warmup_and_eval_interval_scale_with_a_step_cap():
    text = TrainerConfig(
        max_steps=100, batch_size=32, planned_steps=20000, warmup_steps=8000, eval_every=1000
    )
    scaled, note = text.fit_budget()
    assert (scaled.warmup_steps, scaled.eval_every) == (40, 5)
    assert "warmup_steps 8000 -> 40" in note and "eval_every 1000 -> 5" in note
    kept, note = text.fit_budget(fixed={"warmup_steps"})
    assert (kept.warmup_steps, kept.eval_every) == (8000, 5)
    for unchanged in (
        TrainerConfig(max_steps=5000, batch_size=1, planned_steps=5000, warmup_steps=1000),
        TrainerConfig(max_steps=3000, batch_size=1, planned_steps=5000, warmup_steps=1000),
        TrainerConfig(max_steps=10, batch_size=1, warmup_steps=1000),  # no plan known
    ):
        assert unchanged.fit_budget() == (unchanged, None)


def test_lra_with_steps_below_the_warmup_reaches_the_peak_lr(run_nys, tmp_path):
    # The ListOps defaults: 5000 steps, warm-up 1000, eval every 500; --steps 10 keeps the ratios.
    args = [a for a in TINY if not a.startswith(("trainer.eval_every", "trainer.warmup_steps"))]
    args[args.index("--steps") + 1] = "10"
    done = run_nys("lra", *args, f"data_cache={tmp_path / 'cache'}")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "warmup_steps 1000 -> 2, eval_every 500 -> 1" in " ".join(done.stdout.split())
    [run] = run_folders(tmp_path / "outputs" / "lra")
    metrics = pd.read_csv(run / "metrics.csv")
    train = metrics[metrics.split == "train"]
    assert train.lr.iloc[0] == 0.5e-4 and train.lr.max() == 1e-4  # the peak lr is reached
    assert list(metrics[metrics.split == "dev"].step) == list(range(1, 11))
    row = pd.read_csv(run / "results.csv").iloc[0]
    assert (row.warmup_steps, row.eval_every) == (2, 1)
    assert row.chance_rate == 0.1 and 0 < row.majority_rate < 1
    assert "majority %" in done.stdout and "chance %" in done.stdout


def test_tables_show_trivial_rates_flags_and_the_papers_rows():
    rows = []
    for attention, accuracy in (("softmax", 0.5), ("nystrom-64", 0.61)):
        for task in ("text", "listops"):
            rows.append(
                {"task": task, "attention": attention, "test_accuracy": accuracy,
                 "best_dev_accuracy": accuracy, "steps": 4, "max_steps": 4, "wall_s": 6.0,
                 "tokens_per_s": 1e3, "peak_mb": 10.0, "majority_rate": 0.5,
                 "chance_rate": 0.5 if task == "text" else 0.1,
                 "flag": "= majority" if accuracy == 0.5 else None}
            )  # fmt: skip
    text = render_text(lra.render(pd.DataFrame(rows)))
    assert "majority %" in text and "chance %" in text and "= majority" in text
    flagged = [line for line in text.splitlines() if "= majority" in line]
    assert len(flagged) == 2 and all("softmax" in line for line in flagged)

    bench_rows = pd.DataFrame(
        {"attention": ["softmax"] * 2, "seq_len": [512, 1024], "status": ["ok", "ok"],
         "peak_mb": [1.0, 2.0], "time_ms": [1.0, 2.0], "baseline": "softmax", "scope": "module",
         "mode": "forward", "dtype": "fp32", "device": "cpu", "batch_size": 1, "hidden": 768,
         "num_heads": 12}
    )  # fmt: skip
    text = render_text(bench.render(bench_rows))
    assert "Nyströmformer-64 (paper, 1080Ti)" in text  # the paper's GPU, not this device
    lines = [cells(line) for line in text.splitlines() if "Transformer (paper, 1080Ti)" in line]
    assert [row[3:] for row in lines] == [["54", "186"], ["0.8", "2.4"]]  # memory, time

    tuned = pd.DataFrame(
        [{"task": "sst2", "init": "scratch", "attention": "softmax", "max_len": 128,
          "dev_accuracy": 0.509, "dev_f1": float("nan"), "dev_mm_accuracy": float("nan"),
          "test_accuracy": float("nan"), "steps": 4, "max_steps": 4, "epochs": 0.1,
          "batch_size": 8, "lr": 3e-5, "wall_s": 6.0, "tokens_per_s": 1e3, "peak_mb": 1.0,
          "majority_rate": 0.509, "chance_rate": 0.5, "flag": "= majority"}]
    )  # fmt: skip
    text = render_text(finetune.render(tuned))
    assert "majority %" in text and "50.90" in text and "= majority" in text


def test_results_row_flags_a_majority_result_and_a_single_class_dev_set(caplog):
    test = ClassBalance.of(np.array([0, 0, 0, 1]), num_classes=2)
    dev = ClassBalance.of(np.array([1, 1]), num_classes=2)
    assert baseline_fields(test, 0.5, "test") == {
        "majority_rate": 0.75, "chance_rate": 0.5, "flag": "< majority"
    }  # fmt: skip
    with caplog.at_level("WARNING"):
        fields = baseline_fields(test, 0.75, "test", dev)
    assert fields["flag"] == "= majority, dev single class"
    assert "test accuracy 75.00% is flagged: = majority, dev single class" in caplog.text


def test_schedule_values_given_on_the_command_line_are_kept(tmp_path):
    (tmp_path / ".hydra").mkdir()
    (tmp_path / ".hydra" / "overrides.yaml").write_text("- trainer.warmup_steps=300\n- seed=1\n")
    text = TrainerConfig(
        max_steps=100, batch_size=32, planned_steps=20000, warmup_steps=300, eval_every=1000
    )
    kept = fit_schedule(text, tmp_path)
    assert (kept.warmup_steps, kept.eval_every) == (300, 5)
