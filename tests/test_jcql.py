"""JCQL agent side (jcql_joint_kbc_kbqa.txt §3.2-3.4, App. E): the action parser on Prompt 2's example and under
fuzzing, Parse's BFS on a hand-made G_q, replay batch composition, the no-gold-in-test-prompts rule, the Table 3
ablations (action gone from prompt and dispatcher), Complete with a real trained completer (PyKEEN TransE), App. E's
Prompts 1-7 and both worked examples verbatim against the paper text, Fig. 5 never fine-tuning on a held-out triple, and
the agent on the real embedded server (marked `llm`)."""
import asyncio, re
from collections import Counter
from dataclasses import replace

import numpy as np, pandas as pd
import pytest
from hypothesis import given, settings, strategies as st

from kgrag_nb.kg import KG
from kgrag_nb.kgqa import Question, get_method
from kgrag_nb.studies.jcql.kbqa import (ACTIONS, EXAMPLE_TEST, AgentConfig, AgentKB, GoldLeakError, JCQLAgent, ParsedStep, _Run,
                           agent_example, agent_instruction, bfs_path, expand_paths, gold_leaks, parse_step, parse_triples,
                           parse_trajectory, replay_batch, slm_triples, step_prompt)
from kgrag_nb.studies.jcql import kbqa as J

# ---------------------------------------------------------------- the action parser

def test_parser_on_prompt2_example():
    got = [parse_step(f" {th}\nAction {i}: {act}") for i, (_, th, act, _) in enumerate(EXAMPLE_TEST["steps"], 1)]
    assert [(s.action, s.args, s.failure) for s in got] == [
        ("search", ["William Shakespeare"], None), ("generate", ["who are William Shakespeare’s father?"], None),
        ("generate", ["who are William Shakespeare’s mother?"], None), ("search", ["John Shakespeare", "Mary Shakespeare"], None),
        ("complete", ["John Shakespeare", "occupation"], None), ("finish", ["John Shakespeare"], None)]
    assert got[3].raw_action == "Search[John Shakespeare | Mary Shakespeare]" and not any(s.repairs for s in got)
    # the model often runs on: only the first action counts
    s = parse_step(" I search.\nAction 1: Search[Paris]\nObservation 1: Paris, country, France\nThought 2: done\nAction 2: Finish[France]")
    assert (s.action, s.args) == ("search", ["Paris"])


@pytest.mark.parametrize("text,failure", [("", "no action"), ("I think.", "no action"), ("x\nAction 1: Search[]", "search without arguments"),
                                          ("x\nAction 1: Complete[a | b | c]", "complete needs [head | relation], got 3 argument(s)"),
                                          ("x\nAction 1: Lookup[Paris]", "unknown action 'Lookup'"), ("x\nAction 1: go home", "no Name[...] in the action")])
def test_parser_failures(text, failure):
    assert parse_step(text).failure == failure and parse_step(text).action is None


_arg = st.text(st.characters(blacklist_characters="|[]\n\r", blacklist_categories=("Cs", "Zl", "Zp", "Cc")), min_size=1, max_size=20).filter(lambda s: s.strip())

@settings(max_examples=200, deadline=None)
@given(kind=st.sampled_from(["Search", "Finish", "Complete"]), args=st.lists(_arg, min_size=1, max_size=4),
       thought=st.text(max_size=50).filter(lambda s: "action" not in s.lower() and "[" not in s))
def test_parser_roundtrip(kind, args, thought):
    args = args[:2] if kind == "Complete" else args
    if kind == "Complete" and len(args) < 2: args = args + ["rel"]
    s = parse_step(f"{thought}\nAction 3: {kind}[{' | '.join(args)}]")
    assert s.failure is None and s.action == kind.lower() and s.args == [a.strip() for a in args]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200), st.lists(st.sampled_from(ACTIONS[:3]), unique=True))
def test_parser_never_raises_and_respects_enabled_actions(text, extra):
    acts = tuple(extra) + ("finish",)
    s = parse_step(text, acts)
    assert isinstance(s, ParsedStep)
    assert (s.action is None) == (s.failure is not None)
    assert s.action is None or s.action in acts

# ---------------------------------------------------------------- Parse: BFS on G_q

G_Q = [("Obama", "spouse", "Michelle"), ("Michelle", "born in", "Chicago"), ("Obama", "born in", "Honolulu"),
       ("Honolulu", "located in", "Hawaii"), ("Chicago", "located in", "Illinois"), ("Malia", "parent", "Michelle"),
       ("Paris", "capital of", "France")]

def test_bfs_hand_made_gq():
    assert bfs_path(G_Q, "Obama", "Chicago") == [0, 1]
    assert bfs_path(G_Q, "obama", "Illinois") == [0, 1, 4]
    assert bfs_path(G_Q, "Obama", "Hawaii") == [2, 3]
    assert bfs_path(G_Q, "Malia", "Obama") == [5, 0]  # edges are followed both ways
    assert bfs_path(G_Q, "Obama", "France") is None and bfs_path(G_Q, "Obama", "Obama") == []
    # expansion: every triple at Obama, Michelle or Chicago
    assert expand_paths(G_Q, [0, 1]) == [0, 1, 2, 4, 5]


def test_parse_trajectory_drops_wrong_answers_and_their_triples():
    from kgrag_nb.kgqa import Prediction
    steps = [dict(triples=[[*t, "search"] for t in G_Q[:3]]), dict(triples=[["Obama", "born in", "Kenya", "generate"]])]
    pred = Prediction("q", "jcql train", "Kenya | Honolulu", ["Kenya", "Honolulu"], 3, meta=dict(steps=steps))
    q = Question("q", "where was obama born?", ["/m/o"], ["Honolulu"], topic_names=["Obama"])
    p = parse_trajectory(pred, q)
    assert p["dropped_wrong"] == ["Kenya"] and p["n_dropped"] == 1
    assert p["paths"] == {"Honolulu": [["Obama", "born in", "Honolulu"]]}
    assert [t[:3] for t in p["expanded"]] == [list(G_Q[0]), list(G_Q[2])]  # the one-hop triples of Obama and Honolulu in G_q


def test_parse_trajectory_searches_from_every_topic_entity():
    "E_q is a set (§2): a path from the second topic entity counts, and the shortest path over all topics is kept."
    from kgrag_nb.kgqa import Prediction
    tri = [["Male", "gender of", "Nobody", "search"], ["Apartheid", "opposed by", "Robert F. Kennedy", "search"],
           ["Male", "gender of", "Ted Kennedy", "search"], ["Ted Kennedy", "sibling", "Robert F. Kennedy", "search"]]
    pred = Prediction("q", "jcql train", "Robert F. Kennedy", ["Robert F. Kennedy"], 1, meta=dict(steps=[dict(triples=tri)]))
    one = parse_trajectory(pred, Question("q", "who?", ["/m/m"], ["Robert F. Kennedy"], topic_names=["Male"]))
    assert one["paths"] == {"Robert F. Kennedy": [tri[2][:3], tri[3][:3]]}  # two hops from the only topic
    both = parse_trajectory(pred, Question("q", "who?", ["/m/m", "/m/a"], ["Robert F. Kennedy"], topic_names=["Male", "Apartheid"]))
    assert both["paths"] == {"Robert F. Kennedy": [tri[1][:3]]}  # one hop from the second topic beats two from the first
    none = parse_trajectory(pred, Question("q", "who?", ["/m/x"], ["Robert F. Kennedy"], topic_names=["France"]))
    assert none["paths"] == {} and none["expanded"] == []

def test_path_questions_on_the_complete_smoke_slice():
    "Setting Details: the training questions Algorithm 1 takes first have a topic → answer path inside the complete slice."
    from kgrag_nb.studies.jcql import kbc as K
    full = K.fb15k237_splits()["all"]
    topics, _ = K.slice_topics(full, ["cwq", "webqsp"], 10, 0)  # the smoke slice of jcql_kbc
    idx = K.slice_triples(full, topics, 2, 3000, 0)
    sl = full.subgraph(idx)
    names = J.entity_names(full)
    for d in ("cwq", "webqsp"):
        got = J.path_questions(d, sl, 3, seed=0, max_hops=2)
        assert len(got) == 3 and got["hops"].between(1, 2).all() and got["id"].is_unique, got
        assert J.path_questions(d, sl, 3, seed=0, max_hops=2)["id"].tolist() == got["id"].tolist()  # seeded
        qs = {q.id: q for q in J.kbqa_questions(d, "train", full)}
        for _, r in got.iterrows():
            tri = sl.triples[r["triples"]]  # indices of the graph passed in
            assert set(map(tuple, tri.tolist())) <= set(map(tuple, full.triples[idx].tolist()))  # every path triple is a slice triple
            ends = [str(names[e]) for e in (set(tri[:, 0].tolist()) | set(tri[:, 2].tolist()))]
            assert r["topic"] in qs[r["id"]].topic_names and r["answer"] in qs[r["id"]].answers
            assert r["topic"] in ends and any(J._name_key(a) == J._name_key(r["answer"]) for a in ends)
    with pytest.raises(ValueError, match="dataset"): J.path_questions("nq", sl, 1)


# ---------------------------------------------------------------- replay

def test_replay_batch_composition():
    mem = [(f"h{i}", "r", f"t{i}") for i in range(1000)]
    path = [("a", "r", "b"), ("c", "r", "d"), ("e", "r", "f")]
    p, rep = replay_batch(path, mem, 10, seed=7)
    assert p == path and len(rep) == 30 and len(set(rep)) == 30 and set(rep) <= set(mem)
    assert replay_batch(path, mem, 10, seed=7) == (p, rep) and replay_batch(path, mem, 10, seed=8)[1] != rep
    for k in (0, 5, 15, 20): assert len(replay_batch(path, mem, k, seed=0)[1]) == 3 * k
    with pytest.raises(ValueError, match="n_replay"): replay_batch(path, mem, -1)
    with pytest.raises(ValueError, match="empty"): replay_batch(path, [], 10)


def test_replay_is_uniform():
    mem = [(i,) for i in range(10)]
    c = Counter(t[0] for s in range(400) for t in replay_batch([("x",)], mem, 10, seed=s)[1])
    # 4,000 draws over 10 cells: expected 400 each, sd ~19; each draw is without replacement inside a batch -> exactly 400
    assert set(c) == set(range(10)) and all(abs(v - 400) < 100 for v in c.values())

# ---------------------------------------------------------------- Fig. 5: no held-out triple is trained on (issue 22 item 7)

def test_exclude_held_out_hand_computed():
    b = [[("a", "r", "b"), ("c", "r", "d")], [("c", "r", "d")], [("e", "r", "f")]]
    assert J.exclude_held_out(b, [("c", "r", "d"), ("x", "r", "y")]) == ([[("a", "r", "b")], [], [("e", "r", "f")]], 2)
    assert J.exclude_held_out(b, []) == ([list(x) for x in b], 0) and J.exclude_held_out([], [("c", "r", "d")]) == ([], 0)


@pytest.mark.slow  # trains a 5-entity SLM for a few seconds
def test_replay_study_never_fine_tunes_on_held_out_triples(tmp_path):
    "A real (toy) KBC SLM: path triples that are held-out KBC test triples are dropped, counted and never scored as paths."
    from kgrag_nb.studies.jcql import kbc as K
    ents = ["Ann", "Bob", "Cy", "Dee", "Eve"]
    train = [("Ann", "parent", "Bob"), ("Bob", "parent", "Cy"), ("Cy", "parent", "Dee"), ("Ann", "likes", "Eve"),
             ("Eve", "likes", "Dee"), ("Dee", "likes", "Ann")]
    valid, test = [("Cy", "likes", "Bob")], [("Dee", "parent", "Eve"), ("Bob", "likes", "Ann")]
    data = K.KBCData(ents, ["parent", "likes"], train, valid, test, train + valid + test)
    cfg = K.SLMConfig(d_model=32, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=2, d_kv=16, vocab_size=300,
                      epochs=5, batch_size=6, lr=1e-2, R=30, log_every=10)
    K.train_kbc(data, cfg, seed=0).save(tmp_path / "ck")
    load = lambda: K.KBCModel.load(tmp_path / "ck")
    batches = [[test[0], valid[0]], [test[1]]]  # oracle-style paths: complete-KB triples outside the KBC training set
    f5 = J.replay_study(load, batches, data.train, test, data.known, sizes=(0, 2), seed=0)
    assert len(f5) == 6 and f5["held_out_excluded"].eq(2).all()
    assert f5.loc[f5["on"] == "path triples", "n"].eq(1).all() and f5.loc[f5["on"] == "held-out triples", "n"].eq(2).all()
    assert f5.loc[f5["replay"] != "none", "updates"].eq(1).all()  # the batch left empty is no update
    with pytest.raises(ValueError, match="nothing to fine-tune"): J.replay_study(load, [[test[1]]], data.train, test, data.known, sizes=(0,))
    with pytest.raises(ValueError, match="in the replay memory"):
        J.replay_study(load, batches, data.train + test[:1], test, data.known, sizes=(0,))


# ---------------------------------------------------------------- App. E prompts verbatim (issue 22 item 9)

def _paper() -> str:
    from kgrag_nb.papers import paper_text
    return paper_text(J.STUDY.paper)  # shared/papers/ beside the data mirror; missing = an error, never a skip


def _app_e_prompt(k: int) -> str:
    "The text of App. E's Prompt k: the line after its title, from '\\bullet Instruction:' on."
    m = re.search(rf"\nPrompt {k}\.\n[^\n]+\n(\\bullet Instruction:[^\n]+)", _paper())
    assert m, f"Prompt {k} not found in {J.STUDY.paper}"
    return m.group(1)


def _flat(s: str) -> str:
    "PDF text and ours compared without the bullet markers and without any whitespace (line breaks are ours)."
    return re.sub(r"\s+", "", s.replace("\\bullet", ""))


@pytest.mark.parametrize("k,train", [(1, True), (2, False)])
def test_agent_prompts_1_2_and_their_examples_are_app_e_verbatim(k, train):
    "Prompt 1 (training, Woodrow Wilson example) and Prompt 2 (inference, Shakespeare example), every word and bracket."
    ours = f"Instruction: {agent_instruction(ACTIONS, train)}\nExample:\n{agent_example(ACTIONS, train)}"
    assert _flat(ours) == _flat(_app_e_prompt(k))
    head = step_prompt(_question(), [], ACTIONS, train)[0]  # what the agent sends starts with them
    assert head.startswith(agent_instruction(ACTIONS, train) + "\n\n" + agent_example(ACTIONS, train) + "\n\n")


def _example_part(template: str) -> str:
    "The paper's part of a prompt template: up to the first blank line (our query block follows it)."
    return template.split("\n\n", 1)[0]


@pytest.mark.parametrize("k,name", [(3, "PROMPT_ENTITY"), (4, "PROMPT_RELATIONS"), (5, "PROMPT_GENERATE"), (6, "PROMPT_MODIFY"),
                                    (7, "PROMPT_PATHS")])
def test_supplementary_prompts_3_to_7_are_app_e_verbatim(k, name):
    "Instruction and example of Prompts 3-7 (Prompt 5 with its training Hint, the paper's pink font)."
    t = getattr(J, name).replace("{example_hint}", J.EXAMPLE_HINT)
    assert _flat(_example_part(t)) == _flat(_app_e_prompt(k))
    assert "{" not in _example_part(t)  # no placeholder inside the paper's text


def test_verbatim_check_can_fail():
    assert _flat(J.agent_instruction(ACTIONS, True)) not in _flat(_app_e_prompt(2))  # Prompt 1's Finish is not Prompt 2's
    assert _flat(_example_part(J.PROMPT_RELATIONS).replace("educated at, employer", "employer, educated at")) != _flat(_app_e_prompt(4))


# ---------------------------------------------------------------- no gold answer in test-time prompts

SENTINEL = "Zyxwvut Qrstuv"

def _question():
    return Question("q1", "what is the nationality of Bob?", ["/m/b"], [SENTINEL], topic_names=["Bob"])

def test_test_prompts_never_see_gold():
    q = _question()
    agent = JCQLAgent(None, ("search", "generate", "finish"))
    run = _Run(replace(q, answers=[]), list(q.answers), False)
    prompt, _ = step_prompt(run.q, [("t", "Search[Bob]", "Bob, nationality, France")], agent.actions, False)
    assert SENTINEL not in prompt and "Answer:" not in prompt.split("Question: what is")[1]
    train_prompt, _ = step_prompt(q, [], agent.actions, True)
    assert f"Answer: {SENTINEL}" in train_prompt  # Prompt 1 shows them on purpose
    # the runtime check raises before any request is sent (client=None would fail otherwise)
    with pytest.raises(GoldLeakError, match="q1"):
        asyncio.run(agent._llm(run, None, AgentConfig(), None, "step 1", train_prompt, 8, ["\n"]))
    # text the run itself produced may contain the answer
    run.allowed.append(f"Bob, nationality, {SENTINEL}")
    assert gold_leaks(f"Observation 1: Bob, nationality, {SENTINEL}", q.answers, run.allowed) == []

# ---------------------------------------------------------------- Table 3 ablations

@pytest.mark.parametrize("removed", ["complete", "generate"])
def test_ablation_removes_action_from_prompt_and_dispatcher(removed):
    acts = tuple(a for a in ACTIONS if a != removed)
    m = get_method(f"jcql w/o {removed}", slm=None) if removed == "complete" else get_method("jcql w/o generate", slm=_Completer())
    assert m.actions == acts
    name = removed.capitalize() + "["
    assert name not in agent_instruction(acts) and name not in agent_example(acts)
    assert name not in step_prompt(_question(), [], acts)[0] and "three types" in step_prompt(_question(), [], acts)[0]
    s = parse_step(f"x\nAction 1: {removed.capitalize()}[Bob | nationality]" if removed == "complete" else "x\nAction 1: Generate[who?]", m.actions)
    assert s.action is None and s.failure == f"disabled action {removed!r}"
    with pytest.raises(ValueError, match="Complete action needs slm"): get_method("jcql", slm=None)

# ---------------------------------------------------------------- Complete with a real trained completer

class _Completer:
    "Protocol check helper: a PyKEEN TransE trained here for a few epochs, wrapped to topk(head name, relation id, k)."
    def __init__(self, kb=None, epochs=0):
        self.kb, self.model = kb, None
        if kb is None or not epochs: return
        import torch
        from pykeen.models import TransE
        from pykeen.training import SLCWATrainingLoop
        from pykeen.triples import TriplesFactory
        df = kb.kg.to_dataframe()
        self.tf = TriplesFactory.from_labeled_triples(df[["head", "relation", "tail"]].to_numpy(str))
        torch.manual_seed(0)
        self.model = TransE(triples_factory=self.tf, embedding_dim=16, random_seed=0)
        SLCWATrainingLoop(model=self.model, triples_factory=self.tf).train(self.tf, num_epochs=epochs, batch_size=256, use_tqdm=False)

    def topk(self, head, relation, k=5):
        import torch
        if self.model is None: return []
        e = self.kb.by_name[head.lower()][0] if head.lower() in self.kb.by_name else None
        hid, rid = self.tf.entity_to_id[str(self.kb.kg.entities[e])], self.tf.relation_to_id[relation]
        with torch.no_grad(): s = self.model.score_t(torch.tensor([[hid, rid]])).squeeze(0)
        best = torch.topk(s, k).indices.tolist()
        inv = {v: k_ for k_, v in self.tf.entity_to_id.items()}
        return [(str(self.kb.names[self.kb.kg.entity_index(inv[i])]), float(s[i])) for i in best]


def test_complete_uses_the_completer_output_exactly():
    from kgrag_nb.datasets import load_kg
    kg = load_kg("nations", "train")
    kb = AgentKB(kg)
    slm = _Completer(kb, epochs=3)
    agent = JCQLAgent(slm)
    q = Question("q", "?", [str(kg.entities[0])], ["x"], topic_names=[str(kb.names[0])])
    run = _Run(q, ["x"], False)
    ps = parse_step(f"x\nAction 1: Complete[{kb.names[0]} | {kb.rel_names[0]}]")
    step = {}
    got = asyncio.run(agent._complete(run, ps, kb, None, AgentConfig(), None, step))
    want = slm.topk(str(kb.names[0]), str(kg.relations[0]), 5)
    assert [(h, r, t) for h, r, t, _ in got] == [(str(kb.names[0]), str(kb.rel_names[0]), t) for t, _ in want]
    assert run.complete_calls == 1 and step["complete"]["relation"] == str(kg.relations[0]) and len(want) == 5
    # the path triples Parse would hand to the SLM map back to KB ids
    ids, dropped = slm_triples(kb, [(h, r, t) for h, r, t, _ in got] + [("nobody", "x", "y")])
    assert dropped == 1 and len(ids) == len(set(ids)) and all(h == str(kg.entities[0]) for h, _, _ in ids)


def test_parse_triples():
    assert parse_triples(' A, r, B\n2. C, long, rel, D\n"""\n4. E, r, F') == [("A", "r", "B"), ("C", "long, rel", "D")]
    assert parse_triples("nothing useful") == []

# ---------------------------------------------------------------- the agent on the real embedded server

@pytest.mark.llm
def test_agent_embedded(embedded_server, tmp_path):
    "The agent with a real tiny SLM trained here (kgrag_nb.studies.jcql.kbc) on the real embedded server; failures counted."
    from kgrag_nb.studies.jcql import kbc as K
    from kgrag_nb.kgqa import TraceWriter
    from kgrag_nb.llm import LLMClient
    from kgrag_nb.studies.jcql.kbqa import (kbqa_questions, name_kg, prediction_frame, failure_table, relation_names_of, select_questions)
    splits = K.fb15k237_splits(); full = splits["all"]
    seeds = kbqa_questions("cwq", "test", full, n=2, seed=0)
    data = K.build_kbc_data(splits, keep=0.5, seed=0, topics=[m for q in seeds for m in q.meta["mids"]], hops=1, max_triples=300)
    slm = K.train_kbc(data, K.SLMConfig(d_model=32, d_ff=64, num_layers=1, num_decoder_layers=1, num_heads=2, d_kv=16,
                                        vocab_size=800, epochs=1.0, lr=0.01, R=10, time_budget_s=10))
    kb = AgentKB(name_kg(data.train, "slice", {n: r for r, n in relation_names_of(full).items()}))
    qs, _ = select_questions(kb, "cwq", "test", full, 2, 0, prefer=[q.id for q in seeds])
    client = LLMClient(embedded_server.url, cache=tmp_path / "llm.sqlite", progress=False)
    trace = TraceWriter(tmp_path / "trace.jsonl")
    cfg = AgentConfig(max_steps=3)
    cfg_actions = get_method("jcql", slm=slm).actions
    preds = get_method("jcql", slm=slm).answer_all(qs, kb, client, cfg, trace)
    df = prediction_frame(preds, qs)
    assert len(preds) == 2 and df["n_steps"].between(1, 3).all()
    for p in preds:  # every step was an LLM call; failures are counted, never hidden
        steps = p.meta["steps"]
        assert len(steps) == p.meta["n_steps"] >= 1 and [s["i"] for s in steps] == list(range(1, len(steps) + 1))
        assert sum(c["stage"].startswith("step") for c in p.meta["calls"]) == p.meta["n_steps"]
        n_fail = sum(s["failure"] is not None for s in steps)
        assert n_fail == sum(v for k, v in p.meta["failures"].items() if k.startswith("parse:"))
        assert [s["action"] is None for s in steps] == [s["failure"] is not None for s in steps]  # a step parses or fails, counted
        assert all(s["action"] in cfg_actions for s in steps if s["failure"] is None)
        # every Complete call is one recorded step, its observation exactly the SLM's output (a count: holds with 0 calls)
        completes = [s for s in steps if "complete" in s]
        assert len(completes) == p.meta["complete_calls"] and all(s["action"] == "complete" for s in completes)
        assert [[t[2] for t in s["triples"]] for s in completes] == [[t for t, _ in s["complete"]["tails"]] for s in completes]
        assert p.meta["steps_ok"] == len(steps) - n_fail and p.meta["finished"] == any(s["action"] == "finish" for s in steps)
    print(failure_table(df).T)
    for q, p in zip(qs, preds):  # one traced step prompt per step, none of them with an Answer field
        recs = [rec for rec in trace.records if rec["question_id"] == q.id and rec["stage"].startswith("step")]
        assert len(recs) == p.meta["n_steps"]
        assert not any("\nAnswer: " in rec["prompt"].split(f"Question: {q.text}")[-1] for rec in recs)
    n = client.usage.requests  # a second run is answered by the cache
    again = get_method("jcql", slm=slm).answer_all(qs, kb, client, cfg)
    assert client.usage.requests == n and [p.answer for p in again] == [p.answer for p in preds]

# ---------------------------------------------------------------- constrained decoding (issue 21)

from kgrag_nb.llm import Constraint, fill_constraint
from kgrag_nb.studies.jcql.kbqa import (COT_ANSWER, SHORT_ANSWER, DECODINGS, agent_decode as decode, entity_constraint, parse_choice, parse_cot, parse_paths,
                           parse_relation_choice, parse_short, paths_constraint, relations_constraint, schema_constraint,
                           step_constraint, triples_constraint)

VARIANTS = [ACTIONS, ("search", "complete", "finish"), ("search", "generate", "finish")]  # jcql and its Table 3 ablations


@pytest.mark.parametrize("actions", VARIANTS)
@pytest.mark.parametrize("i", [1, 2, 10])
def test_stub_filled_step_parses(actions, i):
    "Every prompt sent with a constraint is parseable by its parser when the stub fills the constraint: the ReAct step."
    s = parse_step(fill_constraint(step_constraint(actions, i).spec()), actions)
    assert s.failure is None and s.action in actions and not s.repairs


@pytest.mark.parametrize("actions", VARIANTS)
def test_step_constraint_admits_only_enabled_actions(actions):
    import re
    pat = step_constraint(actions, 4).value
    calls = {"search": "Search[Bob | Ann (/m/a)]", "complete": "Complete[Bob | spouse]", "generate": "Generate[who is Bob's wife?]",
             "finish": "Finish[France]"}
    for a, call in calls.items():
        assert bool(re.fullmatch(pat, f" I think.\nAction 4: {call}")) == (a in actions)
    for bad in ["Search[]", "Complete[Bob]", "Finish[ | x]", "Search[a]\nObservation 4: x"]:  # ill-formed arguments cannot be written
        assert not re.fullmatch(pat, f" I think.\nAction 4: {bad}")
    assert not re.fullmatch(pat, " I think.\nAction 3: Finish[France]")  # the step number is the prompt's


def test_stub_filled_aux_outputs_parse():
    "Prompts 3, 4, 5/6, the schema prompt, Prompt 7 and the CoT / short answers: the stub's filling is read by each parser."
    ids = ["Bob (/m/b1)", "Bob (/m/b2)"]
    assert parse_choice(fill_constraint(entity_constraint(ids).spec()), ids) is not None
    names = ["place of birth", "spouse", "a, b", "educated at"]
    text = fill_constraint(relations_constraint(names, 3).spec())
    got = parse_relation_choice(text, names)
    assert text.count(", ") == 2 and 1 <= len(got) <= 3 and 2 not in got  # three written (Prompt 4 asks for 3); repeats count once
    assert relations_constraint(["a, b"]) is None
    assert len(parse_triples(fill_constraint(triples_constraint(5).spec()))) >= 1
    import re
    assert re.fullmatch(r" \[[^\]]+\], nationality, \[[^\]]+\]", fill_constraint(schema_constraint("nationality").spec()))
    known = [("Bob", "spouse", "Ann"), ("Ann", "place of birth", "Paris, Texas"), ("Ann", "nationality", "France")]
    assert set(parse_paths(fill_constraint(paths_constraint(known).spec()), known)) <= set(known)
    one = ' spouse\nRelated triples: """\nBob, spouse, Ann\n"""'  # a selection of one known triple (none is admitted too)
    assert re.fullmatch(paths_constraint(known).value, one) and parse_paths(one, known) == [known[0]] and paths_constraint([]) is None
    assert parse_cot(fill_constraint(COT_ANSWER.spec())) and parse_short(fill_constraint(SHORT_ANSWER.spec()))


class _FakeClient:
    "Records each acomplete call; answers a constrained call with the stub's filling of its constraint."
    def __init__(self): self.calls = []
    async def acomplete(self, prompts, return_records=False, constraint=None, **kw):
        self.calls.append((prompts[0], constraint))
        text = fill_constraint(constraint.spec()) if constraint is not None else " free text with no format"
        return [[text]], [[{"cached": False}]]


@pytest.mark.parametrize("decoding,n_calls", [("free", 1), ("constrained", 1), ("decoupled", 2)])
def test_decode_modes(decoding, n_calls):
    c, fake = step_constraint(ACTIONS, 2), _FakeClient()
    out, recs = asyncio.run(decode(fake, "Question: x\nThought 2:", decoding, c, temperature=0.7, max_tokens=8))
    assert len(fake.calls) == len(recs) == n_calls
    assert (parse_step(out).failure is None) == (decoding != "free")
    assert [r["constrained"] for r in recs] == ([False] if decoding == "free" else [True] if decoding == "constrained" else [False, True])
    if decoding == "decoupled":  # the restatement continues the prompt + the free answer, after the prompt's last label
        p2 = fake.calls[1][0]
        assert p2.startswith("Question: x\nThought 2: free text with no format\n\nRestate") and p2.endswith("\nThought 2:")
    with pytest.raises(ValueError, match="free"): asyncio.run(decode(fake, "x", "greedy", c))


@pytest.mark.llm
def test_constrained_step_embedded(embedded_server, tmp_path):
    "A constrained ReAct step on the real embedded server (Gemma-3-270M): parsed as an enabled action by `parse_step`."
    from kgrag_nb.llm import LLMClient
    client = LLMClient(embedded_server.url, cache=tmp_path / "llm.sqlite", progress=False)
    q = Question("q", "what is the nationality of Bob Dylan?", ["/m/b"], [], topic_names=["Bob Dylan"])
    for actions in VARIANTS[1:]:
        hist = [("I need Bob Dylan's nationality.", "Search[Bob Dylan]", "Bob Dylan, nationality, United States of America")]
        prompt, _ = step_prompt(q, hist, actions)
        out, recs = asyncio.run(decode(client, prompt, "constrained", step_constraint(actions, 2), temperature=0.7, max_tokens=128,
                                       stop=["\nObservation", "\nQuestion:"], seed=0))
        s = parse_step(out, actions)
        assert s.failure is None and s.action in actions and recs[0]["constrained"], out
        assert f"\nAction 2: {s.action.capitalize()}[" in out


# ---------------------------------------------------------------- format tax (issue 21 item 4)
def test_format_tax_declaration_and_bad_decoding():
    from kgrag_nb.studies.jcql import STUDY
    from kgrag_nb.studies.jcql.kbqa import FT_VARIANT, format_tax_arm
    arm = STUDY.arm("jcql").as_dict()
    assert set(arm) == {"study", "step", "metric", "paper", "settings"} and arm["study"] == "jcql"
    assert "L = 2 steps (paper: 10)" in arm["settings"]  # where the arm differs from the paper
    assert "0.475" in arm["paper"] and "Table 3" in arm["paper"]
    assert "complete" not in get_method(FT_VARIANT).actions  # the arm's variant needs no SLM checkpoint
    with pytest.raises(ValueError, match="decoding"):
        format_tax_arm(None, "json", 1)


@pytest.mark.llm
def test_format_tax_arm_constrained_embedded(embedded_server, tmp_path):
    "The JCQL format-tax arm (constrained) on the real server: one record with the contract's keys and types."
    from kgrag_nb.llm import LLMClient
    from kgrag_nb.studies.jcql.kbqa import format_tax_arm, FT_MAX_STEPS
    from _format_tax import one_constrained_record
    r = one_constrained_record(format_tax_arm, LLMClient(embedded_server.url, cache=tmp_path / "llm.sqlite", progress=False), "jcql")
    assert isinstance(r["finished"], bool) and r["fired"] is None and r["kept"] is None
    assert not r["cot_fallback"]  # the arm's KB slice is built around its questions' topic entities: the agent runs, never CoT
    assert 1 <= r["n_steps"] <= FT_MAX_STEPS and r["parsed"] == r["steps_ok"] / r["n_steps"]
    assert r["finished"] == ("finish" in r["actions"])  # Finish is the agent's own action, never forced


@pytest.mark.slow  # builds the KB slice and runs the agent twice (about 20 s on 2 busy cores)
def test_format_tax_arm_counts_with_the_stub():
    "The arm on 2 CWQ questions with the stub's rule: free steps never parse (no Finish, L steps); constrained steps all"
    " parse as an enabled action (decoupled = `decode`, tested above); Finish is only ever the agent's own action."
    from kgrag_nb.studies.jcql.kbqa import format_tax_arm, FT_MAX_STEPS
    from kgrag_nb.metrics import _check_tax_record
    arms = {d: format_tax_arm(_FakeClient(), d, 2) for d in ("free", "constrained")}
    assert [r["item"] for r in arms["free"]] == [r["item"] for r in arms["constrained"]]
    for d, out in arms.items():
        assert len(out) == 2 and all(_check_tax_record(r, d) for r in out)
        assert all(r["finished"] == ("finish" in r["actions"]) for r in out)
    assert not any(r["cot_fallback"] for out in arms.values() for r in out)  # the agent ran on both items in both arms
    assert all((r["parsed"], r["finished"], r["n_steps"], r["metric"]) == (0.0, False, FT_MAX_STEPS, 0.0) for r in arms["free"])
    assert all(r["parsed"] == 1.0 and set(r["actions"]) <= {"search", "generate", "finish"} for r in arms["constrained"])

# ---------------------------------------------------------------- Table 2 / Table 4 as the paper means them (issue 22 item 8)

@pytest.mark.parametrize("model,paper", [("gpt-4o-mini", "GPT-4o-mini"), ("gpt-4o-mini-2024-07-18", "GPT-4o-mini"),
                                         ("meta-llama/Llama-3.1-70B-Instruct", "LLaMA3.1-70B"), ("llama-3.1-70b", "LLaMA3.1-70B"),
                                         ("Qwen/Qwen3-30B-A3B", "Qwen3-30B-A3B"), ("Qwen/Qwen3-30B-A3B-Instruct-2507", "Qwen3-30B-A3B"),
                                         ("gemma-3-270m-q4_k_m", None), ("meta-llama/Llama-3.1-8B-Instruct", None),
                                         ("Qwen/Qwen2.5-72B-Instruct", None), ("gpt-4o", None), (None, None)])
def test_paper_llm(model, paper):
    assert J.paper_llm(model) == paper


def _hits(rows):  # (method, llm) -> a hits_table-like frame on CWQ 50% KB
    return pd.DataFrame([dict(dataset="cwq", setting="50% KB", method=m, llm=l, n=1, **{"Hits@1": 0.0}) for m, l in rows])


def test_rows_labelled_by_the_model_that_ran():
    # tiny/smoke: the embedded Gemma ran everything; its JCQL row stands beside the paper's default-LLM row
    g = "gemma-3-270m-q4_k_m"
    out = J.label_by_model(J.ours_for_table(_hits([("jcql io", g), ("jcql", g), ("jcql w/o complete", g)]), J.PAPER_ROW, g), g)
    assert out[["model", "paper row", "setting", "llm"]].values.tolist() == [
        ["IO (gemma-3-270m-q4_k_m)", "GPT-4o-mini", "w/o KB", g], ["JCQL (gemma-3-270m-q4_k_m)", "JCQL_GPT-4o-mini", "50% KB", g],
        ["JCQL w/o complete (gemma-3-270m-q4_k_m)", "JCQL w/o complete", "50% KB", g]]
    assert "JCQL_GPT-4o-mini" not in set(out["model"])
    # full: the main model is GPT-4o-mini; the two other paper LLMs ran JCQL only, each beside its own paper row
    m, l, q = "gpt-4o-mini", "meta-llama/Llama-3.1-70B-Instruct", "Qwen/Qwen3-30B-A3B"
    out = J.label_by_model(J.ours_for_table(_hits([("jcql cot", m), ("jcql", m), ("jcql", l), ("jcql", q)]), J.PAPER_ROW, m), m)
    assert out[["model", "paper row"]].values.tolist() == [
        ["CoT (gpt-4o-mini)", "CoT"], ["JCQL (gpt-4o-mini)", "JCQL_GPT-4o-mini"],
        ["JCQL (meta-llama/Llama-3.1-70B-Instruct)", "JCQL_LLaMA3.1-70B"], ["JCQL (Qwen/Qwen3-30B-A3B)", "JCQL_Qwen3-30B-A3B"]]
    # a main model that is not the paper's, beside a GPT-4o-mini that ran: the default row is GPT-4o-mini's, not Gemma's
    out = J.label_by_model(J.ours_for_table(_hits([("jcql", g), ("jcql", m)]), J.PAPER_ROW, g), g)
    assert out["paper row"].tolist() == ["JCQL (gemma-3-270m-q4_k_m)", "JCQL_GPT-4o-mini"]
    # Table 4's labels: the paper's row names with the model
    out = J.label_by_model(J.ours_for_table(_hits([("jcql w/o complete", g)]), J.TABLE4_ROW, g), g, base=J.TABLE4_ROW)
    assert out[["model", "paper row"]].values.tolist() == [["JCQL-SLM (gemma-3-270m-q4_k_m)", "JCQL-SLM"]]


def test_versus_paper_keeps_the_papers_labels():
    g = "gemma-3-270m-q4_k_m"
    ours = J.label_by_model(J.ours_for_table(_hits([("jcql", g)]), J.PAPER_ROW, g), g)
    both = J.versus_paper(ours, "Table 2", "tiny")
    mine, paper = both[both["source"] == "ours (tiny)"], both[both["source"] == "paper (Table 2)"]
    assert mine["model"].tolist() == ["JCQL (gemma-3-270m-q4_k_m)"] and (paper["model"] == paper["paper row"]).all()
    assert {"JCQL_GPT-4o-mini", "JCQL_LLaMA3.1-70B", "JCQL_Qwen3-30B-A3B", "GPT-4o-mini"} <= set(paper["model"])
    # ours sits right before the paper's JCQL_GPT-4o-mini CWQ 50% KB row (0.508, Table 2)
    i = both.index[both["source"] == "ours (tiny)"][0]
    assert both.loc[i + 1, ["model", "dataset", "setting", "Hits@1"]].tolist() == ["JCQL_GPT-4o-mini", "CWQ", "50% KB", 0.508]


def _call(stage, cached=False, s=1.0): return dict(stage=stage, cached=cached, latency_s=s)


def test_table4_offline_schema_calls_apart(tmp_path):
    from kgrag_nb.kgqa import Prediction, TraceWriter
    # q1: 3 steps, a generate + modify, two schema summaries (one restated when decoupled); q2: 2 steps, no schema
    c1 = [_call("step 1"), _call("step 2"), _call("generate"), _call("schema", s=2.0), _call("schema reformat", s=0.5),
          _call("modify", cached=True, s=0.1), _call("step 3")]
    c2 = [_call("step 1", s=3.0), _call("step 2")]
    qs = [Question("q1", "?", ["/m/b"], ["France"]), Question("q2", "?", ["/m/b"], ["Spain"])]
    preds = [Prediction(q.id, "jcql", "", [], len(c), meta=dict(calls=c)) for q, c in zip(qs, [c1, c2])]
    df = J.prediction_frame(preds, qs, dataset="cwq", setting="50% KB")
    assert df["llm_calls_offline"].tolist() == [2, 0] and df["llm_calls"].tolist() == [7, 2]
    e = J.efficiency_table(df).iloc[0]
    # online: 5 + 2 = 7 calls over 2 questions; offline: 2; traced: 9; online miss time (1+1+1+1 + 3+1) / 2 = 4.0
    assert (e["LLM call"], e["online calls"], e["offline calls"], e["calls traced"]) == (3.5, 7, 2, 9)
    assert (e["Time (s) of misses"], e["offline miss time (s)"], e["misses/question"]) == (4.0, 2.5, 4.0)
    # the same calls counted again from the trace file the experiment writes
    tw = TraceWriter(tmp_path / J.trace_file("cwq", "50% KB"))
    assert tw.path.name == "cwq_50.jsonl" and J.trace_file("cwq", "50% KB", "Qwen/Qwen3-30B-A3B") == "cwq_50_Qwen_Qwen3-30B-A3B.jsonl"
    for q, c in zip(qs, [c1, c2]):
        for x in c: tw.write(q.id, "jcql", x["stage"], "p", "t")
    tw.write("q9", "jcql", "step 1", "p", "t")  # an Algorithm 1 (training) question: not a predicted one
    tw.write("q1", "jcql tog", "answer", "p", "t")  # another method
    tr = J.traced_calls(tmp_path, df, ["jcql"])
    assert tr.values.tolist() == [["cwq", "50% KB", "jcql", 9]]
    assert e["online calls"] + e["offline calls"] == tr["traced"].iloc[0]
    # a missing schema call in the trace would break the identity
    assert J.traced_calls(tmp_path, df.iloc[:1], ["jcql"])["traced"].tolist() == [7]


def test_efficiency_table_of_frames_without_the_split():
    # predictions saved before the split (no offline columns): every call is online, as before
    df = pd.DataFrame([dict(dataset="cwq", setting="50% KB", method="jcql", id="q1", llm_calls=4, llm_misses=1, miss_time_s=2.0,
                            hit_time_s=0.0, complete_calls=1)])
    e = J.efficiency_table(df).iloc[0]
    assert (e["LLM call"], e["offline calls"], e["calls traced"], e["Time (s) of misses"]) == (4.0, 0, 4, 2.0)


# ------------------------------------------------------------------------------------------ caps the constraints no longer add
def _paper_example_steps():
    "Prompt 1's example of App. E, from the paper's text: (Thought 4, Action 4) of the Woodrow Wilson example."
    from kgrag_nb.papers import paper_text
    text = paper_text("jcql_joint_kbc_kbqa")
    ex = text[text.index("Question: where did woodrow wilson go to school?"):]
    thought = ex[ex.index("Thought 4: ") + len("Thought 4: "):ex.index(" Action 4:")]
    action = ex[ex.index("Action 4: ") + len("Action 4: "):ex.index(" Observation 4:")]
    return thought, action


def test_step_constraint_admits_the_papers_own_step():
    "Prompt 1's own Thought 4 (297 characters) with its Finish of four answers, and a Finish of five answers, are steps."
    thought, action = _paper_example_steps()
    assert len(thought) > 240 and action.startswith("Finish[")
    from kgrag_nb.studies.jcql.kbqa import step_constraint
    c = re.compile(step_constraint(ACTIONS, 4).value)
    assert c.fullmatch(f" {thought}\nAction 4: {action}")
    assert c.fullmatch(" All five are answers.\nAction 4: Finish[a | b | c | d | e]")


def test_paths_constraint_admits_an_empty_selection():
    "Prompt 7 may select no known triple under every decoding (P_q then falls back to the BFS path, as in free decoding)."
    from kgrag_nb.studies.jcql.kbqa import paths_constraint
    k = [("Bob", "spouse", "Ann")]
    assert re.fullmatch(paths_constraint(k).value, ' spouse\nRelated triples: """\n"""')
    assert parse_paths(' spouse\nRelated triples: """\n"""', k) == []
