"""LRA Pathfinder: a generator of dashed-contour images, a pixel connectivity check, a reader.

The task (Linsley et al. 2018; LRA's 32x32 version): an image holds two round markers and
several dashed, curvy contours; the label is 1 iff the markers sit on the two ends of one
contour. Images become sequences of H * W pixel values (ids 0..255, vocabulary 256).

Generator (modelled on drewlinsley/pathfinder ``snakes2.py``, which made the release):

* Two *target* contours of ``contour_length`` dashes grow from seeds ``seed_distance`` pixels
  apart (the first seed away from the border, as in the release). A dash is a straight run
  of ``dash_length`` pixels; the next starts ``dash_gap`` pixels further on. Its heading is
  drawn, as in the release, among candidate turns in (-pi/2c, pi/2c) that fit, weighted by
  ``cos(c * turn) ** 2`` with c = ``continuity`` (1.0 at 32x32 in the release). A contour that
  runs into a dead end backtracks a few dashes before the attempt is given up.
* One marker goes on the seed (origin) of target A; the other on the far end (terminal) of
  A (label 1) or of B (label 0). So in both classes one marker is on a contour end near
  the other contour's origin, as in the release.
* ``num_distractors`` shorter contours of ``distractor_length`` dashes fill the free space
  (release: ``contour_length // 3`` dashes, ``20 // distractor_length`` of them; a distractor
  that finds no room is dropped, as with the release's ``allow_incomplete``).
* Difficulty is the release's knob, the target length in dashes: 6 (``curv_baseline``,
  "easy"), 9 (``curv_contour_length_9``) and 14 (``curv_contour_length_14``, "hard", default).
* Pixels are 0 (background) or 255 (dash or marker); there is no anti-aliasing.

Connectivity and labels: rounding a step of g pixels moves at most ceil(g) pixels per axis,
so consecutive dashes of one contour leave at most ``gap_pixels = ceil(dash_gap) - 1`` empty
pixels between them (1 by default). :func:`endpoints_connected` flood-fills over drawn
pixels only, letting a step jump up to ``gap`` empty pixels (Chebyshev distance
``gap + 1``). While drawing, different contours (and marker discs) are kept at Chebyshev
distance >= ``gap_pixels + 2``, so the fill can never jump from one contour to another; each
finished image is still checked and regenerated if its pixel connectivity disagrees with
its label. Labels are balanced in every prefix up to one: samples 2j and 2j + 1 get
opposite labels in random order.

Cost: about 2.5 / 3 / 4.5 ms of CPU per image for contour length 6 / 9 / 14 (measured on a
shared 2-core machine; 10.4 ms for 1000 hard images with the same 2 cores under a load of
~9.5), so the release-sized 200k hard images take 15-35 CPU-minutes, i.e. 8-17 minutes with
2 workers on 2 free cores, once (a progress bar counts them). Chunks of 1000 images are
seeded independently (``default_rng([seed, split, chunk])``) and ``workers`` processes
generate them in parallel with identical results. Splits are cached as ``.npz``; a split of
n images is a prefix of the same split with more.

Release layout (``lra_release/pathfinder32/``; read by the release's TFDS builder and by
state-spaces/s4): ``<root>/<difficulty>/metadata/<n>.npy`` with ``<difficulty>`` one of
``curv_baseline``, ``curv_contour_length_9``, ``curv_contour_length_14``. Despite the suffix
each metadata file is *text*: one line per image, fields separated by single spaces,
``<subdir> <filename> <index> <label> <continuity> <contour_length> ...``, e.g.
``imgs/0 sample_0.png 0 1 1.0 14 4 2 0.5 1 1``; the image is
``<root>/<difficulty>/<subdir>/<filename>`` (a grayscale PNG). The LRA pipeline drops
zero-byte PNGs (one exists in the release) and splits each difficulty 80/10/10 in order;
this reader does the same. A real ``np.save`` file (binary header ``\\x93NUMPY``) of the same
rows is accepted too.
"""

from __future__ import annotations

import logging
import math
import multiprocessing
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import numpy as np

from nyscli.data.choices import DIFFICULTY_CONTOUR_LENGTH
from nyscli.data.common import (
    SPLITS,
    ClassificationCollate,
    DataError,
    GeneratorConfig,
    TaskData,
    atomic_save_npz,
    ensure_generated,
    image_dataset,
    keyed_cache_dir,
    progress_bar,
    read_cached,
    read_generated_splits,
    reading,
    require_path,
    split_counts,
)

log = logging.getLogger(__name__)

VOCAB_SIZE = 256
NUM_CLASSES = 2
CHUNK = 1000  # samples per independently seeded chunk (even, so each chunk is balanced)
DIFFICULTY_DIRS = {
    "easy": "curv_baseline",
    "intermediate": "curv_contour_length_9",
    "hard": "curv_contour_length_14",
}
INK = 255
N_TURNS = 24  # candidate headings per dash


@dataclass(frozen=True)
class PathfinderConfig(GeneratorConfig):
    """Generation parameters; defaults follow the release's 32x32 "hard" settings."""

    n_train: int = 160_000
    n_val: int = 20_000
    n_test: int = 20_000
    image_size: int = 32
    contour_length: int = 14
    dash_length: float = 2.0
    dash_gap: float = 2.0
    continuity: float = 1.0
    marker_radius: float = 1.5
    seed_distance: float = 7.0
    distractor_length: int | None = None  # None: max(1, contour_length // 3)
    num_distractors: int | None = None  # None: 20 // distractor_length
    padding: int = 1
    FORMAT: ClassVar[str] = "nyscli-pathfinder-v1"

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.image_size < 16 or self.contour_length < 1 or self.dash_length <= 0:
            raise DataError(
                "pathfinder: need image_size >= 16, contour_length >= 1, dash_length > 0"
            )
        if self.dash_gap < 0 or self.marker_radius < 0 or self.seed_distance <= 0:
            raise DataError("pathfinder: dash_gap, marker_radius, seed_distance must be positive")

    @property
    def gap_pixels(self) -> int:
        """Most empty pixels between consecutive dashes of one contour."""
        return max(math.ceil(self.dash_gap) - 1, 0)

    @property
    def n_distractor_dashes(self) -> int:
        return self.distractor_length or max(1, self.contour_length // 3)

    @property
    def n_distractor_contours(self) -> int:
        if self.num_distractors is not None:
            return self.num_distractors
        return 20 // self.n_distractor_dashes


# --------------------------------------------------------------------------- connectivity


def dilate(mask: np.ndarray, radius: int) -> np.ndarray:
    """Chebyshev dilation of a bool (H, W) mask by ``radius`` (a (2r+1)^2 square), separably."""
    out = mask.copy()
    for axis in (0, 1):
        src = out.copy()
        for s in range(1, radius + 1):
            if axis == 0:
                out[s:] |= src[:-s]
                out[:-s] |= src[s:]
            else:
                out[:, s:] |= src[:, :-s]
                out[:, :-s] |= src[:, s:]
    return out


def endpoints_connected(
    image: np.ndarray, p1: Iterable[int], p2: Iterable[int], gap: int = 1, threshold: int = 0
) -> bool:
    """Whether pixels ``p1`` and ``p2`` ((row, col)) are joined by a chain of drawn pixels.

    Drawn = ``image > threshold`` (image (H, W)). Consecutive pixels of the chain may be up to
    ``gap + 1`` apart in Chebyshev distance, i.e. the chain may jump over at most ``gap``
    empty pixels (the gaps between dashes); ``gap = 0`` is plain 8-connectivity. A flood fill
    over drawn pixels only, so two contours merge only if they come within ``gap + 1``.
    False if either point is not drawn.
    """
    img = np.asarray(image)
    if img.ndim != 2:
        raise ValueError(f"image must be (H, W), got {img.shape}")
    (r1, c1), (r2, c2) = (tuple(int(v) for v in p) for p in (p1, p2))
    drawn = img > threshold
    if not (drawn[r1, c1] and drawn[r2, c2]):
        return False
    reach = gap + 1
    h, w = drawn.shape
    # Pad by `reach` so every neighbour offset stays inside the flat array.
    stride = w + 2 * reach
    padded = np.zeros((h + 2 * reach, stride), dtype=bool)
    padded[reach : reach + h, reach : reach + w] = drawn
    flat = padded.ravel()
    span = range(-reach, reach + 1)
    offsets = np.array([dr * stride + dc for dr in span for dc in span if dr or dc])
    start = (r1 + reach) * stride + c1 + reach
    goal = (r2 + reach) * stride + c2 + reach
    seen = np.zeros_like(flat)
    seen[start] = True
    frontier = np.array([start])
    while frontier.size and not seen[goal]:
        nb = (frontier[:, None] + offsets).ravel()
        nb = np.unique(nb[flat[nb] & ~seen[nb]])
        seen[nb] = True
        frontier = nb
    return bool(seen[goal])


# --------------------------------------------------------------------------- generation


class _Canvas:
    """Geometry shared by the contours of one image size: bounds, marker disc, dash sampling."""

    def __init__(self, cfg: PathfinderConfig) -> None:
        self.cfg = cfg
        self.size = cfg.image_size
        # Pixels of different contours stay >= gap + 2 apart (Chebyshev), one more than the
        # jump endpoints_connected allows, so they are never joined by it.
        self.halo = cfg.gap_pixels + 1
        m = int(math.floor(cfg.marker_radius))
        # Every contour pixel may end up under a marker, so keep a disc's room to the border.
        self.lo, self.hi = cfg.padding + m, self.size - 1 - cfg.padding - m
        r2 = cfg.marker_radius**2 + 1e-9
        span = range(-m, m + 1)
        self.disc = [(dr, dc) for dr in span for dc in span if dr * dr + dc * dc <= r2]
        # Points every <= 0.5 px along a dash; rounded, they give its pixels.
        n_steps = max(2, math.ceil(cfg.dash_length / 0.5))
        self.steps = np.linspace(0.0, cfg.dash_length, n_steps + 1)
        self.steps_after_gap = self.steps + cfg.dash_gap
        # Candidate dashes are tested on a padded grid so that no index can leave it.
        self.pad = math.ceil(cfg.dash_length + cfg.dash_gap) + 2
        self.wide = self.size + 2 * self.pad
        self.offset = self.pad * (self.wide + 1)  # flat index of image pixel (0, 0)
        self.disc_flat = np.array([dr * self.wide + dc for dr, dc in self.disc])
        # Candidate headings: N_TURNS turns over (-pi / 2c, pi / 2c) after a dash, any
        # heading for a first dash; both grids are shifted by one random jitter per draw.
        k = N_TURNS
        half = math.pi / (2 * cfg.continuity)
        self.turn_step = 2 * half / k
        self.turn_grid = -half + np.arange(k) * self.turn_step
        self.heading_step = 2 * math.pi / k
        self.heading_grid = np.arange(k) * self.heading_step
        self.ones = np.ones(k)

    def inside(self, r: int, c: int) -> bool:
        return self.lo <= r <= self.hi and self.lo <= c <= self.hi

    def disc_at(self, r: int, c: int) -> list[tuple[int, int]]:
        return [(r + dr, c + dc) for dr, dc in self.disc]

    def mask(self, pixels: Iterable[tuple[int, int]]) -> np.ndarray:
        m = np.zeros((self.size, self.size), dtype=bool)
        for r, c in pixels:
            m[r, c] = True
        return m

    def padded(self, grid: np.ndarray, border: bool) -> np.ndarray:
        """(wide, wide) copy of ``grid`` (H, W) in the middle of a padding of False.

        With ``border`` everything outside the drawable square [lo, hi]^2 is True instead.
        """
        out = np.zeros((self.wide, self.wide), dtype=bool)
        q = self.pad
        out[q : q + self.size, q : q + self.size] = grid
        if border:
            inner = out[q + self.lo : q + self.hi + 1, q + self.lo : q + self.hi + 1].copy()
            out[:] = True
            out[q + self.lo : q + self.hi + 1, q + self.lo : q + self.hi + 1] = inner
        return out


class _Snake:
    """One contour grown dash by dash, with backtracking when it runs into a dead end.

    ``forbid`` (H, W) bool marks pixels too close to other contours. Placement tests use
    ``blocked``: ``forbid``, the image border, and pixels next to this contour's dashes older
    than the previous one (no self-touching).

    Each next dash is chosen like the release does it: among N_TURNS candidate headings
    spread over (-pi / 2c, pi / 2c) around the current one (randomly jittered), the ones
    whose pixels fit are weighted by ``cos(c * turn) ** 2`` (c = continuity) and one is
    drawn. All candidates are tested at once with numpy.
    """

    def __init__(
        self, cv: _Canvas, origin: tuple[int, int], forbid: np.ndarray, mark_end: bool = False
    ) -> None:
        self.cv = cv
        self.origin = origin
        self.forbid = forbid
        self.blocked = cv.padded(forbid, border=True).ravel()  # flat (wide * wide,)
        # A contour whose terminal may carry a marker keeps the marker disc clear of others.
        self._forbid_wide = cv.padded(forbid, border=False).ravel() if mark_end else None
        self._n = 0
        self.dashes: list[list[tuple[int, int]]] = []
        self.end = (float(origin[0]), float(origin[1]))
        self.theta = 0.0
        self._undo: list[tuple[tuple[float, float], float, np.ndarray]] = []

    def _candidates(
        self, rng: np.random.Generator
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Candidate dashes: headings (K,), pixel rows and cols (K, P), weights (K,)."""
        cv = self.cv
        if self.dashes:
            turns = cv.turn_grid + rng.random() * cv.turn_step
            theta = self.theta + turns
            weight = np.cos(cv.cfg.continuity * turns)
            weight *= weight
            along = cv.steps_after_gap
        else:  # first dash: any heading, from the seed itself
            theta = cv.heading_grid + rng.random() * cv.heading_step
            weight = cv.ones
            along = cv.steps
        rows = np.rint(self.end[0] + np.sin(theta)[:, None] * along).astype(np.intp)
        cols = np.rint(self.end[1] + np.cos(theta)[:, None] * along).astype(np.intp)
        flat = rows * cv.wide + cols + cv.offset
        ok = ~self.blocked[flat].any(axis=1)
        if self._forbid_wide is not None and len(self.dashes) == self._n - 1:
            disc = flat[:, -1:] + cv.disc_flat  # (K, D): marker disc at the last pixel
            ok &= ~self._forbid_wide[disc].any(axis=1)
        return theta, rows, cols, weight * ok

    def _place(self, rng: np.random.Generator) -> bool:
        theta, rows, cols, weight = self._candidates(rng)
        cum = np.cumsum(weight)
        if cum[-1] <= 0:
            return False
        # x < cum[-1], so the first index with cum > x exists and has a positive weight.
        pick = int(np.searchsorted(cum, rng.random() * cum[-1], "right"))
        pixels: list[tuple[int, int]] = []
        for p in zip(rows[pick].tolist(), cols[pick].tolist(), strict=True):
            if not pixels or pixels[-1] != p:
                pixels.append(p)
        self._undo.append((self.end, self.theta, self.blocked.copy()))
        if self.dashes:  # the previous dash becomes "old" for the next one
            grid = self.blocked.reshape(self.cv.wide, self.cv.wide)
            q = self.cv.pad
            for r, c in self.dashes[-1]:
                grid[q + r - 1 : q + r + 2, q + c - 1 : q + c + 2] = True
        cfg = self.cv.cfg
        step = cfg.dash_length + (cfg.dash_gap if self.dashes else 0.0)
        self.dashes.append(pixels)
        self.theta = float(theta[pick])
        self.end = (
            self.end[0] + step * math.sin(self.theta),
            self.end[1] + step * math.cos(self.theta),
        )
        return True

    def _pop(self) -> None:
        self.end, self.theta, self.blocked = self._undo.pop()
        self.dashes.pop()

    def grow(self, n: int, rng: np.random.Generator, tries: int = 3, budget: int = 60) -> bool:
        """Draw ``n`` dashes from the origin, depth-first: a dead end retries the dash before
        it (up to ``tries`` times per dash). False if ``budget`` placements do not suffice."""
        used = [0] * n
        self._n = n
        while len(self.dashes) < n:
            level = len(self.dashes)
            if used[level] >= tries or budget <= 0:
                if level == 0 or budget <= 0:
                    return False
                used[level] = 0
                self._pop()
                continue
            used[level] += 1
            budget -= 1
            self._place(rng)
        return True

    @property
    def terminal(self) -> tuple[int, int]:
        return self.dashes[-1][-1]

    def pixels(self) -> list[tuple[int, int]]:
        return [p for d in self.dashes for p in d]


def _targets(rng: np.random.Generator, cv: _Canvas) -> tuple[_Snake, _Snake] | None:
    """The two target contours from seeds ``seed_distance`` apart; None if they don't fit.

    As in the release the first seed is drawn away from the border (``2 * seed_distance``
    where the image allows it), the second on a circle of radius ``seed_distance`` around it.
    A grows first; B keeps clear of A's pixels and of both of A's end discs, and B's own end
    discs keep clear of A (any end may carry a marker).
    """
    cfg = cv.cfg
    margin = min(int(2 * cfg.seed_distance), cv.size // 2 - 2)
    lo, hi = max(cv.lo, margin), min(cv.hi, cv.size - 1 - margin)
    ya, xa = (int(v) for v in rng.integers(lo, hi + 1, 2))
    a = _Snake(cv, (ya, xa), np.zeros((cv.size, cv.size), dtype=bool))
    if not a.grow(cfg.contour_length, rng):
        return None
    b_forbid = dilate(cv.mask(a.pixels() + cv.disc_at(ya, xa) + cv.disc_at(*a.terminal)), cv.halo)
    # B's seed is re-drawn on the circle a few times before A is given up (saves A's work).
    for _ in range(4):
        phi = rng.uniform(0, 2 * math.pi)
        yb = round(ya + cfg.seed_distance * math.sin(phi))
        xb = round(xa + cfg.seed_distance * math.cos(phi))
        if not cv.inside(yb, xb) or any(b_forbid[p] for p in cv.disc_at(yb, xb)):
            continue
        b = _Snake(cv, (yb, xb), b_forbid, mark_end=True)
        if b.grow(cfg.contour_length, rng):
            return a, b
    return None


def _add_distractors(rng: np.random.Generator, cv: _Canvas, occupied: np.ndarray) -> None:
    """Draw up to n distractor contours clear of everything in ``occupied`` (updated).

    A contour that does not fit is dropped (the release's ``allow_incomplete``); at most
    2n seeds are tried in all, so a crowded image does not cost much time.
    """
    cfg = cv.cfg
    width = cv.hi - cv.lo + 1
    placed, attempts = 0, 0
    while placed < cfg.n_distractor_contours and attempts < 2 * cfg.n_distractor_contours:
        attempts += 1
        forbid = dilate(occupied, cv.halo)
        free = np.flatnonzero(~forbid[cv.lo : cv.hi + 1, cv.lo : cv.hi + 1])
        if free.size == 0:
            return
        cell = int(free[rng.integers(free.size)])
        snake = _Snake(cv, (cv.lo + cell // width, cv.lo + cell % width), forbid)
        if snake.grow(cfg.n_distractor_dashes, rng, tries=1):
            for r, c in snake.pixels():
                occupied[r, c] = True
            placed += 1


def _sample(
    rng: np.random.Generator, cfg: PathfinderConfig, label: int
) -> tuple[np.ndarray, tuple[int, int], tuple[int, int]]:
    """One image (H, W) uint8 with ``label`` and its two marker centres (row, col)."""
    cv = _Canvas(cfg)
    for _ in range(2_000):
        targets = _targets(rng, cv)
        if targets is None:
            continue
        a, b = targets if rng.random() < 0.5 else targets[::-1]  # a carries the origin marker
        end = a.terminal if label == 1 else b.terminal
        end_disc = cv.disc_at(*end)
        occupied = cv.mask(a.pixels() + b.pixels() + cv.disc_at(*a.origin) + end_disc)
        _add_distractors(rng, cv, occupied)
        image = np.where(occupied, INK, 0).astype(np.uint8)
        # Construction guarantees the label; the pixel check guards the construction.
        if endpoints_connected(image, a.origin, end, gap=cfg.gap_pixels) == bool(label):
            return image, a.origin, end
    raise DataError("pathfinder: could not place the contours; lower contour_length")


def generate_chunk(cfg: PathfinderConfig, split: str, chunk: int, count: int = CHUNK) -> dict:
    """The first ``count`` samples of chunk ``chunk`` of ``split`` (deterministic).

    Returns ``{"images": (count, H, W) uint8, "labels": (count,) int64,
    "endpoints": (count, 2, 2) int16}`` (marker centres as (row, col)). Samples 2j and
    2j + 1 have opposite labels, so any prefix is balanced up to one.
    """
    rng = np.random.default_rng([cfg.seed, SPLITS.index(split), chunk])
    first = rng.integers(0, 2, (CHUNK + 1) // 2)
    labels = np.stack([first, 1 - first], axis=1).reshape(-1)[:count].astype(np.int64)
    size = cfg.image_size
    images = np.zeros((count, size, size), dtype=np.uint8)
    endpoints = np.zeros((count, 2, 2), dtype=np.int16)
    for i, label in enumerate(labels):
        images[i], p1, p2 = _sample(rng, cfg, int(label))
        endpoints[i] = (p1, p2)
    return {"images": images, "labels": labels, "endpoints": endpoints}


def _chunk_job(args: tuple[PathfinderConfig, str, int, int]) -> dict:
    return generate_chunk(*args)


def _quiet_worker() -> None:
    """A generator worker leaves stopping to the parent: Ctrl-C (sent to the whole terminal
    group) is ignored, SIGTERM (the parent's pool ending) kills it without a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def generate_split(cfg: PathfinderConfig, split: str, workers: int = 1) -> dict:
    """All ``cfg.split_size(split)`` samples of ``split`` as in :func:`generate_chunk`.

    Chunks are independent, so ``workers > 1`` runs them in processes with the same result.
    A progress bar counts the images.
    """
    n = cfg.split_size(split)
    jobs = [(cfg, split, c, min(CHUNK, n - c * CHUNK)) for c in range(-(-n // CHUNK))]
    parts = []
    with progress_bar(f"pathfinder: generating {split}", n) as advance:
        if workers > 1 and len(jobs) > 1:
            # The platform's default start method (fork on Linux): the workers run numpy only,
            # never torch, and fork also works from notebooks and unguarded scripts. A Pool, not
            # a ProcessPoolExecutor: leaving its block (Ctrl-C, SIGTERM) terminates the workers
            # at once, where the executor would first run every queued chunk to the end.
            with multiprocessing.Pool(min(workers, len(jobs)), _quiet_worker) as pool:
                for part in pool.imap(_chunk_job, jobs):  # in order, as chunks finish
                    parts.append(part)
                    advance(len(part["labels"]))
        else:
            for job in jobs:
                parts.append(_chunk_job(job))
                advance(job[3])
    size = cfg.image_size
    if not parts:
        return {
            "images": np.zeros((0, size, size), np.uint8),
            "labels": np.zeros(0, np.int64),
            "endpoints": np.zeros((0, 2, 2), np.int16),
        }
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}


def ensure_pathfinder_files(
    cache_dir: str | os.PathLike[str] | None = None,
    cfg: PathfinderConfig | None = None,
    splits: tuple[str, ...] = SPLITS,
    workers: int = 1,
) -> dict[str, Path]:
    """Paths of generated ``<split>-<n>.npz`` files, generating only the missing ones.

    Files live in ``<cache_dir>/pathfinder-<hash of generation params>/`` and hold
    ``images`` (n, H, W) uint8, ``labels`` (n,) int64 and ``endpoints`` (n, 2, 2) int16.
    """
    cfg = cfg or PathfinderConfig()

    def make(path: Path, split: str) -> None:
        started = time.perf_counter()
        atomic_save_npz(path, **generate_split(cfg, split, workers))
        log.info(
            "pathfinder: generated %d %s images in %.0f s (%d worker%s) -> %s",
            cfg.split_size(split), split, time.perf_counter() - started, workers,
            "" if workers == 1 else "s", path,
        )  # fmt: skip

    return ensure_generated(
        cache_dir, "pathfinder", cfg, splits, lambda split, n: f"{split}-{n}.npz", make
    )


# --------------------------------------------------------------------------- release reader


def _difficulty_dir(root: Path, difficulty: str) -> Path:
    """``root`` itself if it holds ``metadata/``, else ``root/<release dir of difficulty>``."""
    if (root / "metadata").is_dir():
        return root
    name = DIFFICULTY_DIRS.get(difficulty, difficulty)
    d = root / name
    if not (d / "metadata").is_dir():
        raise DataError(
            f"data.path={root}: no {name}/metadata/ folder; expected the release's pathfinder32 "
            f"folder (with {', '.join(DIFFICULTY_DIRS.values())}) or one of those folders"
        )
    return d


def read_metadata(path: Path) -> list[list[str]]:
    """Rows of one metadata file: text lines split on whitespace, or a binary ``np.save``."""
    with reading(path, "data.path", "a Pathfinder metadata file"):
        raw = path.read_bytes()
        if raw.startswith(b"\x93NUMPY"):
            import io

            arr = np.load(io.BytesIO(raw), allow_pickle=False)
            return [[str(v) for v in row] for row in np.atleast_2d(arr)]
        return [line.split() for line in raw.decode("utf-8").splitlines() if line.strip()]


def _meta_key(p: Path) -> tuple[int, int | str]:
    return (0, int(p.stem)) if p.stem.isdigit() else (1, p.stem)


def read_pathfinder_release(
    root: str | os.PathLike[str], difficulty: str = "hard"
) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, H, W) uint8 and labels (N,) int64 of one release difficulty, in order.

    ``root`` is the release's ``pathfinder32`` (or 64, ...) folder or a difficulty folder;
    ``difficulty`` is easy/intermediate/hard or a folder name. Metadata files are read in
    numeric order; zero-byte PNGs are skipped as in LRA.
    """
    from PIL import Image  # Pillow ships with matplotlib, a project dependency

    base = require_path(root, "the LRA pathfinder32 folder (curv_*/metadata/*.npy + PNGs)")
    d = _difficulty_dir(base, difficulty)
    metas = sorted((d / "metadata").glob("*.npy"), key=_meta_key)
    if not metas:
        raise DataError(f"data.path={root}: no metadata/*.npy files in {d}")
    images, labels = [], []
    for meta in metas:
        for row in read_metadata(meta):
            if len(row) < 4:
                raise DataError(f"{meta}: metadata row {row} has fewer than 4 fields")
            img_path = d / row[0] / row[1]
            if not img_path.is_file():
                raise DataError(f"{meta}: image {img_path} is missing")
            if img_path.stat().st_size == 0:
                continue
            with Image.open(img_path) as im:
                images.append(np.asarray(im.convert("L"), dtype=np.uint8))
            labels.append(int(float(row[3])))
    if len({im.shape for im in images}) > 1:
        raise DataError(f"data.path={root}: images of different sizes in {d}")
    return np.stack(images), np.asarray(labels, dtype=np.int64)


def _release_arrays(
    root: str | os.PathLike[str], difficulty: str, cache_dir: str | os.PathLike[str] | None
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`read_pathfinder_release`, cached as an npz keyed by the folder and its metadata."""
    if cache_dir is None:
        return read_pathfinder_release(root, difficulty)
    d = _difficulty_dir(require_path(root, "the LRA pathfinder32 folder"), difficulty)
    metas = sorted((d / "metadata").glob("*.npy"))
    key = {
        "folder": str(d.resolve()),
        "metadata": [(m.name, m.stat().st_size, m.stat().st_mtime_ns) for m in metas],
        "format": "pathfinder-release-v1",
    }
    path = keyed_cache_dir(cache_dir, "pathfinder-release", key) / "all.npz"

    def build() -> Path:
        images, labels = read_pathfinder_release(root, difficulty)
        atomic_save_npz(path, images=images, labels=labels)
        return path

    if not path.exists():
        build()
    return read_cached(path, _read_images, build)


def _read_images(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(images (n, H, W) uint8, labels (n,)) of a cached npz."""
    with np.load(path) as z:
        return z["images"], z["labels"]


def load_pathfinder(
    data_dir: str | os.PathLike[str] | None = None,
    *,
    difficulty: str = "hard",
    config: PathfinderConfig | None = None,
    cache_dir: str | os.PathLike[str] | None = None,
    workers: int | None = None,
) -> TaskData:
    """Pathfinder train/val/test datasets of ``(pixel ids (H*W,), label)``.

    ``data_dir`` given: the release folder, split 80/10/10 in metadata order (as LRA).
    ``data_dir`` None: generated with ``config`` (default: the release's 32x32 settings with
    the contour length of ``difficulty``), cached under ``cache_dir``, by ``workers``
    processes (default: all CPUs; ``nys lra`` passes ``threads`` when it is set).
    """
    workers = workers or os.cpu_count() or 1
    if data_dir is not None:
        images, labels = _release_arrays(data_dir, difficulty, cache_dir)
        bounds = np.cumsum([0, *split_counts(len(labels), (0.8, 0.1, 0.1))])
        sets = {
            s: image_dataset(images[bounds[i] : bounds[i + 1]], labels[bounds[i] : bounds[i + 1]])
            for i, s in enumerate(SPLITS)
        }
        seq_len = images.shape[1] * images.shape[2]
        dataset = f"Pathfinder {difficulty} (release)"
    else:
        if config is None:
            if difficulty not in DIFFICULTY_CONTOUR_LENGTH:
                allowed = ", ".join(DIFFICULTY_CONTOUR_LENGTH)
                raise DataError(f"pathfinder: difficulty={difficulty}; expected one of {allowed}")
            config = PathfinderConfig(contour_length=DIFFICULTY_CONTOUR_LENGTH[difficulty])
        cfg = config
        arrays = read_generated_splits(
            cfg,
            lambda splits: ensure_pathfinder_files(cache_dir, cfg, splits, workers),
            _read_images,
        )
        sets = {split: image_dataset(*pair) for split, pair in arrays.items()}
        seq_len = config.image_size**2
        dataset = f"Pathfinder-{config.image_size} {difficulty} (generated)"
    collate = ClassificationCollate(seq_len)
    return TaskData.from_splits(sets, VOCAB_SIZE, NUM_CLASSES, collate, dataset)
