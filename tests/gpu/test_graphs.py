"""CUDA graphs of the inference call (``nyscli.attention.gpu.graphs``), with a stand-in for the
graph on a CPU."""

from __future__ import annotations

import pytest
import torch

from nyscli.attention.core import Path
from nyscli.attention.gpu import gates, graphs
from nyscli.attention.nystrom import NystromAttention
from tests.gpu.common import DEVICE, forward_backward, qkv, relative


class FakeGraph:
    """A CUDA graph's stand-in on a CPU: replay runs the captured call again on the tensors
    it was captured with, as a graph reads the addresses it was captured with."""

    made: list[FakeGraph] = []

    def __init__(self) -> None:
        self.fn, self.out, self.replays = None, None, 0
        FakeGraph.made.append(self)

    def replay(self) -> None:
        self.replays += 1
        self.out.copy_(self.fn())


def fake_capture(graph: FakeGraph, fn) -> torch.Tensor:
    graph.fn, graph.out = fn, fn()
    return graph.out


@pytest.fixture
def fake_graphs(gated, interpret, monkeypatch) -> list[FakeGraph]:
    from nyscli.attention.gpu import graphs

    monkeypatch.setattr(FakeGraph, "made", [])
    monkeypatch.setattr(graphs, "_new_graph", FakeGraph)
    monkeypatch.setattr(graphs, "_capture", fake_capture)
    monkeypatch.setattr(graphs, "_make_graphed", lambda fn, sample: fn)  # training: eager
    gated(graphs_on_cpu=True)
    return FakeGraph.made


def test_inference_is_replayed_from_a_graph_of_the_same_inputs(fake_graphs) -> None:
    q, k, v = qkv(2, 3, 256, 16, seed=7)
    core = NystromAttention(num_landmarks=16)
    eager = NystromAttention(num_landmarks=16)
    eager.graphs = lambda fn, *inputs: fn(*inputs)  # the same core, never graphed
    outs = []
    with torch.no_grad():
        for step in range(4):
            if step == 3:
                for x in (q, k, v):  # new values at the same addresses: the graph sees them
                    x.mul_(0.5).add_(0.1)
            outs.append(core(q, k, v))
            assert relative(outs[-1], eager(q, k, v)) < 1e-12
    # seen once (eager), captured the second time, replayed the third and fourth
    assert len(fake_graphs) == 1 and fake_graphs[0].replays == 3
    assert len({out.data_ptr() for out in outs}) == 4  # an output kept is never overwritten
    assert relative(outs[1], outs[2]) == 0 and relative(outs[3], outs[2]) > 0.1


def test_graphs_are_kept_per_layout_least_recent_out_and_stop_when_nothing_returns(
    fake_graphs,
) -> None:
    from nyscli.attention.gpu import graphs

    core = NystromAttention(num_landmarks=16)
    inputs = [qkv(1, 2, 128, 16, seed=s) for s in range(3)]
    with torch.no_grad():
        for x in (*inputs, *inputs, inputs[0]):  # each seen, then captured; 0 again: evicted
            core(*x)
        assert len(fake_graphs) == 4 and len(core.graphs.graphs) == 2
        assert [g.replays for g in fake_graphs] == [1, 1, 1, 1]  # the capture's own replay
        core(*inputs[0])
        assert fake_graphs[-1].replays == 2
        core.graphs.misses = 0
        for s in range(3, 3 + 2 * (graphs.MAX_MISSES + 2)):  # each new layout seen twice
            x = qkv(1, 2, 128, 16, seed=s)
            core(*x)
            core(*x)
            del x
    assert len(fake_graphs) == 4 + graphs.MAX_MISSES  # then it stops capturing


def test_a_failed_capture_falls_back_to_the_call_and_stops_capturing(
    fake_graphs, monkeypatch
) -> None:
    from nyscli.attention.gpu import graphs

    def refuse(graph, fn):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(graphs, "_capture", refuse)
    q, k, v = qkv(1, 2, 256, 16, seed=2)
    core = NystromAttention(num_landmarks=16)
    want = core(q.double(), k.double(), v.double())
    with torch.no_grad(), pytest.warns(UserWarning, match="capture failed"):
        outs = [core(q, k, v) for _ in range(3)]
    assert all(relative(out, want) < 1e-5 for out in outs)
    assert core.graphs.misses == graphs.MAX_MISSES and core.graphs.graphs == {}


@pytest.mark.parametrize("case", ["mask", "grad", "rows", "compile", "kmeans"])
def test_calls_that_are_not_replayed(gated, fake_graphs, monkeypatch, case) -> None:
    q, k, v = qkv(1, 2, 256, 16, seed=1)
    mask = None
    if case == "mask":
        mask = torch.ones(1, 256, dtype=torch.bool, device=DEVICE)
    if case == "grad":
        q.requires_grad_()
    if case == "rows":
        monkeypatch.setattr(graphs, "GRAPH_MAX_ROWS", 2 * 256 - 1)
    if case == "compile":
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    landmarks = "kmeans" if case == "kmeans" else "segment_means"
    core = NystromAttention(num_landmarks=16, landmarks=landmarks)
    gated(fused_cpu=False)
    for _ in range(3):
        core(q, k, v, mask)
    assert fake_graphs == []


def test_graphs_stay_off_a_gpu_until_checked_and_copies_start_without_them(
    gated, monkeypatch
) -> None:
    import copy

    q = torch.zeros(1, 1, 8, 16, device="meta")
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    gated(checked=gates.current().checked - {"graph"})
    assert not graphs.serves(q, None)
    gated(checked=gates.current().checked | {"graph"})
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert graphs.serves(q, None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not graphs.serves(q, None)  # inside the caller's own capture
    core = NystromAttention(num_landmarks=16)
    core.graphs.graphs[("layout",)] = (None, None)
    assert copy.deepcopy(core).graphs.graphs == {}


@pytest.fixture
def fake_training_graphs(interpret, gated, monkeypatch) -> list[dict]:
    """make_graphed_callables' stand-in on a CPU: records each capture's sample tensors and
    replays by running the captured call on copies of the inputs laid out as the sample, as
    a graphed callable copies its inputs into the graph's own."""
    made = []

    def make(fn, sample):
        made.append({"sample": sample, "replays": 0})
        record = made[-1]

        def graphed(*inputs):
            record["replays"] += 1
            assert [x.shape for x in inputs] == [x.shape for x in sample]
            return _Replay.apply(fn, sample, *inputs)

        return graphed

    monkeypatch.setattr(graphs, "_make_graphed", make)
    gated(graphs_on_cpu=True, fused_cpu=False)
    return made


class _Replay(torch.autograd.Function):
    """fn on the graph's own input copies, its gradients handed back to the real inputs."""

    @staticmethod
    def forward(ctx, fn, sample, *inputs):
        copies = [
            s.detach().copy_(x).requires_grad_(x.requires_grad)
            for s, x in zip(sample, inputs, strict=True)
        ]
        with torch.enable_grad():
            out = fn(*copies)
        ctx.saved = (out, copies)
        return out.detach()

    @staticmethod
    def backward(ctx, grad):
        out, copies = ctx.saved
        grads = torch.autograd.grad(out, copies, grad)
        return None, None, *grads


def test_training_is_replayed_from_graphed_forward_and_backward(fake_training_graphs) -> None:
    q, k, v = qkv(2, 3, 256, 16, seed=8)
    core = NystromAttention(num_landmarks=16)
    eager = NystromAttention(num_landmarks=16)
    eager.train_graphs = lambda fn, *inputs: fn(*inputs)  # the same core, never graphed
    for step in range(4):
        x = [t.mul(1.0 + 0.1 * step).requires_grad_() for t in (q, k, v)]
        assert core.path(*x) is Path.GRAPH_TRAIN
        got = forward_backward(core, *x, None)
        want = forward_backward(eager, *x, None)
        assert relative(got[0], want[0]) < 1e-12
        for g_got, g_want in zip(got[1], want[1], strict=True):
            assert relative(g_got, g_want) < 1e-12
    # seen once (eager), captured the second time from a copy laid out as the inputs
    (made,) = fake_training_graphs
    assert made["replays"] == 3 and all(s.requires_grad for s in made["sample"])
    assert [s.shape for s in made["sample"]] == [t.shape for t in (q, k, v)]
    assert core.train_graphs.graphs and not core.graphs.graphs
    with torch.no_grad():  # inference keeps its own path
        assert core.path(q, k, v) is Path.GRAPH


@pytest.mark.parametrize("case", ["mask", "gate", "kmeans", "recompute"])
def test_training_calls_that_are_not_graphed(fake_training_graphs, gated, case) -> None:
    q, k, v = (t.requires_grad_() for t in qkv(1, 2, 256, 16, seed=3))
    mask = torch.ones(1, 256, dtype=torch.bool, device=DEVICE) if case == "mask" else None
    if case == "gate":
        gated(graphs_on_cpu=False)  # on CUDA: "graph-train" not in NYS_GPU_CHECKED
    options = {"landmarks": "kmeans"} if case == "kmeans" else {}
    core = NystromAttention(num_landmarks=16, recompute=case == "recompute", **options)
    want = {"recompute": Path.RECOMPUTE}.get(case, Path.TRITON)
    assert core.path(q, k, v, mask) is want
    for _ in range(3):
        core(q, k, v, mask).sum().backward()
    assert fake_training_graphs == []


def test_the_training_graph_gate_is_off_by_default_and_named_by_the_switch() -> None:
    from nyscli.attention.gpu import gates

    assert "graph-train" not in gates.CHECKED_BY_DEFAULT
    assert "graph-train" in gates.checked_paths("graph-train")
