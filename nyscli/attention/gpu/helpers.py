"""The Triton helpers every kernel shares: one matrix product, one rounding rule.

Imported only by kernel modules (so only when a kernel first runs: CPU runs never load
triton). The torch side of the same rules is ``dtypes.py``.
"""

import triton
import triton.language as tl


@triton.jit
def product(a, b, PREC: tl.constexpr, NATIVE: tl.constexpr):
    """a @ b in float32 (float64 for float64 tiles):

    - float64 tiles: exactly ("ieee").
    - two tiles of one half dtype with NATIVE (compiled, not the interpreter, whose half
      dot is not right): on the tensor cores as they are, float32 sums.
    - otherwise as float32 tiles by PREC: "tf32x3" (three tf32 products, about float32's
      accuracy), "tf32" (one: for half work, whose own rounding is coarser) or "split"
      (tf32x3 written out: a_hi b_hi + a_hi b_lo + a_lo b_hi with x_hi = x's top 10 mantissa
      bits; the hybrid's, where ``input_precision="tf32x3"`` read shared memory out of bounds,
      docs/results/gpu-notes.md). A plain float32 dot of 64 x 64 tiles runs on the FMA units
      and spills kilobytes per thread (ptxas, sm_90); a compiled dot refuses bf16 by float32.
    """
    if a.dtype == tl.float64:
        out = tl.dot(a, b, input_precision="ieee")
    elif (a.dtype == tl.bfloat16 or a.dtype == tl.float16) and a.dtype == b.dtype and NATIVE:
        out = tl.dot(a, b)
    elif PREC == "split":
        a = a.to(tl.float32)
        b = b.to(tl.float32)
        a_hi = (a.to(tl.uint32, bitcast=True) & 0xFFFFE000).to(tl.float32, bitcast=True)
        b_hi = (b.to(tl.uint32, bitcast=True) & 0xFFFFE000).to(tl.float32, bitcast=True)
        out = tl.dot(a_hi, b - b_hi, input_precision="tf32")
        out += tl.dot(a - a_hi, b_hi, input_precision="tf32")
        out += tl.dot(a_hi, b_hi, input_precision="tf32")
    elif PREC == "tf32":
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="tf32")
    else:
        out = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="tf32x3")
    return out


@triton.jit
def rounded(x, OP: tl.constexpr, NATIVE: tl.constexpr):
    """x rounded to OP (to nearest, ties to even), in OP when NATIVE (compiled); in Triton's
    interpreter, whose bf16 cast truncates, the same values held in float32. OP float32 or
    float64: x as it is, in its own dtype. (One return, after constexpr branches: no early
    return in a kernel.)"""
    if OP == tl.float32 or OP == tl.float64:  # noqa: SIM300 (OP is a parameter)
        out = x
    elif NATIVE:
        out = x.to(OP)
    elif OP == tl.bfloat16:  # noqa: SIM300 (OP is a parameter, not a constant)
        bits = x.to(tl.float32).to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        out = bits.to(tl.float32, bitcast=True)
    else:
        out = x.to(OP).to(tl.float32)
    return out
