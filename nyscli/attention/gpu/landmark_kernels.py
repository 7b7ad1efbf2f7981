"""Triton kernels of ``nystrom_gpu``: the landmark side of Nyström for one head per program.

Imported by ``nystrom_gpu`` when a kernel first runs, so that CPU runs never import triton.
Shapes: q~, k~, Bk V, W (B*H, M, D) contiguous, padded in
registers to (BM, BD); the exists mask (B, M) int8.
"""

import triton
import triton.language as tl


@triton.jit
def dot(a, b, PREC: tl.constexpr):
    """a @ b: float64 exactly; float32 on the tensor cores as PREC says: "tf32x3" (three tf32
    products, about float32's accuracy) or "tf32" (one; for bf16/fp16 work, whose own rounding
    is coarser). A plain float32 dot of 64 x 64 tiles runs on the FMA units with whole operand
    rows per thread, which spills ~13 KB per thread (ptxas, sm_90)."""
    if a.dtype == tl.float64:
        out = tl.dot(a, b, input_precision="ieee")
    elif PREC == "tf32":
        out = tl.dot(a, b, input_precision="tf32")
    else:
        out = tl.dot(a, b, input_precision="tf32x3")
    return out


@triton.jit
def landmark_matrix(
    ql_ptr,
    kl_ptr,
    e_ptr,
    base,
    batch,
    scale,
    M,
    D,
    BM: tl.constexpr,
    BD: tl.constexpr,
    HAS_E: tl.constexpr,
    DT: tl.constexpr,
    PREC: tl.constexpr,
):
    """q~, k~ (BM x BD, zero-padded) and A = softmax(q~ k~^T scale) with empty landmarks'
    rows and columns zero (padding too)."""
    rows = tl.arange(0, BM)
    cols = tl.arange(0, BD)
    tile = (rows[:, None] < M) & (cols[None, :] < D)
    offs = base + rows[:, None] * D + cols[None, :]
    ql = tl.load(ql_ptr + offs, mask=tile, other=0.0).to(DT)
    kl = tl.load(kl_ptr + offs, mask=tile, other=0.0).to(DT)
    real = rows < M
    if HAS_E:
        real = real & (tl.load(e_ptr + batch * M + rows, mask=rows < M, other=0) != 0)
    s = dot(ql, tl.trans(kl), PREC) * scale
    s = tl.where(real[None, :], s, float("-inf"))
    top = tl.max(s, axis=1)
    top = tl.where(top == float("-inf"), 0.0, top)  # a row with no landmark at all
    p = tl.exp(s - top[:, None])
    total = tl.sum(p, axis=1)
    p = p / tl.where(total > 0, total, 1.0)[:, None]
    a = tl.where(real[:, None], p, 0.0)
    return ql, kl, p, a, real


@triton.jit
def start(a, tiny):
    """Z_0 = A^T / max(||A||_1 ||A||_inf, tiny) and that scale."""
    norm_1 = tl.max(tl.sum(tl.abs(a), axis=0), axis=0)
    norm_inf = tl.max(tl.sum(tl.abs(a), axis=1), axis=0)
    c = tl.maximum(norm_1 * norm_inf, tiny)
    return tl.trans(a) / c, c, norm_1, norm_inf


@triton.jit
def newton_step(a, z, eye, PREC: tl.constexpr):
    """Z' = 1/4 Z (13 I - AZ (15 I - AZ (7 I - AZ))), the products in pinv.py's order."""
    az = dot(a, z, PREC)
    t = 7.0 * eye - az
    t = 15.0 * eye - dot(az, t, PREC)
    t = 13.0 * eye - dot(az, t, PREC)
    return dot(0.25 * z, t, PREC)


@triton.jit
def forward(
    ql_ptr,
    kl_ptr,
    e_ptr,
    bv_ptr,
    w_ptr,
    heads,
    scale,
    tiny,
    M,
    D,
    BM: tl.constexpr,
    BD: tl.constexpr,
    ITERS: tl.constexpr,
    HAS_E: tl.constexpr,
    DT: tl.constexpr,
    PREC: tl.constexpr,
):
    head = tl.program_id(0)
    base = head * M * D
    _, _, _, a, _ = landmark_matrix(
        ql_ptr, kl_ptr, e_ptr, base, head // heads, scale, M, D, BM, BD, HAS_E, DT, PREC
    )
    z, _, _, _ = start(a, tiny)
    idx = tl.arange(0, BM)
    eye = (idx[:, None] == idx[None, :]).to(DT)
    for _ in tl.static_range(ITERS):
        z = newton_step(a, z, eye, PREC)
    cols = tl.arange(0, BD)
    tile = (idx[:, None] < M) & (cols[None, :] < D)
    offs = base + idx[:, None] * D + cols[None, :]
    bv = tl.load(bv_ptr + offs, mask=tile, other=0.0).to(DT)
    w = dot(z, bv, PREC)
    tl.store(w_ptr + offs, w.to(w_ptr.dtype.element_ty), mask=tile)


@triton.jit
def backward(
    ql_ptr,
    kl_ptr,
    e_ptr,
    bv_ptr,
    gw_ptr,
    gql_ptr,
    gkl_ptr,
    gbv_ptr,
    scratch_ptr,
    heads,
    scale,
    tiny,
    M,
    D,
    BM: tl.constexpr,
    BD: tl.constexpr,
    ITERS: tl.constexpr,
    HAS_E: tl.constexpr,
    DT: tl.constexpr,
    PREC: tl.constexpr,
):
    head = tl.program_id(0)
    base = head * M * D
    ql, kl, p, a, real = landmark_matrix(
        ql_ptr, kl_ptr, e_ptr, base, head // heads, scale, M, D, BM, BD, HAS_E, DT, PREC
    )
    z0, c, norm_1, norm_inf = start(a, tiny)
    idx = tl.arange(0, BM)
    eye = (idx[:, None] == idx[None, :]).to(DT)
    square = idx[:, None] * BM + idx[None, :]
    own = scratch_ptr + head * (ITERS * BM * BM)
    # Forward again, keeping Z_0 .. Z_{ITERS-1} for the walk back.
    z = z0
    for j in tl.static_range(ITERS):
        tl.store(own + j * BM * BM + square, z)
        z = newton_step(a, z, eye, PREC)
    tl.debug_barrier()  # the iterates are read back below by other threads
    cols = tl.arange(0, BD)
    tile = (idx[:, None] < M) & (cols[None, :] < D)
    offs = base + idx[:, None] * D + cols[None, :]
    bv = tl.load(bv_ptr + offs, mask=tile, other=0.0).to(DT)
    gw = tl.load(gw_ptr + offs, mask=tile, other=0.0).to(DT)
    # W = Z bv
    tl.store(gbv_ptr + offs, dot(tl.trans(z), gw, PREC), mask=tile)
    gz = dot(gw, tl.trans(bv), PREC)
    ga = tl.zeros((BM, BM), dtype=DT)
    for jj in tl.static_range(ITERS):
        z = tl.load(own + (ITERS - 1 - jj) * BM * BM + square)
        p1 = dot(a, z, PREC)
        t1 = 7.0 * eye - p1
        t2 = 15.0 * eye - dot(p1, t1, PREC)
        t3 = 13.0 * eye - dot(p1, t2, PREC)
        # Z' = 1/4 Z t3, t3 = 13 I - P t2, t2 = 15 I - P t1, t1 = 7 I - P
        g_t3 = dot(tl.trans(0.25 * z), gz, PREC)
        g_z = dot(0.25 * gz, tl.trans(t3), PREC)
        g_p = -dot(g_t3, tl.trans(t2), PREC)
        g_t2 = -dot(tl.trans(p1), g_t3, PREC)
        g_p += -dot(g_t2, tl.trans(t1), PREC)
        g_t1 = -dot(tl.trans(p1), g_t2, PREC)
        g_p += -g_t1
        # P = A Z
        ga += dot(g_p, tl.trans(z), PREC)
        gz = g_z + dot(tl.trans(a), g_p, PREC)
    # Z_0 = A^T / c, c = max(||A||_1 ||A||_inf, tiny). Where c is the floor, A is zero (no
    # landmark exists) and so is every gradient that reaches q~, k~: 0 there, not gz / tiny.
    inv_c = tl.where(norm_1 * norm_inf > tiny, 1.0 / c, 0.0)
    ga += tl.trans(gz) * inv_c
    g_c = -tl.sum(tl.sum(tl.trans(gz) * a, axis=1), axis=0) * inv_c * inv_c
    col_sums = tl.sum(tl.abs(a), axis=0)
    row_sums = tl.sum(tl.abs(a), axis=1)
    # amax's gradient goes to every tied maximum in equal parts, as torch's does.
    top_cols = (col_sums == norm_1).to(DT)
    top_rows = (row_sums == norm_inf).to(DT)
    sign = tl.where(a > 0, 1.0, tl.where(a < 0, -1.0, 0.0))
    ga += sign * (g_c * norm_inf * top_cols / tl.sum(top_cols, axis=0))[None, :]
    ga += sign * (g_c * norm_1 * top_rows / tl.sum(top_rows, axis=0))[:, None]
    # A = softmax(S) on real rows; S = q~ k~^T scale on real columns
    gp = tl.where(real[:, None], ga, 0.0)
    gs = p * (gp - tl.sum(gp * p, axis=1)[:, None])
    gs = tl.where(real[None, :], gs, 0.0) * scale
    tl.store(gql_ptr + offs, dot(gs, kl, PREC), mask=tile)
    tl.store(gkl_ptr + offs, dot(tl.trans(gs), ql, PREC), mask=tile)


@triton.jit
def pinv(
    a_ptr,
    z_ptr,
    tiny,
    M,
    BM: tl.constexpr,
    ITERS: tl.constexpr,
    DT: tl.constexpr,
    PREC: tl.constexpr,
):
    """Z = the iterative pinv of one (M, M) matrix per program (the per-matrix start)."""
    head = tl.program_id(0)
    idx = tl.arange(0, BM)
    square = (idx[:, None] < M) & (idx[None, :] < M)
    offs = head * M * M + idx[:, None] * M + idx[None, :]
    a = tl.load(a_ptr + offs, mask=square, other=0.0).to(DT)
    z, _, _, _ = start(a, tiny)
    eye = (idx[:, None] == idx[None, :]).to(DT)
    for _ in tl.static_range(ITERS):
        z = newton_step(a, z, eye, PREC)
    tl.store(z_ptr + offs, z.to(z_ptr.dtype.element_ty), mask=square)


# Nyström at inference without SDPA: Bk V split over the keys (a flash-decoding pass: m queries
# per head are too few rows for SDPA to fill the GPU), the splits combined, then F W with its
# m landmark keys per query in one pass. Products of q, k, v tiles run in their own dtype on a
# GPU (HALF_DOT: bf16/fp16 on the tensor cores, float32 sums); the interpreter, whose half
# precision dot is not right and whose bf16 cast truncates, multiplies them in float32.


@triton.jit
def rounded(x, OP: tl.constexpr, NATIVE: tl.constexpr):
    """x rounded to OP (to nearest, ties to even), in OP on a GPU; in Triton's interpreter,
    whose bf16 cast truncates and whose half-precision dot is not right, the same values
    held in float32. OP float32: x as it is, in its own dtype. (One return, after constexpr
    branches: no early return in a kernel.)"""
    if OP == tl.float32:  # noqa: SIM300 (OP is a parameter, not a constant)
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


@triton.jit
def product(a, b, PREC: tl.constexpr, HALF_DOT: tl.constexpr):
    """a @ b in float32 (float64 for float64 tiles): half-precision tiles as they are when
    HALF_DOT and both are in one half dtype, else through ``dot`` (a compiled dot refuses
    mixed operands: bf16 by float32 failed to compile on the H200)."""
    if a.dtype == tl.float64:
        out = dot(a, b, PREC)
    elif (a.dtype == tl.bfloat16 or a.dtype == tl.float16) and a.dtype == b.dtype and HALF_DOT:
        out = tl.dot(a, b)
    else:
        out = dot(a.to(tl.float32), b.to(tl.float32), PREC)
    return out


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
    HALF_DOT: tl.constexpr,
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
    ql = rounded(ql, OP, HALF_DOT)
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
        kt = rounded(kt, OP, HALF_DOT)
        s = product(ql, tl.trans(kt), PREC, HALF_DOT).to(DT) * scale
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
        vt = rounded(vt, OP, HALF_DOT)
        if HALF_DOT:  # as flash attention: the weights in V's dtype for the tensor cores
            p = p.to(vt.dtype)
        acc = acc * alpha[:, None] + product(p, vt, PREC, HALF_DOT).to(DT)
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
    HALF_DOT: tl.constexpr,
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
    q, kl = rounded(q, OP, HALF_DOT), rounded(kl, OP, HALF_DOT)
    s = product(q, tl.trans(kl), PREC, HALF_DOT)
    s = s.to(w.dtype) * scale
    ok = lm < M
    if HAS_E:
        real = tl.load(e_ptr + (head // heads) * M + lm, mask=lm < M, other=0) != 0
        ok = ok & (real | (tl.max(real.to(tl.int32), axis=0) == 0))
    s = tl.where(ok[None, :], s, float("-inf"))
    p = tl.exp(s - tl.max(s, axis=1)[:, None])
    p = p / tl.sum(p, axis=1)[:, None]
    if HALF_DOT:  # as SDPA's F W: weights and W in q's dtype
        p = p.to(q.dtype)
        w = w.to(q.dtype)
    out = product(p, w, PREC, HALF_DOT)
    tl.store(out_ptr + at, out.to(out_ptr.dtype.element_ty), mask=q_tile)
