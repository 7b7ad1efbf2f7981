"""Triton kernels of ``landmark.py``: the landmark side of Nyström for one head per program.

Imported by ``ops.kernel`` when a kernel first runs, so that CPU runs never import triton.
Shapes: q~, k~, Bk V, W (B*H, M, D) contiguous, padded in registers to (BM, BD); the exists
mask (B, M) int8. Products of DT tiles: ``helpers.product`` as PREC says.
"""

import triton
import triton.language as tl

from nyscli.attention.gpu.helpers import product


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
    s = product(ql, tl.trans(kl), PREC, False) * scale
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
    az = product(a, z, PREC, False)
    t = 7.0 * eye - az
    t = 15.0 * eye - product(az, t, PREC, False)
    t = 13.0 * eye - product(az, t, PREC, False)
    return product(0.25 * z, t, PREC, False)


@triton.jit
def program_start(
    ql_ptr,
    kl_ptr,
    e_ptr,
    heads,
    scale,
    tiny,
    M,
    D,
    BM: tl.constexpr,
    BD: tl.constexpr,
    HAS_E: tl.constexpr,
    DT: tl.constexpr,
    PREC: tl.constexpr,
):
    """What the forward and backward programs of one (sequence, head) begin with: its q~,
    k~, A's softmax p and A (``landmark_matrix``), which landmarks are real, Z_0 and its scale
    (``start``), the identity, and the (BM, BD) tile's mask and offsets in q~, k~, Bk V, W."""
    head = tl.program_id(0)
    base = head * M * D
    ql, kl, p, a, real = landmark_matrix(
        ql_ptr, kl_ptr, e_ptr, base, head // heads, scale, M, D, BM, BD, HAS_E, DT, PREC
    )
    z0, c, norm_1, norm_inf = start(a, tiny)
    idx = tl.arange(0, BM)
    eye = (idx[:, None] == idx[None, :]).to(DT)
    cols = tl.arange(0, BD)
    tile = (idx[:, None] < M) & (cols[None, :] < D)
    offs = base + idx[:, None] * D + cols[None, :]
    return head, ql, kl, p, a, real, z0, c, norm_1, norm_inf, idx, eye, tile, offs


@triton.jit
def forward(
    ql_ptr, kl_ptr, e_ptr, bv_ptr, w_ptr,  # q~, k~, exists, Bk V in; W out
    heads, scale, tiny, M, D,
    BM: tl.constexpr, BD: tl.constexpr, ITERS: tl.constexpr, HAS_E: tl.constexpr,
    DT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """W = pinv(A) Bk V for one (sequence, head): ITERS Newton-Schulz steps from Z_0."""
    _, _, _, _, a, _, z, _, _, _, _, eye, tile, offs = program_start(
        ql_ptr, kl_ptr, e_ptr, heads, scale, tiny, M, D, BM, BD, HAS_E, DT, PREC
    )
    for _ in tl.static_range(ITERS):
        z = newton_step(a, z, eye, PREC)
    bv = tl.load(bv_ptr + offs, mask=tile, other=0.0).to(DT)
    w = product(z, bv, PREC, False)
    tl.store(w_ptr + offs, w.to(w_ptr.dtype.element_ty), mask=tile)


@triton.jit
def backward(
    ql_ptr, kl_ptr, e_ptr, bv_ptr, gw_ptr,  # q~, k~, exists, Bk V, W's gradient in
    gql_ptr, gkl_ptr, gbv_ptr, scratch_ptr,  # the gradients of q~, k~, Bk V out; the iterates
    heads, scale, tiny, M, D, BM: tl.constexpr, BD: tl.constexpr, ITERS: tl.constexpr,
    HAS_E: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr,
):  # fmt: skip
    """The gradients of q~, k~ and Bk V for one (sequence, head): the forward again, keeping
    its iterates in this program's scratch, then walked back."""
    head, ql, kl, p, a, real, z0, c, norm_1, norm_inf, idx, eye, tile, offs = program_start(
        ql_ptr, kl_ptr, e_ptr, heads, scale, tiny, M, D, BM, BD, HAS_E, DT, PREC
    )
    square = idx[:, None] * BM + idx[None, :]
    own = scratch_ptr + head * (ITERS * BM * BM)
    # Forward again, keeping Z_0 .. Z_{ITERS-1} for the walk back.
    z = z0
    for j in tl.static_range(ITERS):
        tl.store(own + j * BM * BM + square, z)
        z = newton_step(a, z, eye, PREC)
    tl.debug_barrier()  # the iterates are read back below by other threads
    bv = tl.load(bv_ptr + offs, mask=tile, other=0.0).to(DT)
    gw = tl.load(gw_ptr + offs, mask=tile, other=0.0).to(DT)
    # W = Z bv
    tl.store(gbv_ptr + offs, product(tl.trans(z), gw, PREC, False), mask=tile)
    gz = product(gw, tl.trans(bv), PREC, False)
    ga = tl.zeros((BM, BM), dtype=DT)
    for jj in tl.static_range(ITERS):
        z = tl.load(own + (ITERS - 1 - jj) * BM * BM + square)
        p1 = product(a, z, PREC, False)
        t1 = 7.0 * eye - p1
        t2 = 15.0 * eye - product(p1, t1, PREC, False)
        t3 = 13.0 * eye - product(p1, t2, PREC, False)
        # Z' = 1/4 Z t3, t3 = 13 I - P t2, t2 = 15 I - P t1, t1 = 7 I - P
        g_t3 = product(tl.trans(0.25 * z), gz, PREC, False)
        g_z = product(0.25 * gz, tl.trans(t3), PREC, False)
        g_p = -product(g_t3, tl.trans(t2), PREC, False)
        g_t2 = -product(tl.trans(p1), g_t3, PREC, False)
        g_p += -product(g_t2, tl.trans(t1), PREC, False)
        g_t1 = -product(tl.trans(p1), g_t2, PREC, False)
        g_p += -g_t1
        # P = A Z
        ga += product(g_p, tl.trans(z), PREC, False)
        gz = g_z + product(tl.trans(a), g_p, PREC, False)
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
    tl.store(gql_ptr + offs, product(gs, kl, PREC, False), mask=tile)
    tl.store(gkl_ptr + offs, product(tl.trans(gs), ql, PREC, False), mask=tile)


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
