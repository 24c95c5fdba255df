"""Tests of kgrag_nb.studies.coe.evidence (chain_of_evidence.txt): App. A-C prompts verbatim, parsers (hypothesis fuzzing), the CoE decision
rule and its 1 + |keywords| + |relations| call count (scripted client, as the issue allows), context lengths and counts,
the answer swap, Algorithm 1, the FR definition, the released files' quirks, and one run on the real embedded server."""
import json, re
from pathlib import Path

import numpy as np, pandas as pd, pytest
from _fake import with_records
from hypothesis import given, settings, strategies as st

from kgrag_nb.studies.coe import evidence as coe
from kgrag_nb.config import get_config
from kgrag_nb.kgqa import TraceWriter

PAPERS = Path(__file__).resolve().parents[1].parent / "shared" / "papers"


def _papers_dir() -> Path:
    for p in (get_config().root.parent / "shared" / "papers", Path("/work/shared/papers"), PAPERS):
        if (p / "chain_of_evidence.txt").exists(): return p
    pytest.skip("shared/papers not found")


def _norm(s: str) -> str:
    "Paper text without PDF markup: bold markers, list dashes and all whitespace removed."
    s = s.replace("**", "")
    s = re.sub(r"(^|\n)\s*- ", r"\1", s)
    return re.sub(r"\s+", "", s)


@pytest.mark.parametrize("name", ["EXTRACT_INTENT_KEYWORDS_PROMPT", "EXTRACT_RELATIONS_PROMPT", "INTENT_PROMPT", "KEYWORD_PROMPT",
                                  "RELATION_PROMPT", "WRONG_ANSWER_PROMPT"])
def test_paper_prompts_verbatim(name):
    text = (_papers_dir() / "chain_of_evidence.txt").read_text(encoding="utf-8")
    assert _norm(getattr(coe, name)) in _norm(text), f"{name} differs from the paper's appendix"


@pytest.mark.parametrize("name", ["ANSWER_SYSTEM_PROMPT", "CORRECTNESS_JUDGE_PROMPT", "GROUNDEDNESS_JUDGE_PROMPT"])
def test_upstream_prompts_verbatim(name):
    text = (_papers_dir() / "coe_upstream_prompts.txt").read_text(encoding="utf-8")
    assert _norm(getattr(coe, name)) in _norm(text), f"{name} differs from coe_upstream_prompts.txt"


def test_prompts_keep_paper_placeholders_and_fill():
    assert coe.EXTRACT_RELATIONS_PROMPT.count("The output must be in json format") == 2  # printed twice in App. A
    assert coe.EXTRACT_INTENT_KEYWORDS_PROMPT.count("Example") == 5 and coe.WRONG_ANSWER_PROMPT.count("Input phrase:") == 6
    p = coe.fill(coe.RELATION_PROMPT, Relation="A is B.", External_Knowledge="K")
    assert p.endswith("Input relation description: A is B.\nInput external knowledge: K")
    assert "Prediction:  Rome" in coe.fill(coe.CORRECTNESS_JUDGE_PROMPT, Question="q", Reference_answer="Rome", Model_response="Rome")
    with pytest.raises(KeyError, match="left unfilled"): coe.fill(coe.KEYWORD_PROMPT, Keyword="x")
    ap = coe.answer_prompt("Who?", "Doc text")
    assert ap.startswith(coe.ANSWER_SYSTEM_PROMPT) and "Document:\nDoc text\n\nQuestion:\nWho?" in ap and ap.endswith("Answer:")


# ------------------------------------------------------------------------------------------------ parsers
@settings(max_examples=200, deadline=None)
@given(st.text())
def test_parsers_never_raise(text):
    f, r, v, ph = coe.parse_features(text), coe.parse_relations(text), coe.parse_verdict(text), coe.parse_phrase(text)
    assert f is None or (isinstance(f["intent"], str) and f["keywords"] and all(isinstance(k, str) and k for k in f["keywords"]))
    assert r is None or all(isinstance(x["description"], str) and x["description"] for x in r)
    assert v in (True, False, None) and (ph is None or (isinstance(ph, str) and ph))
    assert isinstance(coe.judge_verdict(text), bool)


words = st.text(alphabet=st.characters(whitelist_categories=("L", "N"), whitelist_characters=" '-,"), min_size=1, max_size=20).filter(lambda s: s.strip())


@settings(max_examples=100, deadline=None)
@given(words, st.lists(words, min_size=1, max_size=5), st.sampled_from(["", " ", "\n", "Output: "]), st.sampled_from(["", "\nExample6:", " trailing }"]))
def test_parse_features_roundtrip(intent, kws, pre, post):
    text = pre + json.dumps({"Intent": intent, "Keywords": kws}) + post
    got = coe.parse_features(text)
    assert got == {"intent": " ".join(intent.split()), "keywords": list(dict.fromkeys(" ".join(k.split()) for k in kws))}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.lists(words, max_size=3), words), max_size=4), st.sampled_from(["", " ", "Output: "]))
def test_parse_relations_roundtrip(rels, pre):
    text = pre + json.dumps([{"Keywords": k, "Description": d} for k, d in rels]) + "\nExample"
    got = coe.parse_relations(text)
    want = list({" ".join(d.split()): {"keywords": [" ".join(x.split()) for x in k], "description": " ".join(d.split())} for k, d in rels}.values())
    assert got == want


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(["yes", "Yes", "YES", "no", "No"]), st.sampled_from(["", " ", "\n", '"', "**"]), st.sampled_from(["", ".", "\nmore", ", because", '"']))
def test_parse_verdict(word, pre, post):
    assert coe.parse_verdict(pre + word + post) is (word.lower() == "yes")


def test_parse_verdict_unreadable_and_judge_rule():
    for s in ["", "maybe", "Yesterday", "none", "The answer is yes", None]:
        assert coe.parse_verdict(s) is None, s
    assert coe.judge_verdict(" Yes") and coe.judge_verdict("The answer is yes") and not coe.judge_verdict("No.")


# ------------------------------------------------------------------------------------------------ discrimination
class Scripted:
    "Replies in call order; records every prompt (a scripted client, for the decision rule and the call count only)."
    def __init__(self, replies): self.replies, self.prompts = list(replies), []
    @with_records
    def complete(self, prompts, **kw):
        self.prompts += list(prompts)
        return [[self.replies.pop(0)] for _ in prompts]


def feats(nk, nr):
    return {"intent": "Intent", "keywords": [f"kw{i}" for i in range(nk)],
            "relations": [{"keywords": ["kw0"], "description": f"relation {i}."} for i in range(nr)]}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 4), st.integers(0, 3)), min_size=1, max_size=4), st.data())
def test_call_count_and_decision_rule(shapes, data):
    n_calls = [1 + k + r for k, r in shapes]
    replies = data.draw(st.lists(st.sampled_from([" yes", "Yes.", " no", "maybe", ""]), min_size=sum(n_calls), max_size=sum(n_calls)))
    client, tw = Scripted(replies), TraceWriter()
    res = coe.discriminate(client, [(f"q{i}", feats(k, r), f"K{i}") for i, (k, r) in enumerate(shapes)], trace=tw)
    assert [x["calls"] for x in res] == n_calls and len(client.prompts) == sum(n_calls) == len(tw.records)
    start = 0
    for x, n in zip(res, n_calls):
        mine = [coe.parse_verdict(s) for s in replies[start:start + n]]
        assert x["is_coe"] == all(v is True for v in mine)  # CoE iff every feature is judged yes
        assert x["unreadable"] == sum(v is None for v in mine)  # unreadable = no, tallied
        start += n
    assert {r["stage"] for r in tw.records} <= {"discriminate/intent", "discriminate/keywords", "discriminate/relations"}
    assert all(r["prompt"].endswith(coe.VERDICT_CUE) for r in tw.records)


def test_no_relations_means_relation_condition_holds():
    assert coe.coe_decision({"intent": True, "keywords": [True, True], "relations": []})
    assert not coe.coe_decision({"intent": True, "keywords": [True], "relations": [False]})
    assert not coe.coe_decision({"intent": False, "keywords": [True], "relations": []})


def test_extract_features_counts_failures():
    client, tw = Scripted(['{ "Intent": "Birth year", "Keywords": ["Paul"] }', "garbage", "[not json"]), TraceWriter()
    f = coe.extract_features(client, ["Q1?", "Q2?"], ["a", "b"], tw)
    assert f[0] == {"intent": "Birth year", "keywords": ["Paul"], "relations": [], "relations_ok": False} and f[1] is None
    assert [r["stage"] for r in tw.records] == ["intent_keywords", "intent_keywords", "relations"]


# ------------------------------------------------------------------------------------------------ contexts
sentence = st.text(alphabet="abcdefgh ", min_size=1, max_size=15).filter(lambda s: s.strip()).map(lambda s: s.strip() + ".")


@settings(max_examples=150, deadline=None)
@given(st.lists(sentence, min_size=1, max_size=6), st.lists(st.text(alphabet="xyz ", min_size=1, max_size=30).filter(str.strip), min_size=1, max_size=5),
       st.sampled_from([0, 0.25, 0.5, 0.75]), st.sampled_from(coe.PLACEMENTS))
def test_irrelevant_context_length(sents, noise, p, placement):
    K = " ".join(sents)
    out = coe.irrelevant_context(K, noise, p, placement=placement, seed=1)
    need = int(len(K) * p / (1 - p))
    assert need == coe.irrelevant_chars(K, p)
    if need == 0: assert out == K
    elif placement == "after": assert out.startswith(K + " ") and len(out) == len(K) + 1 + need and set(out[len(K) + 1:]) <= set("xyz ")
    elif placement == "before": assert out.endswith(" " + K) and len(out) == len(K) + 1 + need
    else: assert sorted(out.replace(" ", "")) == sorted(coe.irrelevant_context(K, noise, p).replace(" ", ""))


def test_irrelevant_context_hand_computed():
    K = "x" * 30
    assert coe.irrelevant_context(K, ["ab"], 0.25) == K + " " + "ab ab ab ab " [:10]  # int(30·0.25/0.75) = 10
    assert len(coe.irrelevant_context(K, ["ab"], 0.75)) == 30 + 1 + 90
    with pytest.raises(ValueError, match="noise has no text"): coe.irrelevant_context(K, ["  "], 0.5)
    with pytest.raises(ValueError, match="placement"): coe.irrelevant_context(K, ["a"], 0.5, placement="middle")


@settings(max_examples=150, deadline=None)
@given(st.lists(sentence, min_size=1, max_size=8), st.lists(sentence, min_size=1, max_size=3), st.sampled_from([0, 0.25, 0.5, 0.75]),
       st.sampled_from(coe.PLACEMENTS))
def test_misinformation_context_counts(sents, mis, p, placement):
    K, n = " ".join(sents), len(sents)
    m = coe.misinformation_needed(K, p)
    assert m == (0 if p == 0 else max(int(n / (1 - p)) - n, 1))
    out = coe.misinformation_context(K, mis, p, placement=placement, seed=3)
    assert len(coe.split_sentences(out)) == n + m
    if placement == "after": assert out.startswith(K)


def test_misinformation_hand_computed():
    K = "A. B. C."
    assert [coe.misinformation_needed(K, p) for p in (0, 0.25, 0.5, 0.75)] == [0, 1, 3, 9]
    assert coe.misinformation_context(K, ["X is Y.", "Z"], 0.5) == "A. B. C. X is Y. Z. X is Y."
    with pytest.raises(ValueError, match="no misinformation"): coe.misinformation_context(K, [], 0.25)


def test_swap_answer_and_faithfulness_exclusions():
    assert coe.swap_answer("Born in Rome; ROME is big.", "Rome", "Paris") == ("Born in Paris; Paris is big.", 2)
    assert coe.swap_answer("No answer here.", "Rome", "Paris") == ("No answer here.", 0)
    rec = pd.DataFrame([dict(id="r", question="Where?", answer="Rome", wrong_ans="Paris", CoE="He was born in Rome.", SenP="He was born.",
                             WordP="He was born in Rome.", irrelevant_info=["noise"], misinformation=[])])
    jobs, excl = coe.build_contexts(rec, [0, 0.5])
    faith = [j for j in jobs if j["condition"] == "faithfulness"]
    assert {j["variant"] for j in faith} == {"CoE", "WordP"} and all("Paris" in j["context"] and "Rome" not in j["context"] for j in faith)
    reasons = sorted((e["condition"], e["variant"], e["reason"]) for e in excl)
    assert reasons == [("faithfulness", "SenP", "answer not in knowledge")] + [("misinformation", v, "no misinformation") for v in coe.VARIANTS]
    assert len(jobs) == 3 * 2 + 2 * 2 + 3 * 1  # irrelevant: 3 variants × 2 p; faithfulness: 2 × 2; misinformation: p = 0 only


# ------------------------------------------------------------------------------------------------ FR and the answer pipeline
def test_following_rate_definition():
    assert coe.following("It was in PARIS.", "Paris", None)  # contained, no judge needed
    assert coe.following("Rome", "Paris", True) and not coe.following("Rome", "Paris", False) and not coe.following("Rome", "Paris", None)


class ByPrompt:
    "Replies chosen from the prompt's kind; records the prompts."
    def __init__(self, answer, correct="yes", grounded="no"): self.answer, self.correct, self.grounded, self.prompts = answer, correct, grounded, []
    @with_records
    def complete(self, prompts, **kw):
        self.prompts += list(prompts)
        return [[self.correct if "correctness of predictions" in p else self.grounded if "groundedness" in p else self.answer] for p in prompts]


def test_run_conditions_acc_fr_and_judge_calls():
    rec = pd.DataFrame([dict(id="r", question="Where?", answer="Rome", wrong_ans="Paris", CoE="He was born in Rome.", SenP="He was born in Rome.",
                             WordP="He was born in Rome.", irrelevant_info=["noise"], misinformation=["He was born in Paris."])])
    jobs, _ = coe.build_contexts(rec, [0, 0.5])
    c = ByPrompt(" Paris\nmore")
    rows = coe.run_conditions(c, c, jobs, seeds=[1, 2])
    assert len(rows) == 2 * len(jobs) and set(rows["run"]) == {0, 1}
    f = rows[rows["condition"] == "faithfulness"]
    assert (f["fr"] == 1).all() and f["grounded"].isna().all()  # wrong answer contained: no groundedness call
    assert not any("groundedness" in p for p in c.prompts)
    a = rows[rows["condition"] != "faithfulness"]
    assert (a["acc"] == 1).all() and (~a["contains_gold"]).all()  # the judge said yes; containment disagrees
    cells = coe.cell_table(rows.assign(model="m", dataset="d"), "acc")
    assert (cells["agreement"] == 0).all() and (cells["runs"] == 2).all()
    c2 = ByPrompt(" Rome", grounded=" yes")
    r2 = coe.run_conditions(c2, c2, jobs, seeds=[1])
    assert (r2.loc[r2["condition"] == "faithfulness", "fr"] == 1).all() and any("groundedness" in p for p in c2.prompts)


def test_significance_two_and_one_sided():
    rows = pd.DataFrame([dict(model="m", dataset="d", condition="irrelevant", p=0.0, variant=v, id=f"q{i}", run=0, acc=float(a))
                         for v, accs in [("CoE", [1] * 8), ("SenP", [0] * 7 + [1]), ("WordP", [1] * 8)] for i, a in enumerate(accs)])
    sg = coe.significance(rows, "acc").set_index("variant")
    assert sg.loc["SenP", "stars"] == "*" and sg.loc["SenP", "p_one_sided"] < sg.loc["SenP", "p_two_sided"] < 0.05
    assert sg.loc["SenP", "U"] == 60 and sg.loc["SenP", "rank_biserial"] == pytest.approx(0.875)  # U = 8·7 + 0.5·8 ties
    assert sg.loc["WordP", "stars"] == ""


# ------------------------------------------------------------------------------------------------ ScopeCoE
def J(i, r, k): return {"intent": i, "relations": r, "keywords": k}


def recheck(judgements):
    "Coverage re-checked after each addition (what Algorithm 1 does NOT do)."
    S = {i for i, j in enumerate(judgements) if j["intent"]}
    for kind in ("relations", "keywords"):
        for f in range(len(judgements[0][kind])):
            if any(judgements[i][kind][f] for i in S): continue
            for i, j in enumerate(judgements):
                if j[kind][f]: S.add(i); break
    return sorted(S)


def test_minimal_coverage_as_printed_differs_from_recheck():
    js = [J(False, [False, True], []), J(False, [True, True], []), J(True, [False, False], [])]
    assert coe.minimal_coverage(js) == [0, 1, 2] and recheck(js) == [1, 2]  # relation 1 is added again (snippet 0)
    js = [J(False, [], [False, True]), J(False, [], [True, True]), J(False, [], [False, False])]
    assert coe.minimal_coverage(js) == [0, 1] and recheck(js) == [1]  # keywords too
    js = [J(False, [False], [True]), J(False, [True], [False]), J(False, [False], [True])]
    assert coe.minimal_coverage(js) == [0, 1]  # keyword uncovered after phase 2 -> first snippet with it
    js = [J(True, [True], [True]), J(True, [True], [True])]
    assert coe.minimal_coverage(js) == [0, 1]  # every intent snippet, no cap


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 3), st.integers(0, 3), st.data())
def test_minimal_coverage_properties(nr, nk, data):
    n = data.draw(st.integers(1, 7))
    js = [J(data.draw(st.booleans()), data.draw(st.lists(st.booleans(), min_size=nr, max_size=nr)), data.draw(st.lists(st.booleans(), min_size=nk, max_size=nk)))
          for _ in range(n)]
    S = coe.minimal_coverage(js)
    assert S == sorted(set(S)) and {i for i, j in enumerate(js) if j["intent"]} <= set(S)
    for kind in ("relations", "keywords"):
        for f in range(len(js[0][kind])):
            if any(j[kind][f] for j in js): assert any(js[i][kind][f] for i in S)
    # (no subset check against `recheck`: the re-checking variant can reach phase 3 with a keyword uncovered that
    # Algorithm 1 has covered already, and then add a snippet Algorithm 1 does not; the hand cases above show both ways)


# ------------------------------------------------------------------------------------------------ released data
def test_released_quirks_counted():
    hp, wk = coe.load_released("hotpotqa"), coe.load_released("2wiki")
    qh, qw = coe.quirks(hp), coe.quirks(wk)
    assert (qh["rows"], qh["unique questions"], qh["repeated question rows"]) == (679, 656, 23)
    assert (qw["rows"], qw["unique questions"]) == (661, 661)
    assert qh["irrelevant_info < 10"] == int((hp["irrelevant_info"].map(len) < 10).sum()) > 0
    assert qh["SenP == CoE"] > 0 and qh["wrong answer in CoE"] > 0
    s = coe.sample_records(hp, 5, seed=0)
    assert len(s) == 5 and s["question"].is_unique and s.equals(coe.sample_records(hp, 5, seed=0))



def test_paper_piece_count_hand_computed():
    # hand-counted pieces of str.split('.'): the empty piece after a final period counts, '!' and '?' do not split
    cases = {"A. B.": 3, "A. B": 2, "": 1, "No stop": 1, "Pi is 3.14.": 3, "Why? Yes!": 1, "A.B.": 3, "...": 4}
    assert {t: coe.paper_piece_count(t) for t in cases} == cases
    assert coe.paper_piece_count(None) == 1
    toy = pd.DataFrame([dict(CoE="A was born in Rome. B.", SenP="A was born in Rome.", WordP="A was born in Paris. B")])
    assert coe.paper_piece_counts(toy) == {"CoE": 3.0, "SenP": 2.0, "WordP": 2.0}
    assert coe.piece_counts(toy) == {"CoE": 2.0, "SenP": 1.0, "WordP": 2.0}  # ours: sentences


@given(st.lists(st.text(alphabet="abc xyz,", min_size=1).filter(str.strip), min_size=1, max_size=6))
def test_paper_rule_is_ours_plus_one_on_period_terminated_text(sents):
    text = " ".join(s + "." for s in sents)
    assert coe.paper_piece_count(text) == len(coe.split_sentences(text)) + 1 == len(sents) + 1


def test_paper_rule_reproduces_table1_coe_pieces():
    from kgrag_nb import papers
    paper = papers.paper_numbers(coe.STUDY.paper, table="Table 1", setting="CoE", metric="knowledge pieces")
    rule = coe.paper_rule_pieces()
    got = {d: round(x, 1) for d, x in rule.loc[rule["variant"] == "CoE", ["dataset", "knowledge pieces"]].itertuples(index=False)}
    assert got == dict(zip(paper["dataset"], paper["value"])) == {"hotpotqa": 4.0, "2wiki": 3.4}
    ours = {d: round(coe.piece_counts(coe.load_released(d))["CoE"], 2) for d in ("hotpotqa", "2wiki")}
    assert ours == {"hotpotqa": 3.05, "2wiki": 2.38}  # ours: about one piece fewer per text

# ------------------------------------------------------------------------------------------------ real embedded server
@pytest.mark.llm
def test_pipeline_embedded(embedded_server, tmp_path):
    from kgrag_nb.llm import LLMClient
    client = LLMClient(embedded_server.url, cache=tmp_path / "llm.sqlite", progress=False)
    rec = coe.sample_records(coe.load_released("2wiki"), 1, seed=0)
    tw = TraceWriter(tmp_path / "trace.jsonl")
    (f,) = coe.extract_features(client, rec["question"], rec["id"], tw)
    calls = TraceWriter.read(tw.path)  # free decoding (the paper's): readable or not, the call is traced and counted
    assert [c["stage"] for c in calls] == ["intent_keywords", "relations"][: 1 + (f is not None)]  # relations only after features
    assert (calls[0]["parsed"] is None) == (f is None) and coe.parse_features(calls[0]["completion"]) == calls[0]["parsed"]
    (fc,) = coe.extract_features(client, rec["question"], rec["id"], tw, decoding="constrained")  # the grammar's JSON always parses
    assert fc is not None and fc["keywords"] and tw.n == len(calls) + 2 == len(TraceWriter.read(tw.path))
    f = f if f is not None else fc  # no skip: the discrimination runs on the free features, else on the constrained ones
    n_extract = tw.n
    res = coe.discriminate(client, [(rec["id"][0] + "/" + v, f, rec[v][0]) for v in coe.VARIANTS], tw)
    assert all(0 <= r["unreadable"] <= r["calls"] for r in res)  # unreadable verdicts are counted (as 'no'), never dropped
    assert [r["calls"] for r in res] == [1 + len(f["keywords"]) + len(f["relations"])] * 3
    assert tw.n == n_extract + sum(r["calls"] for r in res) == len(TraceWriter.read(tw.path))
    rec = rec.assign(misinformation=[["He was born in Paris."]])
    jobs, excl = coe.build_contexts(rec, [0.5], conditions=["irrelevant", "faithfulness"])
    rows = coe.run_conditions(client, client, jobs, seeds=[0])
    assert len(rows) == len(jobs) and rows["output"].map(lambda s: isinstance(s, str)).all()
    assert rows.loc[rows["condition"] == "irrelevant", "acc"].isin([0.0, 1.0]).all()
    assert rows.loc[rows["condition"] == "faithfulness", "fr"].isin([0.0, 1.0]).all()


# ------------------------------------------------------------------------------------------------ rebuild and pools (pure logic)
class Rules:
    "Replies by prompt kind; `coe_until` = number of sentences a knowledge text needs to be judged CoE (keyword verdicts)."
    def __init__(self, need_sentences=2): self.need, self.n = need_sentences, 0
    @with_records
    def complete(self, prompts, **kw):
        out = []
        for p in prompts:
            self.n += 1
            if p.startswith("Please extract both"): r = '{ "Intent": "Birth place", "Keywords": ["Oberoi Group", "hotel company"] }'
            elif p.startswith("Please extract relations"): r = "[]"
            elif p.startswith("Replace the phrase"): r = " business organization"
            elif p.startswith("For the input phrase"): r = " Mumbai"
            elif "Input Keyword:" in p:
                know = p.split("Input external knowledge: ", 1)[1]
                r = "yes" if len(coe.sentence_spans(know.rsplit("\nOutput:", 1)[0])) >= self.need else "no"
            else: r = "yes"
            out.append([r])
        return out


def hotpot_record(sents, answer="Delhi"):
    from kgrag_nb.datasets import QARecord
    return QARecord(id="h1", question="The Oberoi Group is a hotel company with a head office in what city?", answers=[answer],
                    context=[{"title": "Oberoi", "sentences": sents}, {"title": "Other", "sentences": ["Unrelated text."]}],
                    supporting_facts=[("Oberoi", i) for i in range(len(sents))])


def test_rebuild_senp_wordp_and_counts():
    sents = ["The Oberoi Group is a hotel company.", "The Oberoi Group has its head office in Delhi.", "The Oberoi Group has staff."]
    tw = TraceWriter()
    df = coe.rebuild_samples(Rules(need_sentences=3), [hotpot_record(sents)], seed=0, trace=tw)
    r = df.iloc[0]
    assert r["is_coe"] and r["senp_status"] == "ok" and r["senp_removed"] == 1  # first candidate (keyword, no answer) removed -> Non-CoE
    assert r["SenP"] == " ".join(sents[1:]) and r["wrong_ans"] == "Mumbai"
    assert r["wordp_status"] == "ok" and "business organization" in r["WordP"] and "Delhi" in r["WordP"]
    # never Non-CoE after every removal: counted as "cannot be perturbed"
    df2 = coe.rebuild_samples(Rules(need_sentences=1), [hotpot_record(sents)], seed=0)
    assert df2.iloc[0]["senp_status"] in ("still CoE", "nothing left") and coe.rebuild_summary(df2)["SenP cannot be perturbed"] == 1
    assert coe.rebuild_samples(Rules(), [hotpot_record(sents, answer="yes")]).empty  # yes/no questions are left out
    assert {t["stage"] for t in tw.records} >= {"intent_keywords", "relations", "discriminate/intent", "broader_term", "wrong_answer"}


def test_pools_keep_gold_cap_and_are_seeded():
    rec = hotpot_record([f"Gold sentence {i}." for i in range(3)])
    rec.context.append({"title": "More", "sentences": [f"Other {i}." for i in range(20)]})
    sn, gold = coe.pool_hotpot(rec, max_pool=8, seed=1)
    assert len(sn) == 8 and sum(gold) == 3 and all(s.startswith("Gold") == g for s, g in zip(sn, gold))
    assert (sn, gold) == coe.pool_hotpot(rec, max_pool=8, seed=1)
    r = dict(question="Q?", answer="Rome", CoE="A is in Rome. B is old.", irrelevant_info=["n1", "n2"])
    sn, gold = coe.pool_released(r, None, seed=0)
    assert sorted(sn) == sorted(["n1", "n2", "A is in Rome.", "B is old."]) and sum(gold) == 2
    assert all((s in ("A is in Rome.", "B is old.")) == g for s, g in zip(sn, gold))


def test_discrimination_rates_direction():
    j = pd.DataFrame([dict(dataset="d", variant=v, is_coe=c, unreadable=0, calls=3) for v, c in
                      [("CoE", True), ("CoE", False), ("SenP", False), ("SenP", False), ("WordP", True), ("WordP", True)]])
    r = coe.discrimination_rates(j).set_index("variant")["rate"].to_dict()
    assert r == {"CoE": 50.0, "SenP": 100.0, "WordP": 0.0}


def test_rebuild_summary_states_both_denominators():
    # 4 candidates: 2 accepted, 1 rejected, 1 with unreadable features (no verdict). The paper's 676/1,000 (§4.1)
    # divides by candidates: 2/4 = 50 %; among readable verdicts it is 2/3
    df = pd.DataFrame(dict(is_coe=[True, True, False, None], features_ok=[True, True, True, False],
                           senp_status=["ok", "nothing left", None, None], wordp_status=["ok", "ok", None, None],
                           wordp_is_coe=[False, True, None, None], CoE=["A. B.", "C. D. E.", "F.", "G."],
                           SenP=["A.", None, None, None]))
    s = coe.rebuild_summary(df)
    assert s["records"] == 4 and s["CoE accepted"] == 2 and s["features unreadable"] == 1
    assert s["acceptance % of candidates"] == 50.0 and abs(s["acceptance % of verdicts"] - 200 / 3) < 1e-9
    assert s["SenP ok"] == 1 and s["SenP cannot be perturbed"] == 1 and s["WordP rejected (Non-CoE)"] == 1


# ------------------------------------------------------------------------------------------------ constrained decoding (issue 21)
CONSTRAINTS = {"FEATURES": coe.parse_features, "RELATIONS": coe.parse_relations, "VERDICT": coe.parse_verdict,
               "JUDGE_VERDICT": coe.parse_verdict, "PHRASE": coe.parse_phrase, "SENTENCE": coe.parse_phrase}


@pytest.mark.parametrize("name", sorted(CONSTRAINTS))
@pytest.mark.parametrize("seed", [0, 1])
def test_every_constraint_filled_by_the_stub_parses(name, seed):
    from kgrag_nb.llm import Constraint, fill_constraint
    c = getattr(coe, name)
    assert isinstance(c, Constraint)
    text = fill_constraint(c.spec(), seed=seed)
    assert CONSTRAINTS[name](text) is not None, (name, text)  # parsed ok, by the very parser of the unconstrained output


def test_decoding_modes_send_the_constraint_and_count_the_same():
    class Rec:
        def __init__(self, reply): self.reply, self.calls = reply, []
        @with_records
        def complete(self, prompts, **kw):
            self.calls.append((list(prompts), kw)); return [[self.reply] for _ in prompts]
    f = {"intent": "Birth year", "keywords": ["Paul"], "relations": []}
    free, con = Rec(" Yes, it is"), Rec(" yes")
    assert coe.discriminate(free, [("q", f, "K")])[0]["is_coe"] == coe.discriminate(con, [("q", f, "K")], decoding="constrained")[0]["is_coe"]
    assert "constraint" not in free.calls[0][1] and con.calls[0][1]["constraint"] == coe.VERDICT and con.calls[0][1]["stop"] is None
    dec, tw = Rec(" no"), TraceWriter()
    (r,) = coe.discriminate(dec, [("q", f, "K")], tw, decoding="decoupled")
    assert len(dec.calls) == 2 and "constraint" not in dec.calls[0][1] and dec.calls[1][1]["constraint"] == coe.VERDICT
    assert all(p.endswith(" no" + coe.REFORMAT["verdict"].line) for p in dec.calls[1][0]) and r["is_coe"] is False
    assert [t["stage"] for t in tw.records] == ["discriminate/intent/free", "discriminate/keywords/free", "discriminate/intent", "discriminate/keywords"]
    with pytest.raises(ValueError, match="free"): coe.discriminate(con, [("q", f, "K")], decoding="json")
    S = coe.STUDY
    assert S.deviation_lines("evidence", "free") == list(S.deviations["evidence"]) and "decoupled" in S.deviation_lines("evidence", "decoupled")[-1]


def test_misinformation_decoupled_regroups_n_samples():
    class Rec:
        def __init__(self): self.n = 0
        @with_records
        def complete(self, prompts, n=1, **kw):
            out = [[f" It is in Paris {self.n + i * n + k}." for k in range(n)] for i in range(len(prompts))]
            self.n += len(prompts) * n
            return out
    rec = pd.DataFrame([dict(id="r", question="Where?", answer="Rome", wrong_ans="Paris", CoE="He was born in Rome.")])
    for n in (1, 2):
        c = Rec()
        (mis,) = coe.make_misinformation(c, rec, n_generated=n, decoding="decoupled")
        assert mis[0] == "He was born in Paris." and len(mis) == 1 + n and c.n == 2 * n  # n free + n restated


@pytest.mark.llm
def test_constrained_steps_embedded(embedded_server, tmp_path):
    "Constrained App. A features and App. B / judge verdicts on the real embedded model, read by the study's parsers."
    from kgrag_nb.llm import LLMClient
    client = LLMClient(embedded_server.url, cache=tmp_path / "llm.sqlite", progress=False)
    rec = coe.sample_records(coe.load_released("hotpotqa"), 1, seed=0)
    tw = TraceWriter()
    (f,) = coe.extract_features(client, rec["question"], rec["id"], tw, decoding="constrained")
    assert f is not None and f["relations_ok"], tw.records  # the grammar makes the JSON; only max_tokens could cut it
    (j,) = coe.discriminate(client, [(rec["id"][0], f, rec["CoE"][0])], tw, decoding="constrained")
    assert j["unreadable"] == 0 and j["calls"] == 1 + len(f["keywords"]) + len(f["relations"])
    jp = [coe.fill(coe.CORRECTNESS_JUDGE_PROMPT, Question=rec["question"][0], Reference_answer=rec["answer"][0], Model_response=a)
          for a in (rec["answer"][0], "I do not know")]
    out = client.complete(jp, max_tokens=coe.JUDGE_TOKENS, constraint=coe.JUDGE_VERDICT)
    assert all(o[0] in coe.JUDGE_VERDICT.value and coe.parse_verdict(o[0]) is not None for o in out), out


# ---------------------------------------------------------------- format tax (issue 21 item 4)
def test_format_tax_declaration_and_bad_decoding():
    from kgrag_nb.studies.coe import STUDY
    from kgrag_nb.studies.coe.evidence import format_tax_arm
    arm = STUDY.arm("coe").as_dict()
    assert set(arm) == {"study", "step", "metric", "paper", "settings"} and arm["study"] == "coe"
    assert "its own judge" in arm["settings"] and "p = 0.5" in arm["settings"]  # where the arm differs from the paper
    assert "92.0%" in arm["paper"] and "Table 2" in arm["paper"]
    with pytest.raises(ValueError, match="decoding"):
        format_tax_arm(None, "json", 1)


@pytest.mark.llm
def test_format_tax_arm_constrained_embedded(embedded_server, tmp_path):
    "The CoE format-tax arm (constrained) on the real server: one record with the contract's keys and types."
    from kgrag_nb.llm import LLMClient
    from kgrag_nb.studies.coe.evidence import format_tax_arm
    from _format_tax import one_constrained_record
    r = one_constrained_record(format_tax_arm, LLMClient(embedded_server.url, cache=tmp_path / "llm.sqlite", progress=False), "coe")
    assert r["item"].startswith("hotpotqa:")
    assert r["fired"] is None and r["finished"] is None and r["kept"] is None
    assert r["features_ok"] and r["verdicts"] >= 2 and 0 <= r["verdicts_readable"] <= r["verdicts"]


def test_format_tax_arm_counts_with_the_stub():
    "The arm on 2 released records with the stub's rule (constraint filled, free text otherwise): free reads nothing,"
    " constrained and decoupled read every output; the same items in every arm."
    from kgrag_nb.llm import fill_constraint
    from kgrag_nb.metrics import _check_tax_record

    class Stub:
        def __init__(self): self.calls = 0
        @with_records
        def complete(self, prompts, constraint=None, n=1, **kw):
            self.calls += len(prompts)
            return [[fill_constraint(constraint.spec()) if constraint is not None else " free text, no format"] * n for _ in prompts]
    arms = {d: coe.format_tax_arm(Stub(), d, 2) for d in ("free", "constrained", "decoupled")}
    assert [r["item"] for r in arms["free"]] == [r["item"] for r in arms["constrained"]] == [r["item"] for r in arms["decoupled"]]
    for d, out in arms.items():
        assert len(out) == 2 and all(_check_tax_record(r, d) for r in out)
    # free: features unreadable (no discrimination), two unreadable judge replies -> 0 of 3 outputs read, ACC 0
    assert all((r["parsed"], r["features_ok"], r["verdicts"], r["verdicts_readable"], r["metric"]) == (0.0, False, 2, 0, 0.0)
               for r in arms["free"])
    for d in ("constrained", "decoupled"):  # the stub's minimal features: intent + 1 keyword, no relation -> 2 + 2 judge verdicts
        assert all((r["parsed"], r["features_ok"], r["verdicts"], r["verdicts_readable"]) == (1.0, True, 4, 4) for r in arms[d])


# ------------------------------------------------------------------------------------------------ issue 22 item 11: roles and Table 5 arms
def test_roles_spec_hand_computed():
    assert coe.roles_spec(None, None, None) is None  # tiny/smoke: the judge is the answering client, and it plays the roles
    assert coe.roles_spec(None, "http://judge/v1", "Llama-3.1-70B") is None  # full: the judge's client
    assert coe.roles_spec("Llama-3.1-70B", "http://judge/v1", "Llama-3.1-70B") is None  # the judge's model named: same client
    assert coe.roles_spec("Qwen-72B", "http://judge/v1", "Llama-3.1-70B") == {"base_url": "http://judge/v1", "model": "Qwen-72B"}
    assert coe.roles_spec("Qwen-72B", None, None) == {"base_url": None, "model": "Qwen-72B"}  # the answering endpoint


def test_role_models_table():
    t = coe.role_models(["A-7B", "B-13B"], "R-70B", "J-70B").set_index("role")
    assert t.loc["answers (Tables 2–5)", "ours"] == "A-7B, B-13B" and t.loc["answers (Tables 2–5)", "paper"] == ", ".join(coe.PAPER_MODELS)
    for role in ("extraction", "discrimination", "broader terms (WordP)", "wrong answers", "misinformation"):
        assert (t.loc[role, "paper"], t.loc[role, "ours"]) == ("GPT-4o", "R-70B"), role
    assert t.loc["judges (correctness, groundedness)", "ours"] == "J-70B" and len(t) == 7


def _uq(qid, features, n_snip=3):
    return dict(id=qid, question=f"{qid}?", answer="Delhi", features=features, snippets=[f"s{i} Delhi." if i == 0 else f"s{i}." for i in range(n_snip)],
                is_gold=[i == 0 for i in range(n_snip)], setting="(a)", dataset="d")


def test_same_questions_rule_hand_computed():
    f = feats(1, 0)
    qs = [_uq("q1", f), _uq("q2", None), _uq("q3", f, 2)]
    jobs = coe.pair_jobs(qs, rag=[[2, 0], [1, 0, 2], [1]], scoped=[[0], None, [0, 1]])
    assert [(j["id"], j["method"], j["scope_failed"]) for j in jobs] == [
        ("q1", "RAG", False), ("q1", "RAG+ScopeCoE", False), ("q2", "RAG", False), ("q2", "RAG+ScopeCoE", True),
        ("q3", "RAG", False), ("q3", "RAG+ScopeCoE", False)]
    assert jobs[3]["selected"] == [] and jobs[3]["context"] is None and jobs[0]["context"] == "s2.\ns0 Delhi."
    with pytest.raises(ValueError, match="2 questions"): coe.pair_jobs(qs[:2], [[0]] * 3, [None] * 3)
    c = ByPrompt(" Delhi")  # answers Delhi, the judge says yes
    rows = coe.answer_usability(c, c, jobs, seeds=[0, 1])
    assert len(c.prompts) == 2 * (5 + 5)  # two runs x (5 answers + 5 judges): the failed ScopeCoE job sends nothing
    assert len(rows) == 2 * 6 and rows["scope_failed"].sum() == 2  # the failure is a row of every run
    fail = rows[rows["scope_failed"]]
    assert (fail["acc"] == 0).all() and (~fail["contains_gold"]).all() and fail["gold_recall"].isna().all() and fail["output"].isna().all()
    t = coe.usability_table(rows.assign(model="m")).set_index("method")
    assert t["n"].to_dict() == {"RAG": 3, "RAG+ScopeCoE": 3}  # the same three questions in both arms
    assert t.loc["RAG", "ACC mean"] == 100.0 and t.loc["RAG+ScopeCoE", "ACC mean"] == pytest.approx(200 / 3)  # q2 counts 0
    assert t["scope_failed"].to_dict() == {"RAG": 0, "RAG+ScopeCoE": 1}
    assert t.loc["RAG", "snippets"] == 2.0 and t.loc["RAG+ScopeCoE", "snippets"] == 1.5  # (2+3+1)/3; (1+2)/2 over the scoped questions
    assert t.loc["RAG", "gold_recall"] == pytest.approx(200 / 3) and t.loc["RAG+ScopeCoE", "gold_recall"] == 100.0  # q3's RAG misses s0


def test_feature_and_relation_formats_admit_what_app_a_admits():
    "App. A asks for the question's keywords and the relations among them, with no count: five keywords and three relations are readable."
    import jsonschema
    jsonschema.validate({"Intent": "Birth place", "Keywords": ["a", "b", "c", "d", "e"]}, coe.FEATURES_SCHEMA)
    jsonschema.validate([{"Keywords": [x, "b"], "Description": "x."} for x in "acd"], coe.RELATIONS_SCHEMA)
    assert coe.parse_features('{ "Intent": "Birth place", "Keywords": ["a", "b", "c", "d", "e"] }')["keywords"] == list("abcde")


def test_scopecoe_reports_what_phase_1_kept_of_the_pool():
    "ScopeCoE's phase 1 keeps the snippets whose intent verdict is yes: a judge that says yes to everything keeps the whole pool."
    f = feats(1, 0)
    qs = [_uq("q1", f, 4), _uq("q2", None, 3)]
    class AllYes:
        @with_records
        def complete(self, prompts, **kw): return [[" yes"] for _ in prompts]
    jobs = coe.usability_jobs(AllYes(), qs)
    scoped = {j["id"]: j for j in jobs if j["method"] == "RAG+ScopeCoE"}
    assert scoped["q1"]["phase1_kept"] == 4 and scoped["q2"]["phase1_kept"] is None  # all 4 offered; no features, no phase 1
    rows = coe.answer_usability(ByPrompt(" Delhi"), ByPrompt(" Delhi"), jobs, seeds=[0])
    t = coe.usability_table(rows.assign(model="m")).set_index("method")
    assert t.loc["RAG+ScopeCoE", "phase1_kept"] == 4 and t.loc["RAG+ScopeCoE", "pool"] == 3.5 and pd.isna(t.loc["RAG", "phase1_kept"])


def test_constrained_deviation_states_the_lowercase_yes_no():
    "The yes/no formats admit lower case only while the authors' judge rule is case-insensitive: the deviation says so."
    line = coe.STUDY.deviation_lines("evidence", "constrained")[-1]
    assert "lower case only" in line and "any case" in line and coe.VERDICT.value == (" yes", " no")
    assert coe.judge_verdict(" Yes") and coe.judge_verdict(" yes")  # the authors' rule (coe_upstream_prompts.txt §5)
