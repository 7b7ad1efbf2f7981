"""Nyström's landmark side in one Triton program per head: W = pinv(A) (Bk V), forward and backward.

On a GPU the landmark side was tens of small kernels (the landmark kernel, its softmax, six
Newton-Schulz steps of four products each, the product with Bk V) and their backward three
times as many: the core was bound by launches, not arithmetic (docs/results/gpu.md). Here one
program per (sequence, head) holds q~, k~ (m x d) and the m x m iterates in registers and
does all of it; the backward is one more program per head that keeps the iterates in a
scratch buffer of its own and walks them back. The two large attentions stay in SDPA's fused
kernels (``nystrom.py``).

The same function as ``NystromAttention.landmark_values`` with the iterative pseudo-inverse
and its per-matrix start, computed in float32 (float64 for float64 inputs), whatever the
input dtype. The kernels run where Triton does: on CUDA, and anywhere under Triton's
interpreter (``TRITON_INTERPRET=1``), which is how the tests check them on a CPU.
"""

from __future__ import annotations

import importlib.util
import math
import os
from functools import cache
from typing import Any

import torch
from torch import Tensor

from nyscli import gpu_env

# The register tile a program holds: m and d are padded up to powers of two of at least 16
# (tl.dot's smallest), and beyond these the m x m iterates would spill out of registers.
MAX_LANDMARKS = 64
MAX_HEAD_DIM = 128


def interpreting() -> bool:
    """Whether Triton runs its interpreter (``TRITON_INTERPRET=1`` before triton is first
    imported: Triton's own library functions are decorated then) instead of compiling."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# Found, not imported: importing triton takes about a second that CPU runs need not pay.
HAS_TRITON = importlib.util.find_spec("triton") is not None
# Set by tests only: CPU tensors then take the kernels (under the interpreter), and float64
# on a GPU too. Users' CPU runs keep the CPU path whatever their environment says, and
# float64 on a GPU (a reference) keeps the torch path.
TESTING = False


def applies(q: Tensor, v: Tensor, m: int) -> bool:
    """Whether the kernels serve m landmarks of q: (B, H, n, d), v: (B, H, n, d_v) here."""
    d = q.shape[-1]
    if q.is_cuda:
        device_ok = q.dtype != torch.float64 or TESTING
    else:
        device_ok = TESTING and interpreting() and q.device.type == "cpu"
    return (
        device_ok
        and m <= MAX_LANDMARKS
        and d <= MAX_HEAD_DIM
        and v.shape[-1] == d
        and q.dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64)
        and HAS_CUSTOM_OPS
        and HAS_TRITON
    )


def _block(size: int) -> int:
    return max(16, 1 << (size - 1).bit_length())


def _compute_dtype(x: Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _launch_args(q_land: Tensor, exists: Tensor | None) -> dict[str, Any]:
    h, m, d = q_land.shape[1:]
    return _launch_constants(h, m, d, q_land.dtype == torch.float64, exists is not None)


HALF = (torch.bfloat16, torch.float16)
# How the landmark programs multiply float32 tiles, by the attention's operands: "tf32x3"
# (three tf32 products, about float32's accuracy) for float32 work, "tf32" (one) for bf16/fp16
# work, whose own rounding (2^-9) is as coarse as tf32's (2^-11) and whose outputs (H200,
# docs/results/gpu-notes.md) keep bf16's error while the forward program takes 17 us instead
# of 100 and the backward 119 instead of 550. The warps per kernel and products, from the
# same measurement (and ptxas' stacks). Read at each launch, so that scripts/gpu_profile.py
# can time the alternatives in one process.
PRODUCTS = {"16-bit": "tf32", "32-bit": "tf32x3"}
WARPS = {
    "tf32": {"forward": 4, "backward": 4, "pinv": 4},
    "tf32x3": {"forward": 4, "backward": 8, "pinv": 4},
}


@cache
def _tile(m: int, wide: bool) -> dict[str, Any]:
    """What a program holding m x m iterates needs besides tensors: the floor of the pinv's
    start, the padded tile and the compute dtype (cached: at small n a call's time is its
    Python)."""
    import triton.language as tl

    return {
        "tiny": torch.finfo(torch.float64 if wide else torch.float32).tiny,
        "BM": _block(m),
        "DT": tl.float64 if wide else tl.float32,
    }


def _products(operands: torch.dtype) -> str:
    """How float32 tiles are multiplied in work whose operands are ``operands``."""
    return PRODUCTS["16-bit" if operands in HALF else "32-bit"]


def rounding(operands: torch.dtype) -> Any:
    """The Triton dtype the inference kernels round their q, k, v and landmark tiles to in
    work on ``operands``: the half dtype itself, also when q is already in it, because the
    landmarks can be float32 beside bf16 q (padded segment means divide by float32 counts),
    and a compiled dot refuses bf16 by float32 (the LRA Text step, lease 7); float32 work
    keeps its tiles as they are."""
    return _triton_dtype(operands if operands in HALF else torch.float32)


@cache
def _triton_dtype(dtype: torch.dtype) -> Any:
    """Triton's name for a torch dtype the kernels take."""
    import triton.language as tl

    names = {torch.float64: tl.float64, torch.float32: tl.float32}
    return {**names, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}[dtype]


def _how(kernel: str, operands: torch.dtype) -> dict[str, Any]:
    """The launch settings of one landmark kernel in work on ``operands``: products, warps."""
    products = _products(operands)
    return {"PREC": products, "num_warps": WARPS[products][kernel]}


@cache
def _launch_constants(h: int, m: int, d: int, wide: bool, has_e: bool) -> dict[str, Any]:
    """The landmark kernels' arguments besides tensors, per shape."""
    return {
        "heads": h,
        "scale": 1.0 / math.sqrt(d),
        "M": m,
        "D": d,
        "BD": _block(d),
        "HAS_E": has_e,
        **_tile(m, wide),
    }


def _forward(
    q_land: Tensor, k_land: Tensor, bv: Tensor, exists: Tensor | None, iterations: int
) -> Tensor:
    # Bk V comes from SDPA in the attention's operand dtype (under autocast too).
    return _weights(q_land, k_land, bv, exists, iterations, operands=bv.dtype)


def _weights(
    q_land: Tensor,
    k_land: Tensor,
    bv: Tensor,
    exists: Tensor | None,
    iterations: int,
    operands: torch.dtype,
) -> Tensor:
    """``landmark_weights`` without autograd, its products chosen for work on ``operands``."""
    from nyscli.attention.gpu.landmark_kernels import forward as forward_kernel

    q_land, k_land, bv = q_land.contiguous(), k_land.contiguous(), bv.contiguous()
    flags = None if exists is None else exists.to(torch.int8).contiguous()
    w = torch.empty_like(bv)
    b, h = q_land.shape[:2]
    args = _launch_args(q_land, exists)
    forward_kernel[(b * h,)](
        q_land, k_land, flags, bv, w, ITERS=iterations, **args, **_how("forward", operands)
    )
    return w


def _backward(
    q_land: Tensor,
    k_land: Tensor,
    bv: Tensor,
    exists: Tensor | None,
    grad_w: Tensor,
    iterations: int,
) -> tuple[Tensor, Tensor, Tensor]:
    from nyscli.attention.gpu.landmark_kernels import backward as backward_kernel

    q_land, k_land, bv = q_land.contiguous(), k_land.contiguous(), bv.contiguous()
    flags = None if exists is None else exists.to(torch.int8).contiguous()
    b, h = q_land.shape[:2]
    args = _launch_args(q_land, exists)
    dtype = _compute_dtype(q_land)
    grads = [torch.empty(x.shape, dtype=dtype, device=x.device) for x in (q_land, k_land, bv)]
    # The iterates Z_0 .. Z_{T-1} of each head, written and read back by its own program.
    scratch = torch.empty(b * h * iterations * args["BM"] ** 2, dtype=dtype, device=bv.device)
    backward_kernel[(b * h,)](
        q_land,
        k_land,
        flags,
        bv,
        grad_w.contiguous(),
        *grads,
        scratch,
        ITERS=iterations,
        **args,
        **_how("backward", bv.dtype),
    )
    g_ql, g_kl, g_bv = grads
    return g_ql.to(q_land.dtype), g_kl.to(k_land.dtype), g_bv.to(bv.dtype)


# Registered as custom ops so that torch.compile keeps them whole (no graph break) and knows
# their output shapes from the fake versions; torch < 2.4 has no custom_op and no GPU path.
HAS_CUSTOM_OPS = hasattr(torch.library, "custom_op")
if HAS_CUSTOM_OPS:
    _forward_op = torch.library.custom_op(
        "nys::nystrom_landmark_weights",
        mutates_args=(),
        schema="(Tensor q_land, Tensor k_land, Tensor bv, Tensor? exists, int iterations)"
        " -> Tensor",
    )(_forward)
    _backward_op = torch.library.custom_op(
        "nys::nystrom_landmark_weights_backward",
        mutates_args=(),
        schema="(Tensor q_land, Tensor k_land, Tensor bv, Tensor? exists, Tensor grad_w,"
        " int iterations) -> (Tensor, Tensor, Tensor)",
    )(_backward)

    @_forward_op.register_fake
    def _(q_land, k_land, bv, exists, iterations):  # noqa: ANN001, ANN202
        return torch.empty_like(bv)

    @_backward_op.register_fake
    def _(q_land, k_land, bv, exists, grad_w, iterations):  # noqa: ANN001, ANN202
        return torch.empty_like(q_land), torch.empty_like(k_land), torch.empty_like(bv)

    def _setup_context(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
        q_land, k_land, bv, exists, iterations = inputs
        ctx.save_for_backward(q_land, k_land, bv, exists)
        ctx.iterations = iterations

    def _grad(ctx: Any, grad_w: Tensor) -> tuple[Tensor | None, ...]:
        q_land, k_land, bv, exists = ctx.saved_tensors
        grads = _backward_op(q_land, k_land, bv, exists, grad_w, ctx.iterations)
        return *grads, None, None

    _forward_op.register_autograd(_grad, setup_context=_setup_context)


def landmark_weights(
    q_land: Tensor, k_land: Tensor, bv: Tensor, exists: Tensor | None, iterations: int
) -> Tensor:
    """W = pinv(A) bv: (B, H, m, d_v) from landmarks q~, k~ (B, H, m, d), Bk V (B, H, m, d_v)
    and the (B, m) mask of landmarks that exist (None: all do).

    A = softmax(q~ k~^T / sqrt(d)) with empty landmarks' rows and columns zero; pinv by
    ``iterations`` Newton-Schulz steps from Z_0 = A^T / (||A||_1 ||A||_inf). W comes back in
    bv's dtype; differentiable in q~, k~ and bv. Requires ``applies`` (d_v = d).
    """
    return _forward_op(q_land, k_land, bv, exists, iterations)


def iterative_pinv(a: Tensor, iterations: int) -> Tensor:
    """``pinv.iterative_pinv(a, iterations)`` (per-matrix start) for a: (..., m, m), m <=
    MAX_LANDMARKS, in one program per matrix: in fp32 (fp64 for fp64), no autograd."""
    from nyscli.attention.gpu.landmark_kernels import pinv as kernel

    m = a.shape[-1]
    dtype = _compute_dtype(a)
    how = _how("pinv", a.dtype)
    a = a.to(dtype).contiguous()
    z = torch.empty_like(a)
    tile = _tile(m, dtype == torch.float64)
    kernel[(a.numel() // (m * m),)](a, z, M=m, ITERS=iterations, **tile, **how)
    return z


def inference_applies(q: Tensor) -> bool:
    """Whether ``nystrom_inference`` serves Nyström for q: (B, H, n, d) where the landmark
    kernels do (``applies``, which the caller checks, as it does that no gradient follows)."""
    return _allowed("inference", q)


# Calls of at most this many (sequence, head, token) rows are replayed from CUDA graphs
# (graphs.py): below it a call's launches outlast its work (12 heads: n ~ 16K on an H200),
# and each kept graph's output buffer stays small (25 MB at d = 64 in bf16).
GRAPH_MAX_ROWS = 12 * 16384
GRAPHS_ON_CPU = False  # set by tests only, with a stand-in for the graph (a CPU has none)


def graph_applies(q: Tensor, key_padding_mask: Tensor | None) -> bool:
    """Whether an inference call on q: (B, H, n, d) (``inference_applies``) is replayed from
    a CUDA graph: launch-bound, no padding mask (whose lengths the core reads on the host),
    outside torch.compile (which makes its own) and outside the caller's own capture."""
    b, h, n = q.shape[:3]
    return (
        (CHECKED_ON_GPU["graph"] and q.is_cuda or GRAPHS_ON_CPU)
        and key_padding_mask is None
        and b * h * n <= GRAPH_MAX_ROWS
        and not torch.compiler.is_compiling()
        # inside a capture of the caller's own (a graph cannot capture another)
        and not (q.is_cuda and torch.cuda.is_current_stream_capturing())
    )


INFERENCE_BLOCK = 64  # keys per tile of Bk V's splits, and queries per program of F W
# Keys per split of Bk V at least: each split leaves an m x d float32 partial, 4.3 MB in all at
# two programs per SM (H200, m = d = 64, 12 heads), which was the whole of the op's memory over
# SDPA's (bench, lease 6); at 1,024 keys a split's partial is 1/8 of its keys' q, k or v in
# bf16, and a program streams 256 KB of k and v (~7 us of one SM's share of the bandwidth).
MIN_SPLIT_KEYS = 1024


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@cache
def _programs_wanted(device: torch.device) -> int:
    """Bk V's programs to aim for: two per multiprocessor (a few under the interpreter)."""
    if device.type != "cuda":
        return 4
    return 2 * torch.cuda.get_device_properties(device).multi_processor_count


def _key_splits(n: int, heads: int, device: torch.device) -> tuple[int, int]:
    """(splits, keys per split) of Bk V over n keys in each of ``heads`` (sequence, head)
    pairs: enough to fill the GPU, each at least MIN_SPLIT_KEYS (but one) and a whole number
    of key tiles."""
    splits = max(1, min(_ceil(_programs_wanted(device), heads), n // MIN_SPLIT_KEYS))
    chunk = _ceil(_ceil(n, splits), INFERENCE_BLOCK) * INFERENCE_BLOCK
    return _ceil(n, chunk), chunk


def _inference(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    q_land: Tensor,
    k_land: Tensor,
    exists: Tensor | None,
    key_padding_mask: Tensor | None,
    iterations: int,
) -> Tensor:
    """Nyström's output (B, H, n, d) at inference, in four kernels and no SDPA: Bk V split over
    the keys, the splits combined, W = pinv(A) Bk V (``landmark_weights``' program) and
    softmax(q k~^T / sqrt(d)) W. q, k, v: (B, H, n, d); landmarks q~, k~ (B, H, m, d), which
    exist ((B, m) or None); key_padding_mask (B, n), True = real (None: all are). The same
    function as ``NystromAttention.approximate_all``; no autograd (``inference_applies``).
    Called as ``nystrom_inference``, the custom op, which torch.compile keeps whole."""
    from nyscli.attention.gpu import landmark_kernels as kernels

    b, h, n, d = q.shape
    m = q_land.shape[2]
    # Under autocast, as SDPA would: its products in the autocast dtype; the kernels round the
    # tiles as they read them, so no cast copies of q, k, v (SDPA's path casts k, v, then q:
    # three copies at once here were most of the op's memory over SDPA's, lease 6).
    operands = operand_dtype(q)
    op = rounding(operands)
    q, k, v, q_land, k_land = (x.contiguous() for x in (q, k, v, q_land, k_land))
    wide = q.dtype == torch.float64
    dtype = _compute_dtype(q)
    block = INFERENCE_BLOCK
    splits, chunk = _key_splits(n, b * h, q.device)
    acc = torch.empty(b * h * splits, m, d, dtype=dtype, device=q.device)
    top = torch.empty(b * h * splits, m, dtype=dtype, device=q.device)
    total = torch.empty_like(top)
    keep = None if key_padding_mask is None else key_padding_mask.to(torch.int8).contiguous()
    flags = None if exists is None else exists.to(torch.int8).contiguous()
    shared = {
        "heads": h,
        "scale": 1.0 / math.sqrt(d),
        "M": m,
        "D": d,
        "BM": _block(m),
        "BD": _block(d),
        "PREC": _products(operands),
        "OP": op,
    }
    half_dot = not interpreting()
    kernels.landmark_attention_split[(b * h, splits)](
        q_land, k, v, keep, acc, top, total, n=n, chunk=chunk, BK=block,
        HAS_KEEP=keep is not None, DT=_tile(m, wide)["DT"], HALF_DOT=half_dot, **shared,
    )  # fmt: skip
    bv = torch.empty(b, h, m, d, dtype=dtype, device=q.device)
    kernels.landmark_attention_combine[(b * h,)](
        acc, top, total, flags, bv, heads=h, splits=splits, M=m, D=d, BM=shared["BM"],
        BD=shared["BD"], HAS_E=flags is not None,
    )  # fmt: skip
    w = _weights(q_land, k_land, bv, exists, iterations, operands)  # (B, H, m, d), float32/64
    out = torch.empty(q.shape, dtype=operands, device=q.device)
    kernels.landmark_output[(b * h, _ceil(n, block))](
        q, k_land, w, flags, out, n=n, BQ=block, HAS_E=flags is not None, HALF_DOT=half_dot,
        **shared,
    )  # fmt: skip
    return out


# One op for torch.compile (torch < 2.4 has no custom ops, and ``applies`` no GPU path).
if HAS_CUSTOM_OPS:
    nystrom_inference = torch.library.custom_op(
        "nys::nystrom_inference",
        mutates_args=(),
        schema="(Tensor q, Tensor k, Tensor v, Tensor q_land, Tensor k_land, Tensor? exists,"
        " Tensor? key_padding_mask, int iterations) -> Tensor",
    )(_inference)

    @nystrom_inference.register_fake
    def _(q, k, v, q_land, k_land, exists, key_padding_mask, iterations):  # noqa: ANN001, ANN202
        return q.new_empty(q.shape, dtype=operand_dtype(q))
else:
    nystrom_inference = _inference


# The hybrid's heavy keys share a register tile with the landmarks' scores.
MAX_HEAVY_KEYS = 64
HYBRID_BLOCK = 64  # queries per program, and keys per band tile
# How the hybrid's kernel is launched: its landmark and heavy-key tiles padded to at least
# ``min_tile`` (16 gives products of 64 x 16 x 16; the landmark programs, which run on the
# H200, multiply 64 x 64 tiles), warps, and the band loops' pipeline stages (3: 111 KB of
# shared memory in float32 at budget 128, 1: 49 KB; ptxas, sm_90, Triton 3.6). On the H200
# min_tile 16 faults (an out-of-bounds shared-memory read) and 64 equals float64 in both
# widths, 1 stage 12-18% faster than 3 (lease 7); scripts/gpu_profile.py --hybrid-matrix tries
# settings, each in a process of its own; NYS_HYBRID_LAUNCH="min_tile=64,num_stages=3" sets them.
HYBRID_LAUNCH = {
    **gpu_env.HYBRID_LAUNCH_DEFAULT,
    **gpu_env.hybrid_launch(os.environ.get(gpu_env.HYBRID_LAUNCH_ENV, "")),
}


# Kernels a GPU has not yet run against float64 stay off on CUDA (the torch path serves), as a
# kernel that passes in the interpreter can still fault compiled: the hybrid's did (H200,
# Triton 3.6, with its tiles padded to 16). On the H200 (torch 2.11, Triton 3.6) these equal
# float64 as the torch path does (docs/results/gpu-notes.md): the inference op and its graph
# replay (n = 4,096: fp32 2.3e-7, bf16 2.4e-3; leases 6 and 7) and the hybrid's kernel with
# HYBRID_LAUNCH's default in both widths (n = 1,024: fp32 7.9e-7, bf16 0.082 against the torch
# path's 0.082; lease 7), so all are on. A kernel added later starts off here;
# scripts/gpu_profile.py turns each on to check it, and NYS_GPU_CHECKED=<name>,... turns it on
# in a process run after such a check passed on the same machine (the bench that follows
# gpu_profile). The hybrid's kernel is checked per operand width: its bf16/fp16 products are
# not its float32 ones. "hybrid" names both widths.
CHECKED_ON_H200 = {"hybrid-16-bit", "hybrid-32-bit", "inference", "graph"}


def checked_on_gpu(named: str, checked: set[str]) -> dict[str, bool]:
    """Per kernel, whether it runs on CUDA: in ``checked`` or named in ``named`` (a
    NYS_GPU_CHECKED value; "hybrid" names both widths)."""
    on = checked | gpu_env.checked(named)
    if "hybrid" in on:
        on |= {"hybrid-16-bit", "hybrid-32-bit"}
    return {name: name in on for name in gpu_env.CHECKABLE if name != "hybrid"}


CHECKED_ON_GPU = checked_on_gpu(os.environ.get(gpu_env.CHECKED_ENV, ""), CHECKED_ON_H200)


def _allowed(kernel: str, q: Tensor) -> bool:
    return CHECKED_ON_GPU[kernel] or TESTING or not q.is_cuda


def operand_dtype(q: Tensor) -> torch.dtype:
    """The dtype a core's products of q take: autocast's (not for float64), else q's."""
    if torch.is_autocast_enabled(q.device.type) and q.dtype != torch.float64:
        return torch.get_autocast_dtype(q.device.type)
    return q.dtype


def hybrid_applies(q: Tensor, v: Tensor, m: int, g: int) -> bool:
    """Whether ``hybrid_forward`` serves the Nyström-local hybrid with m landmarks and g heavy
    keys for q: (B, H, n, d), v: (B, H, n, d_v) here (inference only: no backward)."""
    width = "hybrid-16-bit" if operand_dtype(q) in HALF else "hybrid-32-bit"
    return _allowed(width, q) and applies(q, v, m) and g <= MAX_HEAVY_KEYS


def hybrid_forward(q: Tensor, k: Tensor, v: Tensor, parts: Any, radius: int) -> Tensor:
    """The hybrid's output (B, H, n, d) from q, k, v (B, H, n, d) and the parts every query
    block shares (``nystrom_local.Parts``: Z, B', B' 1, heavy keys, [heavy; k~] keys and
    [heavy; B' V] values, the keys the band may score); the band |i - j| <= radius.

    Under autocast (or for bf16/fp16 inputs) the band's products run on the tensor cores in
    that dtype with float32 sums, the tiles rounded as they are read (no cast copies of q, k,
    v); the output is in that dtype. Everything else is float32 (float64 for float64 inputs).
    """
    from nyscli.attention.gpu.hybrid_kernels import hybrid_forward as kernel

    b, h, n, d = q.shape
    m, g = parts.z.shape[-1], parts.heavy_b.shape[-1]
    dtype = _compute_dtype(q)
    operands = operand_dtype(q)
    operands = operands if operands in HALF else dtype
    out = torch.empty(v.shape, dtype=operands if operands in HALF else v.dtype, device=v.device)
    grid = (b * h, -(-n // HYBRID_BLOCK))
    kernel[grid](
        q.contiguous(),
        k.contiguous(),
        v.contiguous(),
        parts.band_keys.reshape(b * h, n).contiguous(),
        parts.b_kernel.contiguous(),
        parts.z.contiguous(),
        parts.small_k.contiguous(),
        parts.small_v.contiguous(),
        parts.heavy_b.contiguous(),
        parts.heavy_real.reshape(b * h, g).contiguous(),
        parts.b_mass.reshape(b * h, m).contiguous(),
        out,
        n,
        radius,
        m,
        g,
        d,
        1.0 / math.sqrt(d),
        torch.finfo(dtype).tiny,
        BQ=HYBRID_BLOCK,
        BK=HYBRID_BLOCK,
        BM=_block(max(m, HYBRID_LAUNCH["min_tile"])),
        BG=_block(max(g, HYBRID_LAUNCH["min_tile"])),
        BD=_block(d),
        OP=_triton_dtype(operands),
        DT=_triton_dtype(dtype),
        NATIVE=not interpreting(),
        num_warps=HYBRID_LAUNCH["num_warps"],
        num_stages=HYBRID_LAUNCH["num_stages"],
    )
    return out
