"""approx-error's fidelity table: each core's sentence embeddings against exact attention's."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from nyscli.attention import build_attention
from nyscli.checkpoints.capture import load_encoder
from nyscli.experiments.approx_error import fidelity
from tests.test_hf_import import WORDS, tiny_checkpoint


def reference(exact: np.ndarray, approx: np.ndarray) -> tuple[float, float, float]:
    """Mean cosine, nearest-neighbour agreement and exact's neighbour among approx's 3
    nearest, written out with loops."""

    def cos(a, b):
        return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))

    t = len(exact)
    cosines = [cos(exact[i], approx[i]) for i in range(t)]

    def nearest(x, i):
        return max((j for j in range(t) if j != i), key=lambda j: cos(x[i], x[j]))

    agree = [nearest(exact, i) == nearest(approx, i) for i in range(t)]

    def top3(x, i):
        return sorted((j for j in range(t) if j != i), key=lambda j: -cos(x[i], x[j]))[:3]

    in_top = [nearest(exact, i) in top3(approx, i) for i in range(t)]
    return float(np.mean(cosines)), float(np.mean(agree)), float(np.mean(in_top))


def test_compare_matches_its_formula():
    g = torch.Generator().manual_seed(0)
    exact = torch.randn(12, 5, generator=g, dtype=torch.float64)
    approx = exact + 1.2 * torch.randn(12, 5, generator=g, dtype=torch.float64)
    scores = fidelity.compare(exact, approx)
    cosine, agreement, in_top = reference(exact.numpy(), approx.numpy())
    assert scores["cosine_mean"] == pytest.approx(cosine, abs=1e-12)
    assert scores["nn_agreement"] == pytest.approx(agreement, abs=1e-12)
    assert scores["nn_in_top3"] == pytest.approx(in_top, abs=1e-12)
    assert 0 < agreement < in_top < 1  # the noise moved some neighbours, some out of the top 3
    same = fidelity.compare(exact, 3 * exact)  # cosine ignores the scale
    assert same["cosine_min"] == pytest.approx(1.0, abs=1e-12) and same["nn_agreement"] == 1.0
    assert same["nn_in_top3"] == 1.0


def test_paragraphs_are_the_texts_between_blank_lines():
    text = "one\nstill one\n\n\ntwo  \n \nthree\n\nfour"
    assert fidelity.paragraphs(text, 3) == ["one\nstill one", "two", "three"]


def encoder_and_texts(tmp_path):
    encoder, tokenizer = load_encoder(f"hf:{tiny_checkpoint(tmp_path / 'ckpt')}")
    g = np.random.default_rng(0)
    texts = [" ".join(g.choice(WORDS, size=int(g.integers(4, 30)))) for _ in range(9)]
    return encoder.double(), tokenizer, texts


def test_the_encoders_own_attention_is_exact_and_uniform_is_far(tmp_path):
    """Swapping in the core the encoder already has changes nothing: cosine 1, every
    neighbour the same. Each text is read alone: its padded batch gives its own embedding."""
    encoder, tokenizer, texts = encoder_and_texts(tmp_path)
    hybrid = {"name": "nystrom_local", "window": 3, "num_landmarks": 2, "heavy_keys": 2}
    cores = {("softmax", None): build_attention({"name": "softmax"}),
             ("nystrom_local", 8): build_attention(hybrid)}  # fmt: skip
    frame = fidelity.fidelity(encoder, tokenizer, texts, 24, cores).set_index("method")
    assert frame.loc["softmax", "cosine_min"] == pytest.approx(1.0, abs=1e-12)
    assert frame.loc["softmax", "nn_agreement"] == 1.0
    assert frame.loc["uniform", "cosine_mean"] < frame.loc["nystrom_local", "cosine_mean"] < 1
    assert list(frame.texts) == [9, 9, 9] and frame.loc["nystrom_local", "budget"] == 8
    ids, mask = fidelity.token_batch(tokenizer, texts, 24)
    batched = fidelity.embeddings(encoder, ids, mask)
    for i in (0, 4):
        n = int(mask[i].sum())
        alone = encoder(ids[i : i + 1, :n], mask[i : i + 1, :n]).mean(1)[0]
        torch.testing.assert_close(batched[i], alone, rtol=1e-12, atol=1e-12)
    assert mask.sum(1).max() == 24  # the longest texts were cut at seq_len


def test_approx_error_writes_the_fidelity_table_and_refuses_what_cannot_have_one(run_nys, tmp_path):
    folder = tiny_checkpoint(tmp_path / "ckpt")
    texts = tmp_path / "texts.txt"
    texts.write_text("\n\n".join(["the plot was fun , the acting was great ."] * 3
                                 + ["awful . the movie was a delight"]))  # fmt: skip
    common = ("source=checkpoint", f"checkpoint=hf:{folder}", f"data.path={texts}",
              "seq_len=32", "max_sequences=1", "budgets=[8]", "budget_unit=pairs",
              "plots=false", "methods=[nystrom_local,hybrid_routed]", "baselines=[uniform]",
              "threads=1")  # fmt: skip
    done = run_nys("approx-error", *common, f"fidelity.path={texts}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    frame = pd.read_csv(next(tmp_path.rglob("fidelity.csv")))
    assert list(frame.method) == ["nystrom_local", "hybrid_routed", "uniform"]
    assert (frame.texts == 4).all() and "same nearest neighbour" in done.stdout
    # 4 texts: each has 3 others, so exact's neighbour is always among any top 3
    assert (frame.nn_in_top3 == 1.0).all() and "neighbour in top 3" in done.stdout
    runs = len(list(tmp_path.rglob("results.csv")))
    one = tmp_path / "one.txt"
    one.write_text("a single review .")
    for args, message in (
        (("fidelity.path=" + str(texts),), "needs source=checkpoint"),
        ((*common, f"fidelity.path={one}"), "holds 1 text"),
        ((*common, f"fidelity.path={tmp_path / 'none.txt'}"), "fidelity.path"),
        ((*common, f"fidelity.path={texts}", "fidelity.max_texts=1"), "fidelity.max_texts=1"),
    ):
        refused = run_nys("approx-error", *args)
        assert refused.returncode == 2 and message in refused.stdout, refused.stdout
        assert "Traceback" not in refused.stdout + refused.stderr
    assert len(list(tmp_path.rglob("results.csv"))) == runs  # no run folder for a refusal
