"""Table 3: offline substitutes (retrieval, image), trivial baselines, the presets, the report."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from rich.console import Console

from nyscli.data import image, retrieval
from nyscli.data.common import DataError, RaggedSequences, SequenceClassificationDataset, TaskData
from nyscli.data.text import SHARED_IMDB, default_imdb_source
from nyscli.experiments.lra import table as lra_table
from nyscli.experiments.lra.tasks import trivial_baseline
from nyscli.paths import CONF_DIR
from tests.helpers import write_fashion_mnist

# ------------------------------------------------------------------ retrieval substitute


def topic_documents(n: int, topics: int) -> tuple[list[bytes], np.ndarray]:
    """Document i reads ``doc <i> topic <t>``: its text names its id and topic."""
    labels = np.arange(n) % topics
    return [f"doc {i} topic {t}".encode() for i, t in enumerate(labels)], labels


def decode(ids) -> str:
    return bytes(int(i) - 1 for i in ids).decode()


def test_topic_pairs_are_balanced_disjoint_and_labelled_by_topic() -> None:
    texts, topics = topic_documents(300, 5)
    task = retrieval.load_wiki_topic_pairs(pairs_per_document=4, documents=(texts, topics))
    assert task.dataset == retrieval.WIKI_TOPIC_PAIRS and "substitute" in task.dataset
    seen: dict[str, set[int]] = {}
    for split in ("train", "val", "test"):
        pairs = getattr(task, split)
        assert len(pairs) == 4 * {"train": 240, "val": 30, "test": 30}[split]
        assert int(pairs.labels.sum()) * 2 == len(pairs)  # exactly balanced
        docs = set()
        for i in range(len(pairs)):
            a, b, label = pairs[i]
            (_, ia, _, ta), (_, ib, _, tb) = decode(a).split(), decode(b).split()
            assert ia != ib and label == int(ta == tb)
            docs |= {int(ia), int(ib)}
        seen[split] = docs
    assert not (seen["train"] & seen["val"]) and not (seen["train"] & seen["test"])
    assert not (seen["val"] & seen["test"])
    assert len(seen["train"] | seen["val"] | seen["test"]) == 300
    again = retrieval.load_wiki_topic_pairs(pairs_per_document=4, documents=(texts, topics))
    assert np.array_equal(again.train.labels, task.train.labels)  # seeded


def test_topic_pairs_each_document_alternates_labels() -> None:
    rng = np.random.default_rng(0)
    first, second, labels = retrieval.topic_pairs(np.array([0, 0, 1, 1, 2]), 4, rng)
    assert first.tolist() == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4 + [4] * 4
    for i in range(5):  # document 4 is alone in topic 2: it only gets label-0 pairs
        mine = labels[first == i].tolist()
        assert mine in ([0, 1, 0, 1], [1, 0, 1, 0]) if i < 4 else mine == [0, 0, 0, 0]


def test_wiki_topic_pairs_from_the_installed_package() -> None:
    texts, topics, names = retrieval.read_topic_documents()
    assert len(texts) > 8000 and len(names) == 11 and retrieval.NO_TOPIC not in names
    assert max(len(t) for t in texts) <= 4000  # two sides of at most 4000 bytes, as LRA


def test_topic_pairs_bad_setting() -> None:
    with pytest.raises(DataError, match="pairs_per_document=0"):
        retrieval.load_wiki_topic_pairs(pairs_per_document=0, documents=topic_documents(10, 2))


# ------------------------------------------------------------------ image and text defaults


def test_missing_fashion_mnist_names_the_debian_package(monkeypatch, tmp_path: Path) -> None:
    missing = tmp_path / "fashion-mnist"
    monkeypatch.setenv(image.FASHION_MNIST_ENV, str(missing))
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist.*NYSCLI_FASHION"):
        image.read_fashion_mnist()


def test_text_default_is_the_shared_csv_beside_the_checkout(tmp_path: Path) -> None:
    checkout = tmp_path / "nys"
    assert default_imdb_source(checkout) == "imdb"  # nothing beside it: HF (online)
    csv = tmp_path / SHARED_IMDB
    csv.parent.mkdir(parents=True)
    csv.write_text("review,sentiment\n")
    assert default_imdb_source(checkout) == str(csv)


def lra_cfg(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("lra", overrides=list(overrides))


def test_image_and_retrieval_default_to_their_substitutes_unless_a_path_is_given() -> None:
    from nyscli.experiments.lra.tasks import _source

    for task, real, substitute in (("image", "cifar10", "fashion_mnist"),
                                   ("retrieval", "aan", "wiki_topic_pairs")):  # fmt: skip
        assert _source(lra_cfg(f"task={task}").data, real, substitute) == substitute
        given = lra_cfg(f"task={task}", "data.path=/x").data
        assert _source(given, real, substitute) == real


def test_lra_trains_on_length_bucketed_batches_in_every_task_and_schedule() -> None:
    # conf/trainer/lra.yaml: a task file or the CPU schedule must not reset it to 1.
    for task in ("listops", "text", "retrieval", "image", "pathfinder"):
        for schedule in ("paper", "cpu"):
            assert lra_cfg(f"task={task}", f"schedule={schedule}").trainer.bucket == 8
    assert lra_cfg("trainer.bucket=1").trainer.bucket == 1


# ------------------------------------------------------------------ trivial baselines


def listops_like(first_tokens: list[int], labels: list[int]) -> SequenceClassificationDataset:
    seqs = RaggedSequences.from_list([np.array([t, 1, 15], np.uint8) for t in first_tokens])
    return SequenceClassificationDataset(seqs, np.array(labels))


def test_trivial_baselines_are_fitted_on_train_and_scored_on_test() -> None:
    train = listops_like([11, 11, 11, 12, 12, 13], [0, 0, 5, 9, 9, 4])
    test = listops_like([11, 12, 12, 13, 14], [0, 9, 1, 4, 4])
    data = TaskData(train, test, test, 18, 10, lambda b: b)
    name, accuracy = trivial_baseline("listops", data)
    # 11 -> 0, 12 -> 9, 13 -> 4, unseen 14 -> the overall most common (0 and 9 tie: 0)
    assert name == "outer-operator rule" and accuracy == pytest.approx(3 / 5)
    name, accuracy = trivial_baseline("image", data)  # majority of train: 0 (ties -> smaller)
    assert name == "majority class" and accuracy == pytest.approx(1 / 5)


# ------------------------------------------------------------------ presets


def test_table3_presets_sweep_five_tasks_with_their_schedules() -> None:
    cfg = lra_cfg("experiment=table3_cpu", "task=pathfinder")
    assert cfg.trainer.max_steps == 300 and cfg.trainer.lr == pytest.approx(1e-3)
    assert cfg.data.generate.n_train == 20000 and cfg.threads == 2
    assert lra_cfg("experiment=table3_cpu", "task=text").task.max_len == 1000
    short = lra_cfg("experiment=table3_cpu", "task=text", "trainer.max_steps=7").trainer
    assert (short.max_steps, short.planned_steps) == (7, 300)
    paper = lra_cfg("experiment=table3_paper", "task=image")
    assert (paper.trainer.max_steps, paper.trainer.batch_size) == (35000, 256)  # the paper's
    assert lra_cfg("task=text", "schedule=cpu").trainer.max_steps == 300
    text = (CONF_DIR / "experiment" / "table3_cpu.yaml").read_text()
    sweep = OmegaConf.create(text.split("\n", 1)[1]).hydra.sweeper.params
    assert sweep.task.split(",") == ["listops", "text", "retrieval", "image", "pathfinder"]
    attentions = sweep.attention.split(",")
    assert {"softmax", "nystrom"} < set(attentions) and len(attentions) >= 4


# ------------------------------------------------------------------ the Table-3 report


def result_rows() -> pd.DataFrame:
    rows = []
    for attention, base in (("softmax", 0.40), ("nystrom-64+conv35", 0.45)):
        for i, (task, dataset) in enumerate(
            (("listops", "ListOps (generated)"), ("image", image.FASHION_MNIST))
        ):
            rows.append(dict(task=task, dataset=dataset, attention=attention, job="",
                             test_accuracy=base + i / 10, rule_accuracy=0.36 - i / 4,
                             tokens_per_s=1000.0 * (i + 1), peak_mb=100.0, steps=5))  # fmt: skip
    return pd.DataFrame(rows)


def test_table3_has_paper_rows_baselines_and_marks_substitutes() -> None:
    console = Console(width=220, record=True)
    console.print(lra_table.render_table3(result_rows()))
    text = console.export_text()
    lines = text.splitlines()
    transformer = next(line for line in lines if "paper: Transformer" in line)
    assert "37.10" in transformer and "38.20" in transformer and "58.77" in transformer
    assert "19.05" in next(line for line in lines if "paper: Reformer" in line)
    rule = next(line for line in lines if "trivial rule" in line)
    assert "36.00" in rule and "11.00" in rule
    nystrom = next(line for line in lines if line.startswith("│ nystrom-64+conv35"))
    assert "45.00" in nystrom and "55.00" in nystrom and "50.00*" not in nystrom
    assert "image†" in text and "† Fashion-MNIST (substitute for CIFAR-10)" in text


def test_a_cell_of_several_runs_says_so() -> None:
    df = result_rows()
    df = pd.concat([df, df.assign(test_accuracy=df.test_accuracy + 0.1)], ignore_index=True)
    frame = lra_table.table3_frame(df)
    cell = frame[(frame.row == "softmax") & (frame.task == "listops")].iloc[0]
    assert cell.runs == 2 and cell.test_accuracy == pytest.approx(0.45)
    console = Console(width=260, record=True)
    console.print(lra_table.render_table3(df))
    assert "45.00 ± 7.07 (n = 2)" in console.export_text()  # the std with ddof 1
    swept = df.assign(job=["trainer.lr=0.1"] * 4 + ["trainer.lr=0.2"] * 4)
    assert set(lra_table.table3_frame(swept).runs) == {1}  # different settings: separate rows


def test_write_table3_csv_and_one_curve_png_per_task(tmp_path: Path) -> None:
    df = result_rows()
    run_dirs = []
    for k in range(len(df)):
        run = tmp_path / f"run{k}"
        run.mkdir()
        pd.DataFrame({"step": [1, 2, 2], "split": ["train", "train", "val"],
                      "loss": [2.0, 1.5, 1.6], "accuracy": [0.1, 0.2, 0.3]}).to_csv(
            run / "metrics.csv", index=False)  # fmt: skip
        run_dirs.append(str(run))
    written = lra_table.write_table3(df.assign(run_dir=run_dirs), tmp_path)
    names = sorted(p.name for p in written)
    assert names == ["curves_image.png", "curves_listops.png", "table3.csv"]
    table = pd.read_csv(tmp_path / "table3.csv")
    row = table[(table.attention == "softmax") & (table.task == "listops")].iloc[0]
    assert row.paper_accuracy == pytest.approx(0.3710) and row.test_accuracy == pytest.approx(0.4)


# ------------------------------------------------------------------ end to end, offline

TINY = [
    "threads=1",
    "--steps",
    "5",
    "--batch-size",
    "4",
    "trainer.warmup_steps=1",
    "trainer.eval_examples=8",
    "task.test_examples=8",
    "model.dim=16",
    "model.ffn_dim=16",
]
TINY_GENERATED = [  # ++: ListOps and Pathfinder have these keys; the other tasks ignore them
    "++data.generate.n_train=48",
    "++data.generate.n_val=16",
    "++data.generate.n_test=16",
]


def test_table3_preset_runs_every_task_offline_and_writes_the_report(
    run_nys, tmp_path, monkeypatch
):
    """experiment=table3_cpu scaled down: retrieval and image on their offline substitutes
    (Fashion-MNIST: small IDX files in its real format, where $NYSCLI_FASHION_MNIST points),
    ListOps and Pathfinder generated; text (below) on a CSV in the real IMDB layout."""
    fashion = write_fashion_mnist(tmp_path / "fashion-mnist", n_train=200, n_test=60)
    monkeypatch.setenv(image.FASHION_MNIST_ENV, str(fashion))
    done = run_nys(
        "lra", "experiment=table3_cpu", "task=listops,retrieval,image,pathfinder",
        "attention=nystrom", "attention.num_landmarks=4", f"data_cache={tmp_path / 'cache'}",
        *TINY, *TINY_GENERATED, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    [sweep] = {p.parent.parent.parent for p in (tmp_path / "outputs").rglob(".hydra/config.yaml")}
    summary = pd.read_csv(sweep / "summary.csv")
    assert sorted(summary.task) == ["image", "listops", "pathfinder", "retrieval"]
    assert (summary.steps == 5).all() and (summary.status == "ok").all()
    datasets = dict(zip(summary.task, summary.dataset, strict=True))
    assert datasets["image"] == image.FASHION_MNIST
    assert datasets["retrieval"] == retrieval.WIKI_TOPIC_PAIRS
    assert summary.set_index("task").rule_accuracy["retrieval"] == pytest.approx(0.5)
    for name in ("table3.csv", *(f"curves_{t}.png" for t in summary.task)):
        assert (sweep / name).is_file(), name
    assert "Table 3" in done.stdout and "substitute for CIFAR-10" in done.stdout

    csv = tmp_path / "imdb.csv"
    reviews = [("a fine film, loved it", "positive"), ("dull and bad", "negative")] * 12
    pd.DataFrame(reviews, columns=["review", "sentiment"]).to_csv(csv, index=False)
    text = run_nys("lra", "task=text", f"data.path={csv}", *TINY)
    assert text.returncode == 0, text.stdout + text.stderr


# ------------------------------------------------------------------ pathfinder generation


def test_pathfinder_generation_counts_progress_and_threads_cap_the_workers(monkeypatch) -> None:
    import contextlib

    from nyscli.data import pathfinder as pf
    from nyscli.experiments.lra import tasks as lra_tasks

    advanced: list[int] = []

    @contextlib.contextmanager
    def recording_bar(description: str, total: int):
        assert "train" in description and total == 2 * pf.CHUNK + 2
        yield advanced.append

    monkeypatch.setattr(pf, "progress_bar", recording_bar)

    def blank_chunk(job: tuple) -> dict[str, np.ndarray]:
        n = job[3]
        return {"labels": np.zeros(n, np.int64), "images": np.zeros((n, 1, 1)),
                "endpoints": np.zeros((n, 2, 2))}  # fmt: skip

    monkeypatch.setattr(pf, "_chunk_job", blank_chunk)
    cfg = pf.PathfinderConfig(n_train=2 * pf.CHUNK + 2, n_val=0, n_test=0)
    assert len(pf.generate_split(cfg, "train")["labels"]) == cfg.n_train
    assert advanced == [pf.CHUNK, pf.CHUNK, 2]

    seen = {}
    monkeypatch.setattr(pf, "load_pathfinder", lambda *a, **kw: seen.update(kw))
    cfg = lra_cfg("task=pathfinder")
    lra_tasks._pathfinder(cfg.task, cfg.data, None, 1)
    assert seen["workers"] == 1  # threads=1: one generator process
    cfg = lra_cfg("task=pathfinder", "data.workers=3")
    lra_tasks._pathfinder(cfg.task, cfg.data, None, 1)
    assert seen["workers"] == 3


def test_bad_data_source_is_one_line_and_leaves_no_run_folder(nys_here, tmp_path):
    done = nys_here("lra", "task=retrieval", "data.source=acl")
    assert done.returncode == 2 and "Traceback" not in done.stdout + done.stderr
    assert done.stdout.strip().splitlines() == [
        "error: data.source=acl is not allowed; choose one of: auto, aan, wiki_topic_pairs"
    ]
    assert not (tmp_path / "outputs").exists()


def test_each_run_of_a_sweep_in_one_process_reports_its_own_cpu_peak() -> None:
    import torch

    from nyscli.train.resources import peak_memory_mb, reset_peak_memory

    cpu = torch.device("cpu")
    reset_peak_memory(cpu)
    block = np.ones(200 * 2**20, dtype=np.uint8)  # 200 MB, every page touched
    high = peak_memory_mb(cpu)
    del block
    reset_peak_memory(cpu)
    low = peak_memory_mb(cpu)
    assert high - low > 150  # the earlier job's 200 MB no longer counts


def test_every_training_command_and_eval_only_start_a_new_peak(monkeypatch, tmp_path) -> None:
    """lra, pretrain and finetune share start_run; eval_only resets in evaluate_only (a
    finetune eval sweep once showed the first job's peak in every later row)."""
    import inspect

    import torch
    from omegaconf import OmegaConf

    from nyscli.experiments import training
    from nyscli.experiments.finetune import evaluate as finetune_eval

    calls: list[torch.device] = []
    monkeypatch.setattr(training, "reset_peak_memory", calls.append)
    cfg = OmegaConf.create(
        {"command": "lra", "threads": None, "device": "cpu", "resume": False, "seed": 0}
    )
    device, _ = training.start_run(cfg, tmp_path)
    assert calls == [device]
    assert "reset_peak_memory(device)" in inspect.getsource(finetune_eval.evaluate_only)


def test_seeds_of_one_row_share_its_cell_and_its_curve(tmp_path: Path, monkeypatch) -> None:
    # A seed sweep's job label carries seed=...: the seeds are one row of Table 3 (mean ±
    # std) and one line with a min-max band in curves_<task>.png, not a row and line each.
    from nyscli.output import curves

    df = result_rows()
    listops = df[(df.task == "listops") & (df.attention == "softmax")]
    seeds = pd.concat([listops.assign(job=f"attention=softmax seed={s}",
                                      test_accuracy=0.40 + s / 100) for s in range(3)])  # fmt: skip
    run_dirs = []
    for s in range(3):
        run = tmp_path / f"seed{s}"
        run.mkdir()
        pd.DataFrame({"step": [1, 2, 2], "split": ["train", "train", "dev"],
                      "loss": [2.0 + s, 1.5 + s, 1.6], "accuracy": [0.1, 0.2, 0.3]}).to_csv(
            run / "metrics.csv", index=False)  # fmt: skip
        run_dirs.append(str(run))
    seeds = seeds.assign(run_dir=run_dirs)
    frame = lra_table.table3_frame(seeds)
    assert len(frame) == 1 and frame.runs.iloc[0] == 3
    assert frame.test_accuracy_std.iloc[0] == pytest.approx(np.std([0.40, 0.41, 0.42], ddof=1))
    labels = []
    original = curves.save_figure

    def capture(fig, path, dpi=120):
        labels.extend(ln.get_label() for ln in fig.axes[0].get_lines())
        return original(fig, path, dpi)

    monkeypatch.setattr(curves, "save_figure", capture)
    lra_table.write_table3(seeds, tmp_path)
    assert "softmax (mean of 3 seeds; band: min-max)" in labels
