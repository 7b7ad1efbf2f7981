"""GLUE readers on fixtures written here (real column layouts, MRPC's BOM, literal quotes),
label mapping, and the ``[CLS] a [SEP] b [SEP]`` layout with segment ids and truncation."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from nyscli.data.common import DataError
from nyscli.data.glue import GLUE_TASKS, TextExamples, read_glue, read_tsv
from nyscli.data.pairs import PairCollate, encode_examples, layout, truncate_pair


def write(path: Path, lines: list[str], bom: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(("\ufeff" if bom else "").encode() + ("\n".join(lines) + "\n").encode())


def tsv(*fields: str) -> str:
    return "\t".join(fields)


def test_sst2_folder(tmp_path: Path) -> None:
    # As GLUE ships it: header sentence<TAB>label, sentences ending in a space; test unlabelled.
    write(
        tmp_path / "train.tsv", ["sentence\tlabel", "it 's a charming journey . \t1", "bleak \t0"]
    )
    write(tmp_path / "dev.tsv", ["sentence\tlabel", "unflinchingly bleak \t0"])
    write(tmp_path / "test.tsv", ["index\tsentence", "0\tuneasy mishmash ."])
    splits = read_glue(tmp_path, "sst2")
    assert splits["train"].text_a == ["it 's a charming journey .", "bleak"]
    assert splits["train"].text_b is None and splits["train"].labels.tolist() == [1, 0]
    assert splits["dev"].labels.tolist() == [0]
    assert splits["test"].text_a == ["uneasy mishmash ."] and splits["test"].labels is None


MRPC_HEADER = tsv("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String")


def test_mrpc_bom_header_and_literal_quotes(tmp_path: Path) -> None:
    rows = [
        MRPC_HEADER,
        tsv("1", "1355540", "1355592", "He said the pie business doesn 't fit .",
            '" The pie business does not fit our strategy .'),
        tsv("0", "2029631", "2029565", 'His wife said he was " 100 percent behind Bush " .',
            "Magnarelli said Racicot hated the regime ."),
    ]  # fmt: skip
    write(tmp_path / "train.tsv", rows, bom=True)
    write(tmp_path / "dev.tsv", rows[:2], bom=True)
    header, _ = read_tsv(tmp_path / "train.tsv")
    assert header[0] == "Quality"  # the BOM is not part of the first column name
    train = read_glue(tmp_path, "mrpc")["train"]
    assert train.labels.tolist() == [1, 0]
    # A CSV reader would have eaten these quotes (and joined lines); plain TAB split keeps them.
    assert train.text_b[0] == '" The pie business does not fit our strategy .'
    assert train.text_a[1] == 'His wife said he was " 100 percent behind Bush " .'
    assert train.text_a[0] == "He said the pie business doesn 't fit ."


def test_qnli_qqp_mnli_layouts_and_label_mapping(tmp_path: Path) -> None:
    qnli = tmp_path / "QNLI"
    head = tsv("index", "question", "sentence", "label")
    write(qnli / "train.tsv", [head, tsv("0", "Who?", "Him.", "not_entailment"),
                               tsv("1", "What?", "That.", "entailment")])  # fmt: skip
    write(qnli / "dev.tsv", [head, tsv("0", "Q", "S", "entailment")])
    got = read_glue(qnli, "qnli")["train"]
    assert (got.text_a, got.text_b) == (["Who?", "What?"], ["Him.", "That."])
    assert got.labels.tolist() == [1, 0]

    qqp = tmp_path / "QQP"
    head = tsv("id", "qid1", "qid2", "question1", "question2", "is_duplicate")
    write(qqp / "train.tsv", [head, tsv("5", "11", "12", 'How do I "x"?', "How to x?", "1")])
    write(qqp / "dev.tsv", [head, tsv("6", "13", "14", "A?", "B?", "0")])
    got = read_glue(qqp, "qqp")
    assert got["train"].text_a == ['How do I "x"?'] and got["train"].labels.tolist() == [1]
    assert got["dev"].labels.tolist() == [0]

    mnli = tmp_path / "MNLI"
    parse = ["(a)", "(b)", "(A)", "(B)"]
    train_head = tsv("index", "promptID", "pairID", "genre", "sentence1_binary_parse",
                     "sentence2_binary_parse", "sentence1_parse", "sentence2_parse",
                     "sentence1", "sentence2", "label1", "gold_label")  # fmt: skip
    dev_head = train_head.replace(
        "label1\tgold_label", "label1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label"
    )
    write(mnli / "train.tsv", [train_head, tsv("0", "1", "1e", "fiction", *parse, "P.", "H.",
                                               "neutral", "neutral")])  # fmt: skip
    for split, gold in (("dev_matched", "contradiction"), ("dev_mismatched", "entailment")):
        labels = ["entailment"] * 5
        write(mnli / f"{split}.tsv", [dev_head, tsv("0", "1", "1e", "fiction", *parse, "P.", "H.",
                                                    *labels, gold)])  # fmt: skip
    got = read_glue(mnli, "mnli")
    assert set(got) == {"train", "dev_matched", "dev_mismatched"}
    assert got["train"].labels.tolist() == [1]  # entailment 0, neutral 1, contradiction 2
    assert got["dev_matched"].labels.tolist() == [2]
    assert got["dev_mismatched"].labels.tolist() == [0]
    assert got["dev_matched"].text_a == ["P."] and got["dev_matched"].text_b == ["H."]

    assert GLUE_TASKS["qnli"].label_ids == {"entailment": 0, "not_entailment": 1}
    assert GLUE_TASKS["mnli"].label_ids == {"entailment": 0, "neutral": 1, "contradiction": 2}


def test_bad_folders_and_rows_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"data.path=.*nope is not a folder; expected the GLUE SST"):
        read_glue(tmp_path / "nope", "sst2")
    write(tmp_path / "train.tsv", ["sentence\tlabel", "good \t1"])
    with pytest.raises(DataError, match="has no dev.tsv"):
        read_glue(tmp_path, "sst2")
    write(tmp_path / "dev.tsv", ["sentence\tlabel", "fine \t2"])
    with pytest.raises(DataError, match=r"line 2: label '2'; expected one of 0, 1"):
        read_glue(tmp_path, "sst2")
    write(tmp_path / "dev.tsv", ["sentence\tlabel", "no label here"])
    with pytest.raises(DataError, match="line 2 has 1 fields; expected 2"):
        read_glue(tmp_path, "sst2")
    write(tmp_path / "dev.tsv", ["text\tlabel", "x\t1"])
    with pytest.raises(DataError, match="has no column.*sentence"):
        read_glue(tmp_path, "sst2")


def test_truncation_is_longest_first() -> None:
    assert truncate_pair([1, 2, 3, 4, 5], [6, 7], 5) == ([1, 2, 3], [6, 7])
    assert truncate_pair([1, 2, 3], [4, 5, 6], 4) == ([1, 2], [4, 5])  # ties cut b first
    assert truncate_pair([1, 2, 3], [4, 5, 6], 5) == ([1, 2, 3], [4, 5])
    assert truncate_pair([1], [2], 9) == ([1], [2])


def test_layout_single_and_pair_with_exact_ids() -> None:
    cls, sep = 2, 3
    assert layout([10, 11, 12], None, 8, cls, sep) == ([2, 10, 11, 12, 3], 5)
    assert layout([10, 11, 12, 13], None, 4, cls, sep) == ([2, 10, 11, 3], 4)
    assert layout([10, 11], [20, 21, 22], 16, cls, sep) == ([2, 10, 11, 3, 20, 21, 22, 3], 4)
    # budget 8 - 3 = 5 tokens: b (4) is longer and loses one, then a tie cuts b again.
    assert layout([10, 11, 12], [20, 21, 22, 23], 8, cls, sep) == ([2, 10, 11, 12, 3, 20, 21, 3], 5)
    with pytest.raises(ValueError):
        layout([1], [2], 2, cls, sep)


class FakeTokenizer:
    """Whitespace words -> ids from a fixed table (the layout, not WordPiece, is under test)."""

    pad_id, cls_id, sep_id = 0, 2, 3
    vocab = {"a": 10, "b": 11, "c": 12, "d": 13, "e": 14}

    def encode_batch(self, texts: list[str]) -> list[list[int]]:
        return [[self.vocab[w] for w in t.split()] for t in texts]


def test_encode_and_collate_pairs_with_segments_and_padding() -> None:
    examples = TextExamples(["a b", "c"], ["d e c", "e"], np.array([1, 0]))
    data = encode_examples(examples, FakeTokenizer(), max_len=7)
    assert data[0][0].tolist() == [2, 10, 11, 3, 13, 14, 3]  # "c" of b cut (b longer)
    assert data[0][1:] == (4, 1)
    ids, mask, segments, labels = PairCollate(7, pad_id=0)([data[0], data[1]])
    assert ids.tolist() == [[2, 10, 11, 3, 13, 14, 3], [2, 12, 3, 14, 3, 0, 0]]
    assert mask.tolist() == [[True] * 7, [True] * 5 + [False] * 2]
    assert segments.tolist() == [[0, 0, 0, 0, 1, 1, 1], [0, 0, 0, 1, 1, 0, 0]]
    assert labels.tolist() == [1, 0] and ids.dtype == torch.long and segments.dtype == torch.long

    single = encode_examples(TextExamples(["a b c d"], None, np.array([0])), FakeTokenizer(), 4)
    ids, mask, segments, _ = PairCollate(4)([single[0]])
    assert ids.tolist() == [[2, 10, 11, 3]] and segments.tolist() == [[0, 0, 0, 0]]
