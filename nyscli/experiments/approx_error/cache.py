"""Work the jobs of an approx-error sweep share: the source's Q, K, V and, per head, its exact
attention S (with S V) and the SVD of S, computed once per source, not once per job.

A sweep over budgets, landmark selections or pinv settings reads one source in every job; at
the defaults (n = 4096, 4 heads) the SVD alone is ~3/4 of a job. An entry is keyed by a hash of
exactly the settings that determine it (``source_settings``), never by a method's, so
every job of such a sweep finds it. Two levels:

- in this process, the last source's Q, K, V (tens of MB at most): Hydra's basic launcher runs
  a sweep's jobs one after another in one process, and a run called twice reuses them;
- the per-head entries (S, U and V^T: 3 n^2 numbers a head, and S V), in a sweep only:
  - held in this process when Hydra's basic launcher runs the jobs one after another here
    and all of them fit beside the job's own peak (:meth:`SourceCache.hold`: 2.1 GB at the
    defaults); writing and reading them back cost ~10 s in the first job and ~2 s in each
    later one;
  - else on disk, ``<sweep folder>/.cache/approx-error-<hash>/<entry>.pt``, written
    atomically, so jobs in other processes (joblib, submitit, slurm) read what the first job
    computed. Two jobs that miss at once both compute it, and the last rename wins (both
    wrote the same numbers). The sweep's end removes the folder
    (``experiments/report/sweep_summary.py``).

A file that cannot be read, was written for another entry, or whose tensors fail their CRC
(a flipped bit loads silently otherwise) is a miss: computed again and rewritten. The cache is
an optimisation: a failed write is logged and the job goes on.
"""

from __future__ import annotations

import hashlib
import json
import logging
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from nyscli.experiments.approx_error.evaluate import Entry
from nyscli.experiments.approx_error.memory import USABLE
from nyscli.experiments.approx_error.settings import seq_len
from nyscli.experiments.approx_error.sources import AttentionInputs
from nyscli.files import atomic_writer
from nyscli.paths import SWEEP_CACHE

log = logging.getLogger(__name__)

PREFIX = "approx-error"
# Part of every key: bump it when an entry's layout or the computation behind it changes, so
# an older file is never read as a newer one.
VERSION = 1

# The last source's inputs in this process: {key: inputs}, at most one key.
_inputs: dict[str, list[AttentionInputs]] = {}
# The last source's per-head entries held in this process ({key: {name: entry}}, at most one
# key), when a sweep's jobs share the process (``SourceCache.hold``).
_held: dict[str, dict[str, Entry]] = {}
BASIC_LAUNCHER = "hydra._internal.core_plugins.basic_launcher.BasicLauncher"


def digest(settings: dict[str, Any]) -> str:
    """A short hash of ``settings`` (JSON-able values) and :data:`VERSION`."""
    blob = json.dumps({"version": VERSION, **settings}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def text_digest(text: str) -> str:
    """The hash that stands for a source's text in its settings."""
    return hashlib.sha256(text.encode()).hexdigest()


def folder_fingerprint(spec: str) -> list[tuple[str, int, int]]:
    """(file, size, mtime) of every file under the folder ``spec`` names (``hf:`` stripped),
    empty if it names none (a package or hub id): a checkpoint rewritten during a sweep is
    then another source."""
    folder = Path(spec.removeprefix("hf:")).expanduser()
    if not folder.is_dir():
        return []
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    return [(str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns) for p in files]


def source_settings(cfg: DictConfig, text: str | None, device: torch.device) -> dict[str, Any]:
    """Exactly the settings that determine the source's Q, K, V and each head's exact attention
    and SVD: the key of the work a sweep's jobs share (``SourceCache``). No method's setting is in
    it (budgets, attention.*, methods, baselines, plots), so a sweep over those computes the
    source once; ``threads`` is left out too (it may change a last bit, never a result)."""
    settings: dict[str, Any] = {
        "source": str(cfg.source),
        "seq_len": seq_len(cfg),
        "dtype": str(cfg.dtype),
        "device": str(device),
    }
    if text is None:  # synthetic: drawn from these alone
        settings.update(head_dim=int(cfg.head_dim), heads=int(cfg.heads))
        settings.update(scale=float(cfg.scale), seed=int(cfg.seed))
        if cfg.source == "smooth":
            settings["correlation_length"] = float(cfg.correlation_length)
        return settings
    settings.update(max_sequences=int(cfg.max_sequences), text=text_digest(text))
    if cfg.source == "checkpoint":
        spec = str(cfg.checkpoint)
        settings["checkpoint"] = [spec, folder_fingerprint(spec)]
    return settings


def sweep_folder() -> Path | None:
    """This job's sweep folder (a Hydra multirun), or None: a single run, or outside Hydra."""
    if not HydraConfig.initialized():
        return None
    hydra = HydraConfig.get()
    return Path(hydra.sweep.dir) if hydra.mode == RunMode.MULTIRUN else None


def jobs_share_this_process() -> bool:
    """True in a sweep whose jobs Hydra's basic launcher runs one after another in this
    process (the default ``nys ... -m``); a launcher plugin runs them elsewhere."""
    if not HydraConfig.initialized() or sweep_folder() is None:
        return False
    return str(HydraConfig.get().launcher.get("_target_")) == BASIC_LAUNCHER


def checksum(entry: Entry) -> int:
    """CRC-32 of the entry's names, dtypes, shapes and bytes, in name order."""
    crc = 0
    for name in sorted(entry):
        tensor = entry[name].detach().cpu().contiguous().reshape(-1)  # 0-d: no byte view
        crc = zlib.crc32(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode(), crc)
        crc = zlib.crc32(tensor.view(torch.uint8).numpy() if tensor.numel() else b"", crc)
    return crc


def inputs_entry(layers: list[AttentionInputs]) -> Entry:
    """Layers of q, k, v (B, H, n, d) and masks (B, n) as one flat name -> tensor entry."""
    entry: Entry = {}
    for i, inputs in enumerate(layers):
        entry.update({f"{i}.q": inputs.q, f"{i}.k": inputs.k, f"{i}.v": inputs.v})
        entry[f"{i}.layer"] = torch.tensor(inputs.layer)
        if inputs.key_padding_mask is not None:
            entry[f"{i}.mask"] = inputs.key_padding_mask
    return entry


def entry_inputs(entry: Entry) -> list[AttentionInputs]:
    """``inputs_entry``'s layers back."""
    count = sum(name.endswith(".layer") for name in entry)
    return [
        AttentionInputs(
            entry[f"{i}.q"],
            entry[f"{i}.k"],
            entry[f"{i}.v"],
            entry.get(f"{i}.mask"),
            layer=int(entry[f"{i}.layer"]),
        )
        for i in range(count)
    ]


class SourceCache:
    """Entries of one source, keyed by ``settings``; on disk under ``folder`` (a sweep
    folder) if given, else computed afresh (but for the in-process inputs)."""

    def __init__(self, settings: dict[str, Any], folder: Path | None) -> None:
        self.key = digest(settings)
        self.read_count = self.computed_count = 0  # entries of this job, for ``report``
        self.held = False  # per-head entries in this process, not on disk (``hold``)
        self.folder = (
            None if folder is None else Path(folder) / SWEEP_CACHE / f"{PREFIX}-{self.key}"
        )

    def inputs(self, load: Callable[[], list[AttentionInputs]]) -> list[AttentionInputs]:
        """The source's layers: from this process, else from disk, else ``load()``. They are
        shared between jobs: nothing may modify them in place."""
        if self.key not in _inputs:
            layers = entry_inputs(self.fetch("inputs", lambda: inputs_entry(load())))
            _inputs.clear()  # one source at a time: a sweep over sources keeps no old ones
            _inputs[self.key] = layers
        return _inputs[self.key]

    def hold(self, entry_bytes: int, job_bytes: int, available: int) -> None:
        """Keep the per-head entries in this process from now on, if the sweep's jobs run here
        and ``entry_bytes`` (all of them) plus ``job_bytes`` (a job's own peak) fit in
        :data:`memory.USABLE` of ``available``; else they go through the disk as before."""
        self.held = (
            self.folder is not None
            and jobs_share_this_process()
            and entry_bytes + job_bytes <= USABLE * available
        )
        if self.held and self.key not in _held:
            _held.clear()  # one source at a time
            _held[self.key] = {}

    def fetch(self, name: str, compute: Callable[[], Entry]) -> Entry:
        """Entry ``name``: held in this process, or read from disk if there and sound, else
        ``compute()``d and stored."""
        if self.held and name != "inputs":
            entries = _held[self.key]
            if name in entries:
                self.read_count += 1
            else:
                entries[name] = compute()
                self.computed_count += 1
            return entries[name]
        if self.folder is None:
            return compute()
        path = self.folder / f"{name}.pt"
        entry = self.read(path, name)
        if entry is None:
            entry = compute()
            self.write(path, name, entry)
            self.computed_count += 1
        else:
            self.read_count += 1
        return entry

    def report(self) -> None:
        """One log line: how much of this job's source work an earlier job had done."""
        if self.folder is not None:
            log.info(
                "approx-error shared work: %d entries read, %d computed (%s)",
                self.read_count, self.computed_count,
                "held in this process" if self.held else self.folder,
            )  # fmt: skip

    def read(self, path: Path, name: str) -> Entry | None:
        """The entry stored at ``path``, or None if absent or not sound (logged)."""
        if not path.is_file():
            return None
        try:
            stored = torch.load(path, weights_only=True)
            entry = stored["tensors"]
            sound = (stored["key"], stored["name"], stored["crc"]) == (
                self.key, name, checksum(entry),
            )  # fmt: skip
        except Exception as error:  # noqa: BLE001 - any unreadable file is a miss, never a crash
            log.warning("%s: cache file cannot be read (%s); computing it again", path, error)
            return None
        if not sound:
            log.warning("%s: cache file does not match its entry; computing it again", path)
            return None
        return entry

    def write(self, path: Path, name: str, entry: Entry) -> None:
        """Store ``entry`` atomically; a failure (full disk) only loses the sharing."""
        stored = {"key": self.key, "name": name, "crc": checksum(entry), "tensors": entry}
        try:
            with atomic_writer(path, "wb") as handle:
                torch.save(stored, handle)
        except OSError as error:
            log.warning(
                "%s: cache file not written (%s); the other jobs compute it too", path, error
            )
