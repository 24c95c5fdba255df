"""Tests of kgrag_nb.retrieval with the real offline MiniLM, real FAISS, real bm25s and the real NQ-open passages."""
import json, re, warnings
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from sentence_transformers import SentenceTransformer

from kgrag_nb.config import get_config, DEFAULT_EMBEDDER
from kgrag_nb.retrieval import (load_embedder, default_embedder_path, embed, EmbeddingCache, DenseIndex, BM25Index,
                                default_tokenizer, md5_dedup, md5_key, Retriever, auto_threads, encode_threads, _text_key)


@pytest.fixture(scope="module")
def corpus():
    path = get_config().data_dir / "nq_open" / "wiki_passages_sample_1000.jsonl"
    return [json.loads(l)["contents"] for l in path.open()]


@pytest.fixture(scope="module")
def questions():
    path = get_config().data_dir / "nq_open" / "NQ-open.dev.jsonl"
    return [json.loads(l)["question"] for l in path.open()][:200]


@pytest.fixture(scope="module")
def vectors(corpus, questions):
    "Passage and question embeddings (cached under cfg.cache_dir/embeddings, shared with the notebook)."
    return embed(corpus), embed(questions)


class CountingST(SentenceTransformer):
    "The real MiniLM, counting calls to encode and the texts it encoded; optionally failing on a given call."
    calls, encoded, fail_on_call = 0, 0, None

    def encode(self, sentences, *args, **kwargs):
        self.calls += 1
        if self.fail_on_call == self.calls: raise KeyboardInterrupt("simulated interruption")
        self.encoded += len(sentences)
        return super().encode(sentences, *args, **kwargs)


@pytest.fixture
def counting_model():
    model = CountingST(str(default_embedder_path()), device="cpu", local_files_only=True)
    model.kgrag_name = DEFAULT_EMBEDDER
    return model


# --- embedders -------------------------------------------------------------------------------------------------------

def test_load_embedder_once_per_name():
    m = load_embedder()
    assert load_embedder(DEFAULT_EMBEDDER) is m and m.kgrag_name == DEFAULT_EMBEDDER


def test_unknown_embedder_offline_names_model_and_fix(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(RuntimeError, match=r"no-such-org/nothing-here.*hf download"):
        load_embedder("no-such-org/nothing-here")


def test_embeddings_are_normalised_and_meaningful(vectors):
    x, q = vectors
    assert x.dtype == np.float32 and x.shape == (1000, 384) and q.shape == (200, 384)
    np.testing.assert_allclose(np.linalg.norm(x, axis=1), 1.0, atol=1e-5)
    a, b, c = embed(["A cat sits on the mat.", "A kitten is sitting on a rug.", "Stock prices fell sharply."])
    assert a @ b > a @ c + 0.2


def test_cache_hit_identical_and_no_model_call(tmp_path, counting_model):
    texts = ["alpha beta", "gamma delta", "alpha beta", "epsilon"]
    first = embed(texts, counting_model, cache_dir=tmp_path)
    assert counting_model.calls == 1 and counting_model.encoded == 3  # the duplicate is encoded once
    second = embed(texts, counting_model, cache_dir=tmp_path)
    assert counting_model.calls == 1  # served from the cache
    assert np.array_equal(first, second) and first.dtype == np.float32
    embed(["epsilon", "zeta"], counting_model, cache_dir=tmp_path)  # only the new text is encoded
    assert counting_model.calls == 2 and counting_model.encoded == 4
    # the cache is keyed by the normalisation flag too
    raw = embed(["alpha beta"], counting_model, cache_dir=tmp_path, normalize=False)
    assert counting_model.calls == 3 and len(EmbeddingCache(tmp_path, DEFAULT_EMBEDDER, False)) == 1
    np.testing.assert_allclose(raw[0], first[0], atol=1e-5)  # all-MiniLM-L6-v2 ends in a Normalize module anyway


def test_cache_survives_interruption(tmp_path, counting_model):
    texts = [f"sentence number {i}" for i in range(6)]
    counting_model.fail_on_call = 2
    with pytest.raises(KeyboardInterrupt):
        embed(texts, counting_model, cache_dir=tmp_path, chunk_size=2)
    assert len(EmbeddingCache(tmp_path, DEFAULT_EMBEDDER, True)) == 2  # the finished chunk was committed
    counting_model.fail_on_call, counting_model.encoded = None, 0
    out = embed(texts, counting_model, cache_dir=tmp_path, chunk_size=2)
    assert counting_model.encoded == 4  # only the unfinished texts
    np.testing.assert_allclose(out, embed(texts, cache_dir=False), atol=1e-5)  # batching changes only rounding


def test_text_key_hand_values():
    # sha1 of the UTF-8 bytes (FIPS 180 test vectors for "" and "abc")
    assert _text_key("") == "da39a3ee5e6b4b0d3255bfef95601890afd80709"
    assert _text_key("abc") == "a9993e364706816aba3e25717850c26c9cd0d89d"
    assert _text_key("é") == "bf15be717ac1b080b4f1c456692825891ff5073d"  # the UTF-8 bytes c3 a9, not latin-1
    assert _text_key("abc ") != _text_key("abc")  # no normalisation: whitespace is part of the text


@given(st.text(max_size=40), st.text(max_size=40))
@settings(max_examples=200, deadline=None)
def test_text_key_properties(a, b):
    ka = _text_key(a)
    assert re.fullmatch(r"[0-9a-f]{40}", ka) and ka == _text_key(a)
    assert (ka == _text_key(b)) == (a == b)


def test_cache_file_keyed_by_model_and_normalisation(tmp_path):
    a, b = EmbeddingCache(tmp_path, "org/model-a", True), EmbeddingCache(tmp_path, "org/model-b", True)
    c = EmbeddingCache(tmp_path, "org/model-a", False)
    assert len({a.path, b.path, c.path}) == 3 and a.path == EmbeddingCache(tmp_path, "org/model-a", True).path
    assert a.path.name.startswith("org_model-a-") and a.path.name.endswith("-norm1.sqlite") and c.path.name.endswith("-norm0.sqlite")
    v = np.arange(8, dtype=np.float32).reshape(2, 4)
    a.put(["k1", "k2"], v)
    out = np.zeros((3, 4), np.float32)
    assert a.read_into(["k2", "missing", "k1"], out).tolist() == [True, False, True]
    assert np.array_equal(out[[0, 2]], v[::-1]) and not out[1].any()
    assert b.read_into(["k1"], out[:1]).tolist() == [False]  # another model's file
    assert set(a.get(["k1", "k3"], 4)) == {"k1"} and a.get(["k1"], 5) == {}  # a vector of the wrong size is not used
    assert a.has(["k1", "k3", "k2", "k1"]).tolist() == [True, False, True, True] and not b.has(["k1"]).any()


def test_auto_threads_hand_values_and_override():
    assert [auto_threads(2, l) for l in (0.0, 0.49, 0.5, 1.49, 1.5, 6.7)] == [2, 2, 1, 1, 1, 1]
    assert auto_threads(16, 3.2) == 13 and auto_threads(16, 0.1) == 16 and auto_threads(1, 0.0) == 1
    with pytest.raises(ValueError, match="cores=0"): auto_threads(0, 0.0)
    assert encode_threads(get_config(embed_threads=3)) == 3
    with pytest.raises(ValueError, match="KGRAG_EMBED_THREADS"): encode_threads(get_config(embed_threads=-2))


@given(st.integers(1, 256), st.floats(0, 1000), st.floats(0, 1000))
def test_auto_threads_properties(cores, l1, l2):
    lo, hi = sorted((l1, l2))
    assert 1 <= auto_threads(cores, hi) <= auto_threads(cores, lo) <= cores


def test_thread_count_changes_only_rounding(tmp_path, counting_model):
    import torch
    texts = [f"Film number {i}, film genre, drama" for i in range(40)]
    before = torch.get_num_threads()
    one = embed(texts, counting_model, cache_dir=False, threads=1)
    assert torch.get_num_threads() == before  # restored
    two = embed(texts, counting_model, cache_dir=tmp_path, threads=2, batch_size=7, chunk_size=9)
    np.testing.assert_allclose(one, two, atol=1e-5)
    assert np.array_equal(embed(texts + texts[:3], counting_model, cache_dir=tmp_path), np.concatenate([two, two[:3]]))


# --- dense indexes ---------------------------------------------------------------------------------------------------

def test_flat_ip_and_l2_agree_with_numpy(vectors):
    x, q = vectors
    scores, ids = DenseIndex("flat_ip").add(x).search(q, 10)
    brute = q @ x.T
    ref = np.argsort(-brute, axis=1, kind="stable")[:, :10]
    np.testing.assert_allclose(scores, np.take_along_axis(brute, ref, 1), atol=1e-5)
    # ids agree except where two scores tie to float precision
    same = (ids == ref) | np.isclose(np.take_along_axis(brute, ids, 1), np.take_along_axis(brute, ref, 1), atol=1e-6)
    assert same.all()
    d2, ids2 = DenseIndex("flat_l2").add(x).search(q, 10)
    brute_d2 = ((q[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    np.testing.assert_allclose(d2, np.sort(brute_d2, axis=1)[:, :10], atol=1e-4)
    assert (ids2[:, 0] == ids[:, 0]).all()  # on unit vectors L2 and inner product rank alike


def _recall(ids, ref):
    return float(np.mean([len(set(a) & set(b)) / len(b) for a, b in zip(ids, ref)]))


def test_ivf_recall_vs_flat(vectors, tmp_path):
    x, q = vectors
    _, ref = DenseIndex("flat_ip").add(x).search(q, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the automatic nlist = min(4·√1000, 1000 // 40) does not warn
        ivf = DenseIndex("ivf_flat").add(x)
    assert ivf.nlist_used == 1000 // 40
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert DenseIndex("ivf_flat", nlist=4096).add(x).nlist_used == 25  # a paper's nlist, too large: lowered
    assert any("fewer lists than requested" in str(m.message) for m in w)
    recall = _recall(ivf.search(q, 10)[1], ref)
    assert recall >= 0.9, recall
    # the index really is approximate: probing one list of 25 loses neighbours
    assert _recall(DenseIndex("ivf_flat", nprobe=1).add(x).search(q, 10)[1], ref) < 0.9
    # seeded training: a second build gives the same result; save/load keeps it
    assert np.array_equal(DenseIndex("ivf_flat").add(x).search(q, 10)[1], ivf.search(q, 10)[1])
    ivf.save(tmp_path / "ivf.faiss")
    assert np.array_equal(DenseIndex.load(tmp_path / "ivf.faiss").search(q, 10)[1], ivf.search(q, 10)[1])


def test_ivf_keeps_paper_nlist_on_large_input():
    x = np.random.default_rng(1).normal(size=(64 * 40, 4)).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no deviation warning when n >= nlist * train_factor
        ivf = DenseIndex("ivf_flat", nlist=64, sample_per_batch=1000).add(x)
    assert ivf.nlist_used == 64 and ivf.ntotal == len(x)


def test_dense_index_bad_input():
    with pytest.raises(ValueError, match="kind"): DenseIndex("hnsw")
    with pytest.raises(ValueError, match="dimension 3"): DenseIndex("flat_ip").add(np.eye(2)).search(np.ones(3))
    with pytest.raises(ValueError, match="nprobe"): DenseIndex("ivf_flat", nprobe=0)


# --- BM25 ------------------------------------------------------------------------------------------------------------

def test_bm25_exact_term_match_ranks_first(corpus):
    bm = BM25Index(corpus)
    df = Counter(w for t in corpus for w in set(default_tokenizer(t)))
    rare = sorted(w for w, c in df.items() if c == 1 and len(w) > 6 and w.isalpha())[:25]
    assert len(rare) == 25
    for w in rare:
        owner = next(i for i, t in enumerate(corpus) if w in default_tokenizer(t))
        scores, ids = bm.search(w, k=3)
        assert ids[0, 0] == owner and scores[0, 0] > 0 and scores[0, 1] == 0, w


def test_bm25_hand_case():
    bm = BM25Index(["red apple pie", "green apple", "blue sky"])
    scores, ids = bm.search(["sky", "apple pie"], k=3)
    assert ids[0, 0] == 2 and ids[1, 0] == 0 and ids[1, 1] == 1
    assert scores[1, 0] > scores[1, 1] > 0 and scores[1, 2] == 0


# --- md5 dedup -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("texts,expected", [
    ([], []),
    (["x"], [0]),
    (["a", "b", "a", "b", "c"], [0, 1, 4]),
    (["a  b", " a b ", "a\tb\n", "ab"], [0, 3]),  # whitespace is normalised, words are not joined
    (["Case", "case"], [0, 1]),
])
def test_md5_dedup_hand_cases(texts, expected):
    assert md5_dedup(texts) == expected


texts_strategy = st.lists(st.sampled_from(["a", "b", "a ", " b", "c d", "c  d", "E", "e", ""]) | st.text(max_size=8),
                          max_size=30)


@settings(max_examples=200, deadline=None)
@given(texts_strategy)
def test_md5_dedup_properties(texts):
    keep = md5_dedup(texts)
    kept = [texts[i] for i in keep]
    assert keep == sorted(keep)  # input order
    assert len({md5_key(t) for t in kept}) == len(kept)  # output texts unique (after normalisation)
    assert {md5_key(t) for t in kept} == {md5_key(t) for t in texts}  # nothing distinct is lost
    for i in keep:  # each kept index is the first occurrence of its text
        assert all(md5_key(texts[j]) != md5_key(texts[i]) for j in range(i))
    assert md5_dedup(kept) == list(range(len(kept)))  # idempotent


# --- retriever -------------------------------------------------------------------------------------------------------

def test_retriever_on_real_passages(corpus, vectors):
    r = Retriever(corpus)
    hits = r.retrieve(["who sings got my mind set on you", "who won the 2017 ncaa mens basketball tournament"], k=5)
    assert len(hits) == 2 and all(len(h) == 5 for h in hits)
    i, s, t = hits[0][0]
    assert t == corpus[i] and isinstance(s, float)
    assert 89 in [i for i, _, _ in hits[0][:3]]  # "Got My Mind Set on You" article
    assert [h[1] for h in hits[1]] == sorted([h[1] for h in hits[1]], reverse=True)
    assert r.retrieve("who sings got my mind set on you", k=5)[0] == hits[0]
    ivf = Retriever(corpus, kind="ivf_flat", nprobe=25)  # every list probed: same top-5 as exact search
    assert [i for i, _, _ in ivf.retrieve("who sings got my mind set on you", k=5)[0]] == [i for i, _, _ in hits[0]]


def test_own_load_hand_values_and_encode_threads_leaves_out_its_own_share(monkeypatch):
    from kgrag_nb import retrieval
    own = retrieval.OwnLoad(min_s=2)
    assert [own(0, 0), own(1, 2), own(4, 8), own(5, 9), own(10, 11)] == [1.0, 1.0, 2.0, 2.0, 0.5]
    # the load average counts this process too: with 2 cores, a load of 2.0 of which 2.0 is its own leaves 2 threads
    monkeypatch.setattr(retrieval.os, "getloadavg", lambda: (2.0, 2.0, 2.0))
    monkeypatch.setattr(retrieval, "_TORCH_DEFAULT_THREADS", [2])
    monkeypatch.setattr(retrieval, "_OWN_LOAD", lambda: 2.0)
    assert encode_threads(get_config(embed_threads=0)) == 2
    monkeypatch.setattr(retrieval, "_OWN_LOAD", lambda: 1.0)  # another job holds one core
    assert encode_threads(get_config(embed_threads=0)) == 1
