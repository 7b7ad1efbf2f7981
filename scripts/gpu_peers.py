#!/usr/bin/env python3
"""Nyström peers on one device, in one run: SDPA, nys's Nyström-64 core,
Hugging Face's Nyström self-attention and lucidrains' ``nystrom-attention``.

    scripts/gpu_peers.py OUT [--toy] [--minutes M] [--wheels DIR] [--seq-lens N,N,...]

Every row gets the same q, k, v: batch 1, 12 heads of 64 (width 768), m = 64 landmarks, forward
and forward + backward, bf16 and fp32, n = 1,024 ... 65,536. The rows:

- ``sdpa``: ``torch.nn.functional.scaled_dot_product_attention`` (exact; PyTorch picks its
  kernel: flash in bf16, memory-efficient in fp32). The baseline of every ratio.
- ``nys``: nys's ``nystrom`` core at ``num_landmarks: 64``, its defaults (segment means, the
  per-matrix pseudo-inverse start, 6 iterations run in fp32, no conv skip), built through the
  registry (``build_attention``) and called on (B, H, n, d) as ``nys bench scope=core`` does.
- ``hf``: transformers' ``NystromformerSelfAttention``, conv skip off (set on the module after it
  is built: the strict config of transformers 5.x refuses ``conv_kernel_size=None``), 6 pseudo-
  inverse iterations from the per-matrix start (``init_option`` other than "original", the
  start nys uses), ``segment_means_seq_len`` = n. Its query/key/value projections are replaced by
  column slices of one packed q|k|v input, so it computes attention on the very q, k, v the other
  rows get, with no projection; it scales q and k by d^-1/4 each itself.
- ``lucidrains``: ``nystrom_attention.NystromAttention``, residual conv off, 6 iterations (its
  only start: one scale over the whole batch, nys's ``pinv_init: original``), ``to_qkv`` and
  ``to_out`` replaced by identities over the same packed q|k|v input.

Both peers form the n x m kernels and their products in memory and run the pseudo-inverse in
the input's precision (bf16 under autocast); nys never stores an n x m kernel (two SDPA calls)
and runs the pseudo-inverse in fp32. FlashNystrom (a CUDA/CUTLASS build of its own) is not
run: docs/results/gpu.md quotes its published table.

Before timing, each peer is checked to compute nys's function: on the same float64 and float32
q, k, v (batch 2, n = 512, m = 64) its output against nys's with the matching pseudo-inverse
start, relative Frobenius error, written to ``equivalence.csv`` with its bound (and, for scale,
nys against exact softmax).

Timing: CUDA events around each call after a synchronisation (nys bench's ``time_call_ms``),
the median of at least ``min_repeats`` calls after ``warmup`` untimed ones; peak memory is
``max_memory_allocated`` during one call minus what was allocated before it (inputs, weights,
the upstream gradient). On the CPU (``--toy``: tiny n, a check of the script that CI runs)
the same code times with ``perf_counter`` and reads peak RSS. bf16 rows get bf16 inputs and
run under autocast (the peers' pseudo-inverse mixes an fp32 identity into its products).

Writes under OUT: ``peers.csv`` (one row per peer x n x dtype x mode: ms, peak MB, speed-up and
memory over SDPA's, or the row's error: OOM, missing package), ``equivalence.csv``, ``env.json``
and ``peers.md`` (the tables); prints the short table last. Resumable: a point already in
peers.csv is not run again; ``--minutes``: no new point starts once that is spent;
``complete`` marks a run with every point written.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import gc
import importlib.metadata
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's nyscli, installed or not (a lent GPU machine)

import torch  # noqa: E402  (after the path it needs)
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from nyscli.attention import build_attention  # noqa: E402
from nyscli.experiments.bench.memory import warm_peak_mb  # noqa: E402
from nyscli.experiments.bench.timing import time_call_ms  # noqa: E402
from nyscli.experiments.bench.worker import is_oom, timed_call  # noqa: E402

HEADS, HEAD_DIM, LANDMARKS, PINV_ITERATIONS = 12, 64, 64, 6
WIDTH = HEADS * HEAD_DIM
SEQ_LENS = [1024, 2048, 4096, 8192, 16384, 65536]
TOY_SEQ_LENS = [128, 256]
PEERS = ("sdpa", "nys", "hf", "lucidrains")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
MODES = ("fwd", "fwd+bwd")
EQUIVALENCE_N, EQUIVALENCE_BATCH = 512, 2
# A peer computes nys's function if its relative error against nys's (matching start) is at
# most this: what rounding leaves (measured on a CPU: ~1e-15 in float64, ~5e-7 in float32),
# with room for another device's summation order. The other start alone moves the output by
# ~3e-3 after 6 iterations, so the check tells the two apart.
BOUNDS = {"float64": 1e-9, "float32": 1e-4}
COLUMNS = [
    "peer",
    "n",
    "dtype",
    "mode",
    "status",
    "time_ms",
    "time_ms_min",
    "repeats",
    "peak_mb",
    "speedup_vs_sdpa",
    "mem_vs_sdpa",
    "error",
    "device",
    "version",
    "config",
]
CONFIGS = {
    "sdpa": "exact softmax, torch.nn.functional.scaled_dot_product_attention",
    "nys": "nystrom core, m=64, segment means, pinv per_matrix start, 6 iterations in fp32, "
    "no conv; n x m kernels never stored",
    "hf": "transformers NystromformerSelfAttention, m=64, conv skip off, pinv per-matrix start, "
    "6 iterations in the input dtype; q/k/v projections = slices of packed q|k|v",
    "lucidrains": "nystrom_attention.NystromAttention, m=64, residual conv off, pinv one start "
    "scale over the batch, 6 iterations in the input dtype; to_qkv/to_out = identity",
}


class Columns(nn.Module):
    """Stands in for a peer's projection: columns [start, stop) of the packed q|k|v input."""

    def __init__(self, start: int, stop: int) -> None:
        super().__init__()
        self.start, self.stop = start, stop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x[..., self.start : self.stop]


def lucidrains_class(wheels: Path) -> type[nn.Module]:
    """``nystrom_attention.NystromAttention``: installed, or from a wheel in ``wheels`` (a lent
    machine has no package index: the wheel travels in the repository's ignored ``.whl/``)."""
    try:
        from nystrom_attention import NystromAttention
    except ImportError:
        for wheel in sorted(wheels.glob("nystrom_attention-*.whl")):
            sys.path.insert(0, str(wheel))  # a pure-Python wheel imports from the zip
        try:
            from nystrom_attention import NystromAttention
        except ImportError as error:
            raise ImportError(
                f"missing package nystrom-attention ({error}); "
                f"pip download nystrom-attention --no-deps -d {wheels}"
            ) from error
    return NystromAttention


@functools.cache
def version(peer: str) -> str:
    """The version of the package a peer comes from ("" where it is not installed)."""
    if peer == "nys":
        from nyscli import __version__

        return __version__
    package = {"sdpa": "torch", "hf": "transformers", "lucidrains": "nystrom-attention"}[peer]
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""


def nys_core(pinv_init: str = "per_matrix") -> nn.Module:
    return build_attention({"name": "nystrom", "num_landmarks": LANDMARKS, "pinv_init": pinv_init})


def hf_module(n: int, init: str) -> nn.Module:
    from transformers import NystromformerConfig
    from transformers.models.nystromformer.modeling_nystromformer import (
        NystromformerSelfAttention,
    )

    config = NystromformerConfig(
        hidden_size=WIDTH,
        num_attention_heads=HEADS,
        num_landmarks=LANDMARKS,
        segment_means_seq_len=n,
        attention_probs_dropout_prob=0.0,
    )
    module = NystromformerSelfAttention(config)
    module.conv_kernel_size = None  # no conv skip (the strict config refuses None)
    del module.conv
    module.init_option = init  # "original", or any other value: the per-matrix start
    module.query = Columns(0, WIDTH)
    module.key = Columns(WIDTH, 2 * WIDTH)
    module.value = Columns(2 * WIDTH, 3 * WIDTH)
    return module


def lucidrains_module(wheels: Path) -> nn.Module:
    module = lucidrains_class(wheels)(
        dim=WIDTH,
        dim_head=HEAD_DIM,
        heads=HEADS,
        num_landmarks=LANDMARKS,
        pinv_iterations=PINV_ITERATIONS,
        residual=False,
    )
    module.to_qkv = nn.Identity()
    module.to_out = nn.Identity()
    return module


def attention(peer: str, n: int, wheels: Path) -> tuple[Callable[..., torch.Tensor], bool]:
    """(call, packed): the peer's attention as a function of (q, k, v) in (B, H, n, d), or of
    one packed (B, n, 3 * width) q|k|v where ``packed``; output (B, H, n, d) or (B, n, width)."""
    if peer == "sdpa":
        return F.scaled_dot_product_attention, False
    if peer == "nys":
        return nys_core(), False
    if peer == "hf":
        module = hf_module(n, init="per_matrix")
        return (lambda x: module(x)[0]), True
    if peer == "lucidrains":
        return lucidrains_module(wheels), True
    raise ValueError(f"unknown peer {peer}")


def packed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """(B, H, n, d) q, k, v -> (B, n, 3 * H * d), the layout the peers' projections give."""
    return torch.cat([flat(t) for t in (q, k, v)], dim=-1)


def flat(t: torch.Tensor) -> torch.Tensor:
    """(B, H, n, d) -> (B, n, H * d), heads side by side as the peers merge them."""
    b, h, n, d = t.shape
    return t.transpose(1, 2).reshape(b, n, h * d)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref.double()).norm() / ref.double().norm())


def equivalence(device: torch.device, wheels: Path) -> list[dict[str, Any]]:
    """Each peer's output against nys's on the same q, k, v, in float64 and float32."""
    rows = []
    generator = torch.Generator().manual_seed(0)
    shape = (EQUIVALENCE_BATCH, HEADS, EQUIVALENCE_N, HEAD_DIM)
    base = [torch.randn(shape, generator=generator, dtype=torch.float64) for _ in range(3)]
    for dtype in (torch.float64, torch.float32):
        name = str(dtype).removeprefix("torch.")
        q, k, v = (t.to(device, dtype) for t in base)
        with torch.no_grad():
            nys = {init: flat(nys_core(init)(q, k, v)) for init in ("per_matrix", "original")}
            exact = flat(F.scaled_dot_product_attention(q, k, v))
            outputs: dict[str, torch.Tensor | str] = {}
            for peer in ("hf", "lucidrains"):
                try:
                    call, _ = attention(peer, EQUIVALENCE_N, wheels)
                    outputs[peer] = call(packed(q, k, v))
                except Exception as error:  # a missing package: the row says so
                    outputs[peer] = f"{type(error).__name__}: {error}"
        rows.append(
            {
                "peer": "nys",
                "dtype": name,
                "compared_with": "exact softmax (sdpa), for scale",
                "rel_error": relative_error(nys["per_matrix"], exact),
                "bound": "",
                "status": "reference",
            }
        )
        for peer, matched in (("hf", "per_matrix"), ("lucidrains", "original")):
            for init in ("per_matrix", "original"):
                row = {
                    "peer": peer,
                    "dtype": name,
                    "compared_with": f"nys nystrom-64 pinv_init={init}",
                    "rel_error": "",
                    "bound": BOUNDS[name] if init == matched else "",
                }
                out = outputs[peer]
                if isinstance(out, str):
                    row["status"] = "error: " + out.splitlines()[0][:300]
                else:
                    row["rel_error"] = relative_error(out, nys[init])
                    if init != matched:
                        row["status"] = "other start (for scale)"
                    else:
                        ok = row["rel_error"] <= BOUNDS[name]
                        row["status"] = "same function" if ok else "MISMATCH"
                rows.append(row)
    for row in rows:
        row["n"], row["batch"], row["device"] = EQUIVALENCE_N, EQUIVALENCE_BATCH, device.type
    return rows


class Settings:
    def __init__(self, toy: bool) -> None:
        self.warmup = 1 if toy else 3
        self.min_repeats = 2 if toy else 5
        self.max_repeats = 3 if toy else 100
        self.budget_s = 0.02 if toy else 0.5  # timing per point, once min_repeats are in


def measure(
    peer: str,
    n: int,
    dtype: torch.dtype,
    mode: str,
    device: torch.device,
    settings: Settings,
    wheels: Path,
) -> dict[str, Any]:
    """Time and peak memory of one point; the error's first line where it fails."""
    torch.manual_seed(0)
    train = mode == "fwd+bwd"
    call, is_packed = attention(peer, n, wheels)
    if isinstance(call, nn.Module):
        call.to(device)
    shape = (1, HEADS, n, HEAD_DIM)
    if is_packed:
        inputs = [torch.randn(1, n, 3 * WIDTH, device=device, dtype=dtype, requires_grad=train)]
    else:
        inputs = [
            torch.randn(shape, device=device, dtype=dtype, requires_grad=train) for _ in range(3)
        ]
    timed = timed_call(call, inputs, train, dtype, device, [])
    peak = warm_peak_mb(timed, device, settings.warmup)
    times = []
    started = time.monotonic()
    while len(times) < settings.min_repeats or (
        len(times) < settings.max_repeats and time.monotonic() - started < settings.budget_s
    ):
        times.append(time_call_ms(timed, device))
    return {
        "status": "ok",
        "time_ms": statistics.median(times),
        "time_ms_min": min(times),
        "repeats": len(times),
        "peak_mb": peak,
    }


def point(
    peer: str, n: int, dtype: str, mode: str, device: torch.device, settings: Settings, wheels: Path
) -> dict[str, Any]:
    row: dict[str, Any] = {"peer": peer, "n": n, "dtype": dtype, "mode": mode}
    try:
        row |= measure(peer, n, DTYPES[dtype], mode, device, settings, wheels)
    except Exception as error:  # one failed point is a row, never the end of the run
        row["status"] = "oom" if is_oom(error) else "error"
        row["error"] = f"{type(error).__name__}: {error}".splitlines()[0][:300]
    finally:
        if device.type == "cuda":  # what a failed point left behind goes before the next
            gc.collect()
            torch.cuda.empty_cache()
    row |= {"device": device.type, "version": version(peer), "config": CONFIGS[peer]}
    return row


def key(row: dict[str, Any]) -> tuple[str, int, str, str]:
    return row["peer"], int(row["n"]), row["dtype"], row["mode"]


def read_csv(path: Path) -> list[dict[str, str]]:
    if not path.is_file():
        return []
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def write_csv(path: Path, rows: list[dict[str, Any]], columns: list[str]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    tmp.replace(path)


def with_ratios(row: dict[str, Any], sdpa: dict[str, Any] | None) -> dict[str, Any]:
    """``row`` with its speed-up (SDPA's time / its time) and memory over SDPA's."""
    if row["status"] == "ok" and sdpa is not None and sdpa.get("status") == "ok":
        row["speedup_vs_sdpa"] = float(sdpa["time_ms"]) / float(row["time_ms"])
        sdpa_mb = float(sdpa["peak_mb"])
        row["mem_vs_sdpa"] = float(row["peak_mb"]) / sdpa_mb if sdpa_mb > 0 else ""
    return row


def cell(row: dict[str, str] | None) -> str:
    if row is None:
        return "not run"
    if row["status"] != "ok":
        return row["status"]
    text = f"{float(row['time_ms']):,.2f} ms, {float(row['peak_mb']):,.0f} MB"
    if row.get("speedup_vs_sdpa"):
        text += f" ({float(row['speedup_vs_sdpa']):.2f}×"
        mem = row.get("mem_vs_sdpa")
        text += f", {float(mem):.2f}×)" if mem not in ("", None) else ")"
    return text


def markdown(rows: list[dict[str, str]], equivalent: list[dict[str, str]], lens: list[int]) -> str:
    """peers.md: one table per dtype x mode, then the equivalence check."""
    found = {key(r): r for r in rows}
    lines = []
    for dtype in DTYPES:
        for mode in MODES:
            lines += [
                f"#### peers {dtype} {mode}",
                "",
                "Batch 1, 12 heads of 64, m = 64. Each cell: median time, peak memory "
                "(speed-up over SDPA: its time / this time; memory / SDPA's).",
                "",
                "| peer | " + " | ".join(f"n={n}" for n in lens) + " |",
                "|---|" + "---|" * len(lens),
            ]
            for peer in PEERS:
                cells = [cell(found.get((peer, n, dtype, mode))) for n in lens]
                lines.append(f"| {peer} | " + " | ".join(cells) + " |")
            lines.append("")
    errors = sorted({(r["peer"], r["error"]) for r in rows if r.get("error")})
    if errors:
        lines += ["Errors:", ""] + [f"- {peer}: {error}" for peer, error in errors] + [""]
    lines += [
        f"#### equivalence (batch {EQUIVALENCE_BATCH}, n = {EQUIVALENCE_N}, m = {LANDMARKS})",
        "",
        "| peer | dtype | compared with | relative error | bound | status |",
        "|---|---|---|---|---|---|",
    ]
    for r in equivalent:
        err = f"{float(r['rel_error']):.2e}" if r["rel_error"] not in ("", None) else "—"
        bound = f"{float(r['bound']):.0e}" if r["bound"] not in ("", None) else ""
        lines.append(
            f"| {r['peer']} | {r['dtype']} | {r['compared_with']} | {err} | {bound} | "
            f"{r['status']} |"
        )
    return "\n".join(lines) + "\n"


def short_table(rows: list[dict[str, str]], lens: list[int]) -> str:
    """The last thing printed: ms (speed-up over SDPA) per peer, one block per dtype x mode."""
    found = {key(r): r for r in rows}
    lines = []
    for dtype in DTYPES:
        for mode in MODES:
            lines.append(f"{dtype} {mode}: " + "  ".join(f"{n:>14}" for n in lens))
            for peer in PEERS:
                cells = []
                for n in lens:
                    r = found.get((peer, n, dtype, mode))
                    if r is None or r["status"] != "ok":
                        cells.append(f"{'—' if r is None else r['status']:>14}")
                        continue
                    ratio = r.get("speedup_vs_sdpa")
                    shown = f"{float(r['time_ms']):.2f}"
                    shown += f" ({float(ratio):.2f}x)" if ratio not in ("", None) else ""
                    cells.append(f"{shown:>14}")
                lines.append(f"  {peer:<11}" + "  ".join(cells))
    return "\n".join(lines)


def environment(device: torch.device) -> dict[str, str]:
    info = {
        "date": time.strftime("%Y-%m-%d %H:%M %Z"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "device": device.type,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info["gpu"] = f"{props.name}, {props.total_memory / 2**30:.0f} GiB"
        info["cuda"] = str(torch.version.cuda)
    for peer in ("hf", "lucidrains"):
        info[peer] = version(peer) or "not installed"
    return info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--toy", action="store_true", help="CPU, tiny n: a check of the script")
    parser.add_argument("--minutes", type=float, default=None, help="start no point after this")
    parser.add_argument("--wheels", type=Path, default=ROOT / ".whl", help="nystrom-attention's")
    parser.add_argument("--seq-lens", default=None, help="comma-separated n (default: 1K-64K)")
    opts = parser.parse_args()
    if not opts.toy and not torch.cuda.is_available():
        parser.error("no CUDA device: --toy checks the script on a CPU")
    out = opts.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    end = None if opts.minutes is None else time.monotonic() + 60 * opts.minutes
    device = torch.device("cpu" if opts.toy else "cuda")
    lens = TOY_SEQ_LENS if opts.toy else SEQ_LENS
    if opts.seq_lens:
        lens = [int(n) for n in opts.seq_lens.split(",")]
    settings = Settings(opts.toy)
    wheels = opts.wheels.resolve()
    if opts.toy:
        torch.set_num_threads(1)  # a shared CI CPU: two threads spin against other jobs
    with contextlib.suppress(ImportError):
        lucidrains_class(wheels)  # on sys.path now, so env.json can name its version
    with contextlib.suppress(Exception):  # a failure here is each hf row's error, later
        hf_module(LANDMARKS * 2, "original")  # transformers' import, once, before any timing
    # Every collection (each point's memory reading starts with one) would walk the tens of
    # thousands of objects transformers' import made: 0.2 s a point on a CPU.
    gc.freeze()
    (out / "env.json").write_text(json.dumps(environment(device), indent=1))

    equivalence_csv = out / "equivalence.csv"
    if not equivalence_csv.is_file():
        print("equivalence: each peer against nys on the same q, k, v")
        rows = equivalence(device, wheels)
        columns = ["peer", "dtype", "n", "batch", "device", "compared_with", "rel_error"]
        write_csv(equivalence_csv, rows, [*columns, "bound", "status"])

    peers_csv = out / "peers.csv"
    rows = read_csv(peers_csv)
    done = {key(r): r for r in rows}
    stopped = False
    for n in lens:
        for dtype in DTYPES:
            for mode in MODES:
                for peer in PEERS:
                    if (peer, n, dtype, mode) in done:
                        continue
                    if end is not None and time.monotonic() > end:
                        stopped = True
                        break
                    row = point(peer, n, dtype, mode, device, settings, wheels)
                    sdpa = row if peer == "sdpa" else done.get(("sdpa", n, dtype, mode))
                    row = with_ratios(row, sdpa)
                    print(f"  {peer} n={n} {dtype} {mode}: {cell(row)}", flush=True)
                    row = {c: row.get(c, "") for c in COLUMNS}
                    rows.append(row)
                    done[key(row)] = row
                    write_csv(peers_csv, rows, COLUMNS)
    rows = read_csv(peers_csv)
    equivalent = read_csv(equivalence_csv)
    (out / "peers.md").write_text(markdown(rows, equivalent, lens))
    if stopped:
        print(f"stopped by --minutes: {len(rows)} points written; run again to go on")
    else:
        (out / "complete").write_text(f"{len(rows)} points\n")
    print(short_table(rows, lens))


if __name__ == "__main__":
    main()
