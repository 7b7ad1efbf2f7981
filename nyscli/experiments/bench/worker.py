"""Measure one grid point of ``nys bench`` (one attention, one n) in a fresh process.

Run as ``python -m nyscli.experiments.bench.worker '<json spec>'``: the worker warms up,
measures the peak memory of one call, prints ``NYS_READY {json}`` and then times one call for
every ``time`` line on its stdin (``NYS_TIME <ms>``), until any other line or end of input.
A failure is one line ``NYS_RESULT {json}`` with its status (oom/error). ``nys bench`` keeps
one worker per attention alive and asks them in turn, so every row of one n is timed
interleaved, under the same machine load. A fresh process per point keeps the CPU peak-RSS
reading honest and keeps an out-of-memory at one point from ending the whole benchmark.
"""

from __future__ import annotations

import contextlib
import json
import resource
import statistics
import sys
from collections.abc import Callable
from typing import Any

import torch

from nyscli.attention import MultiHeadAttention, build_attention
from nyscli.attention.core import Core
from nyscli.attention.gpu.graphs import Graphs
from nyscli.experiments.bench import rules
from nyscli.experiments.bench.memory import warm_peak_mb
from nyscli.experiments.bench.timing import time_call_ms

DTYPES = {name: getattr(torch, kind) for name, kind in rules.DTYPES.items()}
RESULT_PREFIX = "NYS_RESULT "
READY_PREFIX = "NYS_READY "
REWARM_BELOW_MS = 1000.0  # calls shorter than this get an untimed call before each timed one
TIME_PREFIX = "NYS_TIME "
OOM_MESSAGES = ("out of memory", "can't allocate memory", "cannot allocate memory")


class ValuesOnly(torch.nn.Module):
    """A stand-in core that returns v: (B, H, n, d) as it is."""

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        return v


def build_call(spec: dict[str, Any], device: torch.device) -> Callable[[], object]:
    """The function timed at this point: one forward (or forward + backward) on random input.

    scope "module": x (B, n, hidden) through MultiHeadAttention (projections included).
    scope "projections": the same module with the core replaced by ``ValuesOnly``: what the
    module costs around its core (projections, head split/merge, conv skip), its floor.
    scope "core": q, k, v (B, H, n, hidden/H) through the attention core only, in the
    compute dtype (bf16/fp16 tensors under autocast, as a model's projections hand them
    over: float32 ones would make every call cast them first, which SDPA's does).
    """
    torch.manual_seed(spec["seed"])
    b, n, hidden, heads = spec["batch_size"], spec["seq_len"], spec["hidden"], spec["num_heads"]
    train = spec["mode"] == "train"
    dtype = DTYPES[spec["dtype"]]
    if spec["scope"] in ("module", "projections"):
        model = MultiHeadAttention(hidden, heads, spec["attention"]).to(device)
        if spec["scope"] == "projections":
            model.core = ValuesOnly()
        inputs = [torch.randn(b, n, hidden, device=device, requires_grad=train)]
    else:
        model = build_attention(spec["attention"]).to(device)
        shape = (b, heads, n, hidden // heads)
        inputs = [
            torch.randn(shape, device=device, dtype=dtype, requires_grad=train) for _ in range(3)
        ]
    model.train(train)
    call = timed_call(model, inputs, train, dtype, device, list(model.parameters()))
    call.model = model  # type: ignore[attr-defined]  # for replays_graphs
    return call


def replays_graphs(model: torch.nn.Module) -> bool:
    """Whether a core of model holds a CUDA graph of its call (``attention.gpu.graphs``, of
    inference or training): its time is then a replay's, on the same inputs each call."""
    found = (value for m in model.modules() for value in vars(m).values())
    return any(isinstance(graphs, Graphs) and bool(graphs.graphs) for graphs in found)


@contextlib.contextmanager
def recorded_path(model: torch.nn.Module, taken: list[tuple[str, str]]):
    """While open, each call of model's core appends (the path it takes, the dtype of the q it
    is handed) to ``taken``: ``Core.path`` asked with the call's own inputs, so in its grad
    mode and autocast."""
    core = model.core if isinstance(model, MultiHeadAttention) else model
    if not isinstance(core, Core):  # the projections' stand-in: no core
        yield
        return
    hook = core.register_forward_pre_hook(
        lambda module, args, kwargs: taken.append(
            (str(module.path(*args, **kwargs)), str(args[0].dtype).removeprefix("torch."))
        ),
        with_kwargs=True,
    )
    try:
        yield
    finally:
        hook.remove()


def timed_call(
    model: Callable[..., torch.Tensor],
    inputs: list[torch.Tensor],
    train: bool,
    dtype: torch.dtype,
    device: torch.device,
    parameters: list[torch.Tensor],
) -> Callable[[], object]:
    """``model(*inputs)`` under autocast to ``dtype`` (none in fp32) as the call a bench times:
    in inference mode, or (``train``) forward then backward from a fixed random gradient, the
    inputs' and ``parameters``' gradients cleared after each call."""
    autocast = torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32)
    upstream: list[torch.Tensor] = []

    def forward() -> torch.Tensor:
        with autocast:
            return model(*inputs)

    def forward_backward() -> None:
        out = forward()
        # A dense gradient in the output's own layout, as a next layer sends back; the
        # broadcast ones of sum().backward() made the kernels copy them out first.
        if not upstream:
            upstream.append(torch.randn_like(out))
        out.backward(upstream[0])
        for tensor in [*inputs, *parameters]:
            tensor.grad = None

    def inference() -> torch.Tensor:
        with torch.inference_mode():
            return forward()

    return forward_backward if train else inference


def prepare(spec: dict[str, Any]) -> tuple[Callable[[], object], torch.device, dict[str, Any]]:
    """Build the call, warm up, measure its memory, then time one call (which sizes the
    repeats): (call, device, {"peak_mb", "first_ms", "cuda_graph", "path", "input_dtype"})."""
    device = torch.device(spec["device"])
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    call = build_call(spec, device)
    taken: list[tuple[str, str]] = []
    with recorded_path(call.model, taken):  # type: ignore[attr-defined]
        memory = warm_peak_mb(call, device, max(1, spec["warmup"]))
    first = time_call_ms(call, device)
    graphed = replays_graphs(call.model)  # type: ignore[attr-defined]
    ready = {"peak_mb": memory, "first_ms": first, "cuda_graph": graphed}
    path, input_dtype = taken[-1] if taken else ("", "")
    return call, device, {**ready, "path": path, "input_dtype": input_dtype}


def summarize(times: list[float]) -> dict[str, Any]:
    """A point's time from its timed calls (ms): the lower quartile (``time_ms``), with the
    median, the minimum, the upper quartile and the interquartile range beside it.

    A busy machine only ever lengthens a call (a descheduled thread, evicted caches), so the
    calls' low end is what the code costs and the high end is the machine; the lower quartile
    stays there without resting on one lucky call as the minimum does."""
    if len(times) > 1:
        low, median, high = statistics.quantiles(times, n=4, method="inclusive")
    else:
        low = median = high = times[0]
    return {
        "time_ms": low,
        "time_ms_median": median,
        "time_ms_min": min(times),
        "time_ms_q3": high,
        "time_ms_iqr": high - low,
        "repeats": len(times),
    }


def serve(spec: dict[str, Any]) -> None:
    """Prepare, report ``NYS_READY``, then time one call per ``time`` line on stdin.

    A call shorter than ``REWARM_BELOW_MS`` is preceded by one untimed call each time: between
    its samples the other rows' workers run, and a short call timed straight after a long one
    pays for refilling caches the other process evicted: Nyström-64's core forward at n = 8192
    read 48-50 ms after SDPA's 1.7 s call, 37-38 ms with the untimed call. The untimed call puts it
    back in the state a loop over the same call sees, which is what the row reports. For a call
    of a second or more that refill is well under 1% and the extra call would double its cost.
    """
    call, device, ready = prepare(spec)
    print(READY_PREFIX + json.dumps(ready), flush=True)
    rewarm = ready["first_ms"] < REWARM_BELOW_MS
    for line in sys.stdin:
        if line.strip() != "time":
            break
        if rewarm:
            call()
        print(f"{TIME_PREFIX}{time_call_ms(call, device)!r}", flush=True)


def is_oom(error: BaseException) -> bool:
    if isinstance(error, (MemoryError, torch.OutOfMemoryError)):
        return True
    return any(text in str(error).lower() for text in OOM_MESSAGES)


def limit_address_space(limit_mb: float | None) -> None:
    """Cap virtual memory so a too-large point fails with an allocation error (marked OOM)
    instead of pushing the machine into swap or the kernel's OOM killer."""
    if limit_mb:
        limit = int(limit_mb * 1024 * 1024)
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def main() -> None:
    spec = json.loads(sys.argv[1])
    if spec["device"] == "cpu":
        limit_address_space(spec.get("memory_limit_mb"))
    try:
        serve(spec)
    except Exception as error:  # one point failing must not end the benchmark
        status = "oom" if is_oom(error) else "error"
        result = {"status": status, "error": " ".join(str(error).split())[:300]}
        print(RESULT_PREFIX + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
