"""Pathfinder: gap-tolerant connectivity, generator labels/balance/determinism, release reader."""

from __future__ import annotations

from collections import deque
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from nyscli.data import pathfinder as pf
from nyscli.data.common import DataError

CFG = pf.PathfinderConfig(n_train=24, n_val=6, n_test=4, seed=3)


@pytest.fixture(scope="module")
def chunk() -> dict[str, np.ndarray]:
    return pf.generate_chunk(CFG, "train", 0, 40)


def reference_connected(image: np.ndarray, p1: tuple, p2: tuple, gap: int) -> bool:
    """Plain BFS over drawn pixels; neighbours within Chebyshev distance gap + 1."""
    drawn = image > 0
    h, w = drawn.shape
    p1, p2 = tuple(map(int, p1)), tuple(map(int, p2))
    if not (drawn[p1] and drawn[p2]):
        return False
    seen, todo, reach = {p1}, deque([p1]), gap + 1
    while todo:
        r, c = todo.popleft()
        for dr in range(-reach, reach + 1):
            for dc in range(-reach, reach + 1):
                q = (r + dr, c + dc)
                if 0 <= q[0] < h and 0 <= q[1] < w and drawn[q] and q not in seen:
                    seen.add(q)
                    todo.append(q)
    return p2 in seen


# ------------------------------------------------------------------ endpoints_connected


def test_connectivity_on_hand_drawn_images() -> None:
    img = np.zeros((12, 16), dtype=np.uint8)
    img[5, 2:5] = 255  # dash
    img[5, 6:9] = 255  # one empty pixel (col 5) before this dash
    img[5, 11:14] = 255  # two empty pixels (cols 9, 10) before this one
    assert pf.endpoints_connected(img, (5, 2), (5, 8), gap=1)
    assert not pf.endpoints_connected(img, (5, 2), (5, 8), gap=0)
    assert not pf.endpoints_connected(img, (5, 2), (5, 13), gap=1)
    assert pf.endpoints_connected(img, (5, 2), (5, 13), gap=2)
    assert not pf.endpoints_connected(img, (5, 2), (6, 2), gap=3)  # (6, 2) is not drawn
    diag = np.zeros((6, 6), dtype=np.uint8)
    diag[np.arange(6), np.arange(6)] = 9  # 8-connectivity joins diagonal neighbours
    assert pf.endpoints_connected(diag, (0, 0), (5, 5), gap=0)
    assert not pf.endpoints_connected(diag, (0, 0), (5, 5), gap=0, threshold=9)
    # a diagonal jump over one empty pixel: Chebyshev distance 2
    hop = np.zeros((5, 5), dtype=np.uint8)
    hop[0, 0] = hop[2, 2] = 1
    assert pf.endpoints_connected(hop, (0, 0), (2, 2), gap=1)
    assert not pf.endpoints_connected(hop, (0, 0), (2, 2), gap=0)


def test_connectivity_agrees_with_reference_bfs() -> None:
    rng = np.random.default_rng(0)
    for _ in range(60):
        img = (rng.random((14, 14)) < 0.3).astype(np.uint8) * 255
        pts = np.argwhere(img > 0)
        p1, p2 = pts[rng.integers(len(pts))], pts[rng.integers(len(pts))]
        for gap in (0, 1, 2):
            assert pf.endpoints_connected(img, p1, p2, gap) == reference_connected(img, p1, p2, gap)


# ------------------------------------------------------------------ generator


def test_label_is_pixel_connectivity(chunk: dict[str, np.ndarray]) -> None:
    images, labels, ends = chunk["images"], chunk["labels"], chunk["endpoints"]
    assert images.shape == (40, 32, 32) and images.dtype == np.uint8
    assert set(np.unique(images).tolist()) == {0, 255}
    for img, label, (p1, p2) in zip(images, labels, ends, strict=True):
        assert img[tuple(p1)] == 255 and img[tuple(p2)] == 255  # markers drawn
        assert tuple(p1) != tuple(p2)
        gap = CFG.gap_pixels
        assert reference_connected(img, p1, p2, gap) == bool(label)
        assert pf.endpoints_connected(img, p1, p2, gap) == bool(label)
        # the marker discs: 3x3 squares for radius 1.5
        for r, c in (p1, p2):
            assert (img[r - 1 : r + 2, c - 1 : c + 2] == 255).all()


def test_labels_balanced(chunk: dict[str, np.ndarray]) -> None:
    labels = chunk["labels"]
    assert labels.sum() == 20
    assert (labels[0::2] + labels[1::2] == 1).all()  # every prefix balanced up to one
    assert not (labels[0::2] == labels[0]).all()  # but the order within pairs is random


def test_deterministic_and_seed_dependent(chunk: dict[str, np.ndarray]) -> None:
    again = pf.generate_chunk(CFG, "train", 0, 40)
    assert all(np.array_equal(chunk[k], again[k]) for k in chunk)
    prefix = pf.generate_chunk(CFG, "train", 0, 10)
    assert all(np.array_equal(chunk[k][:10], prefix[k]) for k in chunk)
    other = pf.generate_chunk(pf.PathfinderConfig(seed=4), "train", 0, 10)
    assert not np.array_equal(other["images"], prefix["images"])
    val = pf.generate_chunk(CFG, "val", 0, 10)
    assert not np.array_equal(val["images"], prefix["images"])


def test_difficulty_sets_target_length() -> None:
    rng = np.random.default_rng(1)
    for length in (6, 14):
        cv = pf._Canvas(pf.PathfinderConfig(contour_length=length))
        targets = None
        while targets is None:
            targets = pf._targets(rng, cv)
        assert [len(t.dashes) for t in targets] == [length, length]
    easy = pf.generate_chunk(pf.PathfinderConfig(contour_length=6), "train", 0, 6)
    assert easy["images"].shape == (6, 32, 32)


def test_other_image_size() -> None:
    cfg = pf.PathfinderConfig(image_size=48, contour_length=9, seed=2)
    out = pf.generate_chunk(cfg, "test", 0, 6)
    assert out["images"].shape == (6, 48, 48)
    for img, label, (p1, p2) in zip(out["images"], out["labels"], out["endpoints"], strict=True):
        assert reference_connected(img, p1, p2, cfg.gap_pixels) == bool(label)


def test_cached_splits_and_dataset(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    paths = pf.ensure_pathfinder_files(tmp_path, CFG)
    assert [p.name for p in paths.values()] == ["train-24.npz", "val-6.npz", "test-4.npz"]
    with np.load(paths["train"]) as z:
        assert z["images"].shape == (24, 32, 32) and z["labels"].sum() == 12
        first = z["images"][0].copy()
        first_label = int(z["labels"][0])

    def boom(*args: object, **kw: object) -> None:
        raise AssertionError("regenerated although cached")

    monkeypatch.setattr(pf, "generate_split", boom)
    task = pf.load_pathfinder(config=CFG, cache_dir=tmp_path)
    assert (len(task.train), len(task.val), len(task.test)) == (24, 6, 4)
    assert (task.vocab_size, task.num_classes) == (256, 2)
    ids, label = task.train[0]
    assert ids.shape == (1024,) and label == first_label
    assert np.array_equal(ids.numpy().reshape(32, 32), first)
    ids, mask, labels = task.collate([task.train[i] for i in range(3)])
    assert ids.shape == (3, 1024) and bool(mask.all())


@pytest.mark.parametrize("damage", ["truncated", "missing_array"])
def test_damaged_cache_file_is_generated_again(tmp_path, caplog, damage) -> None:
    path = pf.ensure_pathfinder_files(tmp_path, CFG)["val"]
    before = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(before[: len(before) // 2])
    else:
        np.savez(path.open("wb"), images=np.zeros((6, 32, 32), np.uint8))  # no labels
    task = pf.load_pathfinder(config=CFG, cache_dir=tmp_path)
    assert f"{path}: cache file cannot be read" in caplog.text
    assert path.read_bytes() == before and len(task.val) == 6


def test_bad_difficulty() -> None:
    with pytest.raises(DataError, match="difficulty"):
        pf.load_pathfinder(difficulty="medium")


# ------------------------------------------------------------------ release reader


def write_png(path: Path, array: np.ndarray) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(array, mode="L").save(path)


def fake_release(root: Path, binary_meta: bool = False) -> list[tuple[np.ndarray, int]]:
    """pathfinder32/curv_contour_length_14: metadata 0, 2, 10 (read in numeric order, not
    0, 10, 2), 10 images and 1 empty PNG (which LRA drops)."""
    d = root / "curv_contour_length_14"
    rng = np.random.default_rng(0)
    expected = []
    for batch, count in ((0, 3), (2, 4), (10, 4)):
        lines = []
        for i in range(count):
            name = f"sample_{i}.png"
            path = d / "imgs" / str(batch) / name
            label = int(rng.integers(0, 2))
            if batch == 2 and i == 1:  # the release has a zero-byte PNG; LRA drops it
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(b"")
            else:
                img = rng.integers(0, 256, (32, 32), dtype=np.uint8)
                write_png(path, img)
                expected.append((img, label))
            lines.append([f"imgs/{batch}", name, str(i), str(label), "1.0", "14", "4", "2"])
        meta = d / "metadata" / f"{batch}.npy"
        meta.parent.mkdir(parents=True, exist_ok=True)
        if binary_meta:
            np.save(meta, np.array(lines))
        else:
            meta.write_text("".join(" ".join(row) + "\n" for row in lines))
    return expected


def test_read_release_text_metadata(tmp_path: Path) -> None:
    expected = fake_release(tmp_path / "pathfinder32")
    images, labels = pf.read_pathfinder_release(tmp_path / "pathfinder32", "hard")
    assert images.shape == (10, 32, 32)
    for (img, label), got, got_label in zip(expected, images, labels, strict=True):
        assert np.array_equal(img, got) and label == got_label
    # the difficulty folder itself works too
    images2, _ = pf.read_pathfinder_release(tmp_path / "pathfinder32" / "curv_contour_length_14")
    assert np.array_equal(images, images2)


def test_read_release_binary_metadata(tmp_path: Path) -> None:
    expected = fake_release(tmp_path / "pf", binary_meta=True)
    images, labels = pf.read_pathfinder_release(tmp_path / "pf", "curv_contour_length_14")
    assert labels.tolist() == [lab for _, lab in expected]


def test_load_release_splits_80_10_10(tmp_path: Path) -> None:
    expected = fake_release(tmp_path / "pf32")
    task = pf.load_pathfinder(tmp_path / "pf32", difficulty="hard", cache_dir=tmp_path / "c")
    assert (len(task.train), len(task.val), len(task.test)) == (8, 1, 1)
    ids, label = task.test[0]
    assert np.array_equal(ids.numpy().reshape(32, 32), expected[9][0])
    assert label == expected[9][1]
    # second load comes from the decoded cache
    assert len(list((tmp_path / "c").glob("pathfinder-release-*/all.npz"))) == 1
    again = pf.load_pathfinder(tmp_path / "pf32", difficulty="hard", cache_dir=tmp_path / "c")
    assert np.array_equal(again.train[3][0].numpy(), task.train[3][0].numpy())


def test_release_errors(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        pf.load_pathfinder(tmp_path / "missing")
    fake_release(tmp_path / "pf")
    with pytest.raises(DataError, match="curv_baseline/metadata"):
        pf.read_pathfinder_release(tmp_path / "pf", "easy")
    (tmp_path / "pf" / "curv_contour_length_14" / "imgs" / "10" / "sample_3.png").unlink()
    with pytest.raises(DataError, match="missing"):
        pf.read_pathfinder_release(tmp_path / "pf", "hard")
