"""approx-error's memory before it allocates: an estimate of its peak, checked against what
the machine has, so ``seq_len=2000000`` or ``budgets=[10**11]`` is one line naming both
numbers, not a 400 GB allocation that dies in a traceback (or, just below the machine's
commit limit, an out-of-memory kill halfway through).

The estimate follows what the command holds at once, in bytes of its dtype ``b``:
- the q, k, v under study: layers x sequences x heads x n x d x 3 (float64 while generated);
- the smooth source's convolution, which unfolds every noise row against its kernel:
  heads x d x (6 L + 1) x n float64 (the largest term at the defaults);
- per head, the exact matrix S, its softmax and an approximation's implied matrix when they
  are formed (n^2 b each: ``max_matrix_mb``), and the SVD baseline's factors (3 n^2 b);
- the largest method at the largest budget m: a few n x m and m x m blocks, and Linformer's
  two m x n projections (float32 parameters, copied to the dtype). A budget m >= n is exact
  attention for every method but Linformer and Performer (Nyström's m >= n, a window or band
  over the whole sequence, the SVD's full rank): without those two, m counts as n; m x m
  blocks (Nyström's kernel and pinv) never exceed n x n.
Measured on a 2-core CPU (n = 2048, 2 heads, smooth, the default methods): 1.12 GB peak RSS,
estimate 1.19 GB (with the interpreter's ~0.25 GB); n = 128, ``budget_unit=pairs -b 100000``
(Performer's 100,000 features): 1.09 GB, estimate 1.15 GB. It errs high: a run it lets
through fits.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import torch
from omegaconf import DictConfig

from nyscli.errors import UserInputError
from nyscli.experiments.approx_error.settings import DTYPES, budgets, seq_len

# Heads, layers and head size of the pretrained model source=minilm reads (all-MiniLM-L6-v2).
MINILM_SHAPE = (6, 12, 32)
INTERPRETER_BYTES = 300 * 2**20  # python, torch and the rest before any tensor
BLOCKS_PER_METHOD = 6  # n x m blocks a method holds at once (kernels, features, products)
USABLE = 0.9  # of the available memory: the page cache and other processes need some
# Methods whose n x m blocks keep growing with a budget past n (k projected keys, m features).
PAST_N = ("linformer", "performer")


def estimated_bytes(
    source: str,
    n: int,
    heads: int,
    head_dim: int,
    max_sequences: int,
    correlation_length: float,
    max_budget: int,
    itemsize: int,
    with_matrix: bool,
    with_svd: bool,
    methods: Sequence[str] = PAST_N,
) -> int:
    """The peak bytes of one approx-error run (module docstring) of ``methods``."""
    if source in ("minilm", "checkpoint"):
        layers, heads, head_dim = MINILM_SHAPE  # a checkpoint is priced as MiniLM's size
        inputs = layers * max_sequences * heads * n * head_dim * 3 * 8
        generation = 0
    else:
        inputs = heads * n * head_dim * 3 * 8
        radius = max(1, math.ceil(3 * correlation_length)) if source == "smooth" else 0
        generation = heads * head_dim * (2 * radius + 1) * (n + 2 * radius) * 8 if radius else 0
    matrices = (3 * n * n * itemsize if with_matrix else 0) + (
        3 * n * n * itemsize if with_svd else 0
    )
    m = max_budget if set(methods) & set(PAST_N) else min(max_budget, n)
    square = min(max_budget, n)
    projections = 2 * m * n * (4 + itemsize)  # Linformer's E, F in fp32 and their copies
    method = (BLOCKS_PER_METHOD * n * m + 4 * square * square) * itemsize + projections
    return INTERPRETER_BYTES + inputs + max(generation, matrices + method)


def available_bytes() -> int:
    """Memory the run may take: MemAvailable (Linux), else the machine's total."""
    try:
        with open("/proc/meminfo") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def gigabytes(count: int) -> str:
    if count >= 100 * 2**30:
        return f"{count / 2**30:,.0f} GB"
    return f"{count / 2**30:.1f} GB" if count >= 2**30 else f"{count / 2**20:.0f} MB"


def refusal(estimate: int, available: int, what: str) -> str | None:
    """The one line when ``estimate`` does not fit ``available`` (``what``: the settings that
    drive it), else None."""
    if estimate <= USABLE * available:
        return None
    return (
        f"approx-error would need about {gigabytes(estimate)} for {what}, more than the "
        f"{gigabytes(int(USABLE * available))} this machine can give it "
        f"({gigabytes(available)} available); lower seq_len, budgets, heads or max_sequences, "
        "or use dtype=fp32"
    )


def estimated_peak(cfg: DictConfig) -> int:
    """A run's peak bytes on the CPU, estimated before anything is allocated (module docstring)."""
    n, m = seq_len(cfg), max(budgets(cfg))
    itemsize = torch.finfo(DTYPES[cfg.dtype]).bits // 8
    with_matrix = n * n * itemsize <= cfg.max_matrix_mb * 2**20
    with_svd = "svd" in cfg.baselines and with_matrix and n <= cfg.svd_max_seq_len
    return estimated_bytes(
        str(cfg.source), n, int(cfg.heads), int(cfg.head_dim), int(cfg.max_sequences),
        float(cfg.correlation_length), m, itemsize, with_matrix, with_svd, list(cfg.methods),
    )  # fmt: skip


def check_memory(cfg: DictConfig) -> None:
    """Refuse, before anything is allocated, a run whose estimated peak does not fit this
    machine's memory (CPU runs; a GPU run's tensors live on the GPU)."""
    if str(cfg.device).startswith("cuda"):
        return
    n, m = seq_len(cfg), max(budgets(cfg))
    what = f"seq_len={n}, budgets up to {m}, heads={cfg.heads}, dtype={cfg.dtype}"
    line = refusal(estimated_peak(cfg), available_bytes(), what)
    if line:
        raise UserInputError(line)
