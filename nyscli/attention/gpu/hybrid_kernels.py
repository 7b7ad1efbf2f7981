"""Triton kernel of the Nyström-local hybrid's forward: one program per block of queries.

Imported by ``ops.kernel`` when it first runs (``hybrid.py`` launches it). Each program
scores its queries' band |i - j| <= R exactly, tile by tile of keys, the heavy keys and the
landmarks, and joins them with Nyström's estimate of the rest under one normaliser, as
``NystromLocalAttention.chunk`` and ``_weights`` do; nothing of size n x (band) ever reaches
memory. Shapes (contiguous, B*H heads first): q, k, v, out (BH, n, D); band_keys (BH, n): 1
where the band may score a key (real, not heavy); B' (BH, M, n); Z (BH, M, M); small keys /
values (BH, G + M, D) (heavy keys first, then k~ / B' V); heavy B' (BH, M, G); heavy_real
(BH, G); B' 1 (BH, M).

Tiles are read in whatever dtype the tensors have; the products of q, k, v and the weights
run with operands rounded to OP (bf16/fp16 under autocast: the tensor cores, float32 sums when
NATIVE) or, for float32/float64 work, in DT; float32 products as ``helpers.product``'s "split".
Everything else is DT.
"""

import triton
import triton.language as tl

from nyscli.attention import masking
from nyscli.attention.gpu.helpers import product, rounded

# A compiled kernel reads module globals only as constexpr (the interpreter reads any).
EXP_FLOOR = tl.constexpr(masking.EXP_FLOOR)


@triton.jit
def band_scores(
    q,
    k_ptr,
    keys_ptr,
    head,
    j0,
    rows,
    n,
    R,
    D,
    BK: tl.constexpr,
    BD: tl.constexpr,
    OP: tl.constexpr,
    DT: tl.constexpr,
    NATIVE: tl.constexpr,
):
    """Scores of the queries ``rows`` (q: BQ x BD, scaled, in OP) against keys j0..j0+BK-1,
    -inf where the band does not count them; which count; the key indices; which exist."""
    cols = j0 + tl.arange(0, BK)
    dims = tl.arange(0, BD)
    inside = (cols >= 0) & (cols < n)
    k = tl.load(
        k_ptr + head * n * D + cols[:, None] * D + dims[None, :],
        mask=inside[:, None] & (dims[None, :] < D),
        other=0.0,
    )
    ok = tl.load(keys_ptr + head * n + cols, mask=inside, other=0.0) > 0
    s = product(rounded(q, OP, NATIVE), rounded(tl.trans(k), OP, NATIVE), "split", NATIVE).to(DT)
    near = tl.abs(rows[:, None] - cols[None, :]) <= R
    keep = near & (ok & inside)[None, :] & (rows < n)[:, None]
    return tl.where(keep, s, float("-inf")), keep, cols, inside


@triton.jit
def hybrid_forward(
    q_ptr,
    k_ptr,
    v_ptr,
    keys_ptr,
    b_ptr,
    z_ptr,
    sk_ptr,
    sv_ptr,
    hb_ptr,
    hr_ptr,
    mass_ptr,
    out_ptr,
    n,
    R,
    M,
    G,
    D,
    scale,
    tiny,
    BQ: tl.constexpr,
    BK: tl.constexpr,
    BM: tl.constexpr,
    BG: tl.constexpr,
    BD: tl.constexpr,
    OP: tl.constexpr,
    DT: tl.constexpr,
    NATIVE: tl.constexpr,
):
    head = tl.program_id(0)
    q0 = tl.program_id(1) * BQ
    rows = q0 + tl.arange(0, BQ)
    dims = tl.arange(0, BD)
    lm = tl.arange(0, BM)
    hv = tl.arange(0, BG)
    row_ok = rows < n
    q = tl.load(
        q_ptr + head * n * D + rows[:, None] * D + dims[None, :],
        mask=row_ok[:, None] & (dims[None, :] < D),
        other=0.0,
    )
    if OP == DT:
        q = q.to(DT) * scale
    else:  # scaled in OP, as the torch path divides the query blocks in their own dtype
        q = rounded(rounded(q, OP, NATIVE).to(tl.float32) * scale, OP, NATIVE)
    small = head * (G + M) * D
    # Heavy keys: exact scores, -inf for the ones that are not real keys; landmarks' scores.
    heavy_real = tl.load(hr_ptr + head * G + hv, mask=hv < G, other=0.0).to(DT)
    hk = tl.load(
        sk_ptr + small + hv[:, None] * D + dims[None, :],
        mask=(hv[:, None] < G) & (dims[None, :] < D),
        other=0.0,
    )
    lk = tl.load(
        sk_ptr + small + (G + lm[:, None]) * D + dims[None, :],
        mask=(lm[:, None] < M) & (dims[None, :] < D),
        other=0.0,
    )
    sh = tl.where(
        (heavy_real > 0)[None, :],
        product(rounded(q, OP, NATIVE), rounded(tl.trans(hk), OP, NATIVE), "split", NATIVE).to(DT),
        float("-inf"),
    )
    sl = tl.where(
        (lm < M)[None, :],
        product(rounded(q, OP, NATIVE), rounded(tl.trans(lk), OP, NATIVE), "split", NATIVE).to(DT),
        float("-inf"),
    )
    # One shift per query for every part: the largest score, the band's from a first pass.
    top = tl.maximum(tl.max(sh, axis=1), tl.max(sl, axis=1))
    for j0 in range(q0 - R, q0 + BQ + R, BK):
        s, _, _, _ = band_scores(
            q, k_ptr, keys_ptr, head, j0, rows, n, R, D, BK, BD, OP, DT, NATIVE
        )
        top = tl.maximum(top, tl.max(s, axis=1))
    # Landmarks: F' = exp(scores - shift), p = F' pinv(A'); heavy keys' exact kernel.
    f = tl.where((lm < M)[None, :], tl.exp(tl.maximum(sl - top[:, None], EXP_FLOOR)), 0.0)
    e_heavy = tl.exp(tl.maximum(sh - top[:, None], EXP_FLOOR)) * heavy_real[None, :]
    z = tl.load(
        z_ptr + head * M * M + lm[:, None] * M + lm[None, :],
        mask=(lm[:, None] < M) & (lm[None, :] < M),
        other=0.0,
    ).to(DT)
    p = product(f, z, "split", False)  # (BQ, BM)
    hb = tl.load(
        hb_ptr + head * M * G + lm[:, None] * G + hv[None, :],
        mask=(lm[:, None] < M) & (hv[None, :] < G),
        other=0.0,
    ).to(DT)
    k_heavy = product(p, hb, "split", False) * heavy_real[None, :]
    mass = tl.load(mass_ptr + head * M + lm, mask=lm < M, other=0.0).to(DT)
    lr_mass = tl.sum(p * mass[None, :], axis=1)
    # Second pass over the band: exact kernel and Nyström's estimate there, kept apart until
    # the gate (which needs the estimate's whole band) is known.
    acc_e = tl.zeros((BQ, BD), dtype=DT)
    acc_k = tl.zeros((BQ, BD), dtype=DT)
    den_e = tl.zeros((BQ,), dtype=DT)
    den_k = tl.zeros((BQ,), dtype=DT)
    for j0 in range(q0 - R, q0 + BQ + R, BK):
        s, keep, cols, inside = band_scores(
            q, k_ptr, keys_ptr, head, j0, rows, n, R, D, BK, BD, OP, DT, NATIVE
        )
        e = tl.where(keep, tl.exp(tl.maximum(s - top[:, None], EXP_FLOOR)), 0.0)
        bt = tl.load(
            b_ptr + head * M * n + lm[:, None] * n + cols[None, :],
            mask=(lm[:, None] < M) & inside[None, :],
            other=0.0,
        ).to(DT)
        kt = tl.where(keep, product(p, bt, "split", False), 0.0)
        v = tl.load(
            v_ptr + head * n * D + cols[:, None] * D + dims[None, :],
            mask=inside[:, None] & (dims[None, :] < D),
            other=0.0,
        )
        acc_e += product(rounded(e, OP, NATIVE), rounded(v, OP, NATIVE), "split", NATIVE).to(DT)
        acc_k += product(rounded(kt, OP, NATIVE), rounded(v, OP, NATIVE), "split", NATIVE).to(DT)
        den_e += tl.sum(e, axis=1)
        den_k += tl.sum(kt, axis=1)
    # A query whose estimate of the mass outside its exact support is not positive keeps the
    # exact part alone.
    outside = lr_mass - den_k - tl.sum(k_heavy, axis=1)
    gate = tl.where(outside > 0, 1.0, 0.0).to(DT)
    w_heavy = e_heavy - gate[:, None] * k_heavy
    hvals = tl.load(
        sv_ptr + small + hv[:, None] * D + dims[None, :],
        mask=(hv[:, None] < G) & (dims[None, :] < D),
        other=0.0,
    ).to(DT)
    lvals = tl.load(
        sv_ptr + small + (G + lm[:, None]) * D + dims[None, :],
        mask=(lm[:, None] < M) & (dims[None, :] < D),
        other=0.0,
    ).to(DT)
    num = acc_e - gate[:, None] * acc_k
    num += product(w_heavy, hvals, "split", False)
    num += product(p * gate[:, None], lvals, "split", False)
    den = den_e - gate * den_k + tl.sum(w_heavy, axis=1) + gate * lr_mass
    out = num / tl.maximum(den, tiny)[:, None]
    tl.store(
        out_ptr + head * n * D + rows[:, None] * D + dims[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & (dims[None, :] < D),
    )
