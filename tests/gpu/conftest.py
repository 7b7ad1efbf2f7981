"""Fixtures of the GPU op tests: gates changed for one test, the kernels on the tests' tensors."""

from __future__ import annotations

from contextlib import ExitStack

import pytest

from nyscli.attention.gpu import gates
from tests.gpu.common import DEVICE


@pytest.fixture
def gated():
    """``gated(**changes)``: the gates with ``changes`` until the test ends (calls stack)."""
    with ExitStack() as stack:
        yield lambda **changes: stack.enter_context(gates.override(**changes))


@pytest.fixture
def interpret(gated) -> None:
    """Let the GPU path serve the tests' tensors: float64 on a GPU, or without one CPU
    tensors (in Triton's interpreter)."""
    if DEVICE == "cpu":
        assert gates.current().interpreting, "conftest.py switches the interpreter on"
    gated(testing=True)
