"""approx-error sweeps share the source's work (issue 32, point 6): the jobs of a sweep over
budgets or methods compute the source's Q, K, V, each head's exact attention and the SVD of S
once, in one process and across launcher processes (the sweep folder's ``.cache``), with the
same numbers as independent runs; a damaged cache file is a miss, never a crash or a lie."""

from __future__ import annotations

import functools
from pathlib import Path

import pandas as pd
import pytest
import torch
import yaml
from omegaconf import DictConfig, OmegaConf

from nyscli.experiments.approx_error import cache, evaluate
from nyscli.experiments.approx_error import command as approx_error
from nyscli.launch.run import launch
from nyscli.paths import SWEEP_CACHE
from tests.test_approx_error import config, run

# fp64 (the default dtype), two heads, Nyström and a rival, both baselines (SVD included).
TINY = ["seq_len=64", "head_dim=8", "heads=2", "correlation_length=4.0", "plots=false"]
TINY += ["threads=1", "methods=[nystrom,linformer]", "baselines=[uniform,svd]"]
HEADS = 2


@pytest.fixture
def counted(monkeypatch) -> dict[str, int]:
    """Calls of the shared work (source, exact attention, SVD), each wrapped to count; the
    in-process inputs start empty, as in a fresh process."""
    monkeypatch.setattr(cache, "_inputs", {})
    monkeypatch.setattr(cache, "_held", {})
    calls = {"load_inputs": 0, "exact_attention": 0, "svd_factors": 0}
    for module, name in (
        (approx_error, "load_inputs"),
        (evaluate, "exact_attention"),
        (evaluate, "svd_factors"),
    ):
        real = getattr(module, name)

        def wrapper(*args, real=real, name=name, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(module, name, wrapper)
    return calls


def results(folder: Path) -> pd.DataFrame:
    df = pd.read_csv(folder / "results.csv")
    return df.sort_values(["layer", "sequence", "head", "method", "budget", "metric"]).reset_index(
        drop=True
    )


def assert_same_numbers(a: pd.DataFrame, b: pd.DataFrame) -> None:
    assert list(a.columns) == list(b.columns) and len(a) == len(b) > 0
    pd.testing.assert_frame_equal(a.drop(columns="value"), b.drop(columns="value"))
    assert (a["value"] - b["value"]).abs().max() <= 1e-12
    assert a["value"].notna().all()


@pytest.mark.parametrize("held", [True, False])
def test_a_two_job_sweep_computes_the_source_once_with_the_numbers_of_two_runs(
    tmp_path: Path, monkeypatch, counted, held
) -> None:
    """The basic launcher's jobs share this process: the per-head entries stay in memory
    (``held``), or, when they would not fit beside a job's peak, go through the disk."""
    monkeypatch.chdir(tmp_path)
    if not held:
        monkeypatch.setattr(cache, "USABLE", 0.0)  # no room to hold them
    written: list[str] = []
    write = cache.SourceCache.write
    monkeypatch.setattr(
        cache.SourceCache,
        "write",
        lambda self, path, name, e: [written.append(name), write(self, path, name, e)],
    )
    sweep = tmp_path / "sweep"
    code = launch(
        "approx_error",
        ["--multirun", "attention.num_landmarks=4,8", *TINY, f"hydra.sweep.dir={sweep}"],
    )
    assert code == 0
    # Before: 2 jobs x (1 source, 2 heads' exact attention, 2 SVDs).
    assert counted == {"load_inputs": 1, "exact_attention": HEADS, "svd_factors": HEADS}
    per_head = [f"{kind}-0-0-{h}" for h in range(HEADS) for kind in ("exact", "svd")]
    assert sorted(written) == sorted(["inputs"] + ([] if held else per_head))
    assert not (sweep / SWEEP_CACHE).exists()  # removed at the sweep's end

    # The second job took the first one's work: the same numbers as a run of its own.
    cache._inputs.clear()  # an independent run: nothing shared in this process either
    assert launch("approx_error", ["attention.num_landmarks=8", *TINY, "hydra.run.dir=m8"]) == 0
    assert counted["exact_attention"] == 2 * HEADS  # a single run shares nothing
    single, swept = results(tmp_path / "m8"), results(sweep / "1")
    assert set(swept["budget"].dropna()) == {8}
    assert_same_numbers(swept, single)


def test_a_job_in_another_process_reads_the_source_from_the_sweep_folder(
    tmp_path: Path, monkeypatch, counted
) -> None:
    monkeypatch.setattr(cache, "sweep_folder", lambda: tmp_path / "sweep")
    monkeypatch.setattr(cache, "jobs_share_this_process", lambda: False)  # a launcher's job
    run(tmp_path, *TINY, "budgets=[4]")
    entries = sorted(p.name for p in (tmp_path / "sweep" / SWEEP_CACHE).glob("*/*.pt"))
    assert entries == [
        "exact-0-0-0.pt",
        "exact-0-0-1.pt",
        "inputs.pt",
        "svd-0-0-0.pt",
        "svd-0-0-1.pt",
    ]
    cache._inputs.clear()  # what a joblib or slurm job starts with
    shared = run(tmp_path, *TINY, "budgets=[8]", "methods=[nystrom_random,performer]")
    assert counted == {"load_inputs": 1, "exact_attention": HEADS, "svd_factors": HEADS}

    monkeypatch.setattr(cache, "sweep_folder", lambda: None)
    cache._inputs.clear()
    alone = run(tmp_path, *TINY, "budgets=[8]", "methods=[nystrom_random,performer]")
    assert counted["exact_attention"] == 2 * HEADS
    assert torch.equal(
        torch.tensor(shared["value"].to_numpy()), torch.tensor(alone["value"].to_numpy())
    )


def corrupt(path: Path, how: str, tmp_path: Path) -> None:
    data = path.read_bytes()
    if how == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif how == "flipped byte":  # torch.load reads this without complaint: the CRC catches it
        flipped = bytearray(data)
        flipped[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(flipped))
    elif how == "garbage":
        path.write_bytes(b"not a cache file")
    elif how == "another entry":
        path.write_bytes((path.parent / "other.pt").read_bytes())
    else:
        path.write_bytes(b"")


@pytest.mark.parametrize("how", ["truncated", "flipped byte", "garbage", "another entry", "empty"])
def test_a_damaged_cache_file_is_a_miss_computed_again_and_rewritten(
    tmp_path: Path, how: str
) -> None:
    store = cache.SourceCache({"source": "smooth"}, tmp_path)
    value = {"s": torch.arange(4096, dtype=torch.float64).view(64, 64), "m": torch.ones(3).bool()}
    computed = []

    def compute() -> dict[str, torch.Tensor]:
        computed.append(1)
        return {name: x.clone() for name, x in value.items()}

    store.fetch("other", lambda: {"s": torch.zeros(64, 64, dtype=torch.float64)})
    store.fetch("exact", compute)
    [path] = [p for p in (tmp_path / SWEEP_CACHE).glob("*/exact.pt")]
    corrupt(path, how, tmp_path)
    again = store.fetch("exact", compute)
    assert len(computed) == 2
    assert all(torch.equal(again[name], value[name]) for name in value)
    third = store.fetch("exact", compute)  # rewritten whole: read, not computed
    assert len(computed) == 2 and torch.equal(third["s"], value["s"])


@functools.cache
def tiny_config() -> DictConfig:
    return config(*TINY)


def key(*overrides: str, text: str | None = None) -> str:
    """The cache key of TINY with ``key=value`` overrides (set on one composed config: a
    composition takes ~0.5 s)."""
    cfg = tiny_config().copy()
    for override in overrides:
        name, value = override.split("=", 1)
        OmegaConf.update(cfg, name, yaml.safe_load(value))
    return cache.digest(cache.source_settings(cfg, text, torch.device("cpu")))


def test_the_key_follows_the_source_settings_and_not_the_methods() -> None:
    base = key()
    same = [
        "attention.num_landmarks=32",
        "budgets=[8,16]",
        "methods=[nystrom_kmeans]",
        "baselines=[uniform]",
        "attention.pinv_iterations=12",
        "plots=true",
        "threads=2",
        "plot_head=1",
    ]
    assert {key(o) for o in same} == {base}
    other = [
        "seed=1",
        "seq_len=128",
        "heads=3",
        "head_dim=16",
        "scale=2.0",
        "correlation_length=8.0",
        "dtype=fp32",
        "source=gaussian",
    ]
    keys = {key(o) for o in other}
    assert base not in keys and len(keys) == len(other)
    # A real model's source: its text (not the synthetic draw's settings) and its length.
    minilm = key("source=minilm", text="one text")
    assert minilm != key("source=minilm", text="another text")
    assert minilm == key("source=minilm", "seed=7", "heads=3", text="one text")
    assert minilm != key("source=minilm", "max_sequences=3", text="one text")


def test_an_interrupted_sweep_removes_its_cache(tmp_path: Path, monkeypatch, counted) -> None:
    """Ctrl-C once the first job has written the shared source: the sweep stops in one line
    and its cache (~1.5 GB at the defaults) goes, as at a sweep's end."""
    monkeypatch.chdir(tmp_path)
    seen: list[Path] = []

    def interrupted(self, path, name, entry):
        write(self, path, name, entry)
        seen.append(path)
        raise KeyboardInterrupt

    write = cache.SourceCache.write
    monkeypatch.setattr(cache.SourceCache, "write", interrupted)
    sweep = tmp_path / "sweep"
    code = launch(
        "approx_error",
        ["--multirun", "attention.num_landmarks=4,8", *TINY, f"hydra.sweep.dir={sweep}"],
    )
    assert code == 130
    assert seen and seen[0].is_relative_to(sweep / SWEEP_CACHE)  # it was there
    assert not (sweep / SWEEP_CACHE).exists()
