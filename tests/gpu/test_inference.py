"""The inference op (``nyscli.attention.gpu.inference``): Nyström at inference in four
kernels, against the torch path in float64 (under the interpreter without a GPU)."""

from __future__ import annotations

import pytest
import torch
import torch._dynamo

from nyscli.attention.gpu import dtypes, gates, inference
from nyscli.attention.nystrom import NystromAttention
from tests.gpu.common import DEVICE, padded_with_junk, qkv, relative


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
    want = inference.nystrom_inference(q, k, v, q_land, k_land, exists, mask, 6)
    half = [x.bfloat16() for x in (q, k, v)]
    with torch.no_grad():
        got = inference.nystrom_inference(
            *half, q_land.float(), k_land.float(), exists, mask, 6
        )  # fmt: skip
    assert got.dtype == torch.bfloat16
    real = mask[:, None, :, None].expand_as(want)
    assert relative(got.double()[real], want[real]) < 1e-2


@pytest.mark.parametrize(
    "n, m, d, padded, landmarks_by",
    [
        (96, 64, 32, False, "segment_means"),
        (200, 24, 40, True, "segment_means"),  # Bk V in several splits, a mask, m < the tile
        (150, 16, 16, True, "kmeans"),  # landmarks that may not exist
    ],
)
def test_inference_kernels_equal_the_torch_path(gated, monkeypatch, n, m, d, padded, landmarks_by):
    # Inference: Bk V split over the keys and combined, W, then F W, in four kernels and no
    # SDPA, against the torch path in float64; in float32, against the same float64.
    q, k, v = qkv(3, 2, n, d, seed=n)
    mask = None
    if padded:
        mask = torch.ones(3, n, dtype=torch.bool, device=DEVICE)
        mask[1, n - 37 :] = False
        mask[2, m - 3 :] = False  # at most m real tokens: exact attention, on either path
    core = NystromAttention(num_landmarks=m, landmarks=landmarks_by)
    gated(testing=True)
    calls = []
    served = inference.nystrom_inference
    monkeypatch.setattr(inference, "nystrom_inference", lambda *a: calls.append(1) or served(*a))
    # several splits of Bk V at these small n (but n = 96: one)
    monkeypatch.setattr(inference, "_programs_wanted", lambda device: 24)
    monkeypatch.setattr(inference, "MIN_SPLIT_KEYS", 64)
    assert inference._key_splits(n, 6, q.device)[0] == (1 if n < 128 else 2)
    with torch.no_grad():
        got = core(q, k, v, mask)
        got32 = core(q.float(), k.float(), v.float(), mask)
        assert len(calls) == 2
        gated(triton=False)  # the torch ops
        want = core(q, k, v, mask)
    assert got.dtype == torch.float64 and got32.dtype == torch.float32
    assert relative(got, want) < 1e-12
    assert relative(got32, want) < 1e-5
    if padded:  # pads never count: junk there changes nothing
        junk = padded_with_junk((q, k, v), n - 37, 1e3)
        gated(triton=True)
        with torch.no_grad():
            again = core(*junk, mask)
        assert torch.allclose(again[1, :, : n - 37], got[1, :, : n - 37], atol=1e-12)


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
    monkeypatch.setattr(inference, "_programs_wanted", lambda device: 264)
    splits, chunk = inference._key_splits(n, heads, torch.device("cpu"))
    assert (splits, chunk) == want
    assert (splits - 1) * chunk < n <= splits * chunk and chunk % inference.INFERENCE_BLOCK == 0


def test_inference_kernels_stay_off_a_gpu_until_checked(gated, monkeypatch) -> None:
    # A kernel no GPU has yet run against float64 leaves CUDA tensors to the torch path.
    q = torch.zeros(1, 1, 8, 16, device="meta")
    monkeypatch.setattr(torch.Tensor, "is_cuda", property(lambda self: True))
    gated(checked=gates.current().checked - {"inference"})
    assert not inference.serves(q)
    gated(checked=gates.current().checked | {"inference"})
    assert inference.serves(q)


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


def test_the_inference_op_rounds_every_tile_to_the_half_dtype_of_its_work() -> None:
    # also when q is already bf16: its landmarks can be float32 beside it (padded segment
    # means under CUDA autocast), and bf16 products want both operands rounded (lease 7)
    tl = pytest.importorskip("triton.language")
    assert dtypes.rounding(torch.bfloat16) == tl.bfloat16
    assert dtypes.rounding(torch.float16) == tl.float16
    assert dtypes.rounding(torch.float32) == tl.float32  # float32 tiles kept as they are
    assert dtypes.rounding(torch.float64) == tl.float32  # (rounded() passes them through)


def test_inference_op_equals_its_torch_reference_in_float64(interpret) -> None:
    # Padded keys, landmarks that may not exist (k-means of the real tokens), one sequence
    # with fewer real tokens than landmarks (its empty landmarks drop out), Bk V in splits.
    from nyscli.attention.gpu import reference
    from nyscli.attention.landmarks import select_landmarks

    q, k, v = qkv(3, 2, 200, 24, seed=9)
    mask = torch.ones(3, 200, dtype=torch.bool, device=DEVICE)
    mask[1, 120:] = False
    mask[2, 20:] = False
    q_land, k_land, exists = select_landmarks(q, k, 32, mask, "kmeans", 3, 0)
    assert exists is not None and not exists[2].all()
    with torch.no_grad():
        got = inference.nystrom_inference(q, k, v, q_land, k_land, exists, mask, 6)
    want = reference.nystrom_inference(q, k, v, (q_land, k_land, exists), mask, 6)
    real = mask[:, None, :, None].expand_as(want)
    assert relative(got[real], want[real]) < 1e-12
