"""A toy Triton kernel for tests/gpu/test_gates.py: how a new op registers its launches."""

import triton
import triton.language as tl


@triton.jit
def scale(x_ptr, out_ptr, n, factor, BLOCK: tl.constexpr):
    """out = factor * x over n elements, BLOCK per program."""
    at = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + at, mask=at < n, other=0.0)
    tl.store(out_ptr + at, x * factor, mask=at < n)
