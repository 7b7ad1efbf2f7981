"""LRA models: shapes, padding never changes the output, the dual-encoder head's formula."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from nyscli.models.classifier import build_classifier
from nyscli.models.heads import DualHead
from nyscli.models.pooling import pool

MODEL = {"dim": 16, "depth": 2, "num_heads": 2, "ffn_dim": 32, "dropout": 0.1}
NYSTROM = {"name": "nystrom", "num_landmarks": 4, "conv_kernel_size": 3}


def padded_batch(lengths: list[int], width: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 20, (len(lengths), width), generator=gen)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    return ids * mask, mask  # padded ids are 0


@pytest.mark.parametrize("attention", [{"name": "softmax"}, NYSTROM])
@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_padding_tokens_do_not_change_the_logits(attention, pooling):
    torch.manual_seed(0)
    model = build_classifier(
        vocab_size=20, max_len=24, num_classes=3, model={**MODEL, "pooling": pooling},
        attention=attention,
    ).double().eval()  # fmt: skip
    ids, mask = padded_batch([24, 13, 7], 24)
    logits = model(ids, mask)
    assert logits.shape == (3, 3)
    scrambled = torch.where(mask, ids, torch.randint(1, 20, ids.shape))
    torch.testing.assert_close(model(scrambled, mask), logits, rtol=0, atol=1e-12)
    # The same sequences without the padding columns give the same logits for the short rows
    # only if no landmark/segment depends on the width: check the exact-attention case.
    if attention["name"] == "softmax":
        short_ids, short_mask = ids[2:, :7], mask[2:, :7]
        torch.testing.assert_close(model(short_ids, short_mask), logits[2:], rtol=0, atol=1e-10)


@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_a_batch_without_padding_reaches_attention_unmasked_with_the_same_logits(pooling):
    """No padding: the cores get key_padding_mask=None (their unmasked, faster paths) and the
    logits equal those of the same batch sent through with the all-True mask."""
    torch.manual_seed(0)
    model = build_classifier(
        vocab_size=20, max_len=24, num_classes=3, model={**MODEL, "pooling": pooling},
        attention=NYSTROM,
    ).double().eval()  # fmt: skip
    seen = []
    for block in model.encoder.blocks:
        block.attention.core.register_forward_pre_hook(lambda _, args: seen.append(args[3]))
    ids, mask = padded_batch([16, 16], 16)
    logits = model(ids, mask)
    assert seen and all(m is None for m in seen)
    x, full = model.encoder.embeddings(ids, mask)
    for block in model.encoder.blocks:
        x = block(x, full)  # the masked path, as before
    hidden = model.encoder.norm(x) * full.unsqueeze(-1)
    assert all(m is not None for m in seen[len(model.encoder.blocks) :])
    torch.testing.assert_close(model.head(pool(hidden, full, pooling)), logits, rtol=0, atol=1e-12)
    seen.clear()
    model(*padded_batch([16, 9], 16))
    assert seen and all(m is not None for m in seen)


def test_mean_pooling_averages_real_tokens_only():
    x = torch.arange(2 * 4 * 3, dtype=torch.float64).view(2, 4, 3)
    mask = torch.tensor([[True, True, False, False], [True, True, True, True]])
    pooled = pool(x, mask, "mean")
    torch.testing.assert_close(pooled[0], x[0, :2].mean(0))
    torch.testing.assert_close(pooled[1], x[1].mean(0))
    torch.testing.assert_close(pool(x, mask, "cls"), x[:, 0])


def test_dual_encoder_head_is_the_concatenation_formula():
    torch.manual_seed(0)
    model = build_classifier(
        vocab_size=20, max_len=16, num_classes=2, model=MODEL, attention=NYSTROM, dual=True
    ).eval()
    ids0, mask0 = padded_batch([16, 9], 16, seed=1)
    ids1, mask1 = padded_batch([5, 12], 12, seed=2)
    logits = model(ids0, mask0, ids1, mask1)
    assert logits.shape == (2, 2)
    x0, x1 = model.embed(ids0, mask0), model.embed(ids1, mask1)
    assert x0.shape == (2, 16)
    features = torch.cat([x0, x1, x0 * x1, x0 - x1], dim=-1)
    torch.testing.assert_close(DualHead.features(x0, x1), features)
    torch.testing.assert_close(logits, model.head.classifier(features))
    swapped = model(ids1, mask1, ids0, mask0)  # the head is not symmetric: order matters
    assert not torch.allclose(swapped, logits)


def test_sequence_longer_than_max_len_is_an_error():
    model = build_classifier(
        vocab_size=20, max_len=8, num_classes=2, model=MODEL, attention={"name": "softmax"}
    )
    ids, mask = padded_batch([9], 9)
    with pytest.raises(ValueError, match="longer than the model's max_len"):
        model(ids, mask)


@pytest.mark.parametrize("init", ["torch", "normal"])
def test_model_init_starts_linear_layers_as_its_reference_code(init):
    # torch (the paper's LRA code): PyTorch's Kaiming-uniform, U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    # for weights and biases, std bound/sqrt(3); normal (BERT): N(0, 0.02), zero biases.
    # Embeddings are N(0, 0.02) in both.
    torch.manual_seed(0)
    model = {"dim": 64, "depth": 2, "num_heads": 2, "ffn_dim": 128, "init": init}
    classifier = build_classifier(
        vocab_size=512, max_len=1024, num_classes=10, model=model, attention={"name": "nystrom"}
    )
    linears = [m for m in classifier.encoder.modules() if isinstance(m, nn.Linear)]
    assert len(linears) >= 8  # q, k, v (or one qkv), output and two FFN layers, per block
    for linear in linears:
        w, b = linear.weight, linear.bias
        bound = 1 / math.sqrt(linear.in_features)
        if init == "torch":
            assert w.abs().max() <= bound and b.abs().max() <= bound and b.abs().max() > 0
            assert w.std().item() == pytest.approx(bound / math.sqrt(3), rel=0.1)
        else:
            assert w.std().item() == pytest.approx(0.02, rel=0.1) and not b.any()
    embeddings = [m for m in classifier.encoder.modules() if isinstance(m, nn.Embedding)]
    for embedding in embeddings:
        assert embedding.weight.std().item() == pytest.approx(0.02, rel=0.05)


def test_an_unknown_model_init_is_refused():
    with pytest.raises(
        ValueError, match="init='xavier' is not allowed; choose one of: normal, torch"
    ):
        build_classifier(
            vocab_size=16, max_len=8, num_classes=2, model={"init": "xavier"}, attention={}
        )
