"""Tests of kgrag_nb.metrics: hand-computed cases for every metric (arithmetic in comments) and hypothesis properties.

Papers: awakening_unseen_entity_kgqa.txt (ACC_R, Hits@k, Eq. 6), brink_incomplete_kg_benchmark.txt (§4.3, App. E, App. I),
missing_knowledge_rag.txt (§3.1: EM/F1, ROUGE/BLEU, Eq. 3), jcql_joint_kbc_kbqa.txt (§4.1, App. B: MRR, Hits@k),
chain_of_evidence.txt (§6.1 Following Rate, §5.2/§6.2 Mann-Whitney).
"""
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

from kgrag_nb.metrics import (
    CharTokenizer, MannWhitney, acc_r, acc_r_tokens, bleu, bleu_n, bootstrap_ci, bootstrap_ratio_ci, brink_evaluate,
    brink_normalize, brink_per_question, brink_scores, brink_sets, brink_split, context_recall, exact_match,
    filtered_ranks, following_rate, hard_hits_rate, hits_at_k, kbqa_hits_at_1, mann_whitney, permissive_evaluate,
    permissive_scores, ranking_metrics, rouge_scores, sentence_bleu, squad_normalize, token_f1, unanswerable)

approx = pytest.approx

# ---------------------------------------------------------------- hand-computed cases

def test_normalisations():
    assert acc_r_tokens("Saint-Denis (1998)") == ["saint", "denis", "1998"]  # punctuation -> space
    assert squad_normalize("Saint-Denis, THE city") == "saintdenis city"  # punctuation deleted, article dropped
    assert brink_normalize("An <pad>Apple<PAD> pie.") == "apple pie"
    assert brink_normalize("the") == ""
    with pytest.raises(TypeError, match="str"):
        brink_normalize(3)


def test_acc_r_eq15_intended_direction():
    # Eq. 15 as printed would give 0 here; the intent (§6.1, §4.2: 1 = correct) gives 1
    assert acc_r("The answer is Barack Obama.", "Barack Obama") == 1
    assert acc_r("Obama", "Barack Obama") == 0  # 'barack' missing
    assert acc_r("Obama", ["Barack Obama", "Obama"]) == 1  # alias 2 contained
    assert acc_r("", "Obama") == 0
    with pytest.raises(ValueError, match="no word tokens"):
        acc_r("x", ["...", "!"])
    with pytest.raises(ValueError, match="empty"):
        acc_r("x", [])


def test_hits_at_k_and_unanswerable():
    samples = ["Lyon", "Nice", "Paris", "Paris"]
    # first correct sample is the 3rd -> Hits@1 = Hits@2 = 0, Hits@3 = Hits@4 = 1
    assert [hits_at_k(samples, "paris", k) for k in range(1, 5)] == [0, 0, 1, 1]
    with pytest.raises(ValueError, match="lower k"):
        hits_at_k(samples, "paris", 5)
    with pytest.raises(ValueError, match="positive"):
        hits_at_k(samples, "paris", 0)
    assert unanswerable(["Lyon", "Nice", "Rome"], "Paris") is True  # Eq. 6: all three wrong
    assert unanswerable(["Lyon", "Paris", "Rome"], "Paris") is False
    with pytest.raises(TypeError, match="list of response strings"):
        unanswerable("Paris", "Paris")


def test_brink_split_and_sets():
    assert brink_split("a, b\nc|d;e") == ["a", "b", "c", "d", "e"]
    assert brink_split("Barack Obama and Joe Biden") == ["Barack Obama and Joe Biden"]  # no split on spaces / ' and '
    assert brink_split("- 39\n* 40\n3) 41\n10. 42") == ["39", "40", "41", "42"]
    assert brink_split(" ,\n, ") == []
    assert brink_split(["x, y"]) == ["x, y"]  # a list is already split
    # P = {paris} (duplicates and '<pad>' removed), A = {paris, lyon}
    assert brink_sets("Paris, the paris, <pad>", ["Paris", "Lyon"]) == ({"paris"}, {"paris", "lyon"})
    with pytest.raises(ValueError, match="empty after BRINK normalisation"):
        brink_sets("x", ["the"])
    with pytest.raises(TypeError, match="raw output"):
        brink_split(42)


def test_brink_scores_hand():
    # P = {a, b, c, d}, A = {a, b, e}; |P∩A| = 2 -> P 2/4, R 2/3, F1 = 2·2/(4+3) = 4/7; hard e not predicted
    s = brink_scores("a1, b1, c1, d1", ["a1", "b1", "e1"], hard="e1")
    assert s == approx(dict(hits_any=1.0, precision=0.5, recall=2 / 3, f1=4 / 7, hits_hard=0.0))
    # F1 equals the harmonic mean of P and R: 2·(1/2)(2/3)/(1/2 + 2/3) = (2/3)/(7/6) = 4/7
    assert 2 * 0.5 * (2 / 3) / (0.5 + 2 / 3) == approx(4 / 7)
    # empty prediction: precision 0 by our convention, everything 0
    assert brink_scores("", ["a1"], hard="a1") == dict(hits_any=0.0, precision=0.0, recall=0.0, f1=0.0, hits_hard=0.0)
    assert math.isnan(brink_scores("a1", ["a1"])["hits_hard"])
    with pytest.raises(ValueError, match="hard answer must be a gold answer"):
        brink_scores("a1", ["a1"], hard="b1")


def test_brink_evaluate_hand():
    preds = ["1, 2", "3", "4, 5, 6", ""]
    golds = [["1"], ["3", "7"], ["6", "8"], ["9"]]
    hards = ["1", "7", "6", "9"]
    # q1: P{1,2} A{1}: hit, P 1/2, R 1, F1 2/3, hard hit
    # q2: P{3} A{3,7}: hit, P 1, R 1/2, F1 2/3, hard 7 missed
    # q3: P{4,5,6} A{6,8}: hit, P 1/3, R 1/2, F1 2/5, hard hit
    # q4: empty: all 0
    r = brink_evaluate(preds, golds, hards)
    assert r["n"] == 4
    assert r["hits_any"] == approx(3 / 4)
    assert r["precision"] == approx((1 / 2 + 1 + 1 / 3) / 4)
    assert r["recall"] == approx((1 + 1 / 2 + 1 / 2) / 4)
    assert r["f1"] == approx((2 / 3 + 2 / 3 + 2 / 5) / 4)
    assert r["hits_hard"] == approx(2 / 4)
    assert r["hhr"] == approx((2 / 4) / (3 / 4))  # = 2/3
    per = brink_per_question(preds, golds, hards)
    assert per["hits_hard"].tolist() == [1.0, 0.0, 1.0, 0.0]
    assert hard_hits_rate(0.0, 0.0) == 0.0  # Hits@Any = 0 -> HHR 0, no NaN
    assert math.isnan(brink_evaluate(preds, golds)["hhr"])
    with pytest.raises(ValueError, match="one item per question"):
        brink_evaluate(preds, golds[:2])
    with pytest.raises(ValueError, match="no questions"):
        brink_evaluate([], [])


def test_permissive_hand():
    # haystack "barack obama was president": gold 'barack obama' matched; 1 piece -> P = 1/1, R = 1/2, F1 = 2/3
    s = permissive_scores("Barack Obama was president", ["Barack Obama", "Joe Biden"])
    assert s == approx(dict(hits_at_1=1.0, precision=1.0, recall=0.5, f1=2 / 3))
    # negation counts (BRINK App. I): strict miss, permissive hit
    assert permissive_scores("not Barack Obama", ["Barack Obama"])["hits_at_1"] == 1.0
    assert brink_scores("not Barack Obama", ["Barack Obama"])["hits_any"] == 0.0
    # one piece naming two golds: P = 2 matched / 1 piece = 2 (unclipped), R = 1, F1 = 2·2·1/3 = 4/3
    s = permissive_scores("Paris and Lyon", ["Paris", "Lyon"])
    assert (s["precision"], s["recall"], s["f1"]) == approx((2.0, 1.0, 4 / 3))
    assert permissive_scores("Paris and Lyon", ["Paris", "Lyon"], clip=True)["precision"] == 1.0
    # 3 pieces, 1 matched gold of 2 -> P = 1/3, R = 1/2, F1 = 2(1/6)/(5/6) = 2/5
    assert permissive_scores("rome, oslo, parisian", ["paris", "bern"])["f1"] == approx(2 / 5)
    r = permissive_evaluate(["Paris", "Rome"], [["Paris"], ["Oslo"]])
    assert r == approx(dict(n=2, hits_at_1=0.5, precision=0.5, recall=0.5, f1=0.5))


def test_exact_match_and_token_f1_hand():
    assert exact_match("The Beatles!", ["beatles", "Fab Four"]) == 1.0
    assert exact_match("Beatles band", "beatles") == 0.0
    # pred [john, lennon, and, paul] vs gold [john, lennon]: common 2 -> P 2/4, R 2/2, F1 2/3
    assert token_f1("John Lennon and Paul", "John Lennon") == approx((0.5, 1.0, 2 / 3))
    # vs aliases: 'Lennon' gives P 1/4 R 1 F1 .4; 'john lennon and paul mccartney' gives P 4/4 R 4/5 F1 8/9 -> best
    assert token_f1("John Lennon and Paul", ["Lennon", "John Lennon and Paul McCartney"]) == approx((1.0, 0.8, 8 / 9))
    # repeated tokens count once per occurrence: pred [a1, a1] gold [a1]: common 1 -> P 1/2, R 1, F1 2/3
    assert token_f1("a1 a1", "a1") == approx((0.5, 1.0, 2 / 3))
    assert token_f1("", "x") == (0.0, 0.0, 0.0)
    assert token_f1("the", "a") == (1.0, 1.0, 1.0)  # both empty after normalisation (SQuAD 2.0 convention)


def test_rouge_hand():
    r = rouge_scores("the cat sat on the mat", "the cat is on the mat")
    # unigrams shared 5 of 6 each side -> 5/6; bigrams shared {the cat, on the, the mat} 3 of 5 -> 3/5; LCS 5 -> 5/6
    assert r == approx(dict(rouge1=5 / 6, rouge2=3 / 5, rougeL=5 / 6))
    # several references: the best counts
    assert rouge_scores("a b", ["c d", "a b"])["rouge1"] == 1.0
    # Chinese needs CharTokenizer: pred 4 chars, ref 2 chars, 2 shared -> P 1/2, R 1, F 2/3
    assert rouge_scores("头痛发热", "头痛", tokenizer=CharTokenizer())["rouge1"] == approx(2 / 3)


def test_bleu_hand():
    # order 1: unigram precision 2/2 = 1, brevity penalty exp(1 - r/c) = exp(1 - 3/2)
    assert bleu(["the cat"], ["the cat sat"], max_ngram_order=1) == approx(math.exp(-0.5), abs=1e-6)
    assert sentence_bleu("the cat", "the cat sat") == approx(math.exp(-0.5), abs=1e-6)  # effective order 2
    # "a b c d" vs "a b d c": p1 = 4/4, p2 = 1/3 (ab), p3 = 0/2 and p4 = 0/1 get sacrebleu's 'exp' smoothing:
    # p3 = 1/(2·2) = 1/4, p4 = 1/(4·1) = 1/4; BP = 1
    # BLEU-1 = 1, BLEU-2 = sqrt(1/3), BLEU-3 = (1/12)^(1/3), BLEU-4 = (1/48)^(1/4)
    got = bleu_n(["a b c d"], ["a b d c"])
    assert got == approx(dict(bleu1=1.0, bleu2=(1 / 3) ** 0.5, bleu3=(1 / 12) ** (1 / 3), bleu4=(1 / 48) ** 0.25), abs=1e-6)
    # two references per prediction: the exact one makes BLEU 1
    assert bleu(["a b c d"], [["x y", "a b c d"]]) == 1.0
    assert bleu_n(["病人头痛发热三天"], ["病人发热头痛三天"], tokenize="zh")["bleu1"] == approx(1.0)  # same characters
    with pytest.raises(ValueError, match="same number of references"):
        bleu(["a", "b"], [["a"], ["b", "c"]])
    with pytest.raises(ValueError, match="one reference"):
        bleu(["a", "b"], ["a"])


def test_context_recall_hand():
    assert context_recall([True, True, False], 4) == 0.5  # 2 attributed / |GT_C| = 4
    with pytest.raises(ValueError, match="GT_C"):
        context_recall([True], 0)


def test_filtered_ranks_hand():
    scores = np.array([[5.0, 3.0, 3.0, 3.0, 1.0, 9.0]])
    mask = np.array([[False, False, False, False, False, True]])  # entity 5 is another true answer
    # true = 1 (3.0): higher {0 (5.0), 5 (9.0, filtered)} -> g = 1; ties {2, 3} -> t = 2
    assert filtered_ranks(scores, [1], mask, tie="optimistic").tolist() == [2.0]
    assert filtered_ranks(scores, [1], mask, tie="pessimistic").tolist() == [4.0]
    assert filtered_ranks(scores, [1], mask).tolist() == [3.0]  # mean = 1 + 1 + 2/2
    assert filtered_ranks(scores, [1], mask, tie="realistic").tolist() == [3.0]
    assert filtered_ranks(scores, [1], None, tie="optimistic").tolist() == [3.0]  # raw: 9.0 also above
    assert filtered_ranks(scores[0], 4, largest=False).tolist() == [1.0]  # lowest score is best
    # the true entity is never filtered even if the mask marks it
    assert filtered_ranks(scores, [5], np.ones_like(mask)).tolist() == [1.0]
    # -inf ties (JCQL §3.4 gives unseen entities -inf): true -inf among 2 other -inf and 1 finite -> 1 + 1 + 2/2 = 3
    assert filtered_ranks([-np.inf, 0.5, -np.inf, -np.inf], [0]).tolist() == [3.0]
    with pytest.raises(ValueError, match="NaN"):
        filtered_ranks([np.nan, 1.0], [0])
    with pytest.raises(ValueError, match="tie"):
        filtered_ranks([1.0], [0], tie="random")
    with pytest.raises(ValueError, match="filter_mask"):
        filtered_ranks(scores, [1], np.zeros((2, 3), bool))  # same size, wrong shape


def test_ranking_metrics_hand():
    # ranks [1, 3, 3.5, 11]: MRR = (1 + 1/3 + 2/7 + 1/11)/4; Hits@1 1/4, Hits@3 2/4 (3.5 > 3), Hits@10 3/4
    r = ranking_metrics([1, 3, 3.5, 11])
    assert r == approx({"mrr": (1 + 1 / 3 + 2 / 7 + 1 / 11) / 4, "hits@1": 0.25, "hits@3": 0.5, "hits@10": 0.75})
    assert ranking_metrics([2], ks=(1, 2))["hits@2"] == 1.0
    with pytest.raises(ValueError, match=">= 1"):
        ranking_metrics([0.5])


def test_kbqa_hits_at_1_hand():
    assert kbqa_hits_at_1(["Q5", "Q7"], ["Q7"]) == 0.0  # the first prediction is wrong
    assert kbqa_hits_at_1("Q7, Q5", ["q7"]) == 1.0
    assert kbqa_hits_at_1([], ["Q7"]) == 0.0
    assert kbqa_hits_at_1(["the", "Q7"], ["Q7"]) == 0.0  # an empty top answer is a miss


def test_following_rate_hand():
    assert following_rate([1, 1, 0, 0, 1]) == 0.6  # 3 of 5 follow the planted answer
    # three runs (CoE §6.1 repeats each group 3 times): 2/4, 3/4, 4/4 -> mean 3/4
    assert following_rate([[1, 0, 1, 0], [1, 1, 1, 0], [1, 1, 1, 1]]) == 0.75
    assert following_rate([True, False]) == 0.5
    # strings judged by acc_r: 'canada' in output 1 only -> 1/2
    assert following_rate(["It is in Canada.", "United States"], ["Canada", "Canada"]) == 0.5
    assert following_rate(["yes", "no"], ["a", "b"], judge=lambda o, a: o == "yes") == 0.5
    with pytest.raises(ValueError, match="one per output"):
        following_rate(["x"], ["a", "b"])


def test_mann_whitney_hand():
    # x = [1, 2, 3], y = [2, 4]: pairs x>y: (3,2) = 1; ties: (2,2) = 0.5 -> U = 1.5; r = 2·1.5/6 - 1 = -0.5
    res = mann_whitney([1, 2, 3], [2, 4])
    assert isinstance(res, MannWhitney) and res.u == 1.5 and res.rank_biserial == approx(-0.5)
    assert 0 <= res.p <= 1
    # complete separation, exact one-sided p = 1/C(5,2) = 1/10
    res = mann_whitney([5, 6, 7], [1, 2], alternative="greater")
    assert (res.u, res.rank_biserial) == (6.0, 1.0) and res.p == approx(0.1)
    with pytest.raises(ValueError, match="at least one"):
        mann_whitney([], [1])


def test_bootstrap_hand():
    # resample means of [0, 1] are 0, .5, 1 with prob .25, .5, .25 -> 2.5th pct 0, 97.5th pct 1
    assert bootstrap_ci([0.0, 1.0], seed=0) == (0.5, 0.0, 1.0)
    assert bootstrap_ci([2.0], n_resamples=10) == (2.0, 2.0, 2.0)
    a, b = bootstrap_ci(np.arange(20), seed=1), bootstrap_ci(np.arange(20), seed=1)
    assert a == b and bootstrap_ci(np.arange(20), seed=2) != a  # deterministic given the seed
    # a stat without `axis` still works (apply_along_axis fallback)
    assert bootstrap_ci([1, 2, 3], stat=lambda v: float(max(v)), n_resamples=200)[0] == 3.0
    # HHR of hits_hard [1,0,1,0], hits_any [1,1,1,0]: 2/3
    p, lo, hi = bootstrap_ratio_ci([1, 0, 1, 0], [1, 1, 1, 0])
    assert p == approx(2 / 3) and 0 <= lo <= p <= hi <= 1
    assert bootstrap_ratio_ci([0, 0], [0, 0]) == (0.0, 0.0, 0.0)  # zero_division
    with pytest.raises(ValueError, match="ci="):
        bootstrap_ci([1, 2], ci=95)
    with pytest.raises(ValueError, match="one pair per question"):
        bootstrap_ratio_ci([1], [1, 1])


def test_bootstrap_large_is_chunked_and_fast():
    # 200k values x 1000 resamples would be 1.6 GB at once; chunking keeps memory small
    v = np.random.default_rng(0).random(200_000)
    p, lo, hi = bootstrap_ci(v, n_resamples=100)
    assert lo < p < hi and hi - lo < 0.01

# ---------------------------------------------------------------- properties

WORDS = ["paris", "lyon", "new", "york", "barack", "obama", "39", "7", "the", "berlin", "rome", "x"]
entity = st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join).filter(lambda s: brink_normalize(s) != "")
entities = st.lists(entity, min_size=1, max_size=5)
raw_text = st.text(alphabet=st.sampled_from(list("ab ,\n|;.-tTheHE<pad>1")), max_size=30)
PROPS = settings(max_examples=150, deadline=None)


@PROPS
@given(pred=st.one_of(raw_text, entities, st.lists(raw_text, max_size=4)), gold=entities, data=st.data())
def test_values_in_unit_interval(pred, gold, data):
    hard = data.draw(st.sampled_from(gold))
    s = brink_scores(pred, gold, hard)
    assert all(0.0 <= v <= 1.0 for v in s.values())
    assert s["precision"] <= 1.0
    q = permissive_scores(pred, gold, clip=True)
    assert all(0.0 <= v <= 1.0 for v in q.values())
    assert permissive_scores(pred, gold)["recall"] <= 1.0
    text = pred if isinstance(pred, str) else " ".join(pred)
    assert acc_r(text, gold) in (0, 1)
    assert exact_match(text, gold) in (0.0, 1.0)
    assert all(0.0 <= v <= 1.0 for v in token_f1(text, gold))


@PROPS
@given(gold=entities, data=st.data())
def test_prediction_equal_gold_is_best(gold, data):
    hard = data.draw(st.sampled_from(gold))
    assert brink_scores(gold, gold, hard) == dict(hits_any=1.0, precision=1.0, recall=1.0, f1=1.0, hits_hard=1.0)
    assert brink_scores(", ".join(gold), gold, hard)["f1"] == 1.0
    p = permissive_scores(gold, gold)
    assert p["hits_at_1"] == 1.0 and p["recall"] == 1.0
    g = gold[0]
    assert exact_match(g, g) == 1.0 and token_f1(g, g)[2] == 1.0 and acc_r(g, g) == 1
    r = rouge_scores(g, g)
    assert r["rouge1"] == 1.0 and r["rougeL"] == 1.0 and r["rouge2"] == (1.0 if len(g.split()) > 1 else 0.0)
    assert sentence_bleu(g, g) == approx(1.0)


@PROPS
@given(gold=entities, empty=st.sampled_from(["", [], " \n, ", ["", "<pad>"], "the"]))
def test_empty_prediction_is_worst(gold, empty):
    s = brink_scores(empty, gold, gold[0])
    assert s == dict(hits_any=0.0, precision=0.0, recall=0.0, f1=0.0, hits_hard=0.0)
    assert permissive_scores(empty, gold) == dict(hits_at_1=0.0, precision=0.0, recall=0.0, f1=0.0)
    if isinstance(empty, str):
        assert exact_match(empty, gold) == 0.0 and token_f1(empty, gold) == (0.0, 0.0, 0.0)
    if empty in ("", " \n, "):  # no tokens at all ('the' is a token for ACC_R and ROUGE)
        assert acc_r(empty, gold) == 0 and rouge_scores(empty, gold[0])["rouge1"] == 0.0


@PROPS
@given(pred=entities, gold=entities, data=st.data())
def test_adding_a_correct_answer_never_lowers_recall(pred, gold, data):
    extra = data.draw(st.sampled_from(gold))
    before, after = brink_scores(pred, gold), brink_scores(pred + [extra], gold)
    assert after["recall"] >= before["recall"] and after["hits_any"] >= before["hits_any"] and after["hits_any"] == 1.0
    pb, pa = permissive_scores(pred, gold), permissive_scores(pred + [extra], gold)
    assert pa["recall"] >= pb["recall"]


@PROPS
@given(pred=st.one_of(raw_text, entities, st.lists(raw_text, max_size=4)), gold=entities)
def test_strict_hit_implies_permissive_hit(pred, gold):
    assert brink_scores(pred, gold)["hits_any"] <= permissive_scores(pred, gold)["hits_at_1"]


@PROPS
@given(rows=st.lists(st.tuples(entities, entities, st.integers(0, 4)), min_size=1, max_size=8))
def test_hhr_at_most_one(rows):
    preds = [p for p, _, _ in rows]
    golds = [g for _, g, _ in rows]
    hards = [g[i % len(g)] for _, g, i in rows]
    r = brink_evaluate(preds, golds, hards)
    assert 0.0 <= r["hhr"] <= 1.0 and r["hits_hard"] <= r["hits_any"]
    per = brink_per_question(preds, golds, hards)
    assert (per["hits_hard"] <= per["hits_any"]).all()
    p, lo, hi = bootstrap_ratio_ci(per["hits_hard"], per["hits_any"], n_resamples=200)
    assert 0.0 <= lo <= hi <= 1.0 and p == approx(r["hhr"])


@PROPS
@given(n_q=st.integers(1, 6), n_e=st.integers(1, 25), seed=st.integers(0, 10_000))
def test_ranks_at_least_one_and_hits_monotone(n_q, n_e, seed):
    rng = np.random.default_rng(seed)
    scores = rng.integers(0, 4, size=(n_q, n_e)).astype(float)  # few values: many ties
    true = rng.integers(0, n_e, size=n_q)
    mask = rng.random((n_q, n_e)) < 0.3
    opt, mean, pess = (filtered_ranks(scores, true, mask, tie=t) for t in ("optimistic", "mean", "pessimistic"))
    assert (opt >= 1).all() and (opt <= mean).all() and (mean <= pess).all() and (pess <= n_e).all()
    assert (filtered_ranks(scores, true, mask, tie="optimistic") <= filtered_ranks(scores, true, None, tie="optimistic")).all()
    m = ranking_metrics(mean, ks=(1, 2, 3, 5, 10, 100))
    hits = [m[f"hits@{k}"] for k in (1, 2, 3, 5, 10, 100)]
    assert hits == sorted(hits) and 0 < m["mrr"] <= 1 and all(0 <= h <= 1 for h in hits)


@PROPS
@given(n_e=st.integers(2, 30), seed=st.integers(0, 10_000))
def test_unique_best_score_ranks_first(n_e, seed):
    s = np.random.default_rng(seed).random(n_e)
    assert filtered_ranks(s, [int(s.argmax())], tie="pessimistic").tolist() == [1.0]


finite = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)


@PROPS
@given(values=st.lists(finite, min_size=1, max_size=40), seed=st.integers(0, 100))
def test_bootstrap_contains_point(values, seed):
    p, lo, hi = bootstrap_ci(values, n_resamples=300, seed=seed)
    tol = 1e-9 * (1 + max(abs(x) for x in values))
    assert lo - tol <= p <= hi + tol


@PROPS
@given(values=st.lists(st.integers(0, 10), min_size=2, max_size=30).filter(lambda v: len(set(v)) > 1),
       seed=st.integers(0, 100))
def test_bootstrap_narrows_with_more_data(values, seed):
    # the same empirical distribution with 16x the questions: the standard error shrinks by 4
    _, lo, hi = bootstrap_ci(values, seed=seed)
    _, lo16, hi16 = bootstrap_ci(np.tile(values, 16), seed=seed)
    assert hi16 - lo16 < hi - lo


def _old_percentile_bootstrap(num, den, n_resamples, ci, seed, max_cells=4_000_000):
    "The hand-written numpy bootstrap that `bootstrap_ci` / `bootstrap_ratio_ci` replaced (chunked index draws)."
    rng, n = np.random.default_rng(seed), len(num)
    chunk, means, ratios = max(1, min(n_resamples, max_cells // n)), [], []
    for start in range(0, n_resamples, chunk):
        idx = rng.integers(0, n, size=(min(chunk, n_resamples - start), n))
        means.append(num[idx].mean(1))
        d = den[idx].sum(1)
        ratios.append(np.divide(num[idx].sum(1), d, out=np.zeros(len(d)), where=d != 0))
    q = [50 * (1 - ci), 50 * (1 + ci)]
    return np.percentile(np.concatenate(means), q), np.percentile(np.concatenate(ratios), q)


@pytest.mark.parametrize("n, seed, ci", [(2, 0, 0.95), (7, 3, 0.9), (120, 1, 0.95), (4001, 0, 0.95), (6000, 2, 0.99)])
def test_scipy_bootstrap_keeps_the_published_intervals(n, seed, ci):
    "scipy.stats.bootstrap (percentile, same seeded generator) gives the intervals of the hand-written version."
    rng = np.random.default_rng(100 + n)
    den = rng.integers(0, 2, n).astype(float)
    num = den * rng.integers(0, 2, n)
    old_mean, old_ratio = _old_percentile_bootstrap(num, den, 1000, ci, seed)
    np.testing.assert_allclose(bootstrap_ci(num, n_resamples=1000, ci=ci, seed=seed)[1:], old_mean, rtol=0, atol=1e-12)
    np.testing.assert_allclose(bootstrap_ratio_ci(num, den, n_resamples=1000, ci=ci, seed=seed)[1:], old_ratio, rtol=0, atol=1e-12)
