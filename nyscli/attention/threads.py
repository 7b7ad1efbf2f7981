"""One CPU thread for a core's small work: the m x m side of the landmark cores.

A torch op on a CPU tensor splits its work over the intra-op threads and waits for all of
them at its end. The landmark kernel, the pseudo-inverse's iterates and the product with Bk V
are (B, H, m, m) tensors, tens of such ops a call, each too small to gain from a second
thread; when another process keeps a core busy, each of them waits for a descheduled thread
instead (Nyström-64's module forward at n = 512 beside one busy process: 13x slower with 2
threads than with 1; docs/results/table1.md, "A busy machine"). Their block runs on the
calling thread alone; the n-sized work around it keeps every thread.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import Tensor


@contextmanager
def one_thread(x: Tensor) -> Iterator[None]:
    """Intra-op threads set to 1 for the block, where ``x`` (the small work's input) is on a
    CPU; the count before is back after the block, however it ends. Not under torch.compile,
    which would break its graph at the thread switch (the compiled code keeps its threads)."""
    if x.device.type != "cpu" or torch.compiler.is_compiling():
        yield
        return
    before = torch.get_num_threads()
    if before == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
