"""CUDA graphs of a core's call, replayed when the same inputs come back: its inference call,
or its training call's forward and backward.

Below n ~ 16K a Nyström forward on a GPU is bound by its launches and their Python, not its
work (docs/results/gpu-notes.md, "graphs"). A CUDA graph replays the whole call in one launch.

A graph reads its inputs from the addresses it was captured with, so a cached graph is keyed
by where q, k and v live (pointer, shape, strides, dtype) and by the autocast state: a call
whose q, k, v sit at those addresses with that layout is the same computation on whatever
values they now hold. The output lives in the graph's memory and is copied out at each
replay, so an output the caller keeps is never overwritten by a later call. A layout is
captured the second time it is seen (the first call runs as usual and compiles the kernels),
at most ``size`` graphs per core are kept (least recently used first out), and a core whose
calls keep missing stops capturing. On CUDA, outside torch.compile; each kept inference
graph holds one output-sized buffer.

Training (``Graphs(training=True)``, gate "graph-train", off until a GPU has checked it):
``torch.cuda.make_graphed_callables`` captures the forward and the backward once per layout
(shapes, strides, dtypes, which inputs need a gradient, autocast), and each call copies q, k,
v into the graph's inputs, so the addresses do not count there. Its graphs also hold what the
backward reads; the gradients it hands back live in the graph's memory until the next call's
backward, as make_graphed_callables' do (a core's q, k, v come from projections, whose own
backward consumes them at once).
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
TRAIN_GATE = "graph-train"  # off on CUDA until a GPU has checked it against float64
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
    from a graph (``replayable`` under the gate "graph")."""
    return replayable(q, key_padding_mask, GATE)


def serves_training(q: Tensor, key_padding_mask: Tensor | None) -> bool:
    """Whether a training call on q: (B, H, n, d) on the Triton path runs as a graphed
    forward and backward (``torch.cuda.make_graphed_callables``; ``replayable`` under the gate
    "graph-train"); its layout (shapes, dtypes, which inputs need a gradient) is fixed per call
    site, as a length bucket of LRA training or a bench point is."""
    return replayable(q, key_padding_mask, TRAIN_GATE)


def replayable(q: Tensor, key_padding_mask: Tensor | None, gate: str) -> bool:
    """On CUDA with ``gate`` on (or a test's stand-in), launch-bound (at most GRAPH_MAX_ROWS),
    no padding mask (whose lengths the core reads on the host), outside torch.compile (which
    makes its own) and outside the caller's own capture (a graph cannot capture another)."""
    b, h, n = q.shape[:3]
    g = gates.current()
    return (
        (gate in g.checked and q.is_cuda or g.graphs_on_cpu)
        and key_padding_mask is None
        and b * h * n <= GRAPH_MAX_ROWS
        and not torch.compiler.is_compiling()
        and not (q.is_cuda and torch.cuda.is_current_stream_capturing())
    )


def _make_graphed(fn: Callable[..., Tensor], sample: tuple[Tensor, ...]) -> Callable[..., Tensor]:
    """fn with its forward and backward captured as CUDA graphs, called with tensors laid out
    as ``sample`` (tests put a stand-in here: a CPU has none). Under autocast, capture runs
    with autocast's cast cache off, as make_graphed_callables requires."""
    on = torch.is_autocast_enabled("cuda")
    dtype = torch.get_autocast_dtype("cuda") if on else torch.float16
    with torch.autocast("cuda", dtype=dtype, enabled=on, cache_enabled=False):
        return torch.cuda.make_graphed_callables(fn, sample)


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


def layout(*tensors: Tensor, training: bool = False) -> tuple:
    """Where and how tensors live, and the autocast state: what a replay must match. A graphed
    training call copies its inputs in, so there the addresses do not count, but which inputs
    need a gradient does."""
    autocast = torch.is_autocast_enabled("cuda")
    state = (autocast, torch.get_autocast_dtype("cuda") if autocast else None)
    if training:
        found = ((t.shape, t.stride(), t.dtype, t.device, t.requires_grad) for t in tensors)
    else:
        found = ((t.data_ptr(), t.shape, t.stride(), t.dtype, t.device) for t in tensors)
    return (*found, state)


class Graphs:
    """Up to ``size`` CUDA graphs of one core's call, by input layout: of its inference call,
    or (``training``) of its forward and backward."""

    def __init__(self, size: int = 2, training: bool = False) -> None:
        self.size, self.training = size, training
        # layout -> a replay: called with the inputs, it returns a fresh output
        self.graphs: OrderedDict[tuple, Callable[..., Tensor]] = OrderedDict()
        self.seen: set[tuple] = set()
        self.misses = 0

    def __call__(self, fn: Callable[..., Tensor], *inputs: Tensor) -> Tensor:
        """fn(*inputs), replayed from a graph when one holds this layout."""
        key = layout(*inputs, training=self.training)
        if key in self.graphs:
            self.graphs.move_to_end(key)
            self.misses = 0
            return self.graphs[key](*inputs)
        if key not in self.seen or self.misses >= MAX_MISSES:
            if len(self.seen) > 64 * self.size:
                self.seen.clear()
            self.seen.add(key)
            return fn(*inputs)
        self.misses += 1
        try:
            replay = self._captured(fn, inputs)
        except RuntimeError as error:  # work a graph cannot hold: this core stops capturing
            warnings.warn(f"CUDA graph capture failed, eager from now on: {error}", stacklevel=2)
            self.misses = MAX_MISSES
            return fn(*inputs)
        self.graphs[key] = replay
        if len(self.graphs) > self.size:
            self.graphs.popitem(last=False)
        return replay(*inputs)

    def _captured(self, fn: Callable[..., Tensor], inputs: tuple[Tensor, ...]) -> Callable:
        """A replay of fn for inputs laid out as ``inputs``. Its output is a copy, so an output
        the caller keeps is never overwritten by a later call."""
        if self.training:
            sample = tuple(x.detach().clone().requires_grad_(x.requires_grad) for x in inputs)
            graphed = _make_graphed(fn, sample)
            return lambda *x: graphed(*x).clone()
        graph = _new_graph()
        out = _capture(graph, lambda: fn(*inputs))

        def replay(*x: Tensor) -> Tensor:  # the graph reads the addresses it was captured with
            graph.replay()
            return out.clone()

        return replay

    def __getstate__(self) -> dict:
        # Graphs belong to one process and device: a copy of the core starts without them.
        return {"size": self.size, "training": self.training}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["size"], state.get("training", False))

    def __deepcopy__(self, memo: dict) -> Graphs:
        return Graphs(self.size, self.training)
