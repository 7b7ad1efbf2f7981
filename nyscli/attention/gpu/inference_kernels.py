"""Triton kernels of ``inference.py``: Nyström at inference without SDPA.

Bk V split over the keys (a flash-decoding pass: m queries per head are too few rows for SDPA
to fill the GPU), the splits combined, then F W with its m landmark keys per query in one
pass (W itself comes from ``landmark_kernels.forward``). Products of q, k, v tiles run in
their own dtype when compiled (NATIVE: bf16/fp16 on the tensor cores, float32 sums); the
interpreter, whose half-precision dot is not right and whose bf16 cast truncates, multiplies
them in float32. Shapes: q, k, v, out (B*H, n, D); q~, k~, W (B*H, M, D); masks int8.
"""

import triton
import triton.language as tl

from nyscli.attention.gpu.helpers import product, rounded


@triton.jit
def landmark_attention_split(
    ql_ptr,
    k_ptr,
    v_ptr,
    keep_ptr,
    acc_ptr,
    top_ptr,
    total_ptr,
    heads,
    n,
    chunk,
    scale,
    M,
    D,
    BM: tl.constexpr,
    BK: tl.constexpr,
    BD: tl.constexpr,
    HAS_KEEP: tl.constexpr,
    DT: tl.constexpr,
    PREC: tl.constexpr,
    NATIVE: tl.constexpr,
    OP: tl.constexpr,
):
    """One split of Bk V = softmax(q~ k^T scale) V: the keys [split * chunk, + chunk) of one
    head, with an online softmax. Writes the split's unnormalised sum (BH*S, M, D), its row
    maxima and its row sums (BH*S, M); padded keys (keep = 0) never count. Tiles are rounded
    to OP as they are read (autocast's dtype: no cast copies of k and v), or, with OP float32,
    used as they are."""
    head = tl.program_id(0)
    split = tl.program_id(1)
    splits = tl.num_programs(1)
    rows = tl.arange(0, BM)
    dims = tl.arange(0, BD)
    tile = (rows[:, None] < M) & (dims[None, :] < D)
    ql = tl.load(ql_ptr + head * M * D + rows[:, None] * D + dims[None, :], mask=tile, other=0.0)
    ql = rounded(ql, OP, NATIVE)
    top = tl.full((BM,), float("-inf"), dtype=DT)
    total = tl.zeros((BM,), dtype=DT)
    acc = tl.zeros((BM, BD), dtype=DT)
    lo = split * chunk
    hi = tl.minimum(lo + chunk, n)
    for j0 in range(lo, hi, BK):
        cols = j0 + tl.arange(0, BK)
        inside = cols < hi
        at = head * n * D + cols[:, None] * D + dims[None, :]
        kt = tl.load(k_ptr + at, mask=inside[:, None] & (dims[None, :] < D), other=0.0)
        kt = rounded(kt, OP, NATIVE)
        s = product(ql, tl.trans(kt), PREC, NATIVE).to(DT) * scale
        ok = inside
        if HAS_KEEP:
            kept = tl.load(keep_ptr + (head // heads) * n + cols, mask=inside, other=0)
            ok = ok & (kept != 0)
        s = tl.where(ok[None, :], s, float("-inf"))
        new_top = tl.maximum(top, tl.max(s, axis=1))
        shift = tl.where(new_top == float("-inf"), 0.0, new_top)  # no key yet: no NaN
        alpha = tl.exp(top - shift)
        p = tl.exp(s - shift[:, None])
        total = total * alpha + tl.sum(p, axis=1)
        vt = tl.load(v_ptr + at, mask=inside[:, None] & (dims[None, :] < D), other=0.0)
        vt = rounded(vt, OP, NATIVE)
        if NATIVE:  # as flash attention: the weights in V's dtype for the tensor cores
            p = p.to(vt.dtype)
        acc = acc * alpha[:, None] + product(p, vt, PREC, NATIVE).to(DT)
        top = new_top
    part = head * splits + split
    tl.store(acc_ptr + part * M * D + rows[:, None] * D + dims[None, :], acc, mask=tile)
    tl.store(top_ptr + part * M + rows, top, mask=rows < M)
    tl.store(total_ptr + part * M + rows, total, mask=rows < M)


@triton.jit
def landmark_attention_combine(
    acc_ptr,
    top_ptr,
    total_ptr,
    e_ptr,
    bv_ptr,
    heads,
    splits,
    M,
    D,
    BM: tl.constexpr,
    BD: tl.constexpr,
    HAS_E: tl.constexpr,
):
    """Bk V (BH, M, D) from the splits of one head, times the exists mask (empty landmarks'
    rows zero); a row with no key at all (not reached: those sequences take exact attention)
    comes out zero."""
    head = tl.program_id(0)
    rows = tl.arange(0, BM)
    dims = tl.arange(0, BD)
    tile = (rows[:, None] < M) & (dims[None, :] < D)
    first = head * splits
    top = tl.load(top_ptr + first * M + rows, mask=rows < M, other=float("-inf"))
    for s in range(1, splits):
        top = tl.maximum(top, tl.load(top_ptr + (first + s) * M + rows, mask=rows < M, other=0.0))
    shift = tl.where(top == float("-inf"), 0.0, top)
    total = tl.zeros((BM,), dtype=top.dtype)
    acc = tl.zeros((BM, BD), dtype=top.dtype)
    for s in range(splits):
        part = first + s
        weight = tl.exp(tl.load(top_ptr + part * M + rows, mask=rows < M, other=0.0) - shift)
        total += weight * tl.load(total_ptr + part * M + rows, mask=rows < M, other=0.0)
        at = part * M * D + rows[:, None] * D + dims[None, :]
        acc += weight[:, None] * tl.load(acc_ptr + at, mask=tile, other=0.0)
    bv = acc / tl.where(total > 0, total, 1.0)[:, None]
    if HAS_E:
        real = tl.load(e_ptr + (head // heads) * M + rows, mask=rows < M, other=0)
        bv = tl.where((real != 0)[:, None], bv, 0.0)
    tl.store(bv_ptr + head * M * D + rows[:, None] * D + dims[None, :], bv, mask=tile)


@triton.jit
def landmark_output(
    q_ptr,
    kl_ptr,
    w_ptr,
    e_ptr,
    out_ptr,
    heads,
    n,
    scale,
    M,
    D,
    BQ: tl.constexpr,
    BM: tl.constexpr,
    BD: tl.constexpr,
    HAS_E: tl.constexpr,
    PREC: tl.constexpr,
    NATIVE: tl.constexpr,
    OP: tl.constexpr,
):
    """F W = softmax(q k~^T scale) W for one block of BQ queries of one head: out (BH, n, D)
    in out's dtype. Empty landmarks do not count, unless the sequence has none (then W = 0).
    q and k~ are rounded to OP as they are read (float32: used as they are)."""
    head = tl.program_id(0)
    rows = tl.program_id(1) * BQ + tl.arange(0, BQ)
    lm = tl.arange(0, BM)
    dims = tl.arange(0, BD)
    q_tile = (rows[:, None] < n) & (dims[None, :] < D)
    l_tile = (lm[:, None] < M) & (dims[None, :] < D)
    at = head * n * D + rows[:, None] * D + dims[None, :]
    q = tl.load(q_ptr + at, mask=q_tile, other=0.0)
    kl = tl.load(kl_ptr + head * M * D + lm[:, None] * D + dims[None, :], mask=l_tile, other=0.0)
    w = tl.load(w_ptr + head * M * D + lm[:, None] * D + dims[None, :], mask=l_tile, other=0.0)
    q, kl = rounded(q, OP, NATIVE), rounded(kl, OP, NATIVE)
    s = product(q, tl.trans(kl), PREC, NATIVE)
    s = s.to(w.dtype) * scale
    ok = lm < M
    if HAS_E:
        real = tl.load(e_ptr + (head // heads) * M + lm, mask=lm < M, other=0) != 0
        ok = ok & (real | (tl.max(real.to(tl.int32), axis=0) == 0))
    s = tl.where(ok[None, :], s, float("-inf"))
    p = tl.exp(s - tl.max(s, axis=1)[:, None])
    p = p / tl.sum(p, axis=1)[:, None]
    if NATIVE:  # as SDPA's F W: weights and W in q's dtype
        p = p.to(q.dtype)
        w = w.to(q.dtype)
    out = product(p, w, PREC, NATIVE)
    tl.store(out_ptr + at, out.to(out_ptr.dtype.element_ty), mask=q_tile)
