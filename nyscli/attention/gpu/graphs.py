"""CUDA graphs of a core's inference call, replayed when the same inputs come back.

Below n ~ 16K a Nyström forward on a GPU is bound by its launches and their Python, not its
work (docs/results/gpu-notes.md, "graphs"). A CUDA graph replays the whole call in one launch.

A graph reads its inputs from the addresses it was captured with, so a cached graph is keyed
by where q, k and v live (pointer, shape, strides, dtype) and by the autocast state: a call
whose q, k, v sit at those addresses with that layout is the same computation on whatever
values they now hold. The output lives in the graph's memory and is copied out at each
replay, so an output the caller keeps is never overwritten by a later call. A layout is
captured the second time it is seen (the first call runs as usual and compiles the kernels),
at most ``size`` graphs per core are kept (least recently used first out), and a core whose
calls keep missing stops capturing. Inference only (no autograd), on CUDA, outside
torch.compile; each kept graph holds one output-sized buffer.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from nyscli.attention.gpu import gates

GATE = "graph"
# Calls of at most this many (sequence, head, token) rows are replayed: below it a call's
# launches outlast its work, and each kept graph's output buffer stays small
# (docs/results/gpu-notes.md, "graphs").
GRAPH_MAX_ROWS = 12 * 16384

# Captures per core without a replay in between, after which it stops capturing: inputs that
# never come back at the same addresses (a new allocation each call) would otherwise pay a
# capture (~ms) per call.
MAX_MISSES = 8


def serves(q: Tensor, key_padding_mask: Tensor | None) -> bool:
    """Whether an inference call on q: (B, H, n, d) that the inference op serves is replayed
    from a graph: launch-bound, no padding mask (whose lengths the core reads on the host),
    outside torch.compile (which makes its own) and outside the caller's own capture."""
    b, h, n = q.shape[:3]
    g = gates.current()
    return (
        (GATE in g.checked and q.is_cuda or g.graphs_on_cpu)
        and key_padding_mask is None
        and b * h * n <= GRAPH_MAX_ROWS
        and not torch.compiler.is_compiling()
        # inside a capture of the caller's own (a graph cannot capture another)
        and not (q.is_cuda and torch.cuda.is_current_stream_capturing())
    )


def _new_graph() -> Any:
    """A CUDA graph (tests put a stand-in here: a CPU has none)."""
    return torch.cuda.CUDAGraph()


def _capture(graph: Any, fn: Callable[[], Tensor]) -> Tensor:
    """Record fn's launches into graph; returns the output it will write at each replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()  # allocations settle off the graph (kernels are compiled by the first call)
    torch.cuda.current_stream().wait_stream(side)
    with torch.cuda.graph(graph):
        return fn()


def layout(*tensors: Tensor) -> tuple:
    """Where and how tensors live, and the autocast state: what a replay must match."""
    autocast = torch.is_autocast_enabled("cuda")
    state = (autocast, torch.get_autocast_dtype("cuda") if autocast else None)
    return (*((t.data_ptr(), t.shape, t.stride(), t.dtype, t.device) for t in tensors), state)


class Graphs:
    """Up to ``size`` CUDA graphs of one core's inference call, by input layout."""

    def __init__(self, size: int = 2) -> None:
        self.size = size
        self.graphs: OrderedDict[tuple, tuple[Any, Tensor]] = OrderedDict()
        self.seen: set[tuple] = set()
        self.misses = 0

    def __call__(self, fn: Callable[..., Tensor], *inputs: Tensor) -> Tensor:
        """fn(*inputs), replayed from a graph when one holds this layout."""
        key = layout(*inputs)
        if key in self.graphs:
            self.graphs.move_to_end(key)
            self.misses = 0
            graph, out = self.graphs[key]
            graph.replay()
            return out.clone()
        if key not in self.seen or self.misses >= MAX_MISSES:
            if len(self.seen) > 64 * self.size:
                self.seen.clear()
            self.seen.add(key)
            return fn(*inputs)
        self.misses += 1
        graph = _new_graph()
        try:
            out = _capture(graph, lambda: fn(*inputs))
        except RuntimeError as error:  # work a graph cannot hold: this core stops capturing
            warnings.warn(f"CUDA graph capture failed, eager from now on: {error}", stacklevel=2)
            self.misses = MAX_MISSES
            return fn(*inputs)
        self.graphs[key] = (graph, out)
        if len(self.graphs) > self.size:
            self.graphs.popitem(last=False)
        graph.replay()
        return out.clone()

    def __getstate__(self) -> dict:
        # Graphs belong to one process and device: a copy of the core starts without them.
        return {"size": self.size}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["size"])

    def __deepcopy__(self, memo: dict) -> Graphs:
        return Graphs(self.size)
