"""Wall-clock timing of one call: CUDA events with synchronisation, perf_counter on CPU."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def time_call_ms(call: Callable[[], object], device: torch.device) -> float:
    """Milliseconds ``call()`` takes, including all the GPU work it queued."""
    if device.type == "cuda":
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        call()
        end.record()
        torch.cuda.synchronize(device)
        return float(start.elapsed_time(end))
    began = time.perf_counter()
    call()
    return (time.perf_counter() - began) * 1000.0
