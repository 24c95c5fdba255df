"""JCQL, KBC side (kgrag_nb.studies.jcql.kbc): Eq. 2, the context rule, the KB/test separation, the §3.4 sampled-ranking
convention, the PyKEEN cross-check of our filtered ranks, the tokenizer round trip, and the KBCModel interface."""
import math

import numpy as np
import pandas as pd
import pytest
import torch
from hypothesis import given, settings, strategies as st

from kgrag_nb.studies.jcql.kbc import (NOOP, SPECIALS, ContextIndex, KBCData, KBCModel, PyKEENBaseline, SLMConfig, build_kbc_data,
                               build_tokenizer, cap_tail_share, fb15k237_splits, kbc_input, kbc_training_triples,
                               metric_cis, random_ranking, relation_cooccurrence, result_row, sampled_filtered_rank,
                               slice_topics, tail_share, train_kbc, unique_names)
from kgrag_nb.kg import KG
from kgrag_nb.metrics import filtered_ranks, ranking_metrics


# ---------------------------------------------------------------- Eq. 2 on a hand-made KG
def test_eq2_cooccurrence_hand_made_kg():
    # born_in: (ann, paris), (bob, rome); lives_in: (ann, rome); capital_of: (paris, france), (rome, italy); likes: (cat, cat)
    df = pd.DataFrame([("ann", "born_in", "paris"), ("bob", "born_in", "rome"), ("ann", "lives_in", "rome"),
                       ("paris", "capital_of", "france"), ("rome", "capital_of", "italy"), ("cat", "likes", "cat")],
                      columns=["head", "relation", "tail"])
    S = relation_cooccurrence(KG.from_triples(df, name="hand"))
    # R_ann={born_in, lives_in} R_bob={born_in} R_paris={born_in, capital_of} R_rome={born_in, lives_in, capital_of}
    # R_france=R_italy={capital_of} R_cat={likes}
    want = {("born_in", "born_in"): 4, ("born_in", "lives_in"): 2, ("born_in", "capital_of"): 2,
            ("lives_in", "lives_in"): 2, ("lives_in", "capital_of"): 1, ("capital_of", "capital_of"): 4,
            ("likes", "likes"): 1, ("likes", "born_in"): 0}
    for (a, b), x in want.items():
        assert S.loc[a, b] == x and S.loc[b, a] == x, (a, b)
    assert list(S.index) == list(S.columns) and len(S) == 4


def test_context_ranks_by_eq2():
    kb = [("rome", "capital_of", "italy"), ("ann", "lives_in", "rome"), ("bob", "born_in", "rome"), ("ann", "born_in", "paris"),
          ("paris", "capital_of", "france")]
    ci = ContextIndex(kb, size=2)
    # query (rome, born_in, ?): S(born_in, capital_of)=2 ties S(born_in, born_in)... rome's edges: capital_of(out), lives_in(in), born_in(in)
    ctx = ci.context("rome", "born_in")
    s = [ci.S.loc["born_in", r] for _, r, _ in ctx]
    assert s == sorted(s, reverse=True) and len(ctx) == 2
    assert ("bob", "born_in", "rome") in ctx  # S(born_in, born_in) = 3 is the highest


kb_strategy = st.lists(st.tuples(st.sampled_from("abcdef"), st.sampled_from(["p", "q", "r"]), st.sampled_from("abcdef")),
                       min_size=1, max_size=30, unique=True)


@settings(max_examples=60, deadline=None)
@given(kb=kb_strategy, size=st.integers(1, 5), order=st.sampled_from(["cooccurrence", "random"]))
def test_context_never_contains_its_target(kb, size, order):
    ci = ContextIndex(kb, size=size, order=order)
    for h, r, t in kb:
        ctx = ci.context(h, r, exclude=(h, r, t))
        assert (h, r, t) not in ctx and len(ctx) <= size
        assert all(h in (a, c) for a, _, c in ctx)  # one-hop triples of h only
        assert f"<{h} || {r} || {t}>" not in kbc_input(h, r, ctx) or (h, r, t) in [tuple(x) for x in ctx if x != (h, r, t)]
        if order == "cooccurrence":
            s = [ci._S.get((r, b), 0) for _, b, _ in ctx]
            assert s == sorted(s, reverse=True)


# ---------------------------------------------------------------- data: no valid/test triple in the KB
@pytest.fixture(scope="module")
def splits():
    return fb15k237_splits()


def test_no_valid_or_test_triple_in_training_kb(splits):
    topics, qs = slice_topics(splits["all"], n_questions=3, seed=0)
    assert len(qs) == 6 and topics
    d = build_kbc_data(splits, keep=0.5, seed=0, topics=topics, max_triples=800)
    kb = set(d.train)
    assert not kb & set(d.valid) and not kb & set(d.test)
    assert set(d.test) <= set(d.known) and kb - {t for t in kb if t[1] == NOOP} <= set(d.known)
    st_ = d.stats()
    assert st_["train"] - st_["isolated"] == d.info["kb_triples"] == round(0.5 * d.info["train_complete"])
    cand = set(d.entities)
    assert all(h in cand and t in cand for h, _, t in d.test)
    with pytest.raises(AssertionError, match="valid/test triples are in the training KB"):
        KBCData(d.entities, d.relations, d.train + d.test[:1], d.valid, d.test, d.known)


def test_unique_names_real_fb15k237(splits):
    full = splits["all"]
    names = unique_names(full.entities.tolist(), full.entity_labels)
    assert len(set(names)) == full.num_entities
    labels = [full.entity_labels.get(e) for e in full.entities.tolist()]
    from collections import Counter
    c = Counter(l for l in labels if l)
    n_shared_names, n_entities = sum(1 for v in c.values() if v > 1), sum(v for v in c.values() if v > 1)
    assert (n_shared_names, n_entities) == (223, 499)  # the issue's count for FB15k-237's entity2text
    assert sum(n.endswith(")") and " (/m/" in n for n in names) >= 499


# ---------------------------------------------------------------- §3.4 sampled ranking (KGT5's convention)
def test_sampled_ranking_hand_computed():
    # 6 entities; sampled: 0 (-1.0), 2 (-0.2), 3 (-1.0), 5 (-3.0); never sampled: 1, 4
    s = np.array([-1.0, -np.inf, -0.2, -1.0, -np.inf, -3.0])
    known_other = np.array([0, 0, 1, 0, 0, 0], bool)  # entity 2 is another true tail of (h, r)
    assert sampled_filtered_rank(s, 1) == math.inf                # true tail 1 never sampled: RR 0, no Hits
    assert sampled_filtered_rank(s, 4, known_other) == math.inf
    assert sampled_filtered_rank(s, 0) == 2.5                     # 2 better, 3 tied (mean rank 2.5)
    assert sampled_filtered_rank(s, 0, known_other) == 1.5        # 2 filtered out
    assert sampled_filtered_rank(s, 5) == 4.0                     # 0, 2, 3 better; 1, 4 unsampled: not ties
    m = ranking_metrics([math.inf, 2.5, 1.0, 4.0])
    assert m == {"mrr": (0 + 1 / 2.5 + 1 + 1 / 4) / 4, "hits@1": 0.25, "hits@3": 0.5, "hits@10": 0.75}


scores_st = st.lists(st.one_of(st.just(-math.inf), st.sampled_from([-3.0, -2.0, -1.0, -0.5, 0.0])), min_size=2, max_size=12)


@settings(max_examples=200, deadline=None)
@given(s=scores_st, data=st.data())
def test_sampled_rank_properties(s, data):
    s = np.array(s)
    t = data.draw(st.integers(0, len(s) - 1))
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=len(s), max_size=len(s))))
    r = sampled_filtered_rank(s, t, mask)
    if np.isneginf(s[t]): assert r == math.inf; return
    competitors = np.isfinite(s) & ~mask; competitors[t] = False
    assert 1 <= r <= 1 + competitors.sum()
    assert r <= sampled_filtered_rank(s, t)  # filtering never worsens a rank
    better = s.copy(); better[t] = 1.0  # the best possible score: rank 1
    assert sampled_filtered_rank(better, t, mask) == 1
    worse = s.copy(); worse[t] = -100.0  # still sampled, below everyone: last among competitors
    assert sampled_filtered_rank(worse, t, mask) == 1 + competitors.sum() >= r


# ---------------------------------------------------------------- PyKEEN cross-check (tie policy: mean = PyKEEN "realistic")
def test_filtered_ranks_match_pykeen_ranks_from_scores():
    from pykeen.evaluation.ranks import Ranks
    rng = np.random.default_rng(0)
    s = rng.integers(0, 5, (40, 30)).astype(float)  # many ties on purpose
    true = rng.integers(0, 30, 40)
    mask = rng.random((40, 30)) < 0.2; mask[np.arange(40), true] = False
    filtered = np.where(mask, np.nan, s)  # PyKEEN filters by setting scores to NaN
    r = Ranks.from_scores(torch.tensor(s[np.arange(40), true])[:, None], torch.tensor(filtered))
    for ours, theirs in [("mean", r.realistic), ("optimistic", r.optimistic), ("pessimistic", r.pessimistic)]:
        np.testing.assert_allclose(filtered_ranks(s, true, mask, tie=ours), theirs.numpy())


def test_pykeen_baseline_matches_rank_based_evaluator():
    from pykeen.evaluation import RankBasedEvaluator
    rng = np.random.default_rng(1)
    ents, rels = [f"e{i}" for i in range(25)], ["p", "q", "r"]
    tri = sorted({(ents[a], rels[b], ents[c]) for a, b, c in zip(rng.integers(0, 25, 160), rng.integers(0, 3, 160), rng.integers(0, 25, 160))})
    test, train = tri[:20], tri[20:]
    data = KBCData(ents, rels, train, [], test, tri)
    pk = PyKEENBaseline(data, "DistMult", dim=8, epochs=3, batch_size=32, seed=0)
    ours = pk.evaluate(test, tri)
    mt = lambda ts: torch.tensor([[pk.eidx[h], pk.ridx[r], pk.eidx[t]] for h, r, t in ts], dtype=torch.long)
    res = RankBasedEvaluator(filtered=True).evaluate(pk.model, mt(test), additional_filter_triples=[mt(tri)],
                                                     batch_size=20, use_tqdm=False)
    assert ours["mrr"] == pytest.approx(res.get_metric("tail.realistic.inverse_harmonic_mean_rank"), rel=1e-5)
    for k in (1, 3, 10):
        assert ours[f"hits@{k}"] == pytest.approx(res.get_metric(f"tail.realistic.hits_at_{k}"), abs=1e-6)


# ---------------------------------------------------------------- tokenizer round trip
TOK = build_tokenizer(["Justin Bieber", "Pattie Mallette (/m/0abc)", "film actor film. film performance film", "São Paulo"], 400)


@settings(max_examples=200, deadline=None)
@given(s=st.text(max_size=40))
def test_tokenizer_round_trip(s):
    if any(sp in s for sp in SPECIALS): return  # specials are single tokens that decoding drops by design
    assert TOK.decode(TOK.encode(s).ids) == s


def test_tokenizer_specials():
    assert [TOK.token_to_id(x) for x in SPECIALS] == [0, 1, 2, 3]
    assert TOK.encode(kbc_input("a", "p", [("a", "q", "b")])).ids.count(3) == 1  # <SEP> is one token


# ---------------------------------------------------------------- the KBCModel interface (what kgrag_nb.studies.jcql.kbqa calls)
@pytest.fixture(scope="module")
def toy_model():
    ents = ["Ann", "Bob", "Cy", "Dee", "Eve"]
    train = [("Ann", "parent", "Bob"), ("Bob", "parent", "Cy"), ("Cy", "parent", "Dee"), ("Ann", "likes", "Eve"),
             ("Eve", "likes", "Dee"), ("Dee", "likes", "Ann")]
    data = KBCData(ents, ["parent", "likes"], train, [], [("Dee", "parent", "Eve")], train + [("Dee", "parent", "Eve")])
    cfg = SLMConfig(d_model=32, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=2, d_kv=16, vocab_size=300,
                    epochs=150, batch_size=6, lr=1e-2, R=30, log_every=10)
    return data, train_kbc(data, cfg, seed=0)


def test_kbcmodel_interface(toy_model, tmp_path):
    data, m = toy_model
    assert m.history[-1]["loss"] < m.history[0]["loss"] / 2  # it learns its 6 training triples
    assert kbc_training_triples(data) == data.train
    top = m.topk("Cy", "likes", k=3)  # not in the KB: a completion
    assert top and all(e in data.entities for e, _ in top) and all(a[1] >= b[1] for a, b in zip(top, top[1:]))
    ex = m.evaluate(data.train, data.known, R=None)  # the training triples, each without itself in its context
    assert ex["n"] == 6 and ex["mrr"] == 1.0 and len(ex["per_triple"]) == 6  # memorised
    sm = m.evaluate(data.train, data.known, R=30, seed=0)
    assert all(r["rank"] == math.inf or r["rank"] >= 1 for r in sm["per_triple"])
    m.save(tmp_path / "ck"); m2 = KBCModel.load(tmp_path / "ck")
    np.testing.assert_allclose(m2.exact_scores("Ann", "parent"), m.exact_scores("Ann", "parent"), rtol=1e-5)
    assert m2.kb == m.kb and m2.entities == m.entities and m2.history == m.history
    before = m2.exact_scores("Dee", "parent")[data.entities.index("Eve")]
    outs = [m2.fine_tune([("Dee", "parent", "Eve")], data.train[:2], lr=1e-2, steps=1, seed=i) for i in range(5)]
    assert all(o["param_change"] > 0 and o["n"] == 3 and np.isfinite(o["loss"]) for o in outs)
    assert outs[-1]["loss"] < outs[0]["loss"]
    assert m2.exact_scores("Dee", "parent")[data.entities.index("Eve")] > before  # the new triple became likelier
    with pytest.raises(ValueError, match="no triples"): m2.fine_tune([], [], lr=1e-2)
    with pytest.raises(KeyError, match="not a candidate entity"): m.evaluate([("Ann", "parent", "Zed")], [], R=None)
    with pytest.raises(FileNotFoundError, match="no saved KBCModel"): KBCModel.load(tmp_path / "nothing")


# ---------------------------------------------------------------- issue 22 item 6: baselines that are baselines
CYC_E = [f"e{i}" for i in range(30)]
CYC = [(CYC_E[i], "next", CYC_E[(i + 1) % 30]) for i in range(30)] + [(CYC_E[i], "skip", CYC_E[(i + 7) % 30]) for i in range(30)]


@pytest.mark.parametrize("model", ["TransE", "DistMult", "ComplEx", "RotatE"])
def test_pykeen_baseline_fits_its_training_triples(model):
    # The issue-22 bug: with PyKEEN's sLCWA defaults (our old PyKEENBaseline: lr 0.01, N(0,1)-initialised ComplEx, NSSA RotatE)
    # ComplEx/RotatE ranked even their own training triples at random (smoke: train MRR 0.002 = random). A baseline must fit a
    # KB it can represent: every "next"/"skip" triple of a 30-cycle, unfiltered, far above random (H_30/30 = 0.133).
    data = KBCData(CYC_E, ["next", "skip"], CYC, [], [], CYC)
    pk = PyKEENBaseline(data, model, dim=32, seed=0)  # the defaults: LCWA, cross-entropy, lr 0.05, 20 epochs
    assert pk.info["training_loop"] == "lcwa"
    random_mrr = random_ranking(data, CYC, [])["mrr"]
    assert random_mrr == pytest.approx(sum(1 / k for k in range(1, 31)) / 30)
    assert pk.evaluate(CYC, [])["mrr"] > 0.5 > 3 * random_mrr, model


def test_old_slcwa_complex_does_not_fit():
    # the regime the fix replaced, kept selectable: it stays near random on the same KB (documents the bug the test above catches)
    data = KBCData(CYC_E, ["next", "skip"], CYC, [], [], CYC)
    old = PyKEENBaseline(data, "ComplEx", dim=32, epochs=20, lr=0.01, training_loop="slcwa", loss=None, seed=0)
    assert old.evaluate(CYC, [])["mrr"] < 0.3


def test_random_ranking_hand_computed():
    # 4 candidates; (a, p) has another known tail (b): 3 unfiltered candidates -> E[RR] = (1 + 1/2 + 1/3) / 3, Hits@1 = 1/3
    d = KBCData(["a", "b", "c", "d"], ["p"], [("a", "p", "b")], [], [("a", "p", "c")], [("a", "p", "b"), ("a", "p", "c")])
    r = random_ranking(d, d.test, d.known)
    assert r["mrr"] == pytest.approx((1 + 1 / 2 + 1 / 3) / 3) and r["hits@1"] == pytest.approx(1 / 3)
    assert r["hits@3"] == 1.0 and r["per_triple"][0]["candidates"] == 3 and r["per_triple"][0]["rank"] == 2.0
    assert random_ranking(d, d.test, [])["mrr"] == pytest.approx((1 + 1 / 2 + 1 / 3 + 1 / 4) / 4)


@settings(max_examples=80, deadline=None)
@given(tails=st.lists(st.sampled_from("UUUUUUabcdefg"), min_size=1, max_size=60), n=st.integers(1, 40),
       share=st.sampled_from([0.05, 0.1, 0.2, 0.5, 1.0]), seed=st.integers(0, 3))
def test_cap_tail_share_holds_its_cap(tails, n, share, seed):
    tri = [(f"h{i}", "p", t) for i, t in enumerate(tails)]
    s = cap_tail_share(tri, n, share, seed)
    assert len(s) <= n and set(s) <= set(tri) and len(set(s)) == len(s)
    if s: assert tail_share(s) <= max(share, 1 / len(s)) + 1e-12
    if s and tail_share(s) > share: assert len(set(t for *_, t in s)) == len(s)  # only when every tail appears once
    assert s == sorted(s, key=tri.index)


def test_cap_tail_share_smoke_like_sample():
    # 121 of 199 test tails one country (the smoke slice): a 50-triple sample at 10% holds at most 5 of them
    tri = [(f"h{i}", "nationality", "USA") for i in range(121)] + [(f"g{i}", "nationality", f"c{i % 40}") for i in range(78)]
    s = cap_tail_share(tri, 50, 0.1, seed=0)
    assert len(s) == 50 and sum(t == "USA" for *_, t in s) == 5 and tail_share(s) <= 0.1


# ---------------------------------------------------------------- issue 22 item 5: CIs over the evaluated triples
def test_metric_cis_bracket_and_use_expected_values():
    ranks = [1.0, 2.0, math.inf, 4.0, 1.0, 10.0]
    ci = metric_cis([dict(rank=r) for r in ranks], seed=0)
    m = ranking_metrics(ranks)
    for k, name in [("mrr", "MRR"), ("hits@1", "Hits@1"), ("hits@3", "Hits@3"), ("hits@10", "Hits@10")]:
        assert ci[f"{name} CI low"] <= m[k] <= ci[f"{name} CI high"]
    assert ci["MRR CI low"] < ci["MRR CI high"] and metric_cis([dict(rank=r) for r in ranks], seed=0) == ci  # seeded
    rnd = [dict(rank=2.0, rr=0.6, **{"hits@1": 0.2, "hits@3": 0.6, "hits@10": 1.0})] * 3
    assert metric_cis(rnd)["MRR CI low"] == metric_cis(rnd)["MRR CI high"] == 0.6  # the expectation, not 1/E[rank] = 0.5
    row = result_row("m", "v", 0.5, "exact", {**m, "n": 6, "per_triple": [dict(rank=r) for r in ranks]})
    assert row["MRR CI low"] == ci["MRR CI low"]
