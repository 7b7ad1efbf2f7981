"""``nys finetune task=csv``: your own labelled file (CSV, TSV, JSON lines, Parquet, gzipped),
its label mapping and seeded split, each bad file as one line before any folder, the run and
its direct deployment end to end on a tiny checkpoint, and approx-error reading the same
files' text column."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import hydra
import numpy as np
import pandas as pd
import pytest
from omegaconf import OmegaConf

from nyscli.data import table
from nyscli.data.common import DataError
from nyscli.errors import UserInputError
from nyscli.experiments.finetune.command import validate
from nyscli.experiments.finetune.tasks import load_examples, num_classes, recorded_classes
from nyscli.paths import CONF_DIR
from tests.test_hf_import import WORDS, tiny_checkpoint

POSITIVE, NEGATIVE = ("good", "great", "fun"), ("bad", "awful", "dull")


def reviews(n: int, seed: int) -> pd.DataFrame:
    """``review`` texts from the tiny checkpoint's words and ``sentiment`` pos/neg, by
    whether a positive word was put in; classes alternate, as sorted files often do not."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        label = ("pos", "neg")[i % 2]
        cue = rng.choice(POSITIVE if label == "pos" else NEGATIVE)
        filler = rng.choice(WORDS[6:], int(rng.integers(3, 8)))
        rows.append({"review": f"the movie was {cue} " + " ".join(filler), "sentiment": label})
    return pd.DataFrame(rows)


def write(frame: pd.DataFrame, path: Path) -> Path:
    """``frame`` in the format ``path``'s suffix names, as pandas writes it."""
    kind = table.table_format(path)
    if kind == ".parquet":
        frame.to_parquet(path)
        return path
    text = (
        frame.to_json(orient="records", lines=True)
        if kind == ".jsonl"
        else frame.to_csv(index=False, sep="\t" if kind == ".tsv" else ",")
    )
    data = text.encode()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    return path


def compose(*overrides: str):
    with hydra.initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return hydra.compose("finetune", overrides=["finetune_task=csv", *overrides])


def task(**keys):
    base = {"name": "csv", "text_column": "review", "text_pair_column": None,
            "label_column": "sentiment", "dev_fraction": 0.1, "test_fraction": 0.2}  # fmt: skip
    return OmegaConf.create({**base, **keys})


# ------------------------------------------------------------------ reading the formats


@pytest.mark.parametrize(
    "name", ["r.csv", "r.tsv", "r.jsonl", "r.csv.gz", "r.jsonl.gz", "r.parquet"]
)
def test_every_format_reads_the_same_examples_and_classes(tmp_path, name):
    if name.endswith(".parquet"):
        pytest.importorskip("pyarrow")
    frame = reviews(12, seed=0)
    frame.loc[3, "review"] = 'a "quoted", comma\tand tab review'  # quoting survives each format
    examples = table.read_labelled(write(frame, tmp_path / name), "data.path",
                                   table.Columns("review", None, "sentiment"))  # fmt: skip
    assert examples.text_a == frame.review.tolist()
    assert examples.classes == ("neg", "pos")  # sorted: neg 0, pos 1
    assert examples.labels.tolist() == [1, 0] * 6 and examples.rows.tolist() == list(range(12))


def test_integer_labels_keep_their_value_order_and_json_numbers_equal_csv_digits(tmp_path):
    frame = pd.DataFrame({"text": [f"t {i}" for i in range(6)], "label": [10, 2, 0, 2, 10, 0]})
    columns = table.Columns()
    from_csv = table.read_labelled(write(frame, tmp_path / "n.csv"), "data.path", columns)
    from_json = table.read_labelled(write(frame, tmp_path / "n.jsonl"), "data.path", columns)
    assert from_csv.classes == from_json.classes == ("0", "2", "10")  # by value, not "10" < "2"
    assert from_csv.labels.tolist() == from_json.labels.tolist() == [2, 1, 0, 1, 2, 0]
    (tmp_path / "f.jsonl").write_text('{"text": "a", "label": 1.0}\n{"text": "b", "label": 0}\n')
    assert table.read_labelled(tmp_path / "f.jsonl", "data.path", columns).classes == ("0", "1")
    (tmp_path / "frac.jsonl").write_text('{"text": "a", "label": 0.5}\n{"text": "b", "label": 0}\n')
    with pytest.raises(DataError, match="row 1: label 0.5 is a fraction"):
        table.read_labelled(tmp_path / "frac.jsonl", "data.path", columns)


def test_a_pair_column_and_a_given_mapping(tmp_path):
    frame = pd.DataFrame({"q": ["a", "b", "c"], "s": ["x", "y", "z"], "y": ["no", "yes", "no"]})
    path = write(frame, tmp_path / "p.tsv")
    examples = table.read_labelled(path, "data.path", table.Columns("q", "s", "y"))
    assert examples.text_b == ["x", "y", "z"] and examples.labels.tolist() == [0, 1, 0]
    mapped = table.read_labelled(path, "data.path", table.Columns("q", "s", "y"), ("yes", "no"))
    assert mapped.labels.tolist() == [1, 0, 1]
    with pytest.raises(DataError, match=r"row 2 has label 'yes', not one of the training classes"):
        table.read_labelled(path, "data.test_path", table.Columns("q", "s", "y"), ("no", "maybe"))


def test_the_seeded_split_sizes_strata_and_determinism(tmp_path):
    """Without dev and test files: 20% test and 10% dev of data.path, drawn stratified with
    the fixed evaluation seed (whatever the run's seed), disjoint, train in file order."""
    path = write(reviews(50, seed=1), tmp_path / "r.csv")
    splits = load_examples(task(), str(path), seed=0)
    again = load_examples(task(), str(path), seed=7)
    assert [len(splits[s]) for s in ("train", "dev", "test")] == [35, 5, 10]
    assert sorted(np.bincount(splits["test"].labels).tolist()) == [5, 5]  # stratified
    rows = {s: splits[s].rows.tolist() for s in splits}
    assert rows == {s: again[s].rows.tolist() for s in again}  # the same rows for every seed
    assert sorted(sum(rows.values(), [])) == list(range(50))  # every row once
    assert rows["train"] == sorted(rows["train"])
    assert num_classes("csv", splits["train"]) == 2
    parts = table.split_rows(np.arange(10) % 2, dev=2, test=4)
    assert [len(parts[s]) for s in ("train", "dev", "test")] == [4, 2, 4]
    assert table.split_rows(np.arange(10) % 2, 0, 0)["train"].tolist() == list(range(10))


def test_separate_dev_and_test_files_use_the_training_files_classes(tmp_path):
    train = write(reviews(20, seed=2), tmp_path / "train.csv")
    test = write(reviews(8, seed=3), tmp_path / "test.jsonl")
    files = {"train": str(train), "dev": None, "test": str(test)}
    splits = load_examples(task(), str(train), seed=0, files=files)
    assert [len(splits[s]) for s in ("train", "dev", "test")] == [18, 2, 8]  # dev: 10% of 20
    assert splits["test"].labels.tolist() == [1, 0] * 4
    swapped = load_examples(task(), str(train), 0, files=files, classes=("pos", "neg"))
    assert swapped["test"].labels.tolist() == [0, 1] * 4  # a run's recorded mapping wins


# ------------------------------------------------------------------ bad files: one line each


def bad_files(tmp_path: Path) -> dict[Path, str]:
    """Each kind of bad file -> its exact refusal (after ``task=csv: data.path=<file>``)."""
    good = reviews(10, seed=4)
    latin, utf16, empty, header, null = (
        tmp_path / name for name in ("latin.csv", "utf16.csv", "empty.csv", "h.csv", "n.jsonl")
    )
    latin.write_bytes("review,sentiment\nun film très bon,pos\nmauvais,neg\n".encode("latin-1"))
    utf16.write_bytes("review,sentiment\ngood,pos\nbad,neg\n".encode("utf-16"))
    empty.write_bytes(b"")
    header.write_text("review,sentiment\n")
    null.write_text('{"review": "good", "sentiment": "pos"}\n{"review": "bad", "sentiment": null}')
    labels = ["pos", None, "neg", None] + ["neg"] * 6
    return {
        write(good.rename(columns={"review": "body"}), tmp_path / "columns.csv"): (
            " has no column 'review' (columns found: body, sentiment); name the column with "
            "task.text_column=<column>"
        ),
        empty: " is empty; expected a header line and one row per example",
        header: " is empty (no rows under its header); expected one row per example",
        write(good.assign(sentiment="pos"), tmp_path / "one.csv"): (
            ": column 'sentiment' holds one class only ('pos' in all 10 rows); a classifier "
            "needs at least 2"
        ),
        latin: (
            " is not UTF-8 text (byte 0xe8 on line 2); save it as UTF-8, e.g. iconv -f latin1 "
            "-t utf-8"
        ),
        utf16: (
            " is not UTF-8 text (it holds NUL bytes: UTF-16 or a binary file); save it as UTF-8"
        ),
        write(good.assign(sentiment=labels), tmp_path / "nan.csv"): (
            ": column 'sentiment' has 2 empty or NaN labels, first at row 2; fill or drop "
            "those rows"
        ),
        null: (
            ": column 'sentiment' has 1 empty or NaN label, first at row 2; fill or drop those rows"
        ),
    }


def test_each_bad_file_is_one_line_exit_2_and_no_run_folder(nys_here, tmp_path):
    columns = ("task.text_column=review", "task.label_column=sentiment", "threads=1")
    for path, message in bad_files(tmp_path).items():
        done = nys_here("finetune", "task=csv", "init=scratch", f"data.path={path}", *columns)
        lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        assert done.returncode == 2, (path, lines)
        assert lines == [f"error: task=csv: data.path={path}{message}"], lines
        assert not (tmp_path / "outputs").exists()


def test_bad_settings_of_the_csv_task_are_refused_by_validate(tmp_path):
    path = write(reviews(10, seed=5), tmp_path / "r.csv")
    common = (f"data.path={path}", "task.text_column=review", "task.label_column=sentiment")
    for overrides, message in (
        ((), "task=csv: data.path is not set; give data.path=<a .csv, .tsv, .jsonl"),
        ((f"data.path={tmp_path / 'r.txt'}",), "r.txt is not a table file; expected a .csv"),
        ((f"data.path={tmp_path / 'no.csv'}",), "no.csv does not exist"),
        ((*common, "task.dev_fraction=0.5", "task.test_fraction=0.5"), "their sum must be below 1"),
        ((*common, "task.dev_fraction=1.5"), "task.dev_fraction=1.5 is not allowed"),
        ((*common, "task.text_column=sentiment", "task.label_column=nope"), "no column 'nope'"),
        (
            (*common, f"data.test_path={tmp_path / 'gone.jsonl'}"),
            "task=csv: data.test_path=" + str(tmp_path / "gone.jsonl") + " does not exist",
        ),
    ):
        with pytest.raises(UserInputError) as error:
            validate(compose(*overrides))
        assert message in str(error.value), str(error.value)
    tiny = write(reviews(2, seed=5), tmp_path / "tiny.csv")
    with pytest.raises(UserInputError, match=r"has 2 rows: too few to hold out dev \(1\) and test"):
        validate(compose(*common[1:], f"data.path={tiny}"))


# ------------------------------------------------------------------ end to end


def test_finetune_records_the_mapping_and_split_and_eval_only_swaps_the_attention(
    run_nys, tmp_path
):
    checkpoint = tiny_checkpoint(tmp_path / "ckpt")
    data = write(reviews(60, seed=6), tmp_path / "reviews.csv")
    done = run_nys("finetune", "task=csv", f"init=hf:{checkpoint}", f"data.path={data}",
                   "task.text_column=review", "task.label_column=sentiment", "task.max_len=32",
                   "--steps", "4", "--batch-size", "8", "threads=1", "trainer.eval_every=2",
                   "trainer.progress=false")  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [run] = [p.parent for p in (tmp_path / "outputs" / "finetune").rglob(".hydra")]
    row = pd.read_csv(run / "results.csv").iloc[0]
    assert row.task == "csv" and row.steps == 4
    assert (row.train_examples, row.dev_examples, row.test_examples) == (48, 6, 6)
    assert row.majority_rate == 0.5 and 0 <= row.test_accuracy <= 1
    assert json.loads((run / "labels.json").read_text()) == {
        "label_column": "sentiment", "labels": {"neg": 0, "pos": 1}}  # fmt: skip
    assert recorded_classes(run) == ("neg", "pos")
    split = pd.read_csv(run / "split.csv")
    assert split.groupby("split").size().to_dict() == {"dev": 6, "test": 6, "train": 48}
    assert (split.file == "data.path").all() and sorted(split.row) == list(range(1, 61))
    source = pd.read_csv(data)
    assert (source.sentiment.iloc[split.row - 1].to_numpy() == split.label.to_numpy()).all()
    assert "Table 2 layout" in done.stdout and "csv" in done.stdout

    again = run_nys("finetune", f"eval_only={run}", "attention=nystrom_local", "threads=1")
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    evaluated = pd.read_csv(next(p for p in (tmp_path / "outputs").rglob("results.csv")
                                 if p.parent != run)).iloc[0]  # fmt: skip
    assert evaluated["mode"] == "eval_only" and evaluated.split == "test"
    assert evaluated.examples == 6 and evaluated.attention.startswith("nystrom_local")
    # texts of at most 32 tokens lie inside the hybrid's 65-token band: it is exact there
    assert evaluated.accuracy == pytest.approx(row.test_accuracy)


def test_approx_error_reads_a_tables_text_column(run_nys, tmp_path):
    checkpoint = tiny_checkpoint(tmp_path / "ckpt")
    data = write(reviews(5, seed=7), tmp_path / "reviews.jsonl")
    common = ("source=checkpoint", f"checkpoint=hf:{checkpoint}", f"data.path={data}",
              "seq_len=32", "max_sequences=1", "budgets=[8]", "budget_unit=pairs",
              "plots=false", "methods=[nystrom_local]", "baselines=[uniform]",
              "threads=1", f"fidelity.path={data}")  # fmt: skip
    refused = run_nys("approx-error", *common)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert (
        f"data.path={data} has no column 'text' (columns found: review, sentiment); "
        "name the column with task.text_column=<column>"
    ) in refused.stdout
    done = run_nys("approx-error", *common, "task.text_column=review")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    frame = pd.read_csv(next(tmp_path.rglob("fidelity.csv")))
    assert list(frame.method) == ["nystrom_local", "uniform"] and (frame.texts == 5).all()
    assert "embeddings vs exact attention (5 texts" in done.stdout
