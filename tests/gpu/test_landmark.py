"""The GPU path of Nyström's landmark side (``nystrom_gpu``): its Triton kernels against the
float64 formula, forward and backward — compiled on a GPU where there is one, otherwise on the
CPU under Triton's interpreter (switched on by conftest.py)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from nyscli.attention import build_attention
from nyscli.attention.gpu import landmark as nystrom_gpu
from nyscli.attention.nystrom import NystromAttention
from nyscli.errors import UserInputError

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def interpret(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let the GPU path serve the tests' tensors: float64 on a GPU, or without one CPU
    tensors (in Triton's interpreter)."""
    if DEVICE == "cpu":
        assert nystrom_gpu.interpreting(), "conftest.py switches the interpreter on"
    monkeypatch.setattr(nystrom_gpu, "TESTING", True)


def landmarks(
    b: int, h: int, m: int, d: int, seed: int, dtype: torch.dtype = torch.float64
) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (b, h, m, d)
    return [
        torch.randn(shape, generator=g, dtype=torch.float64).to(DEVICE, dtype) for _ in range(3)
    ]


def formula(
    q_land: torch.Tensor, k_land: torch.Tensor, bv: torch.Tensor, exists, iterations: int
) -> torch.Tensor:
    """W = pinv(A) bv by the torch ops of the CPU path (float64, autograd)."""
    core = NystromAttention(num_landmarks=q_land.shape[2], pinv_iterations=iterations)
    a = core.landmark_kernel(q_land, k_land, exists)
    return core.pseudo_inverse(a) @ bv


def relative(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize(
    "m, d, partial",
    [(64, 64, False), (24, 40, True), (16, 16, True)],
    ids=["m64-d64", "m24-d40-some-empty", "m16-d16-some-empty"],
)
def test_landmark_weights_equal_the_float64_formula(interpret, m, d, partial) -> None:
    q_land, k_land, bv = (x.requires_grad_() for x in landmarks(3, 2, m, d, seed=m + d))
    exists = None
    if partial:
        exists = torch.ones(3, m, dtype=torch.bool, device=DEVICE)
        exists[1, m - 5 :] = False
        exists[2] = False  # a sequence with no landmark at all: A = 0, W = 0
    w = nystrom_gpu.landmark_weights(q_land, k_land, bv, exists, 6)
    ref = formula(q_land, k_land, bv, exists, 6)
    assert relative(w, ref) < 1e-12
    if partial:
        assert torch.equal(w[2], torch.zeros_like(w[2]))
    grad = torch.randn(w.shape, generator=torch.Generator().manual_seed(1), dtype=w.dtype)
    grad = grad.to(DEVICE)
    got = torch.autograd.grad(w, (q_land, k_land, bv), grad)
    want = torch.autograd.grad(ref, (q_land, k_land, bv), grad)
    for g_got, g_want in zip(got, want, strict=True):
        assert relative(g_got, g_want) < 1e-11


@pytest.mark.parametrize("iterations", [1, 3])
def test_other_iteration_counts(interpret, iterations) -> None:
    q_land, k_land, bv = (x.requires_grad_() for x in landmarks(1, 2, 32, 16, seed=7))
    w = nystrom_gpu.landmark_weights(q_land, k_land, bv, None, iterations)
    ref = formula(q_land, k_land, bv, None, iterations)
    assert relative(w, ref) < 1e-12
    got = torch.autograd.grad(w.sum(), q_land)[0]
    want = torch.autograd.grad(ref.sum(), q_land)[0]
    assert relative(got, want) < 1e-11


@pytest.mark.parametrize("products", ["tf32x3", "tf32"])
@pytest.mark.parametrize("dtype, bound", [(torch.float32, 1e-5), (torch.bfloat16, 1e-2)])
def test_low_precision_inputs_compute_in_float32(
    interpret, monkeypatch, dtype, bound, products
) -> None:
    # Against the float64 formula on the same (rounded) inputs: only float32 arithmetic and
    # the output's rounding to the input dtype separate them. (The interpreter multiplies in
    # float32 whatever the products' setting: a GPU measures tf32's own error, gpu_profile.)
    monkeypatch.setattr(nystrom_gpu, "PRODUCTS", dict.fromkeys(("16-bit", "32-bit"), products))
    q_land, k_land, bv = landmarks(2, 3, 64, 64, seed=3, dtype=dtype)
    w = nystrom_gpu.landmark_weights(q_land, k_land, bv, None, 6)
    assert w.dtype == dtype and torch.isfinite(w).all()
    ref = formula(q_land.double(), k_land.double(), bv.double(), None, 6)
    assert relative(w, ref) < bound


def test_inference_under_autocast_makes_no_cast_copy_of_q_k_v(interpret, monkeypatch) -> None:
    # The inference op's kernels round q, k, v's tiles to the autocast dtype as they read them:
    # three copies at once were most of its memory over SDPA's (H200, lease 6).
    q, k, v = (x.float() for x in qkv(1, 2, 256, 16, seed=4))
    copies = []
    to = torch.Tensor.to

    def spy(self, *args, **kwargs):
        out = to(self, *args, **kwargs)
        if out.data_ptr() != self.data_ptr() and self.numel() >= q.numel():
            copies.append((tuple(self.shape), out.dtype))
        return out

    monkeypatch.setattr(torch.Tensor, "to", spy)
    core = NystromAttention(num_landmarks=16)
    reference = core(q.double(), k.double(), v.double())
    copies.clear()
    with torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16):
        out = core(q, k, v)
    assert copies == [] and out.dtype == torch.bfloat16
    assert relative(out, reference) < 1e-2


def test_core_under_autocast_keeps_the_landmark_side_in_float32(interpret) -> None:
    # bench's bf16 rows: fp32 inputs under autocast. The custom op is not autocast: the
    # landmarks arrive in fp32 and W leaves in Bk V's bf16, as the torch path's W does.
    q, k, v = (x.float() for x in qkv(2, 2, 256, 64, seed=4))
    core = NystromAttention(num_landmarks=64)
    reference = core(q.double(), k.double(), v.double())
    with torch.no_grad(), torch.autocast(DEVICE, dtype=torch.bfloat16):
        assert core.uses_triton(q, v)
        out = core(q, k, v)
    assert out.dtype == torch.bfloat16 and relative(out, reference) < 1e-2


def test_inference_op_takes_bf16_q_k_v_beside_float32_landmarks(interpret) -> None:
    # The LRA Text step under CUDA autocast: q, k, v in bf16 (its projections), landmarks in
    # float32 (padded segment means: autocast sums in float32), which failed to compile on the
    # H200 (lease 7; compile_check compiles the mix). Its value: that of the same landmarks in
    # float64, to bf16's rounding.
    from nyscli.attention.landmarks import select_landmarks

    q, k, v = qkv(2, 2, 200, 32, seed=7)
    mask = torch.ones(2, 200, dtype=torch.bool, device=DEVICE)
    mask[1, 150:] = False
    q_land, k_land, exists = select_landmarks(q, k, 24, mask)
    want = nystrom_gpu.nystrom_inference(q, k, v, q_land, k_land, exists, mask, 6)
    half = [x.bfloat16() for x in (q, k, v)]
    with torch.no_grad():
        got = nystrom_gpu.nystrom_inference(
            *half, q_land.float(), k_land.float(), exists, mask, 6
        )  # fmt: skip
    assert got.dtype == torch.bfloat16
    real = mask[:, None, :, None].expand_as(want)
    assert relative(got.double()[real], want[real]) < 1e-2


def qkv(b: int, h: int, n: int, d: int, seed: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    shape = (b, h, n, d)
    return [torch.randn(shape, generator=g, dtype=torch.float64).to(DEVICE) for _ in range(3)]


def forward_backward(core, q, k, v, mask):
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = core(q, k, v, mask)
    grad = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    return out, torch.autograd.grad(out, (q, k, v), grad)


@pytest.mark.parametrize("n, m, padded", [(96, 64, False), (50, 24, True), (70, 16, True)])
def test_core_on_the_gpu_path_equals_the_torch_path(monkeypatch, n, m, padded) -> None:
    q, k, v = qkv(3, 2, n, 32, seed=n)
    mask = None
    if padded:
        mask = torch.ones(3, n, dtype=torch.bool, device=DEVICE)
        mask[1, n - 9 :] = False
        mask[2, m - 3 :] = False  # at most m real tokens: exact attention, on either path
    core = NystromAttention(num_landmarks=m)
    core.fused_cpu_backward = False  # CPU training would take its own fused path
    monkeypatch.setattr(nystrom_gpu, "TESTING", True)
    assert core.uses_triton(q, v)
    got = forward_backward(core, q, k, v, mask)
    monkeypatch.setattr(nystrom_gpu, "HAS_TRITON", False)  # the torch ops, on any device
    assert not core.uses_triton(q, v)
    want = forward_backward(core, q, k, v, mask)
    assert relative(got[0], want[0]) < 1e-12
    for g_got, g_want in zip(got[1], want[1], strict=True):
        assert relative(g_got, g_want) < 1e-11
    if padded:  # pads never count: junk there changes nothing
        junk = [x.clone() for x in (q, k, v)]
        for x in junk:
            x[1, :, n - 9 :] = 1e3
        monkeypatch.setattr(nystrom_gpu, "HAS_TRITON", True)
        again = core(*junk, mask)
        assert torch.allclose(again[1, :, : n - 9], got[0][1, :, : n - 9], atol=1e-12)
        exact = build_attention({"name": "softmax_naive"})(q, k, v, mask)
        assert torch.allclose(got[0][2, :, : m - 3], exact[2, :, : m - 3], atol=1e-12)


@pytest.mark.parametrize(
    "n, m, d, padded, landmarks_by",
    [
        (96, 64, 32, False, "segment_means"),
        (200, 24, 40, True, "segment_means"),  # Bk V in several splits, a mask, m < the tile
        (150, 16, 16, True, "kmeans"),  # landmarks that may not exist
    ],
)
def test_inference_kernels_equal_the_torch_path(monkeypatch, n, m, d, padded, landmarks_by):
    # Inference: Bk V split over the keys and combined, W, then F W, in four kernels and no
    # SDPA, against the torch path in float64; in float32, against the same float64.
    q, k, v = qkv(3, 2, n, d, seed=n)
    mask = None
    if padded:
        mask = torch.ones(3, n, dtype=torch.bool, device=DEVICE)
        mask[1, n - 37 :] = False
        mask[2, m - 3 :] = False  # at most m real tokens: exact attention, on either path
    core = NystromAttention(num_landmarks=m, landmarks=landmarks_by)
    monkeypatch.setattr(nystrom_gpu, "TESTING", True)
    calls = []
    served = nystrom_gpu.nystrom_inference
    monkeypatch.setattr(nystrom_gpu, "nystrom_inference", lambda *a: calls.append(1) or served(*a))
    # several splits of Bk V at these small n (but n = 96: one)
    monkeypatch.setattr(nystrom_gpu, "_programs_wanted", lambda device: 24)
    monkeypatch.setattr(nystrom_gpu, "MIN_SPLIT_KEYS", 64)
    assert nystrom_gpu._key_splits(n, 6, q.device)[0] == (1 if n < 128 else 2)
    with torch.no_grad():
        got = core(q, k, v, mask)
        got32 = core(q.float(), k.float(), v.float(), mask)
        assert len(calls) == 2
        monkeypatch.setattr(nystrom_gpu, "HAS_TRITON", False)  # the torch ops
        want = core(q, k, v, mask)
    assert got.dtype == torch.float64 and got32.dtype == torch.float32
    assert relative(got, want) < 1e-12
    assert relative(got32, want) < 1e-5
    if padded:  # pads never count: junk there changes nothing
        junk = [x.clone() for x in (q, k, v)]
        for x in junk:
            x[1, :, n - 37 :] = 1e3
        monkeypatch.setattr(nystrom_gpu, "HAS_TRITON", True)
        with torch.no_grad():
            again = core(*junk, mask)
        assert torch.allclose(again[1, :, : n - 37], got[1, :, : n - 37], atol=1e-12)


@pytest.mark.parametrize(
    "dtype, autocast, products",
    [
        (torch.float32, False, "tf32x3"),
        (torch.float32, True, "tf32"),  # bench's bf16 rows: float32 inputs under autocast
        (torch.bfloat16, False, "tf32"),
    ],
)
@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_landmark_products_follow_the_attention_operands(
    interpret, monkeypatch, dtype, autocast, products, grad
) -> None:
    # bf16/fp16 work multiplies the landmark side's float32 tiles once in tf32 (H200: 17 us
    # against 100 forward), float32 work in three (float32's accuracy): on the fused inference
    # op (whose Bk V is float32 whatever the operands) as on the training path (SDPA's Bk V).
    seen = []
    how = nystrom_gpu._how

    def spy(kernel: str, operands: torch.dtype) -> dict:
        seen.append((kernel, how(kernel, operands)["PREC"]))
        return how(kernel, operands)

    monkeypatch.setattr(nystrom_gpu, "_how", spy)
    q, k, v = (x.to(dtype).requires_grad_(grad) for x in qkv(1, 2, 128, 16, seed=5))
    core = NystromAttention(num_landmarks=16)
    core.fused_cpu_backward = False  # CPU training would take its own fused path
    with torch.set_grad_enabled(grad), torch.autocast(DEVICE, torch.bfloat16, enabled=autocast):
        out = core(q, k, v)
    if grad:
        out.float().sum().backward()
    assert seen == [("forward", products)] + [("backward", products)] * grad


@pytest.mark.parametrize(
    "n, heads, want",
    [
        (1024, 12, (1, 1024)),  # one split per head: its partial is 1/8 of its keys' k
        (8192, 12, (8, 1024)),
        (8191, 12, (7, 1216)),  # splits cover n in whole tiles of 64 keys
        (65536, 12, (22, 3008)),  # two programs per SM (132 on an H200), 22 per head
        (65536, 1, (64, 1024)),
        (300, 4, (1, 320)),
    ],
)
def test_bk_v_splits_fill_the_gpu_with_at_least_1024_keys_each(monkeypatch, n, heads, want):
    monkeypatch.setattr(nystrom_gpu, "_programs_wanted", lambda device: 264)
    splits, chunk = nystrom_gpu._key_splits(n, heads, torch.device("cpu"))
    assert (splits, chunk) == want
    assert (splits - 1) * chunk < n <= splits * chunk and chunk % nystrom_gpu.INFERENCE_BLOCK == 0


def test_inference_kernels_stay_off_a_gpu_until_checked(monkeypatch) -> None:
    # A kernel no GPU has yet run against float64 leaves CUDA tensors to the torch path.
    q = torch.zeros(1, 1, 8, 16, device="meta")
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setitem(nystrom_gpu.CHECKED_ON_GPU, "inference", False)
    assert not nystrom_gpu._allowed("inference", q)
    monkeypatch.setitem(nystrom_gpu.CHECKED_ON_GPU, "inference", True)
    assert nystrom_gpu._allowed("inference", q)


@pytest.mark.parametrize(
    "options",
    [
        {"pinv": "exact"},
        {"pinv_init": "original"},
        {"pinv_tolerance": 1e-3},
        {"num_landmarks": nystrom_gpu.MAX_LANDMARKS + 1},
    ],
)
def test_the_gpu_path_serves_only_what_it_computes(interpret, options) -> None:
    q, _, v = qkv(1, 1, 200, 16, seed=0)
    assert NystromAttention(num_landmarks=16).uses_triton(q, v)
    assert not NystromAttention(**{"num_landmarks": 16, **options}).uses_triton(q, v)


def test_cpu_tensors_take_the_cpu_path() -> None:
    # The interpreter is on in this process (conftest.py), and still a user's CPU run keeps
    # the CPU path: only tests send CPU tensors to the kernels.
    q, _, v = (x.cpu() for x in qkv(1, 1, 200, 16, seed=0))
    assert not NystromAttention(num_landmarks=16).uses_triton(q, v)


def test_torch_compile_keeps_the_kernels_whole(interpret) -> None:
    # Custom ops: one graph, no break, the same numbers (aot_eager: no C++ compiler needed).
    q, k, v = (x.float().requires_grad_() for x in qkv(2, 2, 64, 32, seed=5))
    core = NystromAttention(num_landmarks=16)
    core.fused_cpu_backward = False
    torch._dynamo.reset()
    explained = torch._dynamo.explain(core)(q, k, v, None)
    assert explained.graph_break_count == 0
    compiled = torch.compile(core, backend="aot_eager", fullgraph=True)
    out = compiled(q, k, v, None)
    (grad_q,) = torch.autograd.grad(out.square().sum(), q)
    ref = core(q, k, v, None)
    (ref_grad_q,) = torch.autograd.grad(ref.square().sum(), q)
    assert relative(out, ref.double()) < 1e-6 and relative(grad_q, ref_grad_q.double()) < 1e-5


def test_torch_compile_keeps_the_inference_kernels_whole(interpret) -> None:
    # At inference the four kernels are one custom op: one graph, the same numbers.
    q, k, v = (x.float() for x in qkv(2, 2, 64, 32, seed=6))
    core = NystromAttention(num_landmarks=16)
    torch._dynamo.reset()
    with torch.no_grad():
        explained = torch._dynamo.explain(core)(q, k, v, None)
        assert explained.graph_break_count == 0
        out = torch.compile(core, backend="aot_eager", fullgraph=True)(q, k, v, None)
        ref = core(q, k, v, None)
    assert "nys.nystrom_inference" in str(explained.graphs[0].graph)
    assert relative(out, ref.double()) < 1e-6


def test_the_gpu_profile_script_at_toy_size(tmp_path) -> None:
    # scripts/gpu_profile.py's whole path on the CPU (kernels in the interpreter): every row
    # timed, both paths near the float64 formula, the profiles written.
    import csv
    import subprocess
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "scripts" / "gpu_profile.py"
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path), "--toy"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with open(tmp_path / "gpu_profile.csv", newline="") as handle:
        timed = {(r["mode"], r["row"]) for r in csv.DictReader(handle) if r["call_ms"]}
    rows = ("sdpa", "nystrom-torch", "nystrom-triton")
    expected = {(mode, row) for mode in ("forward", "train") for row in rows}
    inference_only = {("forward", r) for r in ("nystrom-fused", "hybrid-torch", "hybrid-triton")}
    assert timed == expected | inference_only
    with open(tmp_path / "equality.csv", newline="") as handle:
        errors = {
            (r["dtype"], r["path"], r["tensor"]): float(r["relative_error_vs_float64"])
            for r in csv.DictReader(handle)
        }
    assert len(errors) == 16 + 2 + 4  # Nyström: output, 3 gradients; fused, hybrid: output
    for (dtype, path, tensor), error in errors.items():
        if path.startswith("nystrom"):
            assert error < (2e-5 if dtype == "float32" else 3e-2), (dtype, path, error)
        else:  # the hybrid in bf16 is ~8% off float64 on both paths (its band's cancellation)
            torch_path = errors[(dtype, "hybrid-torch", tensor)]
            assert error < (2e-5 if dtype == "float32" else 1.25 * torch_path), (dtype, path)
    with open(tmp_path / "variants.csv", newline="") as handle:
        variants = list(csv.DictReader(handle))
    assert {r["kernel"] for r in variants} == {"forward", "backward"} and len(variants) == 6
    for r in variants:  # the interpreter multiplies in float32 whatever the setting
        assert float(r["relative_error_vs_float64"]) < 1e-5 and float(r["gpu_us"]) > 0
    profiled = [(f"nystrom-{p}", m) for p in ("torch", "triton") for m in ("forward", "train")]
    for row, mode in [*profiled, ("nystrom-fused", "forward"), ("hybrid-triton", "forward")]:
        name = row.removeprefix("nystrom-")
        assert (tmp_path / f"profile-{name}-{mode}.txt").read_text().startswith(f"{row} {mode}")
    autocast = (tmp_path / "profile-fused-forward-autocast.txt").read_text()
    assert autocast.startswith("nystrom-fused forward, n = 128, torch.float32:")  # CPU: none


def test_the_gpu_profile_hybrid_matrix_at_toy_size(monkeypatch) -> None:
    # Each launch setting in a process of its own: one that runs (tiles padded to 64, within
    # the torch path's error of float64 in both dtypes), one whose process ends (here a setting
    # out of range; on a GPU, a fault) and is reported, not raised.
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "scripts"))
    import gpu_profile

    monkeypatch.setattr(gpu_profile, "HYBRID_MATRIX", ["min_tile=64,num_stages=1", "min_tile=0"])
    rows = gpu_profile.hybrid_matrix(toy=True)
    ran = [r for r in rows if r["setting"] == "min_tile=64,num_stages=1"]
    assert [(r["status"], r["dtype"], r["min_tile"]) for r in ran] == [
        ("ok", "bfloat16", 64),
        ("ok", "float32", 64),
    ]
    for r in ran:
        assert r["error"] <= 1.25 * r["torch_error"] + 1e-6 and r["within"]
    ended = [r for r in rows if r["setting"] == "min_tile=0"]
    assert [(r["dtype"], r["status"]) for r in ended] == [
        ("bfloat16", "exit 1"),
        ("float32", "exit 1"),
    ]
    assert all("NYS_HYBRID_LAUNCH" in r["why"] for r in ended)
    assert gpu_profile.chosen_setting(rows) == ("min_tile=64,num_stages=1", ["16-bit", "32-bit"])


def test_the_hybrid_setting_chosen_has_the_most_widths_then_the_least_time(monkeypatch) -> None:
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[2] / "scripts"))
    import gpu_profile

    monkeypatch.setattr(gpu_profile, "HYBRID_MATRIX", ["a", "b", "c"])
    rows = [
        {"setting": "a", "dtype": "bfloat16", "status": "ok"},
        {"setting": "a", "dtype": "float32", "status": "exit -6"},  # faulted after bf16
        {"setting": "b", "dtype": "bfloat16", "status": "off float64"},
        {"setting": "b", "dtype": "float32", "status": "ok"},
        {"setting": "c", "dtype": "bfloat16", "status": "ok"},
        {"setting": "c", "dtype": "float32", "status": "ok"},
    ]
    assert gpu_profile.chosen_setting(rows) == ("c", ["16-bit", "32-bit"])
    assert gpu_profile.chosen_setting(rows[:4]) == ("a", ["16-bit"])
    timed = [{**r, "gpu_us": 100.0} for r in rows[:4]]
    timed[3]["gpu_us"] = 50.0  # b's float32 beats a's bf16: as many widths, less time
    assert gpu_profile.chosen_setting(timed) == ("b", ["32-bit"])
    assert gpu_profile.chosen_setting([{**r, "status": "exit -6"} for r in rows]) == ("", [])
    monkeypatch.setattr(gpu_profile, "HYBRID_WIDTHS", ["16-bit"])
    assert gpu_profile.kernel_serves("hybrid-triton", torch.bfloat16)
    assert not gpu_profile.kernel_serves("hybrid-triton", torch.float32)
    assert gpu_profile.kernel_serves("hybrid-torch", torch.float32)


def test_the_inference_op_rounds_every_tile_to_the_half_dtype_of_its_work() -> None:
    # also when q is already bf16: its landmarks can be float32 beside it (padded segment
    # means under CUDA autocast), and bf16 products want both operands rounded (lease 7)
    tl = pytest.importorskip("triton.language")
    assert nystrom_gpu.rounding(torch.bfloat16) == tl.bfloat16
    assert nystrom_gpu.rounding(torch.float16) == tl.float16
    assert nystrom_gpu.rounding(torch.float32) == tl.float32  # float32 tiles kept as they are
    assert nystrom_gpu.rounding(torch.float64) == tl.float32  # (rounded() passes them through)


def test_kernels_checked_on_the_h200_are_on_and_the_switch_names_others() -> None:
    assert all(nystrom_gpu.checked_on_gpu("", nystrom_gpu.CHECKED_ON_H200).values())
    assert nystrom_gpu.checked_on_gpu("", set()) == dict.fromkeys(
        ("hybrid-16-bit", "hybrid-32-bit", "inference", "graph"), False
    )
    assert nystrom_gpu.checked_on_gpu("hybrid, graph", set()) == {
        "hybrid-16-bit": True, "hybrid-32-bit": True, "inference": False, "graph": True
    }  # fmt: skip
    with pytest.raises(UserInputError, match="NYS_GPU_CHECKED: 'grpah' is not one of"):
        nystrom_gpu.checked_on_gpu("grpah", set())


def test_the_hybrid_kernel_is_checked_per_operand_width(monkeypatch) -> None:
    # bf16/fp16 work (inputs, or float32 under autocast) and float32 work are switched on apart
    q = torch.zeros(1, 1, 256, 16)
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setattr(nystrom_gpu, "applies", lambda q, v, m: True)
    monkeypatch.setitem(nystrom_gpu.CHECKED_ON_GPU, "hybrid-16-bit", True)
    monkeypatch.setitem(nystrom_gpu.CHECKED_ON_GPU, "hybrid-32-bit", False)
    assert nystrom_gpu.hybrid_applies(q.bfloat16(), q, 16, 32)
    assert not nystrom_gpu.hybrid_applies(q, q, 16, 32)
    monkeypatch.setattr(torch, "is_autocast_enabled", lambda device_type: True)
    monkeypatch.setattr(torch, "get_autocast_dtype", lambda device_type: torch.bfloat16)
    assert nystrom_gpu.hybrid_applies(q, q, 16, 32)


@pytest.mark.parametrize("m", [16, 40])
def test_pinv_kernel_equals_the_iterative_pinv(interpret, m) -> None:
    from nyscli.attention.pinv import iterative_pinv

    g = torch.Generator().manual_seed(m)
    a = torch.rand(2, 3, m, m, generator=g, dtype=torch.float64).exp().to(DEVICE)
    a[1, 2, :, m - 3 :] = 0  # empty landmarks: zero rows and columns
    a[1, 2, m - 3 :, :] = 0
    want = iterative_pinv(a, 6)
    assert relative(nystrom_gpu.iterative_pinv(a, 6), want) < 1e-12
    got32 = nystrom_gpu.iterative_pinv(a.float(), 6)
    assert got32.dtype == torch.float32 and relative(got32, want) < 1e-4


HYBRID_CASES = [
    (200, {}, False, 16),
    (150, {"window": 17, "num_landmarks": 8, "heavy_keys": 5}, True, 16),
    (150, {"window": 17, "num_landmarks": 8, "heavy_keys": 5}, True, 64),  # padded tiles
    (300, {"heavy_keys": 0}, True, 16),
    (130, {"window": 129, "num_landmarks": 24, "heavy_keys": 40}, False, 16),
]


def hybrid(options: dict):
    return build_attention({"name": "nystrom_local", **options})


def both_paths(monkeypatch, core, q, k, v, mask, gpu_first: bool = True):
    """(GPU path, torch path) outputs of ``core`` at inference."""
    results = []
    for on in (True, False):
        monkeypatch.setattr(nystrom_gpu, "TESTING", on)
        monkeypatch.setattr(nystrom_gpu, "HAS_TRITON", on)
        with torch.no_grad():
            results.append(core(q, k, v, mask))
    return results


@pytest.mark.parametrize("n, options, padded, min_tile", HYBRID_CASES)
def test_hybrid_kernel_equals_the_torch_path_in_float64(
    monkeypatch, n, options, padded, min_tile
) -> None:
    # min_tile 64: the landmark and heavy-key tiles padded far past m and g, masked out
    monkeypatch.setitem(nystrom_gpu.HYBRID_LAUNCH, "min_tile", min_tile)
    q, k, v = qkv(2, 3, n, 24, seed=n)
    mask = None
    if padded:
        mask = torch.ones(2, n, dtype=torch.bool, device=DEVICE)
        mask[1, n - 37 :] = False
    core = hybrid(options)
    monkeypatch.setattr(nystrom_gpu, "TESTING", True)
    assert nystrom_gpu.hybrid_applies(q, v, core.num_landmarks, core.heavy_keys)
    got, want = both_paths(monkeypatch, core, q, k, v, mask)
    assert relative(got, want) < 1e-12
    if padded:  # pads never count
        junk = [x.clone() for x in (q, k, v)]
        for x in junk:
            x[1, :, n - 37 :] = 50.0
        again, _ = both_paths(monkeypatch, core, *junk, mask)
        assert torch.allclose(again[1, :, : n - 37], got[1, :, : n - 37], atol=1e-12)


def test_gpu_switches_read_known_names_and_whole_numbers() -> None:
    from nyscli import gpu_env

    read = gpu_env.hybrid_launch
    assert read("") == {} and read(" min_tile=64, num_stages=1 ") == {
        "min_tile": 64,
        "num_stages": 1,
    }
    for bad in ("min_tile=0", "num_stages=two", "stages=1", "num_warps", "min_tile=-4"):
        with pytest.raises(UserInputError, match="NYS_HYBRID_LAUNCH: '.*' is not one of"):
            read(bad)
    assert gpu_env.checked(" graph,hybrid-16-bit,") == {"graph", "hybrid-16-bit"}
    with pytest.raises(UserInputError, match="NYS_GPU_CHECKED: 'hybird' is not one of"):
        gpu_env.checked("graph,hybird")


@pytest.mark.parametrize(
    "variable, value", [("NYS_HYBRID_LAUNCH", "min_tile=zero"), ("NYS_GPU_CHECKED", "grpah")]
)
def test_nys_refuses_a_bad_gpu_switch_in_one_line(tmp_path, variable, value) -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, variable: value}
    done = subprocess.run(
        [sys.executable, "-m", "nyscli.cli", "bench", "--seq-len", "64"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120,
    )  # fmt: skip
    output = (done.stdout + done.stderr).strip()
    assert done.returncode == 2, output
    assert len(output.splitlines()) == 1 and variable in output and value in output, output
    assert not (tmp_path / "outputs").exists()


def test_hybrid_kernel_gates_like_the_torch_path(monkeypatch) -> None:
    # Queries whose Nyström estimate of the mass outside their exact support is not positive
    # keep the exact part alone. Random inputs never trigger it, so the shared parts of one
    # head are altered (30% of the low-rank mass: some queries gated, some not) on both paths alike.
    q, k, v = qkv(1, 2, 200, 24, seed=3)
    core = hybrid({})
    parts_of, weights_of = core.parts, core._weights
    gate_on = []

    def less_mass(*args, **kwargs):
        parts = parts_of(*args, **kwargs)
        parts.b_mass[:, 0] *= 0.3
        return parts

    def weights(*args):  # the torch path's gate (its last result), recorded
        result = weights_of(*args)
        gate_on.append(result[-1].flatten(2).double().mean(dim=(0, 2)))
        return result

    monkeypatch.setattr(core, "parts", less_mass)
    monkeypatch.setattr(core, "_weights", weights)
    got, want = both_paths(monkeypatch, core, q, k, v, None)
    assert relative(got, want) < 1e-12
    altered, untouched = torch.stack(gate_on).mean(dim=0).tolist()
    assert 0.05 < altered < 0.95 and untouched == 1.0, (altered, untouched)


def test_hybrid_kernel_under_autocast_and_in_float32(monkeypatch) -> None:
    q, k, v = (x.float() for x in qkv(2, 2, 256, 64, seed=11))
    core = hybrid({})
    exact = core(q.double(), k.double(), v.double())
    monkeypatch.setattr(nystrom_gpu, "TESTING", True)
    with torch.no_grad():
        fp32 = core(q, k, v)
        with torch.autocast(DEVICE, dtype=torch.bfloat16):
            bf16 = core(q, k, v)
    assert fp32.dtype == torch.float32 and relative(fp32, exact) < 1e-5
    # bf16 band and weights, shared parts in the inputs' float32: a bf16-sized error.
    assert bf16.dtype == torch.bfloat16 and relative(bf16, exact) < 1e-2


def test_hybrid_training_keeps_the_torch_path(monkeypatch) -> None:
    q, k, v = (x.requires_grad_() for x in qkv(1, 2, 150, 16, seed=2))
    core = hybrid({"window": 17, "num_landmarks": 8, "heavy_keys": 5})
    monkeypatch.setattr(nystrom_gpu, "TESTING", True)
    out = core(q, k, v)
    out.sum().backward()  # the kernel has no backward: a training call must not reach it
    assert q.grad is not None and torch.isfinite(q.grad).all()
    assert relative(out.detach(), both_paths(monkeypatch, core, q, k, v, None)[1]) < 1e-12


def test_every_kernel_compiles_for_sm90_without_spilling_much() -> None:
    # The interpreter runs a kernel's Python but never compiles it: the compiler refused a
    # global the interpreter had read, and float32 FMA products spilled 13 KB per thread.
    import os
    import subprocess
    import sys
    from pathlib import Path

    pytest.importorskip("triton")  # the --dev setup installs it; CI has it
    script = Path(__file__).resolve().parents[2] / "scripts" / "compile_check.py"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run(
        [sys.executable, str(script), "--quick"], capture_output=True, text=True, env=env,
        timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [line.split() for line in done.stdout.splitlines()[2:]]
    assert len(rows) == 8, done.stdout  # F W thrice: bf16, bf16 beside float32 k~, float32
    for row in rows:  # ... registers, stack, shared, seconds
        assert int(row[-4]) <= 255 and int(row[-3]) <= 1024, row  # at most 1 KB of stack


class FakeGraph:
    """A CUDA graph's stand-in on a CPU: replay runs the captured call again on the tensors
    it was captured with, as a graph reads the addresses it was captured with."""

    made: list[FakeGraph] = []

    def __init__(self) -> None:
        self.fn, self.out, self.replays = None, None, 0
        FakeGraph.made.append(self)

    def replay(self) -> None:
        self.replays += 1
        self.out.copy_(self.fn())


def fake_capture(graph: FakeGraph, fn) -> torch.Tensor:
    graph.fn, graph.out = fn, fn()
    return graph.out


@pytest.fixture
def fake_graphs(interpret, monkeypatch) -> list[FakeGraph]:
    from nyscli.attention.gpu import graphs

    monkeypatch.setattr(FakeGraph, "made", [])
    monkeypatch.setattr(graphs, "_new_graph", FakeGraph)
    monkeypatch.setattr(graphs, "_capture", fake_capture)
    monkeypatch.setattr(nystrom_gpu, "GRAPHS_ON_CPU", True)
    return FakeGraph.made


def test_inference_is_replayed_from_a_graph_of_the_same_inputs(fake_graphs) -> None:
    q, k, v = qkv(2, 3, 256, 16, seed=7)
    core = NystromAttention(num_landmarks=16)
    eager = NystromAttention(num_landmarks=16)
    eager.graphs = lambda fn, *inputs: fn(*inputs)  # the same core, never graphed
    outs = []
    with torch.no_grad():
        for step in range(4):
            if step == 3:
                for x in (q, k, v):  # new values at the same addresses: the graph sees them
                    x.mul_(0.5).add_(0.1)
            outs.append(core(q, k, v))
            assert relative(outs[-1], eager(q, k, v)) < 1e-12
    # seen once (eager), captured the second time, replayed the third and fourth
    assert len(fake_graphs) == 1 and fake_graphs[0].replays == 3
    assert len({out.data_ptr() for out in outs}) == 4  # an output kept is never overwritten
    assert relative(outs[1], outs[2]) == 0 and relative(outs[3], outs[2]) > 0.1


def test_graphs_are_kept_per_layout_least_recent_out_and_stop_when_nothing_returns(
    fake_graphs,
) -> None:
    from nyscli.attention.gpu import graphs

    core = NystromAttention(num_landmarks=16)
    inputs = [qkv(1, 2, 128, 16, seed=s) for s in range(3)]
    with torch.no_grad():
        for x in (*inputs, *inputs, inputs[0]):  # each seen, then captured; 0 again: evicted
            core(*x)
        assert len(fake_graphs) == 4 and len(core.graphs.graphs) == 2
        assert [g.replays for g in fake_graphs] == [1, 1, 1, 1]  # the capture's own replay
        core(*inputs[0])
        assert fake_graphs[-1].replays == 2
        core.graphs.misses = 0
        for s in range(3, 3 + 2 * (graphs.MAX_MISSES + 2)):  # each new layout seen twice
            x = qkv(1, 2, 128, 16, seed=s)
            core(*x)
            core(*x)
            del x
    assert len(fake_graphs) == 4 + graphs.MAX_MISSES  # then it stops capturing


def test_a_failed_capture_falls_back_to_the_call_and_stops_capturing(
    fake_graphs, monkeypatch
) -> None:
    from nyscli.attention.gpu import graphs

    def refuse(graph, fn):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(graphs, "_capture", refuse)
    q, k, v = qkv(1, 2, 256, 16, seed=2)
    core = NystromAttention(num_landmarks=16)
    want = core(q.double(), k.double(), v.double())
    with torch.no_grad(), pytest.warns(UserWarning, match="capture failed"):
        outs = [core(q, k, v) for _ in range(3)]
    assert all(relative(out, want) < 1e-5 for out in outs)
    assert core.graphs.misses == graphs.MAX_MISSES and core.graphs.graphs == {}


@pytest.mark.parametrize("case", ["mask", "grad", "rows", "compile", "kmeans"])
def test_calls_that_are_not_replayed(fake_graphs, monkeypatch, case) -> None:
    q, k, v = qkv(1, 2, 256, 16, seed=1)
    mask = None
    if case == "mask":
        mask = torch.ones(1, 256, dtype=torch.bool, device=DEVICE)
    if case == "grad":
        q.requires_grad_()
    if case == "rows":
        monkeypatch.setattr(nystrom_gpu, "GRAPH_MAX_ROWS", 2 * 256 - 1)
    if case == "compile":
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    landmarks = "kmeans" if case == "kmeans" else "segment_means"
    core = NystromAttention(num_landmarks=16, landmarks=landmarks)
    core.fused_cpu_backward = False
    for _ in range(3):
        core(q, k, v, mask)
    assert fake_graphs == []


def test_graphs_stay_off_a_gpu_until_checked_and_copies_start_without_them(monkeypatch) -> None:
    import copy

    q = torch.zeros(1, 1, 8, 16, device="meta")
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    monkeypatch.setitem(nystrom_gpu.CHECKED_ON_GPU, "graph", False)
    assert not nystrom_gpu.graph_applies(q, None)
    monkeypatch.setitem(nystrom_gpu.CHECKED_ON_GPU, "graph", True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    assert nystrom_gpu.graph_applies(q, None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    assert not nystrom_gpu.graph_applies(q, None)  # inside the caller's own capture
    core = NystromAttention(num_landmarks=16)
    core.graphs.graphs[("layout",)] = (None, None)
    assert copy.deepcopy(core).graphs.graphs == {}
