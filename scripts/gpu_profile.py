#!/usr/bin/env python3
"""Where a Nyström core call goes on a GPU: the torch path against the Triton path, in one run.

    scripts/gpu_profile.py [OUT] [--lens 1024,2048,...] [--minutes M] [--skip-tests] [--toy]
                           [--hybrid-matrix | --no-hybrid]

For one lent GPU, in one call, ratios from one run (docs/results/gpu-notes.md says why each):
0. ``--hybrid-matrix``: the hybrid's kernel at each launch setting of HYBRID_MATRIX, each in a
   process of its own (a fault ends a CUDA context), in bf16 then fp32: its error against
   float64 beside the torch path's, its GPU time, or how the process ended
   (OUT/hybrid-matrix.csv). The rest of the run uses the setting that passes in the most
   widths (the least GPU time among equals), for those widths, or leaves the hybrid out when
   none passes.
1. ``tests/gpu/test_landmark.py`` on CUDA: the compiled kernels against the float64 formula.
2. Both Nyström paths against the float64 formula on the same inputs (fp32, bf16): the
   relative error of the output and of the three gradients.
3. The landmark programs alone, per setting of their products (tf32x3, tf32) and warps:
   GPU time and error against float64 (OUT/variants.csv).
4. Times (median ms) and peak memory over SDPA, for bf16 and fp32, forward and forward +
   backward, batch 1, 12 heads of 64: ``sdpa``; Nyström-64 as ``nystrom-torch`` (the landmark
   side as torch ops, what every GPU run used so far) and ``nystrom-triton`` (this checkout's
   path); forward only, ``nystrom-triton-graph`` (that call captured once in a CUDA graph and
   replayed: what is left when launches cost nothing) and the Nyström-local hybrid at budget
   128 on both paths (``hybrid-torch``, ``hybrid-triton``). Two timings per cell: ``call_ms``,
   one call from an idle GPU as ``nys bench`` times it (launch-bound when the work is small),
   and ``stream_ms``, the mean of calls queued back to back (the GPU's own time, once the CPU
   keeps ahead of it).
5. The torch profiler over one forward and one forward + backward at n = 8,192 (bf16) for both
   Nyström paths: kernels launched, GPU time in kernels, the top kernels (OUT/profile-*.txt).

Writes OUT/gpu_profile.csv, OUT/equality.csv, OUT/variants.csv, OUT/profile-*.txt and prints
a short table last.
``--toy``: the CPU at n = 128 with the kernels in Triton's interpreter: the script's path, run by
the tests. ``--minutes``: stop timing new cells of step 4 when that much time has gone since
it began (the steps before it always run: a fresh machine compiles each kernel once, ~10 s,
about a minute for a tf32x3 backward).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # this checkout's nyscli, installed or not (a lent GPU machine)

HEADS, HEAD_DIM, LANDMARKS = 12, 64, 64
LENS = [1024, 2048, 4096, 8192, 16384, 65536]
PROFILE_LEN = 8192
ROWS = (
    "sdpa",
    "nystrom-torch",
    "nystrom-triton",
    "nystrom-fused",
    "nystrom-graphed",
    "nystrom-graphed-train",  # training's forward and backward graphed (gate "graph-train")
    "nystrom-triton-graph",
    "hybrid-torch",
    "hybrid-triton",
)


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out", nargs="?", default="gpu-profile", type=Path)
    parser.add_argument("--lens", default=",".join(map(str, LENS)))
    parser.add_argument("--minutes", type=float, default=None)
    parser.add_argument("--toy", action="store_true")
    parser.add_argument("--skip-tests", action="store_true", help="not step 1 (compiling)")
    parser.add_argument("--no-hybrid", action="store_true", help="Nyström's rows alone")
    parser.add_argument(
        "--hybrid-matrix",
        action="store_true",
        help="first, the hybrid kernel at each of HYBRID_MATRIX's launch settings, each in a "
        "process of its own; then the rest with the one passing in the most widths (the "
        "fastest among equals)",
    )
    parser.add_argument("--hybrid-probe", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args()


def main() -> None:
    args = parse()
    if args.toy:
        # The interpreter must be chosen before triton is first imported.
        os.environ["TRITON_INTERPRET"] = "1"
    import torch

    from nyscli.attention.gpu import gates

    with contextlib.ExitStack() as gated:
        if args.toy:  # CPU tensors through the kernels; CPU training would skip both paths
            gated.enter_context(gates.override(testing=True, fused_cpu=False))
        run(args, torch, gated)


def run(args: argparse.Namespace, torch, gated: contextlib.ExitStack) -> None:
    """``main`` with the gates of this run entered in ``gated``."""
    from nyscli import gpu_env
    from nyscli.attention.gpu import gates

    device = torch.device("cpu" if args.toy else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_profile: no CUDA device (use --toy on a CPU)")
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    lens = [128] if args.toy else [int(x) for x in args.lens.split(",")]
    if args.hybrid_probe:
        hybrid_probe(torch, device, 128 if args.toy else 1024)
        return
    print(environment(torch, device), flush=True)
    if not (args.toy or args.skip_tests):
        run_kernel_tests(out)
    if args.hybrid_matrix:
        found = hybrid_matrix(args.toy)
        write_csv(out / "hybrid-matrix.csv", found)
        setting, widths = chosen_setting(found)
        if widths:  # the rest of the run launches the hybrid's kernel so, for these widths
            launch = {**gates.current().hybrid_launch, **gpu_env.hybrid_launch(setting)}
            gated.enter_context(gates.override(hybrid_launch=launch))
            HYBRID_WIDTHS[:] = widths
            checked = ",".join(f"hybrid-{w}" for w in widths)
            print(f"hybrid kernel: NYS_HYBRID_LAUNCH={setting} NYS_GPU_CHECKED={checked}")
        else:
            print("hybrid kernel: no setting equals the torch path; Nyström's rows alone")
            args.no_hybrid = True
    if args.no_hybrid:
        global ROWS
        ROWS = tuple(row for row in ROWS if not row.startswith("hybrid"))
    same = equality(torch, device, 128 if args.toy else 4096)
    write_csv(out / "equality.csv", same)
    if bad := mismatches(same):
        sys.exit("gpu_profile: the Triton path is off float64: " + "; ".join(bad))
    write_csv(out / "variants.csv", variants(torch, device, args.toy))
    # --minutes bounds the timing table alone: the checks and variants before it always run.
    ends_at = None if args.minutes is None else time.monotonic() + 60 * args.minutes
    rows = timings(torch, device, lens, args.toy, ends_at)
    write_csv(out / "gpu_profile.csv", rows)
    for row, mode, n, autocast in PROFILES:
        if row.startswith("hybrid") and args.no_hybrid:
            continue
        at = "" if n == PROFILE_LEN or autocast else f"-{n}"  # beside the PROFILE_LEN one
        if args.toy and at:  # at toy size every n is 128: the PROFILE_LEN profile again
            continue
        text = profile(torch, device, row, mode, 128 if args.toy else n, autocast)
        name = f"{row.removeprefix('nystrom-')}-{mode}{at}{'-autocast' * autocast}"
        (out / f"profile-{name}.txt").write_text(text)
    print(summary(rows))


# The hybrid kernel's launch settings to try (the gates' hybrid_launch): tiles padded to 16
# or 64 (16 faulted on the H200 with Triton 3.6 in three leases, in both widths in lease 7;
# 64 passed), 3 or 1 pipeline stages (111 or 49 KB of shared memory in float32). ~20 s each
# on a fresh machine.
HYBRID_MATRIX = [
    "min_tile=16,num_warps=8,num_stages=3",
    "min_tile=64,num_warps=8,num_stages=3",
    "min_tile=16,num_warps=8,num_stages=1",
    "min_tile=64,num_warps=8,num_stages=1",
]
# The operand widths the hybrid's kernel serves in this run (all, unless the matrix found
# one of them faulting with the setting it chose).
HYBRID_WIDTHS = ["16-bit", "32-bit"]
WIDTH = {"bfloat16": "16-bit", "float32": "32-bit"}


def chosen_setting(rows: list[dict]) -> tuple[str, list[str]]:
    """The HYBRID_MATRIX setting with the most operand widths passing, and those; among
    settings passing as many, the one with the least GPU time over them (then the first)."""
    best, rank = ("", []), (0, 0.0)
    for setting in HYBRID_MATRIX:
        ok = [r for r in rows if r["setting"] == setting and r["status"] == "ok"]
        here = (len(ok), -sum(r.get("gpu_us", 0.0) for r in ok))
        if ok and here > rank:
            best, rank = (setting, sorted(WIDTH[r["dtype"]] for r in ok)), here
    return best


def hybrid_matrix(toy: bool) -> list[dict]:
    """Each HYBRID_MATRIX setting in a process of its own (a fault ends the CUDA context):
    per dtype (bf16 first, then fp32), the hybrid kernel's error against float64 beside the
    torch path's and its GPU time, or how the process ended before that dtype's row."""
    from nyscli import gpu_env

    rows = []
    for setting in HYBRID_MATRIX:
        cmd = [sys.executable, str(Path(__file__).resolve()), "--hybrid-probe"]
        env = {**os.environ, gpu_env.HYBRID_LAUNCH_ENV: setting}
        try:
            done = subprocess.run(
                cmd + ["--toy"] * toy, env=env, capture_output=True, text=True, timeout=240
            )
            lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
            found = {r["dtype"]: r for r in map(json.loads, lines)}
            ended = "ok" if done.returncode == 0 else f"exit {done.returncode}"
            why = (done.stderr.strip().splitlines() or [""])[-1][:200]
        except subprocess.TimeoutExpired:
            found, ended, why = {}, "timeout", ""
        for dtype in PROBE_DTYPES:
            row = {"setting": setting, "dtype": dtype, **found.get(dtype, {})}
            if dtype in found:
                row["status"] = "ok" if found[dtype]["within"] else "off float64"
            else:  # the process ended before this row: a fault, a timeout, an error
                row.update(status=ended if ended != "ok" else "missing", why=why)
            rows.append(row)
            print(f"hybrid {setting:<38} {dtype:<9} {row['status']:<12} " + (
                f"{row['error']:.2e} (torch {row['torch_error']:.2e}) {row['gpu_us']:.0f} us"
                if dtype in found else why
            ), flush=True)  # fmt: skip
    return rows


PROBE_DTYPES = ("bfloat16", "float32")  # bf16 first: the bench's rows, and no lease reached it


def kernel_serves(path: str, dtype) -> bool:
    """Whether the row ``path`` runs its own kernel in ``dtype``: not the hybrid's kernel in a
    width the matrix found faulting (the row would time the torch path under its name)."""
    return path != "hybrid-triton" or WIDTH[str(dtype).split(".")[-1]] in HYBRID_WIDTHS


def hybrid_probe(torch, device, n: int) -> None:
    """One line of JSON per dtype: the hybrid kernel (this process's NYS_HYBRID_LAUNCH)
    against the torch path in float64, beside the torch path in that dtype, and its GPU time."""
    from nyscli.attention.gpu import gates

    exact = inputs(torch, device, n, torch.float64, grad=False, seed=1)
    with torch.no_grad():
        want = core(torch, "hybrid-torch")(*exact)
        for dtype in (getattr(torch, name) for name in PROBE_DTYPES):
            x = [t.to(dtype) for t in exact]
            errors = {}
            for path in ("hybrid-torch", "hybrid-triton"):
                attention = core(torch, path)
                got = attention(*x)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)  # a fault surfaces here, in this row
                errors[path] = ((got.double() - want).norm() / want.norm()).item()
            # the kernel's path: the loop's last core
            gpu_us = 1e3 * bench_ms(torch, device, functools.partial(attention, *x))
            ok = errors["hybrid-triton"] <= max(4 * errors["hybrid-torch"], 1e-4)
            row = {"dtype": str(dtype).split(".")[-1], "n": n, **gates.current().hybrid_launch}
            row.update(error=errors["hybrid-triton"], torch_error=errors["hybrid-torch"])
            print(json.dumps({**row, "gpu_us": gpu_us, "within": ok}), flush=True)


def bench_ms(torch, device, fn: Callable[[], object]) -> float:
    """GPU time of fn in ms (``triton.testing.do_bench``; wall clock on a CPU)."""
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - start)
    from triton.testing import do_bench

    return do_bench(fn, warmup=10, rep=50)


def environment(torch, device) -> str:
    line = f"torch {torch.__version__}"
    try:
        import triton

        line += f", triton {triton.__version__}"
    except ImportError:
        line += ", no triton"
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        line += f", {props.name}, {props.multi_processor_count} SMs"
    return line


def run_kernel_tests(out: Path) -> None:
    """The float64 kernel tests, on CUDA tensors (no interpreter where a GPU is present)."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0"]
    cmd += ["tests/gpu/test_landmark.py"]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=420)
    (out / "kernel-tests.txt").write_text(done.stdout + done.stderr)
    last = (done.stdout.strip().splitlines() or ["(no output)"])[-1]
    print(f"kernel tests on CUDA: exit {done.returncode}: {last}", flush=True)


class Gated:
    """A core called under the gates that put it on one path (no autograd across calls)."""

    def __init__(self, attention, switches: dict) -> None:
        self.attention, self.switches = attention, switches

    def __call__(self, *args):
        from nyscli.attention.gpu import gates

        with gates.override(**self.switches):
            return self.attention(*args)


def core(torch, path: str) -> Gated:
    """The attention core of ``path``, called with the gates that put Nyström on that path."""
    from nyscli.attention import build_attention
    from nyscli.attention.gpu import gates

    if path == "sdpa":
        return Gated(build_attention({"name": "softmax"}), {})
    # The kernels no GPU has checked yet, on for the rows that check them.
    checked = set(gates.current().checked) - {"hybrid-16-bit", "hybrid-32-bit", "inference"}
    checked -= {"graph"}
    checked |= {f"hybrid-{w}" for w in HYBRID_WIDTHS if path == "hybrid-triton"}
    checked |= {"inference"} if path in ("nystrom-fused", "nystrom-graphed") else set()
    checked |= {"graph"} if path == "nystrom-graphed" else set()
    checked |= {"graph-train"} if path == "nystrom-graphed-train" else set()
    switches = {
        "triton": path.endswith(("-triton", "-fused", "-graphed", "-graphed-train"))
        and _triton_found(),
        "checked": checked,
    }
    if path.startswith("hybrid"):  # budget 128: w 65, m 16, g 32
        return Gated(build_attention({"name": "nystrom_local"}), switches)
    return Gated(build_attention({"name": "nystrom", "num_landmarks": LANDMARKS}), switches)


def _triton_found() -> bool:
    import importlib.util

    return importlib.util.find_spec("triton") is not None


def inputs(torch, device, n: int, dtype, grad: bool, seed: int = 0):
    g = torch.Generator(device=device).manual_seed(seed)
    shape = (1, HEADS, n, HEAD_DIM)
    return [
        torch.randn(shape, generator=g, device=device, dtype=dtype).requires_grad_(grad)
        for _ in range(3)
    ]


def equality(torch, device, n: int) -> list[dict]:
    """Each Nyström path against the float64 formula (the torch path in float64), output and
    the three gradients, for fp32 and bf16 inputs (the same values, rounded)."""

    def run(path: str, dtype) -> list:
        attention = core(torch, path)
        for _ in range(3 if path == "nystrom-graphed-train" else 1):  # seen, captured, replayed
            q, k, v = (x.detach().to(dtype).requires_grad_() for x in exact_inputs)
            out = attention(q, k, v)
            grads = torch.autograd.grad(out, (q, k, v), upstream.to(dtype))
        return [out, *grads]

    exact_inputs = inputs(torch, device, n, torch.float64, grad=False, seed=1)
    upstream = inputs(torch, device, n, torch.float64, grad=False, seed=2)[0]
    reference = run("nystrom-torch", torch.float64)
    rows = []
    trained = ["nystrom-torch", "nystrom-triton"]
    if device.type == "cuda" and "nystrom-graphed-train" in ROWS:
        trained.append("nystrom-graphed-train")
    for dtype in (torch.float32, torch.bfloat16):
        for path in trained:
            names = ("out", "grad_q", "grad_k", "grad_v")
            for name, got, want in zip(names, run(path, dtype), reference, strict=True):
                error = ((got.double() - want).norm() / want.norm()).item()
                row = {
                    "dtype": str(dtype).split(".")[-1],
                    "n": n,
                    "path": path,
                    "tensor": name,
                    "relative_error_vs_float64": error,
                }
                rows.append(row)
                print(f"{row['dtype']:>8} {path:<15} {name:<6} vs float64: {error:.2e}", flush=True)
    # The kernels that serve inference only (Nyström's fused forward, the hybrid's): output.
    graphed = ["nystrom-graphed"] if device.type == "cuda" else []  # a CPU has no graphs
    families = [
        ("nystrom", ["nystrom-fused", *graphed]),
        ("hybrid", ["hybrid-torch", "hybrid-triton"]),
    ]
    with torch.no_grad():
        for family, paths in families:
            paths = [path for path in paths if path in ROWS]
            if not paths:
                continue
            want = reference[0].detach()
            if family == "hybrid":
                want = core(torch, "hybrid-torch")(*exact_inputs)
            for dtype in (torch.float32, torch.bfloat16):
                x = [t.to(dtype) for t in exact_inputs]
                for path in paths:
                    if not kernel_serves(path, dtype):
                        continue
                    attention = core(torch, path)
                    for _ in range(3 if path == "nystrom-graphed" else 1):
                        got = attention(*x)  # a graph's: seen, captured, then replayed
                    error = ((got.double() - want).norm() / want.norm()).item()
                    label = str(dtype).split(".")[-1]
                    row = {"dtype": label, "n": n, "path": path, "tensor": "out"}
                    rows.append({**row, "relative_error_vs_float64": error})
                    print(f"{label:>8} {path:<15} out    vs float64: {error:.2e}", flush=True)
    return rows


def mismatches(rows: list[dict]) -> list[str]:
    """The kernels' rows more than 4x (and 1e-4) further from float64 than the torch path's
    same row: a kernel that computes something else, not rounding."""
    torch_rows = {
        (r["dtype"], r["path"].split("-")[0], r["tensor"]): r["relative_error_vs_float64"]
        for r in rows
        if r["path"].endswith("-torch")
    }
    bad = []
    for r in rows:
        if not r["path"].endswith("-torch"):
            ref = torch_rows[(r["dtype"], r["path"].split("-")[0], r["tensor"])]
            error = r["relative_error_vs_float64"]
            if not error <= max(4 * ref, ref + 1e-4):  # NaN fails too
                bad.append(f"{r['dtype']} {r['path']} {r['tensor']}: {error:.2e} vs {ref:.2e}")
    return bad


def timer(torch, device) -> tuple[Callable, Callable]:
    """(call_ms, stream_ms): one call from an idle device; the mean of calls queued back to
    back."""

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def call_ms(fn: Callable[[], object]) -> float:
        sync()
        if device.type == "cuda":
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            fn()
            end.record()
            sync()
            return float(start.elapsed_time(end))
        began = time.perf_counter()
        fn()
        return (time.perf_counter() - began) * 1000

    def stream_ms(fn: Callable[[], object], count: int) -> float:
        sync()
        began = time.perf_counter()
        for _ in range(count):
            fn()
        sync()
        return (time.perf_counter() - began) * 1000 / count

    return call_ms, stream_ms


def build(torch, device, row: str, n: int, dtype, train: bool) -> Callable[[], object] | None:
    """The timed call of one cell (None: the row has no such cell)."""
    if row == "nystrom-graphed-train":
        if not train or device.type != "cuda":  # a CPU has no graphs
            return None
    elif "graph" in row and (train or device.type != "cuda"):
        return None
    if (row.startswith("hybrid") or row in ("nystrom-fused", "nystrom-graphed")) and train:
        return None  # their kernels serve inference only
    if not kernel_serves(row, dtype):
        return None
    attention = core(torch, row)
    q, k, v = inputs(torch, device, n, dtype, grad=train)
    if train:
        upstream = torch.randn(q.shape, device=device, dtype=dtype)

        def step() -> None:
            attention(q, k, v).backward(upstream)
            for x in (q, k, v):
                x.grad = None

        return step
    if not row.endswith("graph"):

        def forward():
            with torch.inference_mode():
                return attention(q, k, v)

        return forward
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side), torch.inference_mode():
        for _ in range(3):
            attention(q, k, v)  # compiles the kernels and settles the allocator, off the graph
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph), torch.inference_mode():
        attention(q, k, v)
    return graph.replay


# The landmark programs' settings to time (the gates' products and warps), the current one first.
FORWARD_VARIANTS = [("tf32x3", 4), ("tf32", 4), ("tf32", 8)]
BACKWARD_VARIANTS = [("tf32x3", 8), ("tf32", 4), ("tf32", 8)]


def variants(torch, device, toy: bool) -> list[dict]:
    """Each landmark program alone, per setting of its products and warps: GPU time (CUDA
    events, ``triton.testing.do_bench``; wall clock on a CPU) and the relative error of W
    (forward) or of the worst of its three gradients (backward) against the float64 formula.
    Landmarks: segment means of n = 8,192 random tokens (64 of 128 each), 12 heads, float32
    (W comes back in its inputs' dtype: bf16's rounding would hide the products' error)."""
    import torch.nn.functional as F

    from nyscli.attention.gpu import gates, landmark, reference

    n, m = (256, 16) if toy else (PROFILE_LEN, LANDMARKS)
    q, k, v = inputs(torch, device, n, torch.float32, grad=False, seed=3)
    means = [x.view(1, HEADS, m, n // m, HEAD_DIM).mean(3) for x in (q, k)]
    bv = F.scaled_dot_product_attention(means[0], k, v)
    upstream = torch.randn(bv.shape, device=device, dtype=torch.float64)
    exact = [x.double().requires_grad_() for x in (*means, bv)]
    w_ref = reference.landmark_weights(*exact, None, 6)
    g_ref = torch.autograd.grad(w_ref, exact, upstream)

    def error(got, want) -> float:
        return ((got.double() - want).norm() / want.norm()).item()

    rows = []
    saved = gates.current()
    x = [t.contiguous() for t in (*means, bv)]
    grad_w = upstream.float()
    for kernel, settings in (("forward", FORWARD_VARIANTS), ("backward", BACKWARD_VARIANTS)):
        for products, warps in settings:
            # the same products whatever the operands (these are float32), these warps
            setting = {
                "products": dict.fromkeys(saved.products, products),
                "warps": {**saved.warps, products: {**saved.warps[products], kernel: warps}},
            }
            if kernel == "forward":
                call = lambda: landmark._forward(*x, None, 6)  # noqa: E731
            else:
                call = lambda: landmark._backward(*x, None, grad_w, 6)  # noqa: E731

            def fn(call=call, setting=setting):
                with gates.override(**setting):
                    return call()

            if kernel == "forward":
                err = error(fn(), w_ref)
            else:
                err = max(error(g, r) for g, r in zip(fn(), g_ref, strict=True))
            row = {"kernel": kernel, "products": products, "warps": warps}
            row.update(gpu_us=1e3 * bench_ms(torch, device, fn), relative_error_vs_float64=err)
            rows.append(row)
            print(
                f"{kernel:>8} {products:>6} {warps:>2} warps: {row['gpu_us']:8.1f} us, "
                f"error {err:.2e}",
                flush=True,
            )
    return rows


def peak_mb(torch, device, fn: Callable[[], object]) -> float:
    if device.type != "cuda":
        return float("nan")
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return (torch.cuda.max_memory_allocated(device) - before) / 2**20


def timings(torch, device, lens: list[int], toy: bool, ends_at: float | None) -> list[dict]:
    call_ms, stream_ms = timer(torch, device)
    dtypes = [torch.float32] if toy else [torch.bfloat16, torch.float32]
    rows = []
    for dtype in dtypes:
        for train in (False, True):
            for n in lens:
                if ends_at is not None and time.monotonic() > ends_at:
                    print(f"time is up: not timed from {dtype} train={train} n={n}")
                    return rows
                base = None
                for row in ROWS:
                    cell = {
                        "dtype": str(dtype).split(".")[-1],
                        "mode": "train" if train else "forward",
                        "n": n,
                        "row": row,
                    }
                    try:
                        fn = build(torch, device, row, n, dtype, train)
                        if fn is None:
                            continue
                        held = torch.cuda.memory_allocated() if device.type == "cuda" else 0
                        for _ in range(2 if toy else 5):
                            fn()  # warm-up: compilation, allocator, autotuning, graph capture
                        if device.type == "cuda":  # what the core keeps (a graph's output)
                            held = torch.cuda.memory_allocated() - held
                        memory = peak_mb(torch, device, fn) + held / 2**20
                        first = call_ms(fn)
                        repeats = max(3, min(50, int(1000 / max(first, 1e-3))))
                        times = [call_ms(fn) for _ in range(2 if toy else repeats)]
                        cell.update(
                            call_ms=statistics.median(times),
                            stream_ms=stream_ms(fn, 2 if toy else repeats),
                            peak_mb=memory,
                            repeats=len(times),
                        )
                    except Exception as error:  # one cell's failure (OOM) is a row, not the end
                        cell["error"] = f"{type(error).__name__}: {str(error)[:160]}"
                        if device.type == "cuda":
                            torch.cuda.empty_cache()
                    if row == "sdpa":
                        base = cell
                    if base and "call_ms" in cell and "call_ms" in base:
                        cell["speedup_call"] = base["call_ms"] / cell["call_ms"]
                        cell["speedup_stream"] = base["stream_ms"] / cell["stream_ms"]
                        if device.type == "cuda":
                            cell["memory_ratio"] = cell["peak_mb"] / max(base["peak_mb"], 1e-9)
                    rows.append(cell)
                    print(_line(cell), flush=True)
    return rows


def _line(cell: dict) -> str:
    head = f"{cell['dtype']:>8} {cell['mode']:>7} n={cell['n']:>6} {cell['row']:<22}"
    if "error" in cell:
        return f"{head} {cell['error']}"
    return (
        f"{head} call {cell['call_ms']:8.3f} ms ({cell.get('speedup_call', 1):6.2f}x)  "
        f"stream {cell['stream_ms']:8.3f} ms ({cell.get('speedup_stream', 1):6.2f}x)  "
        f"peak {cell['peak_mb']:8.1f} MB"
    )


# One call of each under the torch profiler: (row, mode, n, autocast). The bench feeds float32
# q, k, v under bf16 autocast, and its Nyström forward at 65,536 was 0.745 ms against 0.389 ms
# with bf16 tensors (lease 7); the hybrid's kernel took 1.4-2.4 ms up to 16,384, unexplained.
PROFILES = [
    *[(f"nystrom-{path}", mode, PROFILE_LEN, False)
      for path in ("torch", "triton") for mode in ("forward", "train")],
    ("nystrom-fused", "forward", PROFILE_LEN, False),
    ("nystrom-fused", "forward", 65536, True),
    ("hybrid-triton", "forward", PROFILE_LEN, False),
    # one forward + backward at 4,096, eager and graphed (before and after graphing)
    ("nystrom-triton", "train", 4096, False),
    ("nystrom-graphed-train", "train", 4096, False),
]  # fmt: skip


def profile(torch, device, row: str, mode: str, n: int, autocast: bool = False) -> str:
    """One call under the torch profiler: kernels launched, their GPU time, the top ones.
    ``autocast``: float32 inputs under bf16 autocast, as the bench runs bf16."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    half = device.type == "cuda" and not autocast
    dtype = torch.bfloat16 if half else torch.float32
    built = build(torch, device, row, n, dtype, train=mode == "train")
    if built is None:
        return f"{row} {mode}: no such cell here\n"
    on = device.type == "cuda" and autocast

    def fn():
        with torch.autocast(device.type, dtype=torch.bfloat16) if on else contextlib.nullcontext():
            return built()

    for _ in range(3):
        fn()
    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    with torch_profile(activities=activities) as prof:
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    events = prof.key_averages()
    kernels = [
        e
        for e in events
        if getattr(e, "device_type", None) is not None and str(e.device_type).endswith("CUDA")
    ]
    launched = sum(e.count for e in kernels)
    gpu_us = sum(getattr(e, "self_device_time_total", 0) for e in kernels)
    sort = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    head = (
        f"{row} {mode}, n = {n}, {dtype}{' under bf16 autocast' * on}: "
        f"{launched} kernels launched, "
        f"{gpu_us:.0f} us of GPU time in kernels\n\n"
    )
    print(head.strip(), flush=True)
    return head + events.table(sort_by=sort, row_limit=25)


def write_csv(path: Path, rows: list[dict]) -> None:
    fields: list[str] = []
    for row in rows:
        fields += [key for key in row if key not in fields]
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def summary(rows: list[dict]) -> str:
    """The short table printed last: speed-up over SDPA per cell, call and stream timing."""
    lines = ["", "speed-up over SDPA (call / stream), peak memory / SDPA's"]
    for row in rows:
        if row["row"] == "sdpa" or "speedup_call" not in row:
            continue
        memory = f"{row['memory_ratio']:.2f}" if "memory_ratio" in row else "-"
        lines.append(
            f"{row['dtype']:>8} {row['mode']:>7} n={row['n']:>6} {row['row']:<22} "
            f"{row['speedup_call']:6.2f}x / {row['speedup_stream']:6.2f}x  mem {memory}"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
