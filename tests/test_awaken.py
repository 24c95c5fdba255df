"""Tests of kgrag_nb.studies.awakening.task1: awakening paper Task 1 (awakening_unseen_entity_kgqa.txt §4.2, Table 1, Eq. 7, App. B, E).

Hand-built tiny KGs with hand-computed expectations for every Table 1 pattern, the answer-leak filter, the probing rule
and the intersection; hypothesis properties; one integration test of the whole pipeline on two CWQ questions against
the real embedded llama.cpp server (marked `llm`).
"""
import json, re
from functools import reduce

import numpy as np
import pandas as pd
import pytest
from _fake import with_records
from hypothesis import given, settings, strategies as st

from kgrag_nb.studies.awakening.task1 import (AwakeningConfig, AWAKENING_TEMPLATE, KNOWLEDGE_TYPES, MAIN_TYPES, PROBE_TEMPLATE, awakening_prompt, awakening_table, paper_rows,
                             distances_to, extract_knowledge, filter_counts, find_gold_path, gold_relations,
                             intersect_ids, item_temperatures, knowledge_candidates, knowledge_distance, leaks_answer,
                             parse_awakening_answer, parse_probe, passing_ids, probe_prompt, probe_rule,
                             qa_probe_question, rank_top1, ranking_query, relation_matches, relation_parts,
                             relation_text, run_awakening, task1_data, verbalize_knowledge, save_task1, load_task1,
                             task1_models, task1_table, probing_table, sweep_summary, mean_over_types, changed_by_query,
                             paper_select, knowledge_label, setting_of, PROBE_VERDICT, SHORT_ANSWER, DECODINGS, REFORMAT,
                             decode, parse_status, probe, probe_counts, probing_rule_counts, decoding_of)
from kgrag_nb.studies.awakening import STUDY
from kgrag_nb.studies.awakening.closed_book import parse_short_answer
from kgrag_nb.llm import Constraint, fill_constraint
from kgrag_nb.backends import LocalBackend
from kgrag_nb.kg import KG


def words(x): return set(re.findall(r"\w+", x.lower()))
def overlap_scorer(q, texts): return [len(words(q) & words(t)) for t in texts]


# ---------------------------------------------------------------- App. E prompts
def test_awakening_prompt_verbatim():
    p = awakening_prompt("Who owns the Pistons?", ["Tom Gores, owns, Detroit Pistons", "Detroit Pistons, mascot, Hooper"])
    assert p.startswith("I will give you some knowledge about the question, the knowledge may be not help you directly answer")
    assert "- Knowledge: Paris is the capital of France.\n- Question: What is the capital of France?\n- Short Answer: Paris.\n" in p
    assert p.endswith("- Knowledge: Tom Gores, owns, Detroit Pistons; Detroit Pistons, mascot, Hooper\n"
                      "- Question: Who owns the Pistons?\n- Short Answer:")
    with pytest.raises(ValueError, match="empty question"): awakening_prompt("  ", ["k"])
    with pytest.raises(ValueError, match="no knowledge"): awakening_prompt("Q?", ["  "])


def test_probe_prompt_verbatim():
    p = probe_prompt('Tom Gores, owns, "Detroit Pistons"')
    assert p.startswith("Determine the truthfulness of a given claim using logical reasoning and evidence-based evaluation.")
    assert '- **Claim**: "The Great Wall of China is visible from space."' in p
    assert p.endswith("- **Claim**: \"Tom Gores, owns, 'Detroit Pistons'\"\n- **Conclusion**:")
    assert probe_prompt(["a, r, b", "b, s, c"]) == probe_prompt("a, r, b; b, s, c")
    assert PROBE_TEMPLATE.count("{claim}") == 1 and AWAKENING_TEMPLATE.count("{knowledge}") == 1


def test_parsers():
    assert parse_probe(" True. Tom Gores owns it.") is True
    assert parse_probe(" False, because true owners differ") is False  # the first verdict word counts
    assert parse_probe("TRUE") is True and parse_probe(" untrue") is None and parse_probe("") is None
    assert parse_awakening_answer(" 2004.\n- Question: next") == "2004"
    assert parse_awakening_answer("- Short Answer: Detroit Pistons.") == "Detroit Pistons"


@given(st.lists(st.text(alphabet="abc xyz\t", min_size=1), min_size=1, max_size=4), st.text(alphabet="abcQ? \n", min_size=1))
def test_prompt_whitespace_property(knowledge, question):
    q = " ".join(question.split())
    items = [" ".join(k.split()) for k in knowledge if k.split()]
    if not q or not items:
        with pytest.raises(ValueError): awakening_prompt(question, knowledge)
        return
    p = awakening_prompt(question, knowledge)
    assert p.endswith(f"- Knowledge: {'; '.join(items)}\n- Question: {q}\n- Short Answer:")


@given(st.sampled_from(["True", "true", "False", "FALSE"]), st.text(alphabet="xyz .,", max_size=20))
def test_parse_probe_property(word, rest):
    assert parse_probe(f" {word}{'.' if rest else ''} {rest}") is (word.lower() == "true")


# ---------------------------------------------------------------- Stage 1: gold path
def test_gold_relations_and_matching():
    class R:
        meta = {"sparql": "ns:m.01 ns:people.person.education ?y .\n?y ns:education.education.institution ?x ."}
        evidence_ids, evidence = [("m.01", "common.topic.notable_types", "m.02")], []
    g = gold_relations(R())
    assert g == {"people.person.education", "education.education.institution", "common.topic.notable_types"}
    assert relation_parts("/a/b/c./d/e/f") == ["a.b.c", "d.e.f"] and relation_parts("P69") == ["P69"]
    assert relation_matches("/people/person/education./education/education/institution", g)
    assert not relation_matches("/people/person/education./education/education/degree", g)
    assert not relation_matches("P69", set())
    assert relation_text("/people/person/education./education/education/institution") == "institution"


# a tiny KG where the gold path's first hop is stored *into* A_q: (b, owned_by^-1 ...) and a hub of variants
TRIPLES = [("pistons", "owned_by", "tom"),  # gold hop 1 (incoming to A_q)
           ("pistons", "won", "finals2004"),  # gold hop 2 to the answer
           ("tom", "founded", "platinum"),  # T2
           ("tom", "P31", "human"),  # a type triple: T4, not T2
           ("financier", "profession_of", "tom"),  # T3
           ("pistons", "mascot", "hooper"), ("pistons", "arena", "palace"),  # T5
           ("tom", "lives_in", "detroit"), ("pistons", "based_in", "detroit"),  # T6 via Z = detroit
           ("bulls", "owned_by", "jerry"), ("jerry", "knows", "tom"),  # T7 (bulls, jerry not A_q/B)
           ("bulls", "won", "finals1998"), ("bulls", "rival_of", "pistons"),  # T8
           ("tom", "watched", "finals2004")]  # leaks the answer
LABELS = {"tom": "Tom Gores", "pistons": "Detroit Pistons", "finals2004": "2004 NBA Finals", "platinum": "Platinum Equity",
          "human": "human", "financier": "Financier", "hooper": "Hooper", "palace": "The Palace", "detroit": "Detroit",
          "bulls": "Chicago Bulls", "jerry": "Jerry Reinsdorf", "finals1998": "1998 NBA Finals"}


@pytest.fixture
def toy():
    return LocalBackend(KG.from_triples(TRIPLES, name="toy", entity_labels=LABELS))


def test_find_gold_path_incoming_hop(toy):
    gp = find_gold_path(toy, ["tom"], ["finals2004"], {"owned_by", "won"})
    assert gp == dict(a_q="tom", b="pistons", answer="finals2004", hop1=("pistons", "owned_by", "tom"),
                      hop2=("pistons", "won", "finals2004"), r1="owned_by", r2="won")
    assert find_gold_path(toy, ["tom"], ["finals2004"], {"owned_by"}) is None  # R² must be gold too
    assert find_gold_path(toy, ["nobody"], ["finals2004"], {"owned_by", "won"}) is None
    assert find_gold_path(toy, ["finals2004"], ["finals2004"], {"won"}) is None  # A_q may not be the answer


def test_knowledge_candidates_each_pattern(toy):
    gp = find_gold_path(toy, ["tom"], ["finals2004"], {"owned_by", "won"})
    sub = toy.khop_triples(["tom", "pistons"], 2)
    c = knowledge_candidates(gp, sub, toy.entity_types("tom"))
    assert set(c) == set(KNOWLEDGE_TYPES)
    assert c["T1"] == [[("pistons", "owned_by", "tom")]]
    assert c["T2"] == [[("tom", "founded", "platinum")], [("tom", "lives_in", "detroit")], [("tom", "watched", "finals2004")]]
    assert c["T3"] == [[("financier", "profession_of", "tom")], [("jerry", "knows", "tom")]]
    assert c["T4"] == [[("tom", "instance-of", "human")]]
    assert c["T5"] == [[("pistons", "arena", "palace")], [("pistons", "based_in", "detroit")], [("pistons", "mascot", "hooper")]]
    assert c["T6"] == [[("tom", "lives_in", "detroit"), ("pistons", "based_in", "detroit")]]
    assert c["T7"] == [[("bulls", "owned_by", "jerry")]]
    assert c["T8"] == [[("bulls", "won", "finals1998")]]
    assert len(knowledge_candidates(gp, sub, [], max_t6=0)["T6"]) == 0


def test_leak_filter_and_distance(toy):
    assert leaks_answer([("tom", "watched", "finals2004")], "x", ["finals2004"], [])
    assert leaks_answer([("a", "r", "b")], "Tom saw the 2004 nba finals!", [], ["2004 NBA Finals"])
    assert not leaks_answer([("a", "r", "b")], "Tom saw the 2004 finals", [], ["2004 NBA Finals"])
    assert not leaks_answer([("a", "r", "b")], "anything", [], ["..."])  # no word tokens: no leak, no error
    chain = [("a", "r", "b"), ("b", "r", "c"), ("d", "r", "c"), ("x", "r", "y")]
    d = distances_to(chain, ["a"])
    assert d == {"a": 0, "b": 1, "c": 2, "d": 3}
    assert knowledge_distance([("d", "r", "c")], d) == 2 and knowledge_distance([("x", "r", "y")], d) is None
    assert distances_to(chain, ["zzz"]) == {}


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=20), st.integers(0, 7))
def test_distance_property(edges, target):
    tri = [(f"e{h}", "r", f"e{t}") for h, t in edges]
    d = distances_to(tri, [f"e{target}"])
    for h, _, t in tri:  # BFS distances differ by at most one along every edge, and both ends are reached or neither
        assert (h in d) == (t in d)
        if h in d: assert abs(d[h] - d[t]) <= 1
    assert all(v == 0 for k, v in d.items() if k == f"e{target}")


def test_extract_knowledge_toy():
    # gold_relations reads dotted Freebase names (SPARQL `ns:` names, crucial triples): give the toy KG dotted gold relations
    dotted = {"owned_by": "x.y.owned_by", "won": "x.y.won"}
    kg = KG.from_triples([(h, dotted.get(r, r), t) for h, r, t in TRIPLES], name="toy2", entity_labels=LABELS)

    class Rec:
        id, question, answers = "toy-1", "Team owner Tom Gores won the Championship in what year?", ["2004 NBA Finals"]
        topic_entities, evidence = [{"id": "tom", "name": "Tom Gores"}], []
        evidence_ids, meta = [("pistons", "x.y.owned_by", "tom"), ("pistons", "x.y.won", "finals2004")], {}
    ex = extract_knowledge(Rec(), LocalBackend(kg), scorer=overlap_scorer)
    q, k = ex["question"], pd.DataFrame(ex["knowledge"])
    assert q["status"] == "ok" and (q["a_q"], q["b"], q["answer"]) == ("tom", "pistons", "finals2004")
    t2 = k[(k["type"] == "T2") & (k["mode"] == "triple")].iloc[0]
    assert (t2.n_candidates, t2.n_after_leak_filter) == (3, 2)  # "Tom Gores, watched, 2004 NBA Finals" dropped
    # ranked against "Tom Gores, x.y.owned_by, Detroit Pistons": the three T5 candidates share 2 words each; ties keep the first
    t5 = k[(k["type"] == "T5") & (k["mode"] == "triple")].iloc[0]
    assert t5.text == "Detroit Pistons, arena, The Palace" and t5.dist_to_answer == 1 and t5.score == 2
    assert (t5.qa_question, t5.qa_expected) == ("What is the arena of Detroit Pistons?", "The Palace")
    assert set(k["mode"]) == {"triple", "head_relation"} and len(k) == 16
    assert all(not leaks_answer([], t, [], Rec.answers) for t in k["text"].dropna())
    Rec.answers = ["Nonexistent Answer"]  # missing pieces give a status, not an error
    assert extract_knowledge(Rec(), LocalBackend(kg), scorer=overlap_scorer)["question"]["status"] == "answer not in KG"
    Rec.answers, Rec.topic_entities = ["2004 NBA Finals"], [{"id": "nobody"}]
    assert extract_knowledge(Rec(), LocalBackend(kg), scorer=overlap_scorer)["question"]["status"] == "topic entity not in KG"


def test_ranking():
    i, s = rank_top1("Tom Gores, owns, Detroit Pistons", ["a b", "Detroit Pistons, mascot", "Tom Gores owns"], overlap_scorer)
    assert i == 2 and list(s) == [0, 2, 3]
    assert rank_top1("q", [], overlap_scorer)[0] == -1
    with pytest.raises(ValueError, match="scorer returned shape"): rank_top1("q", ["a", "b"], lambda q, t: [1.0])
    gp = dict(a_q="tom", b="pistons", r1="/sports/team/owners")
    assert ranking_query(gp, LABELS) == "Tom Gores, owners, Detroit Pistons"
    assert ranking_query(gp, LABELS, mode="head_relation") == "Tom Gores, owners"


def test_verbalize_and_qa_probe():
    k = [("tom", "/business/person/founded", "platinum"), ("platinum", "P31", "/organization/organization")]
    assert verbalize_knowledge(k, LABELS) == "Tom Gores, founded, Platinum Equity; Platinum Equity, P31, organization"
    assert qa_probe_question(k, LABELS) == ("What is the founded of Tom Gores?", "Platinum Equity")


# ---------------------------------------------------------------- probing rule (Eq. 7) and intersection
def test_probe_rule():
    assert probe_rule([True, True, True]) and not probe_rule([True, True, False]) and not probe_rule([True, None, True])
    assert not probe_rule([]) and not probe_rule(None)
    assert probe_rule([False, True, None], min_true=1) and not probe_rule([False, None], min_true=1)


@given(st.lists(st.sampled_from([True, False, None]), min_size=1, max_size=5), st.integers(1, 5))
def test_probe_rule_property(verdicts, k):
    assert probe_rule(verdicts) == all(v is True for v in verdicts)
    assert probe_rule(verdicts, min_true=k) == (sum(v is True for v in verdicts) >= k)
    if probe_rule(verdicts): assert probe_rule(verdicts, min_true=1)  # the relaxation only adds questions


@given(st.lists(st.sets(st.integers(0, 9)), max_size=5))
def test_intersect_property(sets):
    got = intersect_ids(sets)
    assert got == (reduce(set.intersection, sets) if sets else set())
    assert all(got <= s for s in sets)


def test_item_temperatures():
    a = item_temperatures(["x", "y", "z"], 3, seed=4)
    assert a.shape == (3, 3) and (a >= 0).all() and (a <= 1).all()
    assert (item_temperatures(["z"], 3, seed=4)[0] == a[2]).all()  # depends on the text, not its position
    assert not (item_temperatures(["z"], 3, seed=5)[0] == a[2]).all()


def toy_result():
    v3, v2, v0 = [True] * 3, [True, False, True], [None, False, False]
    return dict(
        questions=pd.DataFrame(dict(id=["q1", "q2", "q3", "q4"], status=["ok", "ok", "ok", "no gold 2-hop path"],
                                    answerable=[0, 0, 0, None])),
        knowledge=pd.DataFrame(dict(id=["q1", "q1", "q2", "q2", "q3", "q3"], type=["T1", "T2"] * 3, mode="triple", text="k",
                                    nli_probe_verdicts=[v3, v3, v3, v2, v0, v3])),
        answers=pd.DataFrame(dict(id=["q1", "q2", "q3", "q1", "q2", "q1", "q2", "q3"],
                                  type=["No RAG"] * 3 + ["T1", "T1", "T2", "T2", "T2"], mode=["-"] * 3 + ["triple"] * 5,
                                  temperature=0.7, hits1=[0, 0, 0, 1, 0, 0, 1, 1], hits10=[1, 0, 0, 1, 1, 0, 1, 1])),
        params=dict(n_probe=3))


def test_awakening_tables_hand_computed():
    res = toy_result()
    assert passing_ids(res["knowledge"], "T2") == {"q1", "q3"} and passing_ids(res["knowledge"], "T2", min_true=2) == {"q1", "q2", "q3"}
    # a rule per probing method (smoke: NLI relaxed, QA Eq. 7): NLI's entry applies here, a method left out keeps Eq. 7
    assert passing_ids(res["knowledge"], "T2", min_true={"nli": 2, "qa": None}) == {"q1", "q2", "q3"}
    assert passing_ids(res["knowledge"], "T2", min_true={"qa": 2}) == {"q1", "q3"}
    t2 = awakening_table(res, ["T1", "T2"], intersection=True, n_resamples=200)  # Table 2: only q1 has both types
    assert t2["F"].tolist() == [1, 1, 1] and t2["Hits@1"].tolist() == [0.0, 100.0, 0.0] and t2["Hits@10"].tolist() == [100.0, 100.0, 0.0]
    t4 = awakening_table(res, ["T1", "T2"], intersection=False, n_resamples=200)  # Table 4: own questions
    assert t4["F"].tolist() == [3, 2, 2] and t4["Hits@1"].tolist() == [0.0, 50.0, 50.0]
    assert np.isclose(t4["Hits@10"].iloc[0], 100 / 3)
    t2r = awakening_table(res, ["T1", "T2"], intersection=True, min_true=2, n_resamples=200)
    assert t2r["F"].tolist() == [2, 2, 2] and t2r["Hits@1"].tolist() == [0.0, 50.0, 50.0]
    fc = filter_counts(res, ["T1", "T2"], min_true=1).set_index("filter")["F"]
    assert fc["questions read"] == 4 and fc["gold 2-hop path in KG (Step 2, stage 1)"] == 3
    assert fc["unanswerable closed-book (Step 1, Eq. 6)"] == 3
    assert fc["T2 in model (nli-probing, all 3 True, Eq. 7)"] == 2 and fc["T2 in model (nli-probing, >= 1 True; relaxed)"] == 3
    empty = awakening_table(res, ["T1", "T2"], method="nli", intersection=True, min_true=4, n_resamples=200)
    assert empty["F"].tolist() == [0, 0, 0] and empty["Hits@1"].isna().all()


# ---------------------------------------------------------------- data and the paper's numbers
def test_task1_data_errors():
    with pytest.raises(ValueError, match="online backend"): task1_data("2wiki")


def test_paper_rows_spot_checks():
    # values read off awakening_unseen_entity_kgqa.txt (the CSV itself is checked against the text in test_papers.py)
    def row(table, dataset, model, t):
        r = paper_rows(table, dataset, [model]).set_index("knowledge type")
        return tuple(r.loc[t if t == "No RAG" else f"{KNOWLEDGE_TYPES[t]} ({t})", ["F", "Hits@1", "Hits@10"]])
    assert row("Table 2", "cwq", "Qwen2.5-32B-Instruct", "T5") == (256, 38.7, 50.4)
    assert row("Table 2", "2wiki", "Llama3.1-8B-Instruct", "No RAG") == (815, 0.0, 13.3)
    assert row("Table 4", "2wiki", "Llama3.1-8B-Instruct", "T1") == (1668, 4.1, 14.2)
    assert row("Table 10", "cwq", "Llama3.1-70B-Instruct", "T6") == (270, 28.1, 37.0)
    assert row("Table 11", "cwq", "Llama3.1-8B-Instruct", "T7") == (355, 18.0, 39.2)
    for t in ("Table 2", "Table 4", "Table 11"):
        for d in ("cwq", "2wiki"):
            r = paper_rows(t, d, label=t)
            assert r.groupby("model").size().eq(7).all() and r["model"].nunique() == 5 and set(r["source"]) == {f"paper: {t}"}
            assert set(r["knowledge type"]) == {"No RAG", *(f"{KNOWLEDGE_TYPES[k]} ({k})" for k in MAIN_TYPES)}
    with pytest.raises(ValueError, match="no 'mintaka' block"): paper_rows("Table 2", "mintaka")


# ---------------------------------------------------------------- the shared experiment and the artefact tables
def test_save_load_task1_round_trip(tmp_path):
    from kgrag_nb.reproduce import ExperimentResults, save_result
    class Folder:  # ExperimentRun.save / ExperimentResults.load on a temporary folder
        def save(self, name, obj): return save_result(tmp_path, name, obj)
        def load(self, name): return ExperimentResults(tmp_path).load(name)
    (tmp_path / "_SUCCESS.json").write_text("{}")
    res = toy_result() | {"candidates": pd.DataFrame(dict(id=["q1"], text=["k"], triples=[[["a", "r", "b"]]]))}
    res["questions"]["labels"] = [{"/m/1": "One"}, {}, {"/m/3": "x"}, {}]
    other = {k: (v.iloc[:2].copy() if isinstance(v, pd.DataFrame) else v) for k, v in res.items()}
    save_task1(Folder(), {"main": res, "other": other}, dict(seed=3, temperature=0.7, temperatures=[0.7]))
    assert task1_models(Folder()) == ["main", "other"]
    back = load_task1(Folder())
    assert back["params"] == dict(seed=3, temperature=0.7, temperatures=[0.7], n_probe=3, model="main")
    assert back["knowledge"]["nli_probe_verdicts"].tolist() == res["knowledge"]["nli_probe_verdicts"].tolist()
    assert all(v is True or v is False or v is None for vs in back["knowledge"]["nli_probe_verdicts"] for v in vs)  # not numpy bools
    assert back["questions"]["labels"].tolist() == res["questions"]["labels"].tolist()
    assert back["candidates"]["triples"].tolist() == [[["a", "r", "b"]]]
    assert len(load_task1(Folder(), "other")["questions"]) == 2
    with pytest.raises(KeyError, match="not 'nope'"): load_task1(Folder(), "nope")
    assert awakening_table(back, ["T1", "T2"], n_resamples=200).equals(awakening_table(res, ["T1", "T2"], n_resamples=200))


@given(st.sampled_from(["No RAG", *KNOWLEDGE_TYPES]))
def test_setting_label_round_trip(setting):
    assert setting_of(knowledge_label(setting)) == setting


def test_task1_table_and_probing_table_hand_computed():
    res = toy_result() | {"params": dict(model="toy", min_true=None, seed=0, temperature=0.7)}
    t = task1_table(res, ["T1", "T2"], intersection=False)
    assert t[["model", "setting", "F"]].values.tolist() == [["toy", "No RAG", 3], ["toy", "T1", 2], ["toy", "T2", 2]]
    k = res["knowledge"].copy()
    k["qa_probe_verdicts"] = [[True] * 3, [False] * 3, [True] * 3, [True] * 3, [True] * 3, [True] * 3]
    p = probing_table(res | {"knowledge": k}, ["T1", "T2"]).set_index("setting")["F"]
    # qa passes T1 {q1, q2, q3}, T2 {q2, q3}; nli (Eq. 7) T1 {q1, q2}, T2 {q1, q3}; T1 has answers for q1, q2 only
    assert (p["qa/original/T1"], p["qa/original/T2"], p["qa/intersection/T2"], p["nli/original/No RAG"], p["qa/original/No RAG"]) == (2, 2, 1, 3, 3)


def test_sweep_summary_and_mean_over_types():
    sw = pd.DataFrame(dict(model="m", setting="T7", temperature=[0.3, 0.7, 1.2], F=4, **{"Hits@1": [25.0, 50.0, 0.0],
                           "Hits@10": [50.0, 50.0, 75.0]}))
    assert sweep_summary(sw).iloc[0, 2:].tolist() == [50.0, 0.7, 1.2]
    m = mean_over_types(pd.DataFrame(dict(source="s", model="a", setting=["No RAG", "T1", "T2"], F=[9, 4, 2],
                                          **{"Hits@1": [0.0, 10.0, 30.0], "Hits@10": [5.0, 30.0, 50.0]})))
    assert m.iloc[0].tolist() == ["s", "a", 4.0, 20.0, 40.0]


def test_changed_by_query_and_paper_select():
    k = pd.DataFrame(dict(id=["q1", "q1", "q2", "q2", "q3", "q3"], type="T1", mode=["triple", "head_relation"] * 3,
                          text=["a", "b", "c", "c", None, "d"]))
    assert changed_by_query({"knowledge": k}) == (2, 3)
    assert set(paper_select("Table 4")["model"]) == {f"{m}-Instruct" for m in ("Llama3.1-8B", "Llama3.1-70B", "Qwen2.5-7B", "Qwen2.5-32B", "Qwen2.5-72B")}
    assert paper_select("Fig. 6", dataset=None, models="all")["value"].tolist() == [19.2, 35.4]
    assert len(STUDY.deviations["task1"]) == 10


# ---------------------------------------------------------------- declared output formats (issue 21)
CONSTRAINTS = {"nli": PROBE_VERDICT, "qa": SHORT_ANSWER}  # every LLM output the study parses, by its parser


@pytest.mark.parametrize("method", sorted(CONSTRAINTS))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_stub_filled_constraints_parse(method, seed):
    "What the stub server writes for each declared format is parsed ok (not repaired) by the study's parser."
    c = CONSTRAINTS[method]
    out = fill_constraint(c.spec(), seed=seed)
    assert isinstance(c, Constraint) and parse_status(out, method) == "ok", (method, out)
    if method == "nli": assert parse_probe(out) is (PROBE_VERDICT.value[seed % 2] == " True")
    else: assert parse_short_answer(out) and parse_awakening_answer(out) == parse_short_answer(out)


def test_verdict_options_are_the_papers_words():
    # Eq. 7 counts answers that are "True"; App. E's example answers " False. ..." after the cue
    assert [o.strip() for o in PROBE_VERDICT.value] == ["True", "False"] and PROBE_TEMPLATE.count("**Conclusion**: False.") == 1
    assert [parse_probe(o) for o in PROBE_VERDICT.value] == [True, False]
    for ok in (" Paris.", "Paris", " Barack Obama\n"): assert re.fullmatch(SHORT_ANSWER.value, ok)
    for bad in ("", " ", "\n", " \nParis"): assert not re.fullmatch(SHORT_ANSWER.value, bad)


class _Fake:
    "A client that answers freely with prose and, under a constraint, with what the stub would write."
    def __init__(self): self.calls = []
    @with_records
    def complete(self, prompts, n=1, temperature=0.0, constraint=None, **kw):
        self.calls.append((len(prompts), constraint, temperature))
        fill = (lambda i: fill_constraint(constraint.spec(), seed=i)) if constraint else (lambda i: " I think so. It is true")
        return [[fill(s) for s in range(n)] for _ in prompts]


@pytest.mark.parametrize("decoding", DECODINGS)
def test_probe_decoding_modes(decoding):
    fake = _Fake()
    rows = probe(fake, ["Paris, capital of, France", "Rome, capital of, Italy"], decoding=decoding)
    assert [r["probe_verdicts"] for r in rows] == [[True] * 3 if decoding == "free" else [True] * 3] * 2
    assert all(s == ("repaired" if decoding == "free" else "ok") for r in rows for s in r["probe_status"])
    assert all(("probe_free" in r) == (decoding == "decoupled") for r in rows)
    sent = [c for _, c, _ in fake.calls]
    assert sent == {"free": [None] * 3, "constrained": [PROBE_VERDICT] * 3, "decoupled": [None, PROBE_VERDICT] * 3}[decoding]
    if decoding == "decoupled": assert [t for _, c, t in fake.calls if c] == [0.0] * 3  # the restatement is greedy
    qa = probe(_Fake(), ["What is the capital of France?"], "qa", ["Paris"], decoding=decoding)[0]
    assert qa["probe_status"] == ["ok"] * 3 and qa["probe_verdicts"] == [False] * 3  # the stub's 'a' is readable, not right


def test_decode_decoupled_prompts_and_errors():
    seen = []
    class C(_Fake):
        @with_records
        def complete(self, prompts, **kw): seen.append(list(prompts)); return super().complete(prompts, **kw)
    d = decode(C(), ["P1", "P2"], PROBE_VERDICT, "decoupled", REFORMAT["nli"], n=2)
    outs, free = d.outputs, d.free
    assert seen[1] == [f"{p} I think so. It is true{REFORMAT['nli'].line}" for p in ("P1", "P1", "P2", "P2")]
    assert [len(o) for o in outs] == [2, 2] and free == [[" I think so. It is true"] * 2] * 2
    with pytest.raises(ValueError, match="use 'free'"): decode(C(), ["P"], PROBE_VERDICT, "json")


def test_probe_counts_and_deviations():
    k = pd.DataFrame(dict(id=["q1", "q2", "q3"], type="T1", mode="triple", text="k",
                          nli_probe_raw=[[" True"] * 3, [" True", " False", " True"], [" hm", " False", " False"]],
                          nli_probe_verdicts=[[True] * 3, [True, False, True], [None, False, False]]))
    res = dict(questions=pd.DataFrame(dict(id=["q1", "q2", "q3"], status="ok", answerable=0)), knowledge=k,
               params=dict(probing=["nli"], decoding="constrained"))
    c = probe_counts(res, ["T1"]).set_index("type").loc["all"]
    assert c[["items", "answers", "ok", "repaired", "failed", "true", "kept (Eq. 7, all True)", "kept (>= 1 True)"]].tolist() == [3, 9, 8, 0, 1, 5, 1, 2]
    assert c["readable %"] == round(100 * 8 / 9, 1)
    assert probing_rule_counts(res) == "Probing rule in this run: nli-probing keeps 1 of 3 items by Eq. 7 and 2 by >= 1 True."
    lines = lambda r: STUDY.deviation_lines("task1", decoding_of(r), [probing_rule_counts(r)])  # what every artefact renders
    assert lines(res) == list(STUDY.deviations["task1"]) + [probing_rule_counts(res), STUDY.decoding_deviations["task1"]["constrained"]]
    assert lines({"params": {"decoding": "free"}}) == list(STUDY.deviations["task1"]) + ["Probing rule in this run: no item was probed."]


# ---------------------------------------------------------------- the pipeline against the real model
@pytest.mark.llm
def test_run_awakening_two_questions_embedded(embedded_server, tmp_path):
    from kgrag_nb.llm import LLMClient
    records, backend, map_id = task1_data("cwq")
    client = LLMClient(embedded_server.url, cache=tmp_path / "llm.sqlite", progress=False)
    config = AwakeningConfig(n_questions=2, map_id=map_id, types=["T1", "T5"], min_true=1)
    res = run_awakening(records, backend, client, config, out_dir=tmp_path / "trace")
    q, k, a = res["questions"], res["knowledge"], res["answers"]
    assert (q["status"] == "ok").sum() == 2 and q.loc[q["status"] == "ok", "answerable"].isin([0, 1]).all()
    assert (a["type"] == "No RAG").sum() == 2 and a["samples"].map(len).eq(10).all()
    live = k[k["step1_unanswerable"] & k["text"].notna()]
    assert live["nli_probe_raw"].map(len).eq(3).all() and live["nli_probe_verdicts"].map(len).eq(3).all()
    awakened = a[a["type"] != "No RAG"]
    assert set(zip(awakened["id"], awakened["type"])) == set(zip(live.loc[live["nli_in_model"], "id"], live.loc[live["nli_in_model"], "type"]))
    assert all((h1 == int(c[0] == 1)) and (h10 == int(any(c))) for h1, h10, c in zip(a["hits1"], a["hits10"], a["correct"]))
    for name in ("questions", "candidates", "knowledge", "answers"):  # every intermediate saved, one line per row
        lines = (tmp_path / "trace" / f"awaken_{name}.jsonl").read_text().splitlines()
        assert len(lines) == len(res[name]) and all(json.loads(x) for x in lines)
    n = client.usage.requests  # the cache makes a second run free
    run_awakening(records, backend, client, config)
    assert client.usage.requests == n


@pytest.mark.llm
def test_constrained_probing_embedded(embedded_server, tmp_path):
    "Constrained NLI- and QA-probing on the real model: every answer is readable by the study's parsers (issue 21)."
    from kgrag_nb.llm import LLMClient
    client = LLMClient(embedded_server.url, cache=tmp_path / "llm.sqlite", progress=False)
    items = ["Belgium, adjoins, France", "Ted Kennedy, sibling, John F. Kennedy"]
    rows = probe(client, items, "nli", decoding="constrained")
    raw = [a for r in rows for a in r["probe_raw"]]
    assert set(raw) <= {" True", " False"} and all(s == "ok" for r in rows for s in r["probe_status"]), raw
    assert all(v in (True, False) for r in rows for v in r["probe_verdicts"])
    qa = probe(client, ["What is the adjoins of Belgium?"], "qa", ["France"], decoding="constrained")[0]
    assert all(parse_short_answer(a) for a in qa["probe_raw"]) and qa["probe_status"] == ["ok"] * 3, qa["probe_raw"]


# ---------------------------------------------------------------- Step 1 under the run's decoding (issue 21)
class _Rec:
    def __init__(self, i, q, a): self.id, self.question, self.answers = i, q, a


class _Recorder(_Fake):
    "Records every complete() call's keyword arguments."
    def __init__(self): super().__init__(); self.kw = []
    @with_records
    def complete(self, prompts, n=1, temperature=0.0, constraint=None, **kw):
        self.kw.append(dict(prompts=list(prompts), n=n, temperature=temperature, constraint=constraint, **kw))
        return super().complete(prompts, n=n, temperature=temperature, constraint=constraint, **kw)


def test_step1_constraint_is_declared_next_to_its_parser():
    "Step 1's answers (App. E closed-book prompt) are bound by `SHORT_ANSWER`, declared in baselines beside `parse_short_answer`."
    import kgrag_nb.studies.awakening.closed_book as B
    import kgrag_nb.studies.awakening.task1 as A
    assert B.SHORT_ANSWER is A.SHORT_ANSWER and B.decode is A.decode and B.DECODINGS == DECODINGS == ("free", "constrained", "decoupled")
    assert REFORMAT["qa"] == B.REFORMAT_SHORT
    for seed in range(3):  # what the stub writes for the constraint is read ok by Step 1's parser
        out = fill_constraint(B.SHORT_ANSWER.spec(), seed=seed)
        assert B.parse_short_answer(out) and parse_status(out, "qa") == "ok", out


@pytest.mark.parametrize("decoding", DECODINGS)
def test_closed_book_step1_decoding(decoding):
    from kgrag_nb.studies.awakening.closed_book import closed_book, draw_temperatures, no_rag_prompt
    recs = [_Rec("q1", "What is the capital of France?", ["Paris"]), _Rec("q2", "Who wrote Hamlet?", ["Shakespeare"])]
    fake = _Recorder()
    cb = closed_book(fake, recs, n_probe=3, n_samples=2, seed=5, decoding=decoding)
    step1 = [k for k in fake.kw if k["desc"].startswith("step-1")]
    samples = [k for k in fake.kw if k["desc"] == "2 samples"]
    assert len(samples) == 1 and samples[0]["constraint"] is None  # the Hits@k samples stay free in every mode
    assert [k["constraint"] for k in step1] == {"free": [None] * 3, "constrained": [SHORT_ANSWER] * 3,
                                                "decoupled": [None, SHORT_ANSWER] * 3}[decoding]
    temps = draw_temperatures(2, 3, seed=5)
    if decoding == "free":  # exactly the requests of the plain call it replaced (n=1 and no constraint are the defaults)
        old = [dict(prompts=[no_rag_prompt(r.question) for r in recs], temperature=[float(x) for x in temps[:, j]], max_tokens=24,
                    stop=["\n"], seed=5 + j, desc=f"step-1 answer {j + 1}/3") for j in range(3)]
        assert [{k: v for k, v in s.items() if k not in ("n", "constraint")} for s in step1] == old
        assert all(s["n"] == 1 for s in step1)
        assert cb["probe_answers"].tolist() == [["I think so. It is true"] * 3] * 2 and "probe_free" not in cb
    else:  # the stub's filling is readable and (being 'a'-like) wrong: every question is unanswerable
        assert all(parse_status(a, "qa") == "ok" for raw in cb["probe_raw"] for a in raw)
        assert cb["answerable"].tolist() == [0, 0]
        assert ("probe_free" in cb) == (decoding == "decoupled")
    if decoding == "decoupled":  # the restatement: greedy, after the prompt, the free answer and REFORMAT_SHORT
        restated = [k for k in step1 if k["constraint"] is not None]
        assert all(k["temperature"] == 0.0 for k in restated)
        assert restated[0]["prompts"][0] == no_rag_prompt(recs[0].question) + " I think so. It is true" + REFORMAT["qa"].line
    with pytest.raises(ValueError, match="use 'free'"): closed_book(fake, recs, decoding="json")


def test_step1_counts_hand_computed():
    from kgrag_nb.studies.awakening.task1 import step1_counts
    q = pd.DataFrame(dict(id=["q1", "q2", "q3"], status=["ok", "ok", "no gold 2-hop path"], answerable=[0, 1, None],
                          step1_raw=[[" Paris.", "\n- Short Answer: Rome", "\n"], [" Bonn"] * 3, None]))
    row = step1_counts({"questions": q, "params": {"decoding": "constrained"}}).iloc[0]
    assert row[["decoding", "questions", "answers", "ok", "repaired", "failed", "unanswerable"]].tolist() == ["constrained", 2, 6, 4, 1, 1, 1]
    assert row["readable %"] == 83.3
    assert np.isnan(step1_counts({"questions": q.drop(columns="step1_raw")}).iloc[0]["readable %"])  # older runs: no raw answers


@pytest.mark.llm
def test_constrained_step1_embedded(embedded_server, tmp_path):
    "Step 1 constrained on the real model: every closed-book answer is a readable one-line short answer (issue 21)."
    from kgrag_nb.llm import LLMClient
    from kgrag_nb.studies.awakening.closed_book import closed_book
    client = LLMClient(embedded_server.url, cache=tmp_path / "llm.sqlite", progress=False)
    recs = [_Rec("q1", "What country is north of France and borders Belgium?", ["Netherlands"]),
            _Rec("q2", "Who was the brother of John F. Kennedy?", ["Ted Kennedy"])]
    cb = closed_book(client, recs, n_probe=3, n_samples=0, decoding="constrained")
    raw = [a for r in cb["probe_raw"] for a in r]
    assert len(raw) == 6 and all(re.fullmatch(SHORT_ANSWER.value, a) for a in raw), raw
    assert all(parse_status(a, "qa") == "ok" and parse_short_answer(a) for a in raw), raw
    assert cb["answerable"].isin([0, 1]).all()


# ---------------------------------------------------------------- the format-tax arm (issue 21 item 4)
FORMAT_TAX_KEYS = {"item", "metric", "parsed", "fired", "finished", "kept"}


def _check_arm_rows(rows, n):
    assert 1 <= len(rows) <= n
    for r in rows:
        assert FORMAT_TAX_KEYS <= set(r) and isinstance(r["item"], str) and r["item"].endswith("/T1")
        assert r["metric"] is None or (isinstance(r["metric"], float) and 0 <= r["metric"] <= 1)
        assert isinstance(r["parsed"], float) and 0 <= r["parsed"] <= 1
        assert r["fired"] is None and r["finished"] is None and isinstance(r["kept"], bool)


def test_format_tax_arm_with_stub_answers():
    "Same items in every arm; the stub's constrained answers: readable, ' True' x3 (kept), a wrong short answer (metric 0)."
    from kgrag_nb.studies.awakening.task1 import format_tax_arm, format_tax_items
    assert STUDY.arm("awakening").as_dict()["study"] == "awakening" and "Table 7" in STUDY.arm("awakening").paper
    items = format_tax_items(2)
    assert [i["text"] for i in items] == ["Belgium, adjoins, France", "Ted Kennedy, sibling, John F. Kennedy"]
    rows = {d: format_tax_arm(_Fake(), d, 2) for d in DECODINGS}
    for d, rs in rows.items():
        _check_arm_rows(rs, 2)
        assert [r["item"] for r in rs] == [i["item"] for i in items]
    # free: ' I think so. It is true' reads as True (repaired) for NLI, and as a wrong but readable short answer for QA
    assert [(r["parsed"], r["kept"], r["metric"]) for r in rows["free"]] == [(1.0, True, 0.0)] * 2
    assert [(r["parsed"], r["kept"], r["metric"], r["nli_true"]) for r in rows["constrained"]] == [(1.0, True, 0.0, 3)] * 2
    with pytest.raises(ValueError, match="at least one item"): format_tax_items(0)


@pytest.mark.llm
def test_format_tax_arm_constrained_embedded(embedded_server, tmp_path):
    "The awakening format-tax arm on the real model, constrained: one item, every answer readable."
    from kgrag_nb.llm import LLMClient
    from kgrag_nb.studies.awakening.task1 import format_tax_arm
    client = LLMClient(embedded_server.url, cache=tmp_path / "llm.sqlite", progress=False)
    rows = format_tax_arm(client, "constrained", 1)
    _check_arm_rows(rows, 1)
    assert rows[0]["parsed"] == 1.0 and rows[0]["nli_readable"] == 3 and rows[0]["qa_readable"] == 3, rows


# ---------------------------------------------------------------- the paper's settings passed to the general layers (issue 24)
def test_awakening_passes_its_app_c_settings(monkeypatch):
    "Step 2 caps each 2-hop subgraph at App. C's 40,000; `kgrag bench relation-retrieval` passes the cap and the IVF settings."
    import kgrag_nb.studies.awakening.task1 as A
    from kgrag_nb.hooks import BENCHMARKS
    assert (A.AWAKENING_MAX_SUBGRAPH_TRIPLES, A.AWAKENING_IVF) == (40_000, dict(nlist=4096, train_factor=40, sample_per_batch=20_000))
    caps = []
    class Recording(LocalBackend):
        def khop_triples(self, seeds, hops=2, max_triples=None):
            caps.append(max_triples); return super().khop_triples(seeds, hops, max_triples)
    dotted = {"owned_by": "x.y.owned_by", "won": "x.y.won"}
    kg = KG.from_triples([(h, dotted.get(r, r), t) for h, r, t in TRIPLES], name="toy3", entity_labels=LABELS)
    class Rec:
        id, question, answers = "toy-1", "Team owner Tom Gores won the Championship in what year?", ["2004 NBA Finals"]
        topic_entities, evidence, meta = [{"id": "tom", "name": "Tom Gores"}], [], {}
        evidence_ids = [("pistons", "x.y.owned_by", "tom"), ("pistons", "x.y.won", "finals2004")]
    extract_knowledge(Rec(), Recording(kg), types=("T1",), query_modes=("triple",), scorer=overlap_scorer)
    assert caps == [40_000, 40_000]
    seen = {}
    monkeypatch.setattr(A, "bench_relation_retrieval", lambda **kw: seen.update(kw) or {"ok": True})
    fn = BENCHMARKS["relation-retrieval"][0]
    assert fn.__module__ == "kgrag_nb.studies.awakening.task1" and fn(n=300, llm_url="x", k=3) == {"ok": True}
    assert seen == dict(n=300, k=3, max_triples=40_000, ivf=A.AWAKENING_IVF)
