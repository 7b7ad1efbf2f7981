#!/usr/bin/env python3
"""Where one training step of the paper's LRA model spends its time .

    .venv/bin/python scripts/profile_step.py --task listops --attention nystrom [--threads 2]
        [--device cuda] [--precision bf16] [--compile]

The model of ``nys lra`` (conf/model/lra.yaml: 2 pre-LN blocks, width 64, 2 heads, FFN 128,
dropout 0.1; Nyström-64 with its conv skip 35) on one batch of 32 full-length sequences, one
AdamW update per step. Each part's share is measured by leaving it out (variants timed in
turn, one step each, so machine load hits all alike; the median of ``--repeats`` rounds):

- attention core: the core replaced by "return v" (projections and conv skip kept);
- conv skip: kernel 0; dropout: p = 0; optimizer: no ``step()``;
- backward: the full step minus the forward alone and the optimizer;
- the rest (embeddings, projections, FFN, norms, pooling, head, loss) is what is left.

Then the arithmetic floor: the step's FLOPs (torch's FlopCounterMode, with formulas for the
CPU flash-attention kernels and the depthwise conv it miscounts) at this machine's own float32
matrix-product rate (a 2048^3 product timed here), and how far the step sits above it. The
data path (collating a batch) is timed on its own. ``--compile`` adds a ``torch.compile``d
step (the trainer's ``trainer.compile=true``).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this checkout's nyscli

import torch  # noqa: E402 (after the path)
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from nyscli.data.common import ClassificationCollate
from nyscli.experiments.bench.worker import ValuesOnly
from nyscli.models.classifier import build_classifier
from nyscli.train.optim import build_optimizer

# The LRA tasks' lengths, vocabularies and classes (conf/task/*.yaml, the data modules).
TASKS = {
    "listops": {"n": 2000, "vocab": 20, "classes": 10, "pooling": "cls"},
    "text": {"n": 4000, "vocab": 259, "classes": 2, "pooling": "mean"},
    "image": {"n": 1024, "vocab": 259, "classes": 10, "pooling": "mean"},
}
MODEL = {"dim": 64, "depth": 2, "num_heads": 2, "ffn_dim": 128}
BATCH = 32


def attention_config(name: str, conv: bool) -> dict:
    if name == "nystrom":
        return {"name": "nystrom", "num_landmarks": 64, "conv_kernel_size": 35 if conv else 0}
    return {"name": name}


def make_step(
    task: str, attention: str, variant: str, device: str, precision: str = "fp32"
) -> Callable[[], None]:
    """One training step of ``variant`` on a fixed random batch (seeded), on ``device``,
    under autocast to bf16 for ``precision`` "bf16" (the trainer's ``trainer.precision``)."""
    spec = TASKS[task]
    torch.manual_seed(0)
    model = build_classifier(
        vocab_size=spec["vocab"],
        max_len=spec["n"],
        num_classes=spec["classes"],
        model={
            **MODEL,
            "dropout": 0.0 if variant == "no dropout" else 0.1,
            "pooling": spec["pooling"],
        },
        attention=attention_config(attention, conv=variant != "no conv skip"),
    ).to(device)
    if variant == "no attention core":
        for block in model.encoder.blocks:
            block.attention.core = ValuesOnly()
    optimizer = build_optimizer(model, 1e-4)
    forward = torch.compile(model) if variant == "compiled" else model
    ids = torch.randint(1, spec["vocab"], (BATCH, spec["n"]), device=device)
    mask = torch.ones(BATCH, spec["n"], dtype=torch.bool, device=device)
    labels = torch.randint(0, spec["classes"], (BATCH,), device=device)

    autocast = torch.autocast(device, dtype=torch.bfloat16, enabled=precision == "bf16")

    def step() -> None:
        if variant == "forward only":
            with torch.no_grad(), autocast:
                model(ids, mask)
            return
        with autocast:
            loss = nn.functional.cross_entropy(forward(ids, mask), labels)
        loss.backward()
        if variant != "no optimizer":
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def _sdpa(q, k, v, *args, **kwargs) -> int:  # noqa: ANN001
    return sdpa_flop_count(q, k, v)


def _sdpa_backward(grad_out, q, k, v, *args, **kwargs) -> int:  # noqa: ANN001
    return sdpa_backward_flop_count(grad_out, q, k, v)


def _conv_backward(grad_out, x, weight, *args, output_mask=None, **kwargs) -> int:  # noqa: ANN001
    """torch's own formula ignores ``groups``: a depthwise conv (the conv skip) counted as a
    dense one, 64x over. Each gradient costs what the forward does: 2 per output element
    per input channel of its group per tap."""
    mask = args[-1] if output_mask is None else output_mask
    forward = 2 * math.prod(grad_out) * math.prod(weight[1:])
    return forward * sum(bool(m) for m in mask[:2])


# The CPU kernels that torch's FLOP counter has no formula for (it counts them as 0).
FLOP_FIXES = {
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu: _sdpa,
    torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward: _sdpa_backward,
    torch.ops.aten.convolution_backward: _conv_backward,
}


def synchronize() -> None:
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()


def timed(call: Callable[[], None]) -> float:
    """Seconds ``call()`` takes, with the GPU work it queued (synchronised on CUDA)."""
    synchronize()
    start = time.perf_counter()
    call()
    synchronize()
    return time.perf_counter() - start


def matmul_rate(device: str) -> float:
    """The device's float32 matrix-product rate (FLOP/s), best of 5 products of 2048^3."""
    a, b = (torch.randn(2048, 2048, device=device) for _ in range(2))
    a @ b
    return 2 * 2048**3 / min(timed(lambda: a @ b) for _ in range(5))


def collate_seconds(task: str) -> float:
    """Seconds to collate one batch of 32 random-length sequences (the task's length range)."""
    n = TASKS[task]["n"]
    gen = torch.Generator().manual_seed(0)
    batch = [
        (torch.randint(1, 20, (int(torch.randint(n // 4, n + 1, (1,), generator=gen)),)), 0)
        for _ in range(BATCH)
    ]
    collate = ClassificationCollate(n)
    return statistics.median(timed(lambda: collate(batch)) for _ in range(20))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--task", choices=sorted(TASKS), default="listops")
    parser.add_argument("--attention", choices=["nystrom", "softmax"], default="nystrom")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--compile", action="store_true", help="also time torch.compile's step")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument(
        "--precision", choices=["fp32", "bf16"], default="fp32", help="as trainer.precision"
    )
    opts = parser.parse_args()
    if opts.threads:
        torch.set_num_threads(opts.threads)
    variants = ["full", "no attention core", "no dropout", "no optimizer", "forward only"]
    if opts.attention == "nystrom":
        variants.insert(2, "no conv skip")
    if opts.compile:
        variants.append("compiled")
    steps = {
        v: make_step(opts.task, opts.attention, v, opts.device, opts.precision) for v in variants
    }
    for v, step in steps.items():  # warm-up: allocator, first-call kernels, compiling
        warm = timed(step)
        if v == "compiled":
            print(f"compiled: first step {warm:.0f} s")
    times: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(opts.repeats):
        for v, step in steps.items():
            times[v].append(timed(step))
    med = {v: statistics.median(t) for v, t in times.items()}
    full = med["full"]
    parts = {
        "attention core": full - med["no attention core"],
        "conv skip": full - med.get("no conv skip", full),
        "dropout": full - med["no dropout"],
        "optimizer": full - med["no optimizer"],
    }
    parts["rest (embeddings, projections, FFN, norms, head)"] = full - sum(parts.values())
    tokens = BATCH * TASKS[opts.task]["n"]
    print(
        f"{opts.task} n={TASKS[opts.task]['n']}, {opts.attention}, batch {BATCH}, "
        f"{opts.device}, {opts.precision}, {torch.get_num_threads()} threads, "
        f"{opts.repeats} rounds"
    )
    print(
        f"full step {1000 * full:.0f} ms ({tokens / full:,.0f} tokens/s); forward alone "
        f"{1000 * med['forward only']:.0f} ms, backward ~"
        f"{1000 * (med['no optimizer'] - med['forward only']):.0f} ms"
    )
    if "compiled" in med:
        print(
            f"compiled step {1000 * med['compiled']:.0f} ms ({full / med['compiled']:.2f}x eager)"
        )
    for name, seconds in parts.items():
        print(f"  {name:50s} {1000 * seconds:7.0f} ms  {100 * seconds / full:5.1f}%")
    print(
        f"  {'data: collate one batch (separate)':50s} {1000 * collate_seconds(opts.task):7.1f} ms"
    )
    with FlopCounterMode(display=False, custom_mapping=FLOP_FIXES) as counter:
        steps["no optimizer"]()
    flops, rate = counter.get_total_flops(), matmul_rate(opts.device)
    print(
        f"arithmetic: {flops / 1e9:.1f} GFLOP a step (matrix products), machine float32 "
        f"rate {rate / 1e9:.0f} GFLOP/s -> floor {1000 * flops / rate:.0f} ms; "
        f"the step is {full * rate / flops:.1f}x the floor"
    )


if __name__ == "__main__":
    main()
