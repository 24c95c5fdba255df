"""Tests of kgrag_nb.studies.misk.rag (missing_knowledge_rag.txt): verbatim prompt lines, the JSON parser (hand cases and
hypothesis fuzzing), multi-KB rules, no leakage, hand-computed metrics, and one `llm` pipeline run on the embedded server."""
import json, re
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from kgrag_nb.studies.misk import rag as M
from kgrag_nb.metrics import exact_match

PROPS = settings(max_examples=150, deadline=None)


def deviations(settings: dict) -> list[str]:
    "What a misk artefact renders for an experiment's `settings`: the study's lines for its decoding, then the generator line."
    return M.STUDY.deviation_lines("rag", settings.get("decoding", "free")) + M.generator_deviation(settings)


# ---------------------------------------------------------------- prompts (App. A, Figs. 4-6, key literal lines)
@pytest.mark.parametrize("prompt,line", [
    (M.NQ_MISSING_PROMPT, "You are an knowledge expert and proficient in JSON formats."),
    (M.NQ_MISSING_PROMPT, "- The answer contain wrong information, and is inconsistant with contexts or facts."),
    (M.NQ_MISSING_PROMPT, '{"thought": str, "judge": bool, "missing_knowledge": list, "query": list}'),
    (M.NQ_MISSING_PROMPT, "- Query should be short, precise and closely related to query;"),
    (M.NQ_MISSING_PROMPT, "## First Round Answer\n{first round prediction}\n## Output\n"),
    (M.MED_MISSING_PROMPT, "You are a medical knowledge expert proficient in Chinese and JSON format."),
    (M.MED_MISSING_PROMPT, '{"thought": "No missing knowledge", "judge": false, "missing_knowledge": [], "query": []}'),
    (M.MED_MISSING_PROMPT, "- judge: whether knowledge is missing (True if missing, False otherwise);"),
    (M.NQ_ANSWER_PROMPT, "Q: Who is the original CEO of Google? A: Larry Page and Sergey Brin."),
    (M.NQ_ANSWER_PROMPT, "- If it is not mentioned in the context, briefly answer with your own knowledge."),
    (M.NQ_ANSWER_PROMPT, "## Missing Knowledge Context\n{thought}\n{context retrieved with missing knowledge query}\n"),
    (M.MED_ANSWER_PROMPT, "## Question: Why do I feel hungry after taking a nap at noon?"),
])
def test_prompt_lines_verbatim(prompt, line):
    assert line in prompt


def test_prompt_placeholders_fill():
    p = M.fill(M.NQ_MISSING_PROMPT, query="Q?", contexts="C", first_round_prediction="A")
    assert "{query}" not in p and "Q?\n## Context\nC\n## First Round Answer\nA" in p
    assert '{"thought": str' in p  # JSON braces stay literal


# ---------------------------------------------------------------- parser
def test_parser_hand_cases():
    ok = M.parse_json_verdict('x\n```json\n{"thought": "t", "judge": false, "missing_knowledge": [], "query": []}\n```')
    assert (ok["status"], ok["value"]["judge"]) == ("ok", False)
    last = M.parse_json_verdict('{"judge": true, "query": ["a"]} then {"judge": false, "query": []}')
    assert last["value"]["judge"] is False  # the last object wins
    echo = M.parse_json_verdict('{"thought": str, "judge": bool, "missing_knowledge": list, "query": list}')
    assert (echo["status"], echo["reason"], echo["value"]) == ("failed", "echoed schema", None)
    cut = M.parse_json_verdict('{"thought": "a", "judge": true, "query": ["x"]', finish_reason="length")
    assert cut["status"] == "failed" and cut["truncated"] and "truncated" in cut["reason"]
    # a complete object before a truncated one is still a failure: the output ends inside an object
    assert M.parse_json_verdict('{"judge": false} {"judge": tr')["status"] == "failed"
    rep = M.parse_json_verdict("{'thought': 'x', 'judge': 'True', 'query': 'q',}")
    assert (rep["status"], rep["value"]["judge"], rep["value"]["query"]) == ("repaired", True, ["q"])


_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=30)
_obj = st.fixed_dictionaries({"thought": _text, "judge": st.booleans(),
                              "missing_knowledge": st.lists(_text, max_size=3), "query": st.lists(_text, max_size=3)})
_prefix = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="{}\"'"), max_size=40)


@PROPS
@given(_obj, _prefix, st.booleans())
def test_parser_roundtrip_json(obj, prefix, fenced):
    s = json.dumps(obj, ensure_ascii=False)
    r = M.parse_json_verdict(prefix + ("\n```json\n" + s + "\n```" if fenced else s))
    assert r["status"] == "ok" and {k: r["value"][k] for k in obj} == obj


@PROPS
@given(_obj, _prefix)
def test_parser_python_literal_is_repaired(obj, prefix):
    r = M.parse_json_verdict(prefix + repr(obj))
    assert r["status"] in ("ok", "repaired") and r["value"]["judge"] is obj["judge"] and r["value"]["query"] == obj["query"]


@PROPS
@given(_obj, st.data())
def test_parser_truncation_never_parses(obj, data):
    s = json.dumps(obj, ensure_ascii=False)
    cut = data.draw(st.integers(1, len(s) - 1))
    r = M.parse_json_verdict(s[:cut], finish_reason="length")
    assert r["status"] == "failed" and r["value"] is None


@PROPS
@given(st.text(max_size=200))
def test_parser_total_on_any_text(text):
    r = M.parse_json_verdict(text)
    assert r["status"] in M.PARSE_STATUSES
    assert (r["value"] is None) == (r["status"] == "failed")
    if r["value"] is not None: assert isinstance(r["value"]["judge"], bool)


# ---------------------------------------------------------------- multi-KB
def _kbs():
    wiki = M.KnowledgeBase("Wiki", ["高血压 饮食 注意", "党参 功效", "高血压 饮食 注意", "感冒 发烧"], "wiki", backend="bm25", lang="zh")
    qa = M.KnowledgeBase("QA Pairs", ["Q: 高血压能吃党参吗 A: 可以", "党参 功效", "Q: 感冒怎么办 A: 多喝水"], "qa", backend="bm25", lang="zh")
    return wiki, qa, M.KnowledgeBase.merged("Merged KB", [wiki, qa])


def test_multi_kb_separate_indexes_and_merged_union():
    wiki, qa, mk = _kbs()
    assert (wiki.n_raw, wiki.n_dedup, qa.n_dedup) == (4, 3, 3)
    assert mk.n_raw == 6 and mk.n_dedup == 5  # "党参 功效" is in both: the union has 3 + 3 - 1 texts
    assert len({id(wiki.index), id(qa.index), id(mk.index)}) == 3
    assert dict(zip(mk.texts, mk.tags)) == {**dict(zip(qa.texts, qa.tags)), **dict(zip(wiki.texts, wiki.tags))}
    assert len(set(mk.md5s)) == mk.n_dedup
    stats = M.kb_statistics([wiki, qa, mk], "toy")
    assert list(stats["chunks_dedup"]) == [3, 3, 5] and list(stats["chunks_raw"]) == [4, 3, 6]


def test_second_retrieval_budget_round_robin_and_dedup():
    wiki, qa, mk = _kbs()
    first = mk.search(["党参"], 1)[0]
    got = M.second_retrieval(mk, ["党参 功效", "感冒"], 2, [c.md5 for c in first])
    assert len(got) == 2 and not {c.md5 for c in got} & {c.md5 for c in first}
    assert all(c.kb in ("wiki", "qa") for c in got)
    assert M.second_retrieval(mk, [], 2) == []


# ---------------------------------------------------------------- no leakage
def test_no_leakage_nq_and_medical():
    recs = [dict(question=f"question number {i}", answers=[f"a{i}"], passage=f"passage {i}") for i in range(30)]
    s = M.nq_setup(recs, 5, 20, ["d"], 1, seed=3)
    assert not M.leaks(s["qa"], s["forbidden"]) and len(s["qa"]) == 15
    # every record twice (the copy with other whitespace): 40 rows, 4 tested, their 4 copies must not reach the KB
    df = pd.DataFrame(dict(query=[f"问题{i}" for i in range(20)] + [f" 问题{i} " for i in range(20)],
                           answer=[f"回答{i}" for i in range(20)] * 2))
    m = M.medical_setup(df, 4, 100, 2, ["高血压", "感冒"], seed=1)
    tested = {q["question"].strip() for q in m["questions"]}
    assert not M.leaks(m["qa"], m["forbidden"])
    assert set(m["qa"]) == {f"Q: 问题{i} A: 回答{i}" for i in range(20) if f"问题{i}" not in tested}  # every other record kept
    assert M.leaks(["Q: 问题1 A: x"], ["问题1"])


# ---------------------------------------------------------------- metrics (hand-computed)
def test_strict_vs_containment_em_and_f1():
    preds = pd.DataFrame(dict(prediction=["Larry Page", "It was Larry Page.", "Sergey"], answers=[["larry page"]] * 3))
    s = M.nq_scores(preds)
    assert list(s["em"]) == [1.0, 0.0, 0.0] and list(s["em_contain"]) == [1.0, 1.0, 0.0]
    # "it was larry page" vs "larry page": P = 2/4, R = 2/2, F1 = 2*0.5*1/1.5 = 2/3
    assert s["f1"].round(4).tolist() == [1.0, 0.6667, 0.0]
    assert (s["f1"] >= s["em"]).all()


def test_chinese_rouge_bleu_word_and_char():
    from kgrag_nb.metrics import rouge_scores, CharTokenizer
    # words: 高血压|可以|吃|党参 vs 高血压|不能|吃|党参 -> 3 of 4 unigrams, bigrams 吃党参 only 1 of 3
    r = rouge_scores("高血压可以吃党参", "高血压不能吃党参", tokenizer=M.JiebaTokenizer())
    assert round(r["rouge1"], 4) == 0.75 and round(r["rouge2"], 4) == round(1 / 3, 4)
    # characters: 8 each, 6 shared -> 0.75
    assert round(rouge_scores("高血压可以吃党参", "高血压不能吃党参", tokenizer=CharTokenizer())["rouge1"], 4) == 0.75
    b = M.corpus_bleu(["高血压可以吃党参"], ["高血压可以吃党参"], "word")
    assert all(round(v, 6) == 1.0 for v in b.values())
    # word BLEU-1 = 3/4 unigram precision (no brevity penalty, equal lengths)
    assert round(M.corpus_bleu(["高血压可以吃党参"], ["高血压不能吃党参"], "word")["bleu1"], 4) == 0.75
    assert M.corpus_bleu(["高血压可以吃党参"], ["高血压不能吃党参"], "char")["bleu2"] > 0


def test_deterministic_recall_eq3():
    gt = ["The first Nobel Prize in Physics was awarded to Wilhelm Röntgen"]
    assert M.attributed_det("Q: first nobel prize physics? A: Wilhelm Röntgen", gt)
    assert M.recall_eq3([True, True], 1) == 1.0 and M.recall_eq3([False, True, False], 2) == 0.5


def test_token_recall_direction_by_hand():
    gt = "The capital of France is Paris."  # normalised: capital, of, france, is, paris (5 tokens)
    # every GT token in the context -> attributed
    assert M.token_recall("Paris is the capital of France", gt) == 1.0 and M.attributed_det("Paris is the capital of France", [gt])
    # the GT among 40 other words: recall still 1; the old direction (5 of the context's 45 tokens in GT) said no
    long = "Paris is the capital of France. " + " ".join(f"filler{i}" for i in range(40))
    assert M.token_recall(long, gt) == 1.0 and M.attributed_det(long, [gt], tau=0.5)
    # 2 of 5 GT tokens (is, paris): 0.4, attributed at tau 0.35, not at 0.5
    assert M.token_recall("Paris is big", gt) == 0.4
    assert M.attributed_det("Paris is big", [gt], tau=0.35) and not M.attributed_det("Paris is big", [gt], tau=0.5)
    # Chinese: jieba words of the reference answer found inside a longer consultation chunk
    ans = "高血压可以吃党参"
    assert M.token_recall("Q: 头晕怎么办 A: 高血压可以吃党参，注意休息，多喝水", ans, "zh") == 1.0
    assert M.attributed_det("Q: 头晕怎么办 A: 高血压可以吃党参，注意休息，多喝水", [ans], "zh")
    assert M.TAU == {"en": M.TAU_EN, "zh": M.TAU_ZH}


def test_calibrate_tau_by_hand():
    pairs = pd.DataFrame(dict(gt=["alpha beta gamma delta"] * 4, label=[True, True, False, False],
                              context=["alpha beta gamma delta x", "alpha beta y", "alpha z", "w"]))
    # recalls 1.0, 0.5 (positives), 0.25, 0.0 (negatives); balanced accuracy 0.75, 1.0, 0.75, 0.75 on the grid
    c = M.calibrate_tau(pairs, "en", grid=(0.25, 0.5, 0.75, 1.0))
    assert (c["tau"], c["balanced_accuracy"], c["agreement"], c["n_pos"], c["n_neg"]) == (0.5, 1.0, 1.0, 2, 2)
    assert M.calibrate_tau(pairs, "en", grid=(0.3, 0.4, 0.5, 0.75))["tau"] == 0.4  # three ties: the middle one
    with pytest.raises(ValueError, match="positive and negative"):
        M.calibrate_tau(pairs[pairs["label"]], "en")
    cp = M.verbatim_pairs(["One. Two. Three.", "Four."], ["kb one", "kb two", "Four."], "en", seed=0)
    assert cp["label"].tolist() == [True, False, True, False]
    assert set(cp.loc[~cp["label"], "context"]) <= {"kb one", "kb two", "Four."} and cp["context"].iloc[3] != "Four."
    assert cp["context"].iloc[2].startswith("Four. ")  # the positive states the item, then a KB chunk


# ---------------------------------------------------------------- tau calibration: intervals and pairs not verbatim
def test_agreement_ci_is_the_exact_interval_by_hand():
    """The agreement interval is Clopper-Pearson (scipy's binomtest), not a hand-written or normal interval."""
    from scipy.stats import beta
    # k = n: (alpha/2)^(1/n) .. 1; k = 0: 0 .. 1 - (alpha/2)^(1/n)  (closed forms of the exact interval)
    p, lo, hi = M.agreement_ci([True] * 10)
    assert p == 1.0 and hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 10), abs=1e-9)  # 0.6915
    p, lo, hi = M.agreement_ci([False] * 20)
    assert p == 0.0 and lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 20), abs=1e-9)  # 0.1684
    # 9 of 10: beta quantiles Beta(0.025; 9, 2) and Beta(0.975; 10, 1) = 0.975^(1/10)
    p, lo, hi = M.agreement_ci([True] * 9 + [False])
    assert p == 0.9 and lo == pytest.approx(beta.ppf(0.025, 9, 2), abs=1e-9) and hi == pytest.approx(0.975 ** 0.1, abs=1e-9)
    assert round(lo, 4) == 0.5550
    with pytest.raises(ValueError, match="empty"):
        M.agreement_ci([])


def test_balanced_accuracy_ci_stratified_bootstrap_by_hand():
    """Balanced accuracy resamples positives and negatives separately (scipy.stats.bootstrap), seeded."""
    pred, label = [True, True, True, True, False], [True, True, True, False, False]
    # TPR = 3/3 always; TNR resampled from [wrong, right] is 0, 1/2 or 1, so BA is 0.5, 0.75 or 1: the 95% interval 0.5..1
    ba, lo, hi = M.balanced_accuracy_ci(pred, label, seed=0)
    assert (ba, lo, hi) == (0.75, 0.5, 1.0)
    assert M.balanced_accuracy_ci(pred, label, seed=0) == M.balanced_accuracy_ci(pred, label, seed=0)  # deterministic
    assert M.balanced_accuracy_ci([True, True, False, False], [True, True, False, False]) == (1.0, 1.0, 1.0)
    with pytest.raises(ValueError, match="positive and negative"):
        M.balanced_accuracy_ci([True, False], [True, True])


def test_tau_table_by_hand():
    pairs = pd.DataFrame(dict(gt=["alpha beta gamma delta"] * 4, label=[True, True, False, False],
                              context=["alpha beta gamma delta x", "alpha beta y", "alpha z", "w"],
                              kind=["window", "reordered", "random", "same_topic"]))
    t = M.tau_table(pairs, "en", taus=(0.25, 0.5)).set_index("tau")
    # tau 0.25: predictions T, T, T, F -> 3 of 4 agree, BA 0.75; tau 0.5: all agree
    assert t.loc[0.25, "agreement"] == 0.75 and t.loc[0.5, "agreement"] == 1.0 and t.loc[0.25, "balanced_accuracy"] == 0.75
    assert (t.loc[0.5, "agreement_low"], t.loc[0.5, "agreement_high"]) == M.agreement_ci([True] * 4)[1:]
    assert t["n"].tolist() == [4, 4]
    k = M.kind_table(pairs, "en", taus=(0.25,)).set_index("kind")
    assert k.loc["random", "correct"] == 0.0 and k.loc["window", "correct"] == 1.0 and k.loc["window", "label"]


def _sentences_verbatim(row, lang):
    return any(s in row["context"] for s in M.sentences(row["gt"], lang) if len(s) > 1)


def test_hard_pairs_by_hand():
    """Positives are partial (a window cut at any word, clauses reordered and dropped) and state the answer; negatives
    never state the item or its answer; the QA-pair form is a diagnostic kind."""
    gt = "Alpha beta gamma, delta epsilon. Zeta eta theta, kappa lambda mu. Nu xi omicron, pi rho sigma."
    items = [dict(gt=gt, answers=("kappa lambda",), qa="Q: which? A: kappa lambda", same_topic=["Alpha sigma tau upsilon."])]
    kb = ["phi chi psi", "omega one two", "kappa lambda three", gt]
    p = M.hard_pairs(items, kb, "en", seed=0)
    assert p.set_index("kind")["label"].to_dict() == dict(window=True, reordered=True, qa_pair=True, random=False,
                                                           same_topic=False)
    pos = p[p["label"]]
    assert pos["context"].map(lambda c: "kappa lambda" in c).all()  # every positive states the answer
    neg = p[~p["label"]]
    assert not neg["context"].str.contains("kappa lambda").any() and gt not in set(neg["context"])
    assert p.loc[p["kind"] == "same_topic", "context"].item() == "Alpha sigma tau upsilon."
    r = p.loc[p["kind"] == "reordered", "context"].item()
    assert r != gt and set(M.clauses(r)) <= set(M.clauses(gt))  # the item's clauses, some dropped, in another order
    assert p.equals(M.hard_pairs(items, kb, "en", seed=0))  # seeded
    # Chinese: the whole reference answer is the answer; clauses split at Chinese punctuation
    zh = M.hard_pairs([dict(gt="高血压可以吃党参，注意休息。多喝水，少吃盐。", same_topic=["Q: 高血压头痛 A: 多休息"])],
                      ["Q: 感冒 A: 多喝水", "糖尿病：症状：多饮"], "zh", seed=0)
    assert zh["kind"].tolist() == ["window", "reordered", "random", "same_topic"] and zh["label"].tolist() == [True, True, False, False]
    assert M.clauses("高血压可以吃党参，注意休息。多喝水", "zh") == ["高血压可以吃党参，", "注意休息。", "多喝水"]


@pytest.fixture(scope="module")
def tau_pairs():
    return {(lang, c): M.tau_pairs(lang, c) for lang in ("en", "zh") for c in ("verbatim", "hard")}


def test_tau_calibration_pairs_are_not_verbatim_by_construction(tau_pairs):
    """Before, every calibration positive held half of the GT item's sentences verbatim (agreement guaranteed by
    construction); the calibration now has partial / reordered positives and same-topic hard negatives."""
    for lang in ("en", "zh"):
        old, new = tau_pairs[(lang, "verbatim")], tau_pairs[(lang, "hard")]
        # the old construction: a positive holds its sampled sentences verbatim (short of a one-character "sentence")
        assert old[old["label"]].apply(_sentences_verbatim, axis=1, lang=lang).mean() >= 0.99
        cal = new[new["kind"].isin(M.CALIBRATION_KINDS)]
        pos = cal[cal["label"]]
        no_verbatim = ~pos.apply(_sentences_verbatim, axis=1, lang=lang)
        assert no_verbatim.mean() >= 0.3, (lang, no_verbatim.mean())
        assert set(cal["kind"]) == set(M.CALIBRATION_KINDS) and cal["label"].any() and (~cal["label"]).any()
        assert (cal["kind"] == "same_topic").sum() >= 90  # a same-article / same-subject negative for (nearly) every item
    assert set(tau_pairs[("en", "hard")]["kind"]) - set(M.CALIBRATION_KINDS) == {"qa_pair"}


def test_tau_constants_are_the_calibration_on_the_data(tau_pairs):
    # the named constants are what calibrate_tau finds on the hard pairs from the mirror (seed 0, 100 items per language)
    for lang in ("en", "zh"):
        c = M.tau_calibration(lang)
        assert c["tau"] == M.TAU[lang] and c["n_pos"] >= 180 and c["n_neg"] >= 180
        cal = tau_pairs[(lang, "hard")]
        assert c == M.calibrate_tau(cal[cal["kind"].isin(M.CALIBRATION_KINDS)], lang)
    ba = M.tau_before_after(taus=(M.TAU_EN,), pairs=tau_pairs)
    assert set(ba["pairs"]) == {"verbatim", "hard"} and set(ba["lang"]) == {"en", "zh"} and len(ba) == 4
    assert (ba["agreement_low"] <= ba["agreement"]).all() and (ba["balanced_accuracy"] <= ba["balanced_accuracy_high"]).all()
    lines = M.calibration_lines({"en": M.TAU_EN, "zh": M.TAU_ZH}, pairs=tau_pairs)
    assert len(lines) == 2 and lines[0].startswith("token-recall judge, en: tau=0.35") and "95% CI" in lines[0]
    assert "qa_pair credited" in lines[0] and "qa_pair" not in lines[1]  # the diagnostic kind, reported beside

    class Run:  # what an artefact passes: anything with record_note
        notes = []
        def record_note(self, text): self.notes.append(text)
    run = Run()
    got = M.record_calibration(run, {"tau": 0.5}, ("en",), pairs=tau_pairs)  # a profile's scalar tau
    assert run.notes == got and len(got) == 1 and got[0].startswith("token-recall judge, en: tau=0.5, agreement")


def test_judges_labelled_llm_under_paper_headers():
    g = pd.DataFrame(dict(topk=2, cr_det=[1.0, 0.0], cr_det_origq=[1.0, 1.0], cr_llm=[0.0, None], cr_llm_origq=[1.0, None]))
    rc = M._recall_cols(g, 0)
    assert (rc["Context_Recall_MisQ"], rc["Context_Recall_OrigQ"]) == (0.0, 100.0)  # the LLM judge (question 0)
    assert (rc["Context_Recall_MisQ (token recall, ours)"], rc["Context_Recall_OrigQ (token recall, ours)"]) == (50.0, 100.0)
    p4 = pd.DataFrame(dict(qid=[0, 1], topk=2, row=["2-way retrieval"] * 2, cr_det_qa=[1.0, 0.0], cr_det_wiki=[0.5, 0.5],
                           cr_llm_qa=[0.0, None], cr_llm_wiki=[1.0, None], fallback=[None, None]))
    r = M.table4(p4, "NQ").iloc[0]
    assert (r["QA Pairs Recall"], r["Wiki Recall"], r["n LLM-judged"]) == (0.0, 100.0, 1)
    assert (r["QA Pairs Recall (token recall, ours)"], r["Wiki Recall (token recall, ours)"]) == (50.0, 50.0)


# ---------------------------------------------------------------- the pipeline on the real embedded server
@pytest.mark.llm
def test_pipeline_two_questions_embedded(embedded_server, tmp_path):
    from kgrag_nb.config import get_config
    from kgrag_nb.llm import LLMClient
    cfg = get_config()
    client = LLMClient.from_config(cfg, base_url=embedded_server.url)
    qs = [dict(question="who wrote the declaration of independence", answers=["Thomas Jefferson"]),
          dict(question="what is the capital of france", answers=["Paris"])]
    wiki = M.KnowledgeBase("Wiki", ["Thomas Jefferson wrote the Declaration of Independence in 1776.",
                                    "Paris is the capital and largest city of France.", "The Nile is a river."], "wiki")
    qa = M.KnowledgeBase("QA Pairs", ["Q: who was the third US president A: Thomas Jefferson",
                                      "Q: largest city of france A: Paris"], "qa")
    kbs = dict(wiki=wiki, qa=qa, merged=M.KnowledgeBase.merged("Merged KB", [wiki, qa]))
    preds = M.run_pipeline(client, "nq", qs, kbs, topks=(2,), n_ctx=2048, max_tokens=16, max_tokens_missing=64)
    assert len(preds) == 2 * len(M.ROWS) and set(preds["row"]) == set(M.ROWS)
    misk = preds[preds["row"].str.startswith("Misk")]
    assert misk["parse_status"].isin(M.PARSE_STATUSES).all()
    # a failed parse or judge=false never gets a second retrieval
    assert (misk.loc[misk["parse_status"] == "failed", "fallback"]).all()
    assert (misk.loc[misk["judge"] != True, "fallback"]).all()  # noqa: E712
    t1 = M.table1(M.add_recall(preds, [["Thomas Jefferson Declaration of Independence"], ["Paris capital of France"]]))
    assert (t1["F1"] >= t1["EM"] - 1e-9).all() and len(t1) == len(M.ROWS)


# ---------------------------------------------------------------- settings: n_ctx, judge endpoint at full
def test_embedded_n_ctx_is_a_setting():
    from kgrag_nb.config import get_config
    from kgrag_nb.serve import EmbeddedServer
    cfg = get_config(embedded_n_ctx=4096)
    srv = EmbeddedServer(cfg)
    argv = srv._command(Path("m.gguf"))
    assert srv.n_ctx == 4096 and argv[argv.index("--n_ctx") + 1] == "4096"
    assert EmbeddedServer(cfg, n_ctx=1024).n_ctx == 1024 and get_config().embedded_n_ctx == 2048


def test_full_profile_never_reuses_the_generator_as_judge():
    with pytest.raises(ValueError, match="judge_url"):
        M.judge_client(None, object(), None, None, "full")
    gen = type("C", (), {"model": "g"})()
    assert M.judge_client(None, gen, None, None, "smoke")[0] is gen


# ---------------------------------------------------------------- per-dataset generators (issue 22 item 4)
def test_generator_selection_by_hand():
    run = "gemma-3-270m"
    same = {"model": run, "url": None}
    assert M.generator_models({}, run) == {"nq": same, "med": same}  # empty: the run's model for both
    assert M.generator_models(None, None) == {"nq": {"model": None, "url": None}, "med": {"model": None, "url": None}}
    full = {"nq": "meta-llama/Llama-3.3-70B-Instruct", "med": "Qwen/Qwen2.5-72B-Instruct"}  # the paper's (§3.3, §3.4)
    assert M.generator_models(full, run) == {"nq": {"model": "meta-llama/Llama-3.3-70B-Instruct", "url": None},
                                             "med": {"model": "Qwen/Qwen2.5-72B-Instruct", "url": None}}
    assert M.PAPER_GENERATORS == full
    one = M.generator_models({"med": "Qwen/Qwen2.5-72B-Instruct"}, run)  # a dataset left out keeps the run's model
    assert one == {"nq": same, "med": {"model": "Qwen/Qwen2.5-72B-Instruct", "url": None}}
    own = M.generator_models({"med": {"model": "q", "url": "http://h:8002/v1"}, "nq": {"model": "l"}}, run)  # endpoint per model
    assert own == {"nq": {"model": "l", "url": None}, "med": {"model": "q", "url": "http://h:8002/v1"}}


def test_generator_unknown_dataset_key_names_the_key_and_the_fix():
    with pytest.raises(ValueError) as e:
        M.generator_models({"nq": "l", "medical": "q"}, "m")
    msg = str(e.value)
    assert "['medical']" in msg and "['nq', 'med']" in msg and "studies.yaml" in msg and "misk_runs" in msg
    with pytest.raises(ValueError, match=r"generators\['med'\].*url"):
        M.generator_models({"med": {"url": "http://h:8002/v1"}}, "m")  # an endpoint without a model
    with pytest.raises(ValueError, match=r"generators\['nq'\]"):
        M.generator_models({"nq": 3}, "m")


def test_judges_follow_the_generators_below_full():
    l, q = type("C", (), {"model": "l"})(), type("C", (), {"model": "q"})()
    js, desc = M.judge_clients(None, {"nq": l, "med": l}, None, None, "tiny")  # one generator: as before
    assert js == {"nq": l, "med": l} and desc == "l (the generator; tiny profile)"
    js, desc = M.judge_clients(None, {"nq": l, "med": q}, None, None, "smoke")
    assert js["nq"] is l and js["med"] is q and desc == "each dataset's generator (nq: l, med: q; smoke profile)"
    with pytest.raises(ValueError, match="judge_url"):
        M.judge_clients(None, {"nq": l, "med": q}, None, None, "full")


def test_generator_in_captions_and_deviations():
    s = M.run_settings(2048, [2], 0.5) | {"nq": {"generator": "meta-llama/Llama-3.3-70B-Instruct"},
                                         "med": {"generator": "gemma-3-270m"}}
    cap = M.caption("Table 3", s)
    assert "nq: generator=meta-llama/Llama-3.3-70B-Instruct" in cap and "med: generator=gemma-3-270m" in cap
    assert M.generator_of(s, "med") == "gemma-3-270m" and M.generator_of({}, "med", "old") == "old"
    dev = deviations(s)
    assert len(dev) == len(M.STUDY.deviations["rag"]) + 1 and "med by gemma-3-270m" in dev[-1] and "Qwen2.5-72B-Instruct" in dev[-1]
    s["med"]["generator"] = "Qwen/Qwen2.5-72B-Instruct"  # both the paper's: no generator line
    assert deviations(s) == list(M.STUDY.deviations["rag"])


def test_miss_rate_and_rates_per_row():
    rows = [dict(qid=i, question="q", answers=["a"], row="Misk Wiki+Wiki", topk=2, prediction="a", clipped=0,
                 contexts=[], parse_status=s, judge=j, missing_truncated=t, fallback=f)
            for i, (s, j, t, f) in enumerate([("ok", True, False, False), ("failed", None, True, True),
                                              ("repaired", False, False, True), ("failed", None, False, True)])]
    t1 = M.table1(pd.DataFrame(rows))
    r = t1.iloc[0]
    assert (r["Miss_rate"], r["parse failed %"], r["parse repaired %"], r["truncated %"], r["fallback %"]) == (25, 50, 25, 25, 75)


# ---------------------------------------------------------------- decoding (issue 21): constraints and their parsers
from kgrag_nb.llm import Constraint, fill_constraint  # noqa: E402

CONSTRAINTS = {"MISSING_JSON": (M.MISSING_JSON, lambda t: M.parse_json_verdict(t)["status"]),
               "ATTRIBUTION": (M.ATTRIBUTION, lambda t: M.parse_attribution(t)["status"])}


@pytest.mark.parametrize("name", CONSTRAINTS)
def test_every_constraint_filled_by_the_stub_parses(name):
    "Every prompt sent with a constraint is parseable by its parser when the stub fills the constraint (issue 21)."
    c, status = CONSTRAINTS[name]
    assert isinstance(c, Constraint)
    for seed in range(3):
        text = fill_constraint(c.spec(), seed=seed)
        assert status(text) == "ok", (name, text)
    if name == "MISSING_JSON":  # as the constrained pipeline sends it: reasoning, the fence, then the block
        assert status("Some reasoning." + M.MISSING_BLOCK_OPEN + fill_constraint(c.spec())) == "ok"


def test_missing_schema_branches_follow_fig4():
    "judge=true -> 1-3 queries (the stub's minimal fill has one: the second retrieval fires); judge=false -> empty lists."
    yes = M.parse_json_verdict(fill_constraint(M.MISSING_JSON.spec()))["value"]
    no = M.parse_json_verdict(fill_constraint({"json": M.MISSING_SCHEMA["anyOf"][1]}))["value"]
    assert yes["judge"] is True and 1 <= len(yes["query"]) <= 3 and all(q.strip() for q in yes["query"])
    assert no["judge"] is False and no["query"] == [] and no["missing_knowledge"] == []


class _StubClient:
    "A client answering unconstrained calls with free text and constrained ones with `fill_constraint` (the stub's rule)."
    model = "stub"

    def __init__(self): self.calls = []

    def complete(self, prompts, max_tokens=16, stop=None, temperature=0.0, return_records=False, constraint=None, n=1, **kw):
        self.calls.append(constraint)
        texts = [[fill_constraint(constraint.spec()) if constraint is not None else " Paris is the answer"] for _ in prompts]
        return texts, [[{"finish_reason": "stop"}] for _ in prompts]


def _toy_kbs():
    wiki = M.KnowledgeBase("Wiki", ["paris capital france", "nile river egypt", "jefferson declaration"], "wiki", backend="bm25")
    qa = M.KnowledgeBase("QA Pairs", ["Q: capital of france A: paris", "Q: river of egypt A: nile"], "qa", backend="bm25")
    return dict(wiki=wiki, qa=qa, merged=M.KnowledgeBase.merged("Merged KB", [wiki, qa]))


@pytest.mark.parametrize("decoding", ["constrained", "decoupled"])
def test_constrained_pipeline_fires_on_every_parsed_judge_true(decoding):
    qs = [dict(question="capital of france", answers=["Paris"]), dict(question="river of egypt", answers=["Nile"])]
    cl = _StubClient()
    preds = M.run_pipeline(cl, "nq", qs, _toy_kbs(), topks=(2,), decoding=decoding)
    misk = preds[preds["row"].str.startswith("Misk")]
    assert (misk["parse_status"] == "ok").all() and (misk["judge"] == True).all()  # noqa: E712
    assert not misk["fallback"].any() and (misk["decoding"] == decoding).all()
    assert M.MISSING_JSON in cl.calls and (M.format_rates(preds)["misk_rows_judge_true_fired"] == len(misk))
    free = M.run_pipeline(_StubClient(), "nq", qs, _toy_kbs(), topks=(2,))  # free: the paper's, nothing constrained
    assert free.loc[free["row"].str.startswith("Misk"), "fallback"].all()
    with pytest.raises(ValueError, match="decoding"):
        M.run_pipeline(cl, "nq", qs, _toy_kbs(), topks=(2,), decoding="json")


def test_deviations_list_decoding_only_when_not_free():
    assert deviations({"decoding": "free"}) == list(M.STUDY.deviations["rag"]) and deviations({}) == list(M.STUDY.deviations["rag"])
    assert deviations({"decoding": "constrained"})[-1].startswith("Decoding: the paper decodes freely")
    assert any("decoding: decoupled" in l for l in M.settings_lines(M.run_settings(2048, [2], 0.5, decoding="decoupled")))


@pytest.mark.llm
def test_constrained_fig4_step_embedded(embedded_server):
    "The constrained Fig. 4 call (free reasoning, then the schema-constrained block) on the real server parses."
    from kgrag_nb.config import get_config
    from kgrag_nb.llm import LLMClient
    client = LLMClient.from_config(get_config(), base_url=embedded_server.url)
    prompt = M.fill(M.NQ_MISSING_PROMPT, query="who wrote the declaration of independence",
                    contexts=M.format_contexts([M.Chunk("The Nile is a river in Africa.", "wiki")]), first_round_prediction="the Nile")
    out = M.complete_as(client, [prompt], 192, ["\n## ", "\n\n\n"], M.MISSING_JSON, "constrained", reason_tokens=48,
                        reason_stop=M.MISSING_REASON_STOP, lead=M.MISSING_BLOCK_OPEN)[0]
    r = M.parse_json_verdict(out["text"], finish_reason=out["finish_reason"])
    assert r["status"] in ("ok", "repaired"), (r, out)
    assert isinstance(r["value"]["judge"], bool) and (bool(r["value"]["query"]) == r["value"]["judge"]), r
    attr = M.complete_as(client, [M.fill(M.JUDGE_ATTR_PROMPT, gt="Jefferson wrote it.", context="The Nile is a river.")], 24, ["\n"],
                         M.ATTRIBUTION, "constrained")[0]
    assert M.parse_attribution(attr["text"])["status"] == "ok", attr


# ---------------------------------------------------------------- format tax (issue 21 item 4)
def test_format_tax_declaration_and_bad_decoding():
    arm = M.STUDY.arm("misk").as_dict()
    assert set(arm) == {"study", "step", "metric", "paper", "settings"} and arm["study"] == "misk"
    assert "100 NQ passages + 100 distractors" in arm["settings"]  # where the arm differs from the paper
    assert "37.11" in arm["paper"] and "Table 1" in arm["paper"]
    with pytest.raises(ValueError, match="decoding"):
        M.format_tax_arm(None, "json", 1)
    with pytest.raises(ValueError, match="n=0"):
        M.format_tax_arm(None, "free", 0)


@pytest.mark.llm
def test_format_tax_arm_constrained_embedded(embedded_server):
    "The MisK format-tax arm (constrained) on the real server: one record with the contract's keys and types."
    from kgrag_nb.config import get_config
    from kgrag_nb.llm import LLMClient
    from _format_tax import one_constrained_record
    r = one_constrained_record(M.format_tax_arm, LLMClient.from_config(get_config(), base_url=embedded_server.url), "misk")
    assert r["item"] == "nq:0:0"
    assert isinstance(r["fired"], bool) and r["finished"] is None and r["kept"] is None
    assert r["fired"] == (r["judge"] is True and r["fallback_reason"] == "")  # fired only on a parsed judge=true
    assert (r["parsed"] == 1.0) == (r["parse_status"] != "failed")


@pytest.mark.slow  # three arms, each embeds its ~300-passage KB (about 15 s on 2 busy cores)
def test_format_tax_arm_fires_with_the_stub():
    "The arm on 2 NQ questions with the stub's rule: free never parses (no second retrieval); constrained and decoupled"
    " parse every Fig. 4 output, and the stub's judge=true with one query fires the second retrieval."
    from kgrag_nb.metrics import _check_tax_record
    arms = {d: M.format_tax_arm(_StubClient(), d, 2) for d in ("free", "constrained", "decoupled")}
    assert [r["item"] for r in arms["free"]] == [r["item"] for r in arms["decoupled"]] == ["nq:0:0", "nq:0:1"]
    for d, out in arms.items():
        assert all(_check_tax_record(r, d) for r in out)
    assert all((r["parsed"], r["fired"], r["fallback_reason"]) == (0.0, False, "parse failed") for r in arms["free"])
    for d in ("constrained", "decoupled"):
        assert all((r["parsed"], r["judge"], r["fired"], len(r["mis_queries"])) == (1.0, True, True, 1) for r in arms[d])
        assert all(r["second_chunks"] == M.FT_TOPK // 2 for r in arms[d])


# ---------------------------------------------------------------- run_pipeline's steps, each by hand (issue 24)
def test_pipeline_checks_and_room_by_hand():
    assert M._room_chars(4096, 32, 3.0) == (4096 - 32 - 16) * 3 and M._room_chars(2048, 64, 0.8) == int(1968 * 0.8)
    kbs = dict(wiki=None, qa=None, merged=None)
    for bad, msg in [(("web", (2,), kbs, "free"), "dataset"), (("nq", (2,), kbs, "json"), "decoding"),
                     (("nq", (2, 3), kbs, "free"), r"topks \[3\]"), (("nq", (0,), kbs, "free"), r"topks \[0\]"),
                     (("med", (2,), dict(wiki=None), "free"), r"\['merged', 'qa'\]")]:
        with pytest.raises(ValueError, match=msg): M._check_pipeline(*bad)
    M._check_pipeline("nq", (2, 4), kbs, "constrained")


def test_first_round_contexts_order_and_keys_by_hand():
    w, q = [M.Chunk(f"w{i}", "wiki") for i in range(4)], [M.Chunk(f"q{i}", "qa") for i in range(4)]
    hits = {"wiki": [w], "qa": [q], "merged": [[w[0], q[0], w[1], q[1]]]}
    got = M._first_round_contexts(hits, 0, (2, 4))
    # per TopK: wiki K, K/2; qa K, K/2; merged K, K/2; then 2-way K/2 + K/2
    assert got[:7] == [w[:2], w[:1], q[:2], q[:1], [w[0], q[0]], [w[0]], [w[0], q[0]]]
    assert got[7:] == [w[:4], w[:2], q[:4], q[:2], [w[0], q[0], w[1], q[1]], [w[0], q[0]], w[:2] + q[:2]]
    assert M._rag_key(0, got[4]) == M._rag_key(0, got[6]) != M._rag_key(1, got[6])  # same chunks, same request
    jobs = M._first_round_jobs(["who?"], hits, (2, 4), "nq", 10_000)
    assert list(jobs)[0] == ("direct", 0) and len(jobs) == 1 + len({M._rag_key(0, c) for c in got})


@pytest.mark.parametrize("text,reason", [
    ("no json here", "parse failed"),
    ('{"thought": "", "judge": false, "missing_knowledge": [], "query": []}', "judge=false"),
    ('{"thought": "", "judge": true, "missing_knowledge": ["x"], "query": ["  ", ""]}', "no query"),
    ('{"thought": "", "judge": true, "missing_knowledge": ["x"], "query": [" ", "who"]}', ""),
])
def test_fallback_reason_by_hand(text, reason):
    assert M._fallback_reason(M.parse_json_verdict(text)) == reason


def test_sorted_rows_follow_the_tables_by_hand():
    r = dict(qid=0, topk=2, row="Wiki")
    df = M._sorted_rows([dict(r, row="Misk Merged KB"), dict(r, qid=1), dict(r, row="DirectGen", topk=0), r,
                         dict(r, row="2-way retrieval")])
    assert list(zip(df["topk"], df["row"], df["qid"])) == [(0, "DirectGen", 0), (2, "Wiki", 0), (2, "Wiki", 1),
                                                           (2, "2-way retrieval", 0), (2, "Misk Merged KB", 0)]


def test_pipeline_sends_three_batches_in_order():
    "Free decoding: the first round (DirectGen first), the Fig. 4 calls (3 KBs x 1 TopK per question), the final answers."
    qs = [dict(question="capital of france", answers=["Paris"])]
    cl = _Recorder()
    M.run_pipeline(cl, "nq", qs, _toy_kbs(), topks=(2,))
    assert len(cl.prompts) == 2  # the stub's free text never parses: no Fig. 6 batch
    assert cl.prompts[0][0] == M.fill(M.direct_prompt("nq"), query="capital of france")
    # 3 Fig. 4 jobs (wiki, qa, merged); the merged KB's top chunk is the QA KB's: one prompt, one cache key, asked once
    assert len(set(cl.prompts[1])) == 2 and all("## First Round Answer" in p for p in cl.prompts[1])
    assert "Q: capital of france A: paris" in cl.prompts[1][1] and "Document[1]: paris capital france" in cl.prompts[1][0]


class _Recorder(_StubClient):
    "The stub, recording each batch's prompts."
    def __init__(self): super().__init__(); self.prompts = []

    def complete(self, prompts, **kw):
        self.prompts.append(list(prompts))
        return super().complete(prompts, **kw)


_TYPED_FIGURE = re.compile(r"\d+\.\d+\s?%|\b\d+\s+(?:NQ |medical )?pairs\b|agreement\s+\d")


def _recall_section_prose(cells):
    "Markdown and code comments of the context-recall section (its heading to the next `## ` heading)."
    out, on = [], False
    for c in cells:
        s = "".join(c["source"])
        if c["cell_type"] == "markdown" and s.startswith("## "): on = s.startswith("## Context recall")
        if not on: continue
        out += [s] if c["cell_type"] == "markdown" else [l.split("#", 1)[1] for l in s.splitlines() if "#" in l]
    return out


def test_no_typed_calibration_figures_in_prose():
    """The tau comments and the prose around them cited hand-typed agreement figures ("agreement 100.0% on 200 NQ
    pairs"); the figures are cell outputs now (`tau_before_after`, `kind_table`, `calibration_lines`)."""
    root = Path(__file__).resolve().parents[1]
    cells = json.loads((root / "nbs" / "studies/misk/01_rag.ipynb").read_text(encoding="utf-8"))["cells"]
    prose = _recall_section_prose(cells)
    assert prose and any("TAU_EN" in p or "tau" in p for p in prose)
    assert not [m.group(0) for p in prose for m in _TYPED_FIGURE.finditer(p)]
    tau_lines = [l for c in cells for l in "".join(c["source"]).splitlines() if l.startswith(("TAU_EN =", "TAU_ZH ="))]
    assert len(tau_lines) == 2 and not any(re.search(r"\d", l.split("#", 1)[1]) for l in tau_lines)
    for name in ("misk_fig3", "misk_table3", "misk_table4"):
        nb = json.loads((root / "nbs" / "studies" / "misk" / "artefacts" / f"{name}.ipynb").read_text(encoding="utf-8"))
        md = [m for c in nb["cells"] if c["cell_type"] == "markdown" for m in _TYPED_FIGURE.findall("".join(c["source"]))]
        code = "\n".join("".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code")
        assert not md and "misk.record_calibration(run, settings" in code, name  # the calibration computed in the artefact


def test_the_missing_knowledge_block_is_written_in_fig5_order():
    "The constrained block writes `thought` first, as Fig. 5 prints it (the grammar follows the schema's order, not sorted keys)."
    from kgrag_nb.llm import constraint_gbnf
    g = constraint_gbnf(M.MISSING_JSON)
    rule = next(l for l in g.splitlines() if "thought-kv" in l and "judge-kv" in l)
    assert rule.index("thought-kv") < rule.index("judge-kv") < rule.index("missing-knowledge-kv") < rule.index("query-kv"), rule
    assert "alphabetical" not in M.STUDY.decoding_deviations["rag"]["constrained"]
