"""ListOps: evaluator, generator (labels, lengths, sizes, determinism, cache), reader, datasets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from nyscli.data import listops as lo
from nyscli.data.common import DataError


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Release-default generation parameters, small split sizes."""
    cfg = lo.ListOpsConfig(n_train=40, n_val=6, n_test=5, seed=7)
    return lo.ensure_listops_files(tmp_path_factory.mktemp("lo"), cfg)


def rows(path: Path) -> list[tuple[str, int]]:
    lines = path.read_bytes().split(b"\r\n")
    assert lines[0] == b"Source\tTarget" and lines[-1] == b""
    out = []
    for line in lines[1:-1]:
        src, label = line.decode().split("\t")
        out.append((src, int(label)))
    return out


# ------------------------------------------------------------------ the reference evaluator


@pytest.mark.parametrize(
    ("expr", "value"),
    [
        ("[MAX 4 3 [MIN 2 3 ] 1 0 ]", 4),
        ("[MIN 4 3 [MAX 2 9 ] 1 ]", 1),
        ("[MED 1 5 8 9 2 ]", 5),
        ("[MED 1 2 3 4 ]", 2),  # int(np.median) = int(2.5)
        ("[MED 9 0 ]", 4),  # int(4.5)
        ("[MED 7 7 8 8 ]", 7),
        ("[SM 5 7 ]", 2),
        ("[SM 9 9 9 [MAX 1 9 ] ]", 6),
        ("[SM [MED 1 2 ] [MIN 8 7 ] 3 ]", 1),
        ("( ( ( [MAX 2 ) 9 ) ] )", 9),  # the release's parenthesised form
        ("( ( ( ( [MIN 5 ) ( ( ( [SM 8 ) 9 ) ] ) ) 6 ) ] )", 5),  # MIN(5, SM(8,9)=7, 6)
        ("3", 3),
    ],
)
def test_evaluate_known_values(expr: str, value: int) -> None:
    assert lo.evaluate(expr) == value


def test_evaluate_median_matches_numpy() -> None:
    rng = np.random.default_rng(0)
    for _ in range(200):
        args = rng.integers(0, 10, rng.integers(2, 11)).tolist()
        expr = "[MED " + " ".join(map(str, args)) + " ]"
        assert lo.evaluate(expr) == int(np.median(args))


@pytest.mark.parametrize("bad", ["[MAX 1 2", "]", "[FOO 1 ]", "1 2", "[MAX ]", ""])
def test_evaluate_rejects_malformed(bad: str) -> None:
    with pytest.raises(DataError):
        lo.evaluate(bad)


# ------------------------------------------------------------------ generator


def test_labels_equal_evaluator_and_lengths_in_bounds(generated: dict[str, Path]) -> None:
    ops_seen = set()
    for path in generated.values():
        for src, label in rows(path):
            assert lo.evaluate(src) == label
            core = [t for t in src.split() if t not in ("(", ")")]
            assert 500 < len(core) < 2000  # the release's strict bounds on its "length"
            assert core.count("]") == sum(t.startswith("[") for t in core)
            ops_seen.update(t for t in core if t.startswith("["))
    assert ops_seen == {"[MIN", "[MAX", "[MED", "[SM"}


def test_custom_bounds_depth_and_args(tmp_path: Path) -> None:
    cfg = lo.ListOpsConfig(min_len=10, max_len=40, max_depth=3, max_args=4, n_train=60, seed=1)
    path = lo.ensure_listops_files(tmp_path, cfg, splits=("train",))["train"]
    for src, label in rows(path):
        assert lo.evaluate(src) == label
        core = [t for t in src.split() if t not in ("(", ")")]
        assert 10 < len(core) < 40
        depth = max_depth = 0
        args = []  # argument counts of the open operators
        for tok in core:
            if tok.startswith("["):
                if args:
                    args[-1] += 1
                depth += 1
                max_depth = max(max_depth, depth)
                args.append(0)
            elif tok == "]":
                assert 2 <= args.pop() <= 4
                depth -= 1
            else:
                args[-1] += 1
        # digits sit one level below the deepest operator: depth 3 = two operator levels
        assert max_depth <= 2


def paren_form(core: list[str]) -> str:
    """Re-serialise a parenthesis-free expression the way the release's to_string does."""
    pos = 0

    def node() -> object:
        nonlocal pos
        tok = core[pos]
        pos += 1
        if not tok.startswith("["):
            return int(tok)
        t: object = (tok, node())
        while core[pos] != "]":
            t = (t, node())
        pos += 1
        return (t, "]")

    def to_string(t: object) -> str:
        if isinstance(t, tuple):
            return "( " + to_string(t[0]) + " " + to_string(t[1]) + " )"
        return str(t)

    return to_string(node())


def test_official_parenthesis_format(generated: dict[str, Path]) -> None:
    for src, _ in rows(generated["val"]):
        core = [t for t in src.split() if t not in ("(", ")")]
        assert paren_form(core) == src
    assert paren_form(["[MAX", "2", "9", "]"]) == "( ( ( [MAX 2 ) 9 ) ] )"


def test_split_sizes(generated: dict[str, Path]) -> None:
    sizes = {split: len(rows(p)) for split, p in generated.items()}
    assert sizes == {"train": 40, "val": 6, "test": 5}
    assert generated["train"].name == "basic_train-40.tsv"


def test_deterministic_per_seed_and_prefix_stable(tmp_path: Path) -> None:
    cfg = lo.ListOpsConfig(min_len=30, max_len=120, n_train=25, n_val=0, n_test=0, seed=5)
    a = lo.ensure_listops_files(tmp_path / "a", cfg, splits=("train",))["train"]
    b = lo.ensure_listops_files(tmp_path / "b", cfg, splits=("train",))["train"]
    assert a.read_bytes() == b.read_bytes()
    other = lo.ListOpsConfig(min_len=30, max_len=120, n_train=25, n_val=0, n_test=0, seed=6)
    c = lo.ensure_listops_files(tmp_path / "a", other, splits=("train",))["train"]
    assert c.parent != a.parent and rows(c) != rows(a)
    small = lo.ListOpsConfig(min_len=30, max_len=120, n_train=9, n_val=0, n_test=0, seed=5)
    d = lo.ensure_listops_files(tmp_path / "a", small, splits=("train",))["train"]
    assert d.parent == a.parent and rows(d) == rows(a)[:9]
    # splits use different streams
    cfg_val = lo.ListOpsConfig(min_len=30, max_len=120, n_train=0, n_val=25, n_test=0, seed=5)
    v = lo.ensure_listops_files(tmp_path / "a", cfg_val, splits=("val",))["val"]
    assert rows(v) != rows(a)


def test_cache_is_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = lo.ListOpsConfig(min_len=20, max_len=80, n_train=5, n_val=3, n_test=2)
    first = lo.ensure_listops_files(tmp_path, cfg)
    assert (first["train"].parent / "params.json").exists()
    assert not list(first["train"].parent.glob(".*.tmp"))  # atomic writes leave no temp

    def boom(*args: object) -> None:
        raise AssertionError("regenerated although cached")

    monkeypatch.setattr(lo, "write_split", boom)
    assert lo.ensure_listops_files(tmp_path, cfg) == first


def test_bad_config() -> None:
    with pytest.raises(DataError):
        lo.ListOpsConfig(min_len=100, max_len=50)
    with pytest.raises(DataError):
        lo.ListOpsConfig(max_depth=1)


# ------------------------------------------------------------------ reader and datasets

OFFICIAL = (
    "Source\tTarget\r\n"
    "( ( ( [MAX 2 ) 9 ) ] )\t9\r\n"
    "( ( ( ( [MIN 5 ) ( ( ( [SM 8 ) 9 ) ] ) ) 6 ) ] )\t5\r\n"
    "( ( ( ( ( [MED 1 ) 2 ) 3 ) 4 ) ] )\t2\r\n"
)


def write_release(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for split in lo.SPLITS:
        (root / f"basic_{split}.tsv").write_bytes(OFFICIAL.encode())
    return root


def test_read_official_file(tmp_path: Path) -> None:
    path = write_release(tmp_path / "listops-1000") / "basic_train.tsv"
    seqs, labels = lo.read_listops_tsv(path)
    assert labels.tolist() == [9, 5, 2]
    assert lo.detokenize(seqs[0]) == "[MAX 2 9 ]"
    assert lo.detokenize(seqs[1]) == "[MIN 5 [SM 8 9 ] 6 ]"
    # fixed vocabulary: digits 1..10, [MIN [MAX [MED [SM 11..14, ] 15
    assert seqs[0].tolist() == [12, 3, 10, 15]
    assert seqs[2].tolist() == [13, 2, 3, 4, 5, 15]
    full, _ = lo.read_listops_tsv(path, keep_parens=True)
    assert lo.detokenize(full[0]) == "( ( ( [MAX 2 ) 9 ) ] )"
    assert full[0].tolist() == [16, 16, 16, 12, 3, 17, 10, 17, 15, 17]


def test_read_lf_without_header_and_blank_lines(tmp_path: Path) -> None:
    path = tmp_path / "x.tsv"
    path.write_text("[MAX 2 9 ]\t9\n\n[SM 5 7 ]\t2\n\n")
    seqs, labels = lo.read_listops_tsv(path)
    assert labels.tolist() == [9, 2]
    assert [lo.detokenize(s) for s in seqs] == ["[MAX 2 9 ]", "[SM 5 7 ]"]


def test_read_small_chunks_equals_one_chunk(generated: dict[str, Path]) -> None:
    path = generated["train"]
    whole, labels = lo.read_listops_tsv(path)
    parts, labels2 = lo.read_listops_tsv(path, chunk_bytes=1000)  # rows span many chunks
    assert np.array_equal(whole.flat, parts.flat) and np.array_equal(labels, labels2)
    for (src, label), seq, lab in zip(rows(path), whole, labels, strict=True):
        assert np.array_equal(seq, lo.tokenize(src)) and lab == label


def test_read_rejects_garbage(tmp_path: Path) -> None:
    bad = tmp_path / "bad.tsv"
    bad.write_text("Source\tTarget\n[MAX 2 x ]\t3\n")
    with pytest.raises(DataError, match="unknown token"):
        lo.read_listops_tsv(bad)
    bad.write_text("Source\tTarget\n[MAX 2 9 ] 9\n")
    with pytest.raises(DataError, match="TAB"):
        lo.read_listops_tsv(bad)


def test_load_official_folder_and_collate(tmp_path: Path) -> None:
    task = lo.load_listops(write_release(tmp_path / "rel"), max_len=5)
    assert (task.vocab_size, task.num_classes) == (18, 10)
    assert len(task.train) == len(task.val) == len(task.test) == 3
    ids, label = task.train[1]
    assert ids.dtype == torch.long and ids.shape == (8,) and label == 5
    batch = task.collate([task.train[i] for i in range(3)])
    ids, mask, labels = batch
    assert ids.shape == mask.shape == (3, 5)  # truncated to max_len
    assert labels.tolist() == [9, 5, 2]
    assert mask.sum(1).tolist() == [4, 5, 5]
    assert ids[0].tolist() == [12, 3, 10, 15, 0]  # padded with id 0
    assert mask[0].tolist() == [True, True, True, True, False]


def test_load_generated(tmp_path: Path) -> None:
    cfg = lo.ListOpsConfig(min_len=10, max_len=50, n_train=8, n_val=4, n_test=3)
    task = lo.load_listops(cache_dir=tmp_path, config=cfg, pad_to_max_len=True, max_len=64)
    assert (len(task.train), len(task.val), len(task.test)) == (8, 4, 3)
    ids, mask, labels = task.collate([task.val[i] for i in range(4)])
    assert ids.shape == (4, 64)
    for row in range(4):
        n = int(mask[row].sum())
        assert 10 < n < 50
        assert lo.evaluate(lo.detokenize(ids[row, :n].numpy())) == labels[row]
        assert (ids[row, n:] == 0).all()


@pytest.mark.parametrize("damage", [b"garbage\tnot a label\n", b""])
def test_damaged_cache_file_is_generated_again(tmp_path, caplog, damage) -> None:
    cfg = lo.ListOpsConfig(min_len=10, max_len=50, n_train=8, n_val=4, n_test=3)
    before = lo.load_listops(cache_dir=tmp_path, config=cfg)
    (path,) = tmp_path.glob("listops-*/basic_val-4.tsv")
    path.write_bytes(damage)
    after = lo.load_listops(cache_dir=tmp_path, config=cfg)
    assert f"{path}: cache file cannot be read" in caplog.text
    for i in range(4):
        assert np.array_equal(after.val[i][0].numpy(), before.val[i][0].numpy())
        assert after.val[i][1] == before.val[i][1]


def test_missing_paths(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        lo.load_listops(tmp_path / "nope")
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / "basic_train.tsv").write_text(OFFICIAL)
    with pytest.raises(DataError, match="basic_val.tsv"):
        lo.load_listops(tmp_path / "partial")
