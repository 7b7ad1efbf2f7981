"""``nys finetune``: position extension, classifier, metrics, schedule, IMDB splits, the CLI end
to end on tiny fixtures (from a checkpoint written by save_pretrained), errors, Table 2."""

from __future__ import annotations

import gzip
from pathlib import Path

import hydra
import numpy as np
import pandas as pd
import pytest
import torch
from omegaconf import OmegaConf
from rich.console import Console

from nyscli.checkpoints.pretrained import load_pretrained, save_pretrained
from nyscli.data.pairs import EncodedExamples
from nyscli.errors import UserInputError
from nyscli.experiments.finetune import command as finetune
from nyscli.experiments.finetune.command import render, schedule, validate
from nyscli.experiments.finetune.model import scratch_tokenizer, starting_point
from nyscli.experiments.finetune.tasks import ClassificationObjective, load_examples, seeded_subset
from nyscli.models.bert import BertConfig, BertEncoder
from nyscli.models.bert_classifier import BertClassifier, extend_positions, tiled_rows
from nyscli.paths import CONF_DIR
from nyscli.tokenizers.tokenizer import WordPieceTokenizer
from nyscli.train.checkpoint import load_best
from tests.helpers import make_trainer

WORDS = [
    "good",
    "bad",
    "great",
    "awful",
    "film",
    "movie",
    "plot",
    "actor",
    "fine",
    "dull",
    "fun",
    "boring",
]


def tiny_encoder(vocab_size: int, max_len: int = 32) -> BertEncoder:
    config = BertConfig.create(vocab_size=vocab_size, max_len=max_len, dim=16, depth=1, num_heads=2,
                        ffn_dim=32, attention={"name": "nystrom", "num_landmarks": 4})  # fmt: skip
    return BertEncoder(config)


def test_extend_positions_keeps_learned_rows_and_copies_them() -> None:
    torch.manual_seed(0)
    encoder = tiny_encoder(50, max_len=8)
    old = encoder.encoder.embeddings.positions.weight.detach().clone()  # (8, 16)
    extend_positions(encoder, 20)
    new = encoder.encoder.embeddings.positions.weight.detach()
    assert new.shape == (20, 16)
    assert torch.equal(new[:8], old)  # the learned rows are unchanged
    assert torch.equal(new[8:16], old) and torch.equal(new[16:20], old[:4])  # copies in order
    assert encoder.config.max_len == 20 and encoder.encoder.config.max_len == 20
    assert encoder.encoder.embeddings.positions.weight.requires_grad
    ids = torch.randint(5, 50, (2, 20))
    assert encoder(ids, torch.ones(2, 20, dtype=torch.bool)).shape == (2, 20, 16)
    extend_positions(encoder, 10)  # shorter than the table: nothing changes
    assert encoder.encoder.embeddings.positions.num_embeddings == 20
    assert tiled_rows(torch.arange(3.0)[:, None], 7).flatten().tolist() == [0, 1, 2, 0, 1, 2, 0]


def test_classifier_pools_the_cls_position_through_tanh() -> None:
    torch.manual_seed(0)
    model = BertClassifier(tiny_encoder(50), num_classes=3).eval()
    ids = torch.randint(5, 50, (2, 7))
    mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])
    segments = torch.tensor([[0, 0, 0, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0, 0]])
    hidden = model.bert(ids, mask, segments)
    expected = model.classifier(torch.tanh(model.pooler(hidden[:, 0])))
    torch.testing.assert_close(model(ids, mask, segments), expected)
    # Segment ids reach the encoder: changing them changes the logits.
    assert not torch.allclose(model(ids, mask, torch.zeros_like(segments)), expected)


class FixedLogits(torch.nn.Module):
    def __init__(self, logits: torch.Tensor) -> None:
        super().__init__()
        self.logits = logits

    def forward(self, ids, mask, segments):  # noqa: ANN001 - test double
        return self.logits


def test_objective_counts_give_exact_accuracy_and_f1() -> None:
    predicted = torch.tensor([1, 1, 0, 0, 1, 0])
    labels = torch.tensor([1, 0, 0, 1, 1, 1])  # TP 2, FP 1, FN 2, TN 1
    logits = torch.nn.functional.one_hot(predicted, 2).float() * 3
    mask = torch.tensor([[True, True, False]] * 6)
    batch = (torch.zeros(6, 3, dtype=torch.long), mask, torch.zeros(6, 3, dtype=torch.long), labels)
    result = ClassificationObjective(f1=True)(FixedLogits(logits), batch)
    num, den = result.counts["f1"]
    assert num / den == pytest.approx(2 * 2 / (2 * 2 + 1 + 2))  # F1 = 2TP / (2TP + FP + FN)
    assert result.counts["accuracy"] == (3.0, 6.0) and result.tokens == 12 and result.size == 6
    expected_loss = torch.nn.functional.cross_entropy(logits, labels)
    torch.testing.assert_close(result.loss, expected_loss)
    assert "f1" not in ClassificationObjective()(FixedLogits(logits), batch).counts


def test_schedule_from_epochs_with_cap_and_warmup() -> None:
    cfg = OmegaConf.create(
        {"epochs": 4, "warmup_ratio": 0.1, "trainer": {"max_steps": None, "warmup_steps": 7}}
    )
    assert schedule(cfg, 3668, 32) == (4 * 114, round(0.1 * 456))  # MRPC: 114 full batches/epoch
    cfg.trainer.max_steps = 100
    assert schedule(cfg, 3668, 32) == (100, 10)
    cfg.warmup_ratio = None
    assert schedule(cfg, 3668, 32) == (100, 7)
    cfg.epochs, cfg.trainer.max_steps = 0.5, None
    assert schedule(cfg, 10, 32) == (1, 0)  # fewer examples than a batch: one batch per epoch


def test_imdb_csv_split_dev_holdout_and_seeded_test_draw(tmp_path: Path) -> None:
    rows = ["review,sentiment,split"]
    for split in ("train", "test"):
        for sentiment in ("positive", "negative"):  # as the real file: all positives first
            rows += [f'"A {sentiment} review<br />no {i}",{sentiment},{split}' for i in range(10)]
    path = tmp_path / "imdb.csv.gz"
    path.write_bytes(gzip.compress(("\n".join(rows) + "\n").encode()))
    task = OmegaConf.create({"name": "imdb", "dev_examples": 4})
    splits = load_examples(task, str(path), seed=0)
    assert [len(splits[s]) for s in ("train", "dev", "test")] == [16, 4, 20]
    assert splits["train"].text_a[0] == "A positive review no 0"  # <br /> tags become spaces
    held_out = set(splits["dev"].text_a)
    assert held_out.isdisjoint(splits["train"].text_a)
    assert splits["test"].labels.tolist() == [1] * 10 + [0] * 10
    drawn = seeded_subset(splits["test"], 6)
    assert sorted(drawn.labels.tolist()) == [0, 0, 0, 1, 1, 1]  # stratified, not the first six
    assert drawn.text_a == seeded_subset(splits["test"], 6).text_a
    assert seeded_subset(splits["test"], None) is splits["test"]


def test_scratch_model_from_the_groups_and_a_vocab_file(tmp_path: Path) -> None:
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "##s"]))
    tokenizer = scratch_tokenizer(str(vocab))
    assert tokenizer.encode("Goods") == [5, 6] and tokenizer.cls_id == 2
    with pytest.raises(ValueError, match="scratch.tokenizer=nope is not allowed"):
        scratch_tokenizer("nope")
    overrides = [f"scratch.tokenizer={vocab}", "finetune_task=imdb", "task.max_len=600",
                 "model.dim=16", "model.ffn_dim=32", "model.depth=1",
                 "attention=softmax"]  # fmt: skip
    with hydra.initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        start = starting_point(hydra.compose("finetune", overrides=overrides))
    config = start.encoder.config
    assert (config.vocab_size, config.dim, config.ffn_dim, config.depth) == (7, 16, 32, 1)
    assert config.max_len == 600 and config.attention["name"] == "softmax"  # table >= task
    assert start.source == "scratch" and start.extended_from is None


# ------------------------------------------------------------------ CLI end to end


def sentences(n: int, seed: int) -> list[tuple[str, str, int]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        a = " ".join(rng.choice(WORDS, 5))
        b = " ".join(rng.choice(WORDS, 4))
        out.append((a, b, int(rng.integers(2))))
    return out


@pytest.fixture
def fixtures(tmp_path: Path) -> dict[str, Path]:
    """GLUE MRPC/MNLI folders, an IMDB CSV and a tiny pretrained checkpoint."""
    mrpc = tmp_path / "MRPC"
    mrpc.mkdir()
    for split, n in (("train", 24), ("dev", 10)):
        lines = ["\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String"]
        lines += [f'{y}\t1\t2\t{a} "quoted"\t{b}' for a, b, y in sentences(n, len(split))]
        (mrpc / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    mnli = tmp_path / "MNLI"
    mnli.mkdir()
    labels = ("entailment", "neutral", "contradiction")
    for split, n in (("train", 24), ("dev_matched", 6), ("dev_mismatched", 5)):
        lines = ["index\tgenre\tsentence1\tsentence2\tgold_label"]
        lines += [
            f"{i}\tx\t{a}\t{b}\t{labels[i % 3]}" for i, (a, b, _) in enumerate(sentences(n, 3))
        ]
        (mnli / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    imdb = tmp_path / "imdb.csv"
    rows = ["review,sentiment,split"]
    rows += [f"{a} {b},{('negative', 'positive')[y]},train" for a, b, y in sentences(30, 5)]
    rows += [f"{a} {b},{('negative', 'positive')[y]},test" for a, b, y in sentences(12, 6)]
    imdb.write_text("\n".join(rows) + "\n")
    tokenizer = WordPieceTokenizer.train([" ".join(WORDS)] * 3 + ['quoted " .'], 60, 1)
    checkpoint = tmp_path / "pre" / "pretrained"
    torch.manual_seed(0)
    save_pretrained(checkpoint, tiny_encoder(tokenizer.vocab_size, max_len=32), tokenizer)
    return {"mrpc": mrpc, "mnli": mnli, "imdb": imdb, "checkpoint": checkpoint}


SMALL = ["threads=1", "trainer.log_every=1", "trainer.eval_every=2", "trainer.progress=false"]


def results(root: Path) -> pd.DataFrame:
    files = sorted(root.rglob("results.csv"))
    return pd.concat([pd.read_csv(f) for f in files], ignore_index=True)


def test_mrpc_grid_from_a_checkpoint_is_one_multirun_with_table_2(run_nys, tmp_path, fixtures):
    done = run_nys("finetune", "-m", "task=mrpc", f"init={fixtures['checkpoint'].parent}",
                   f"data.path={fixtures['mrpc']}", "trainer.batch_size=4,8", "trainer.lr=1e-4",
                   "epochs=1", *SMALL)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    [summary] = (tmp_path / "outputs" / "finetune" / "multirun").rglob("summary.csv")
    df = pd.read_csv(summary)
    assert sorted(df.batch_size) == [4, 8] and (df.task == "mrpc").all()
    assert sorted(df.steps) == [3, 6]  # one epoch of 24 examples
    assert (df.init == "pre/pretrained").all() and (df.attention == "nystrom-4").all()
    assert df.dev_accuracy.between(0, 1).all() and df.dev_f1.between(0, 1).all()
    assert (df.dev_examples == 10).all() and (df.tokens_per_s > 0).all()
    assert "Table 2 layout" in done.stdout
    job = next(p for p in summary.parent.iterdir() if (p / "results.csv").exists())
    metrics = pd.read_csv(job / "metrics.csv")
    final = metrics[metrics.split == "dev (best)"].iloc[-1]  # the reported model's
    row = pd.read_csv(job / "results.csv").iloc[0]
    assert final.accuracy == pytest.approx(row.dev_accuracy) and final.f1 == pytest.approx(
        row.dev_f1
    )
    assert (job / "learning_curve.png").exists() and (job / "finetune.log").exists()


def test_imdb_beyond_the_checkpoint_length(run_nys, tmp_path, fixtures):
    done = run_nys("finetune", "--task", "imdb", "--init", str(fixtures["checkpoint"]),
                   f"data.path={fixtures['imdb']}", "--max-len", "48", "task.dev_examples=6",
                   "task.test_examples=8", "--steps", "4", "--batch-size", "4", *SMALL)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "positions 32..47 copied from 0..31" in done.stdout
    row = results(tmp_path / "outputs").iloc[0]
    assert row.task == "imdb" and row.max_len == 48 and row.positions_extended_from == 32
    assert row.steps == 4 and row.test_examples == 8 and row.dev_examples == 6
    assert 0 <= row.test_accuracy <= 1 and row.train_examples == 24
    # eval_only of that run, same attention and test subset: the same reviews, the same score
    (run_dir,) = (tmp_path / "outputs" / "finetune").iterdir()
    again = run_nys("finetune", f"eval_only={run_dir}", "task=imdb", "task.test_examples=8",
                    f"data.path={fixtures['imdb']}", "threads=1")  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    evaluated = results(tmp_path / "outputs").query("mode == 'eval_only'").iloc[0]
    assert evaluated.examples == 8 and evaluated.accuracy == pytest.approx(row.test_accuracy)


def test_mnli_from_scratch_like_a_checkpoint(run_nys, tmp_path, fixtures):
    like = f"scratch.like={fixtures['checkpoint']}"
    done = run_nys("finetune", "task=mnli", "init=scratch", like, f"data.path={fixtures['mnli']}",
                   "--steps", "2", "--batch-size", "8", *SMALL)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    row = results(tmp_path / "outputs").query("task == 'mnli'").iloc[0]
    assert row.init == "scratch" and row.attention == "nystrom-4"
    assert 0 <= row.dev_accuracy <= 1 and 0 <= row.dev_mm_accuracy <= 1
    assert np.isnan(row.dev_f1) and row.dev_examples == 6


def test_bad_paths_fail_in_one_line(nys_here, tmp_path, fixtures):
    missing = nys_here("finetune", "task=mrpc", f"init={fixtures['checkpoint']}",
                      f"data.path={tmp_path / 'nowhere'}", "threads=1")  # fmt: skip
    assert missing.returncode == 2, missing.stdout + missing.stderr
    assert "task=mrpc: data.path=" in missing.stdout and "nowhere is not a folder" in missing.stdout
    bad_init = nys_here("finetune", f"init={tmp_path}", "threads=1")
    assert bad_init.returncode == 2
    assert f"init={tmp_path} is not a pretrained checkpoint" in bad_init.stdout
    for done in (missing, bad_init):
        assert "Traceback" not in done.stdout + done.stderr
        assert len([line for line in done.stdout.splitlines() if "error" in line]) == 1


def test_a_bad_data_path_is_refused_alone_before_the_model_is_loaded(nys_here, tmp_path, fixtures):
    """The refusal is the only line: no ``init=`` line about a model that never trains."""
    done = nys_here("finetune", "task=mrpc", f"init={fixtures['checkpoint']}",
                    f"data.path={tmp_path / 'nowhere'}", "threads=1")  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: task=mrpc: data.path="), lines


def test_corrupt_checkpoint_fails_in_one_line(nys_here, fixtures):
    (fixtures["checkpoint"] / "model.pt").write_bytes(b"not torch")
    corrupt = nys_here("finetune", "task=mrpc", f"init={fixtures['checkpoint']}",
                      f"data.path={fixtures['mrpc']}", "threads=1")  # fmt: skip
    assert corrupt.returncode == 2 and "model.pt is corrupt" in corrupt.stdout
    assert "Traceback" not in corrupt.stdout + corrupt.stderr


def test_task_option_selects_the_finetune_task_group(nys_here):
    done = nys_here("finetune", "--cfg", "job", "task=mnli")
    assert done.returncode == 0, done.stderr
    cfg = OmegaConf.create(done.stdout)
    assert cfg.task.name == "mnli" and cfg.command == "finetune" and cfg.epochs == 4
    assert cfg.trainer.lr == 3e-5 and cfg.trainer.batch_size == 32
    assert cfg.trainer.bucket == 8  # conf/trainer/finetune.yaml: length-bucketed batches


def test_evaluation_batches_are_the_seeded_subset_shortest_first() -> None:
    """by_length(d, k): the very examples evaluation_subset draws (stratified, seeded), in
    order of length, labels carried along; k None or >= n: all of them."""
    from nyscli.data.common import RaggedSequences
    from nyscli.data.subsets import evaluation_subset
    from nyscli.experiments.finetune.evaluate import by_length

    rng = np.random.default_rng(1)
    lengths, labels = rng.integers(1, 60, 200), rng.integers(0, 3, 200)
    seqs = RaggedSequences.from_list([np.full(n, n, dtype=np.int32) for n in lengths], np.int32)
    data = EncodedExamples(seqs, np.ones(200, dtype=np.int64), labels)
    for limit in (None, 37, 500):
        ordered = by_length(data, limit)
        drawn = evaluation_subset(data, limit)
        expected = getattr(drawn, "indices", range(200))
        assert sorted(ordered.indices) == sorted(expected)
        assert np.all(np.diff(lengths[ordered.indices]) >= 0)
        assert np.array_equal(ordered.labels, labels[ordered.indices])


def test_render_lays_runs_out_as_table_2() -> None:
    base = dict(init="run/pretrained", attention="nystrom-64", dev_mm_accuracy=np.nan,
                test_accuracy=np.nan, dev_f1=np.nan, steps=10, max_steps=10, epochs=1.0,
                batch_size=32, lr=3e-5, wall_s=60.0, tokens_per_s=1000.0, peak_mb=100.0,
                max_len=128)  # fmt: skip
    rows = [
        {**base, "task": "mrpc", "dev_accuracy": 0.70, "dev_f1": 0.80},
        {**base, "task": "mrpc", "dev_accuracy": 0.72, "dev_f1": 0.81, "batch_size": 16},
        {**base, "task": "mnli", "dev_accuracy": 0.60, "dev_mm_accuracy": 0.61},
        {**base, "task": "imdb", "dev_accuracy": 0.9, "test_accuracy": 0.85, "max_len": 512},
        {**base, "task": "imdb", "dev_accuracy": 0.9, "test_accuracy": 0.84, "max_len": 1024},
        {**base, "task": "sst2", "init": "scratch", "dev_accuracy": 0.55},
    ]
    console = Console(width=250, record=True)
    console.print(render(pd.DataFrame(rows)))
    text = console.export_text()
    table = text[text.index("Table 2") :]
    header = next(line for line in table.splitlines() if "init / attention" in line)
    assert [c for c in ("sst2", "mrpc", "mnli", "imdb ", "imdb@1024") if c in header] == [
        "sst2", "mrpc", "mnli", "imdb ", "imdb@1024"]  # fmt: skip
    assert (
        header.index("sst2") < header.index("mrpc") < header.index("mnli") < header.index("imdb@")
    )
    ours = next(line for line in table.splitlines() if "run/pretrained / nystrom-64" in line)
    assert "81.00" in ours and "80.00" not in ours  # best MRPC run, reported as F1
    assert "60.00/61.00" in ours and "85.00" in ours and "84.00" in ours
    scratch = next(line for line in table.splitlines() if line.startswith("│ scratch"))
    assert "55.00" in scratch
    assert "Nyströmformer (paper)" in table and "93.0" in table


def test_starts_from_a_real_nys_pretrain_run(run_nys, tmp_path):
    from tests.helpers import pretrain_tiny as tiny
    from tests.helpers import write_corpus

    write_corpus(tmp_path / "corpus", n_docs=40)
    done = run_nys("pretrain", *tiny(tmp_path / "corpus", tmp_path / "cache"), "--steps", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = [p.parent for p in (tmp_path / "outputs" / "pretrain").rglob(".hydra")]
    saved, saved_tokenizer = load_pretrained(run)
    cfg = OmegaConf.create({"init": str(run), "task": {"max_len": 64}})  # pre-trained at 48
    start = starting_point(cfg)
    assert start.extended_from == 48 and start.tokenizer.vocab_size == saved_tokenizer.vocab_size
    mine, theirs = start.encoder.state_dict(), saved.state_dict()
    positions = "encoder.embeddings.positions.weight"
    assert mine.keys() == theirs.keys()
    assert all(torch.equal(mine[k], theirs[k]) for k in mine if k != positions)
    assert torch.equal(mine[positions][:48], theirs[positions])
    assert torch.equal(mine[positions][48:], theirs[positions][:16])
    assert start.encoder.training  # load_pretrained hands it over in eval mode


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("epochs=0", "epochs=0 is not allowed; it must be a finite number > 0"),
        (
            "task.max_len=2",
            "task.max_len=2 is not allowed; it must be an integer from 3 to 1048576",
        ),
        (
            "warmup_ratio=1.5",
            "warmup_ratio=1.5 is not allowed; it must be a finite number >= 0 and < 1",
        ),
        ("init=/no/such/run", "init=/no/such/run is not a pretrained checkpoint; expected scratch"),
        ("scratch.like=/no/run", "scratch.like=/no/run is not a pretrained checkpoint"),
        ("attention.num_landmarks=0", "num_landmarks"),
    ],
)
def test_bad_values_are_user_errors(override, message):
    with hydra.initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = hydra.compose("finetune", overrides=[override])
    with pytest.raises(UserInputError, match=message):
        validate(cfg)


def test_finetune_from_a_checkpoint_on_two_ranks(run_nys, tmp_path, fixtures):
    """The classifier (encoder + pooler + head) trains through DDP on 2 gloo ranks."""
    done = run_nys("finetune", "task=mrpc", f"init={fixtures['checkpoint']}",
                   f"data.path={fixtures['mrpc']}", "--steps", "2", "--batch-size", "4",
                   "trainer.nproc_per_node=2", *SMALL)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    row = results(tmp_path / "outputs").iloc[0]
    assert row.world_size == 2 and row.batch_size == 8 and row.steps == 2
    assert 0 <= row.dev_accuracy <= 1


def test_final_dev_scores_are_the_best_dev_checkpoints_not_the_last_models(tmp_path):
    """The reported model is the best-dev checkpoint (as for test): its dev scores, logged as
    ``dev (best)``, not the last model's (a run headlined 52.29% while its best was 65.37%)."""
    trainer, train, dev = make_trainer(tmp_path, max_steps=12, eval_every=2, lr=3e-2)
    fit = trainer.fit(train, dev)
    assert fit.best_step != fit.step  # the last model is not the best one
    last = trainer.evaluate(dev)
    final, _ = finetune.final_scores(trainer, fit, {"dev": dev}, ("dev",), lambda d: d)
    best, _, _ = make_trainer(tmp_path / "copy")
    load_best(best.model, tmp_path / "checkpoints")
    expected = best.evaluate(dev)
    assert final["dev"]["loss"] == pytest.approx(expected["loss"], rel=1e-6)
    assert final["dev"]["accuracy"] == expected["accuracy"]
    assert final["dev"]["loss"] != pytest.approx(last["loss"], rel=1e-6)
    rows = pd.read_csv(tmp_path / "metrics.csv")
    [logged] = rows[rows.split == "dev (best)"].itertuples()
    assert logged.step == fit.step and logged.accuracy == expected["accuracy"]
