"""Tests of kgrag_nb.kgqa: the KG-QA method layer (records, registry, trace writer, generic KG search operations).

Hand-built tiny KGs with hand-computed relation paths, instantiations and beams; hypothesis properties on random
small KGs (every instantiated path walks its relation path and ends where `path_end` says, beams never revisit an
entity); registry errors; the trace writer round-trip; one `llm` test of `complete_traced` on the real server.
Issue 21: the declared reply formats (`steps_constraint`, `relation_paths_constraint`) admit only replies their parsers
read (hypothesis: strings generated from the regex, on KGs whose labels hold separators); `complete_decoded` sends the old
requests under free (same cache keys, and BRINK's answer-list keys under every decoding, on the stand-in server); one `llm`
test of constrained RoG plan and ToG pruning steps on the real server.
"""
import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kgrag_nb.kg import KG
from kgrag_nb.kgqa import (METHODS, BaseMethod, Method, Prediction, Question, TraceWriter, beam_context, beam_ends,
                           candidate_steps, complete_traced, expand_beam, get_method, instantiate, parse_relation_paths,
                           parse_steps, path_end, path_text, register_method, relation_path_of, relation_paths_to,
                           step_label, triples_of)
from kgrag_nb.kgqa import (PLAN_REFORMAT, PRUNE_REFORMAT, complete_decoded, parse_failures, relation_paths_constraint,
                           steps_constraint)
from kgrag_nb.llm import fill_constraint


# x -r-> y -s-> z, x -t-> z, w -r-> y (y has two r-parents)
@pytest.fixture
def chain():
    return KG.from_triples([("x", "r", "y"), ("y", "s", "z"), ("x", "t", "z"), ("w", "r", "y")], name="chain")


def ix(kg, h, r, t): return int(kg.index_of(kg.encode([(h, r, t)]))[0])


def test_relation_paths_hand_computed(chain):
    R = chain.relation_index
    assert relation_paths_to(chain, "x", ["z"]) == {((R("t"), True),), ((R("r"), True), (R("s"), True))}
    assert relation_paths_to(chain, "z", ["w"]) == {((R("s"), False), (R("r"), False))}
    assert relation_paths_to(chain, "z", ["w"], max_hops=1) == set()
    assert relation_paths_to(chain, "x", ["x"]) == set()  # the source is never its own target
    # 3 hops through KG.paths_between: w -> y -> z -> x (r, s, ~t)
    assert ((R("r"), True), (R("s"), True), (R("t"), False)) in relation_paths_to(chain, "w", ["x"], max_hops=3)


def test_instantiate_hand_computed(chain):
    R = chain.relation_index
    paths = instantiate(chain, "z", [(R("s"), False), (R("r"), False)])
    assert sorted(paths) == sorted([[ix(chain, "y", "s", "z"), ix(chain, "x", "r", "y")], [ix(chain, "y", "s", "z"), ix(chain, "w", "r", "y")]])
    assert sorted(path_end(chain, "z", p) for p in paths) == sorted([chain.entity_index("x"), chain.entity_index("w")])
    shown = chain._display_array("kg_id")
    assert sorted(path_text(chain, "z", p, shown) for p in paths) == ["z -> ~s -> y -> ~r -> w", "z -> ~s -> y -> ~r -> x"]
    assert triples_of(chain, [ix(chain, "y", "s", "z")]) == [["y", "s", "z"]]
    assert instantiate(chain, "x", []) == [] and instantiate(chain, "x", [(R("s"), True)]) == []
    assert len(instantiate(chain, "z", [(R("s"), False), (R("r"), False)], max_paths=1)) == 1
    with pytest.raises(ValueError, match="does not touch"):
        relation_path_of(chain, "w", [ix(chain, "y", "s", "z")])


def test_beam_hand_computed(chain):
    R, E = chain.relation_index, chain.entity_index
    b1 = expand_beam(chain, "x", [[]], [(R("r"), True), (R("t"), True)])
    assert b1 == [[ix(chain, "x", "r", "y")], [ix(chain, "x", "t", "z")]]
    b2 = expand_beam(chain, "x", b1, [(R("s"), True), (R("r"), False), (R("s"), False)])
    # x->y: s -> z, ~r -> w (x not revisited); x->z: ~s -> y
    assert sorted(path_end(chain, "x", p) for p in b2) == sorted([E("z"), E("w"), E("y")])
    assert beam_ends(chain, "x", [[]]) == [E("x")] and beam_ends(chain, "x", b1) == [E("y"), E("z")]
    assert beam_context(b1 + b2) == sorted(b2, key=lambda p: (-len(p), tuple(p)))
    assert expand_beam(chain, "x", b1, [(R("s"), True), (R("r"), False), (R("s"), False)], max_beam=2, seed=1) == \
        expand_beam(chain, "x", b1, [(R("s"), True), (R("r"), False), (R("s"), False)], max_beam=2, seed=1)


def test_pruning_candidates_and_reply(chain):
    y = chain.entity_index("y")
    cs = candidate_steps(chain, [y])
    assert [step_label(chain, s) for s in cs] == ["~r", "s"]
    assert candidate_steps(chain, [y], 1) == cs[:1]
    assert parse_steps("s; ~r; s", chain, cs, 5) == [cs[1], cs[0]]
    assert parse_steps("1. s\n2. ~r", chain, cs, 1) == [cs[1]]
    assert parse_steps("2", chain, cs, 5) == [cs[1]] and parse_steps("nothing; 7", chain, cs, 5) == []
    R = chain.relation_index
    assert parse_relation_paths("r -> s\n~t\nq -> s\n\nt", chain) == [((R("r"), True), (R("s"), True)), ((R("t"), False),)]


def test_records_round_trip():
    q = Question("q1", "Who?", ["e1", "e2"], ["A"], "toy", ["One", "Two"], {"path": (1, 2)})
    back = Question.from_dict(json.loads(json.dumps(q.to_dict())))
    assert back.topic == "e1" and back.topic_name == "One" and back.meta == {"path": [1, 2]}
    assert Question("q", "?", ["e9"]).topic_names == ["e9"]
    with pytest.raises(ValueError, match="topic_names"):
        Question("q", "?", ["e1"], topic_names=["a", "b"])
    with pytest.raises(ValueError, match="empty"):
        Question("", "?")
    p = Prediction("q1", "m", "A", ["A", "B"], 2, "m/q1", "P", " A, B", None, {"paths": [[1]]})
    assert Prediction.from_dict(json.loads(json.dumps(p.to_dict()))) == p
    with pytest.raises(ValueError, match="unknown keys"):
        Prediction.from_dict(dict(question_id="q", method="m", score=1))


def test_registry():
    @register_method("_t_echo", suffix="!")
    class Echo(BaseMethod):
        def __init__(self, suffix=""): self.suffix = suffix
        def answer(self, q, kg, client, config=None, trace=None):
            return Prediction(q.id, self.name, q.topic_name + self.suffix)
    try:
        m = get_method("_t_echo")
        assert isinstance(m, Method) and m.name == "_t_echo" and m.suffix == "!"
        assert get_method("_t_echo", suffix="?").suffix == "?"
        qs = [Question("a", "?", ["e1"], topic_names=["A"]), Question("b", "?", ["e2"], topic_names=["B"])]
        assert [p.answer for p in m.answer_all(qs, None, None)] == ["A!", "B!"]
        with pytest.raises(KeyError, match="_t_echo"):
            get_method("_t_nope")  # the message lists the registered names
        with pytest.raises(ValueError, match="already registered"):
            register_method("_t_echo")(type("Other", (BaseMethod,), {}))
        with pytest.raises(TypeError, match="decorates a class"):
            register_method("_t_fn")(lambda q: q)
        with pytest.raises(NotImplementedError, match="must override"):
            BaseMethod().answer_all(qs, None, None)
    finally:
        METHODS.pop("_t_echo", None)


def test_trace_writer_round_trip(tmp_path):
    tw = TraceWriter(tmp_path / "sub" / "t.jsonl")
    tw.write("q1", "m", "plan", "P1", "out 1", parsed=[(1, True)])
    tw.write("q2", "m", "answer", "P2", ["a", "b"], parsed=["a", "b"], depth=2)
    tw.write("q1", "m", "answer", "P3", "x")
    back = TraceWriter.read(tw.path)
    assert back == tw.records and [r["call"] for r in back] == [0, 1, 2]
    assert back[0]["parsed"] == [[1, True]] and back[1]["depth"] == 2
    assert [r["prompt"] for r in tw.of(TraceWriter.trace_id("m", "q1"))] == ["P1", "P3"]
    assert TraceWriter(tmp_path / "sub" / "t.jsonl").read(tmp_path / "sub" / "t.jsonl") == []  # reopening truncates
    with pytest.raises(ValueError, match="2 prompts for 1"):
        complete_traced(None, ["a", "b"], ["q"], "m", "s")


# ---------------------------------------------------------------- properties on random small KGs
@st.composite
def small_kgs(draw):
    n_e, n_r = draw(st.integers(2, 7)), draw(st.integers(1, 3))
    tri = draw(st.lists(st.tuples(st.integers(0, n_e - 1), st.integers(0, n_r - 1), st.integers(0, n_e - 1)), min_size=1, max_size=18))
    return KG.from_triples([(f"e{h}", f"r{r}", f"e{t}") for h, r, t in tri], name="rand")


def walk(kg, src, path, rp):
    "The entity reached by following steps `rp` along triple path `path` from `src`, None when it does not follow them."
    cur = src
    for ti, (r, fwd) in zip(path, rp):
        h, rr, t = (int(v) for v in kg.triples[ti])
        if rr != r or (h if fwd else t) != cur: return None
        cur = t if fwd else h
    return cur if len(path) == len(rp) else None


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_kgs(), st.data())
def test_instantiated_paths_reach_their_ends(kg, data):
    src = data.draw(st.integers(0, kg.num_entities - 1))
    targets = data.draw(st.lists(st.integers(0, kg.num_entities - 1), min_size=1, max_size=3))
    for rp in relation_paths_to(kg, src, targets, max_hops=2):
        paths = instantiate(kg, src, rp, max_paths=10_000)
        assert paths
        for p in paths:
            end = walk(kg, src, p, rp)
            assert end is not None and end == path_end(kg, src, p)  # path_end agrees with the instantiation
            assert relation_path_of(kg, src, p) == tuple(rp) or any(kg.triples[t][0] == kg.triples[t][2] for t in p)
        assert any(path_end(kg, src, p) in set(targets) for p in paths)  # every listed path reaches a target


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_kgs(), st.data())
def test_beam_never_revisits(kg, data):
    src = data.draw(st.integers(0, kg.num_entities - 1))
    cap = data.draw(st.integers(1, 5))
    b1 = expand_beam(kg, src, [[]], candidate_steps(kg, [src]), max_beam=cap, seed=2)
    b2 = expand_beam(kg, src, b1, candidate_steps(kg, beam_ends(kg, src, b1)), max_beam=cap, seed=3)
    assert len(b1) <= cap and len(b2) <= cap
    for p in b1 + b2:
        seq = [src] + [path_end(kg, src, p[:i + 1]) for i in range(len(p))]
        assert len(set(seq)) == len(seq)
    ctx = beam_context(b1 + b2)
    assert all(not (a != b and b[:len(a)] == a) for a in ctx for b in ctx)  # no kept path is a prefix of another


# ---------------------------------------------------------------- against the real model
@pytest.mark.llm
def test_complete_traced_embedded(embedded_server, tmp_path):
    from kgrag_nb.llm import LLMClient
    client = LLMClient(embedded_server.url, cache=tmp_path / "llm.sqlite", progress=False)
    tw = TraceWriter(tmp_path / "calls.jsonl")
    prompts = ["Question: What is 2 + 2?\nAnswer:", "Question: What colour is the sky?\nAnswer:"]
    outs, parsed = complete_traced(client, prompts, ["a", "b"], "toy", "answer", tw, parse=str.strip, max_tokens=6, stop=["\n"])
    assert outs == [o[0] for o in client.complete(prompts, max_tokens=6, stop=["\n"])]  # same requests: cache hits
    assert client.usage.cache_hits >= 2
    assert [(r["question_id"], r["prompt"], r["parsed"]) for r in TraceWriter.read(tw.path)] == \
        [("a", prompts[0], outs[0].strip()), ("b", prompts[1], outs[1].strip())]


# --- issue 21: the declared format of each parsed reply, and one step under `decoding` ---------------------------------


def test_reply_constraints_hand_written(chain):
    import re
    y = chain.entity_index("y")
    cs = candidate_steps(chain, [y])  # ~r, s
    c = steps_constraint(chain, cs, 2)
    assert c.kind == "regex"
    for out in [" ~r", "s", " ~r; s", " s; s\n"]:
        assert re.fullmatch(c.value, out), out
    for out in ["", " ~r; s; ~r", " t", " ~r, s", " ~r;s", "1", " ~r\n\ns"]:
        assert not re.fullmatch(c.value, out), out
    p = relation_paths_constraint(chain, cs, max_hops=2, limit=2)
    for out in ["~r", "~r -> s\ns", "s -> s\n"]:
        assert re.fullmatch(p.value, out), out
    for out in ["", "~r -> s -> s", "t", "~r\ns\n~r", "~r->s", "~r\n\ns"]:
        assert not re.fullmatch(p.value, out), out
    assert steps_constraint(chain, [], 2) is None and relation_paths_constraint(chain, [], 2, 3) is None
    with pytest.raises(ValueError, match="at least 1"): steps_constraint(chain, cs, 0)
    with pytest.raises(ValueError, match="1 or more"): relation_paths_constraint(chain, cs, 0, 3)
    assert parse_failures([[], None, [cs[0]], [((0, True),)]]) == 2 and parse_failures([]) == 0


def test_labels_the_parser_would_split_are_left_out():
    import re
    kg = KG.from_triples([("a", "x; y", "b"), ("a", "1. z", "b"), ("a", "p->q", "b"), ("a", "ok", "b")], name="odd")
    cs = candidate_steps(kg, [kg.entity_index("a")])
    admitted = lambda c, sep: sorted(l for l in ("x; y", "1. z", "p->q", "ok") if re.fullmatch(c.value, sep + l))
    assert admitted(steps_constraint(kg, cs, 1), " ") == ["ok", "p->q"]  # ';' splits a pruning reply, '1. ' is read as a number
    assert admitted(relation_paths_constraint(kg, cs, 1, 1), "") == ["1. z", "ok", "x; y"]  # '->' splits a path


_LABEL = st.text(st.sampled_from("ab ~;,.-> 1)\né"), min_size=1, max_size=6)


@st.composite
def labelled_kgs(draw):
    "Small KGs whose relation names hold separators, list numbers, '->', spaces and newlines."
    names = draw(st.lists(_LABEL, min_size=1, max_size=4, unique=True))
    tri = draw(st.lists(st.tuples(st.integers(0, 3), st.integers(0, len(names) - 1), st.integers(0, 3)), min_size=1, max_size=8))
    return KG.from_triples([(f"e{h}", names[r], f"e{t}") for h, r, t in tri], name="labels")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(labelled_kgs(), st.integers(1, 3), st.data())
def test_every_pruning_reply_the_constraint_admits_parses(kg, limit, data):
    cs = candidate_steps(kg, [0])
    c = steps_constraint(kg, cs, limit)
    if c is None: return  # no label the parser reads back: the step is sent free
    out = data.draw(st.from_regex(c.value, fullmatch=True))
    got = parse_steps(out, kg, cs, limit)
    assert 1 <= len(got) <= limit and set(got) <= set(cs), (out, got)
    assert parse_steps(fill_constraint(c), kg, cs, limit)  # the stand-in server's filling parses too


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(labelled_kgs(), st.integers(1, 3), st.integers(1, 3), st.data())
def test_every_plan_the_constraint_admits_parses(kg, hops, limit, data):
    cs = candidate_steps(kg, [0])
    c = relation_paths_constraint(kg, cs, hops, limit)
    if c is None: return
    out = data.draw(st.from_regex(c.value, fullmatch=True))
    got = parse_relation_paths(out, kg, hops, limit)
    assert 1 <= len(got) <= limit and all(1 <= len(p) <= hops for p in got), (out, got)
    assert parse_relation_paths(fill_constraint(c), kg, hops, limit)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(small_kgs(), st.integers(1, 3))
def test_constraints_admit_every_listed_label(kg, limit):
    "No listed relation is lost: each candidate's label alone is an admitted reply (small KGs' labels r0, ~r1, ...)."
    import re
    cs = candidate_steps(kg, [0])
    if not cs: return
    c, p = steps_constraint(kg, cs, limit), relation_paths_constraint(kg, cs, 2, limit)
    for s in cs:
        assert re.fullmatch(c.value, " " + step_label(kg, s)) and re.fullmatch(p.value, step_label(kg, s))
        assert parse_steps(" " + step_label(kg, s), kg, cs, limit) == [s]


@pytest.fixture(scope="module")
def stub_server():
    from kgrag_nb.serve import StubServer
    with StubServer() as srv: yield srv


def test_free_sends_the_old_requests_and_constrained_binds_the_format(stub_server, tmp_path, chain):
    "free: exactly `complete_traced`'s requests (same cache keys); constrained: one batch per constraint, every reply in its format."
    import re
    from kgrag_nb.llm import LLMClient
    client = LLMClient(stub_server.url, cache=tmp_path / "c.sqlite", progress=False)
    keys = lambda: (tmp_path / "keys").read_text().split()
    cands = [candidate_steps(chain, [chain.entity_index(e)]) for e in ("x", "y", "z")]
    cons = [steps_constraint(chain, c, 2) for c in cands]
    prompts = [f"Question: q{i}\nRelations: {'; '.join(step_label(chain, s) for s in c)}\nAnswer:" for i, c in enumerate(cands)]
    parsers = [lambda o, c=c: parse_steps(o, chain, c, 2) for c in cands]
    kw = dict(max_tokens=12, stop=["\n"], temperature=0.0, desc="prune")
    client.key_log = tmp_path / "keys"
    old = complete_traced(client, prompts, ["a", "b", "c"], "m", "prune", None, parsers, **kw)
    before = keys(); (tmp_path / "keys").unlink()
    new = complete_decoded(client, prompts, ["a", "b", "c"], "m", "prune", None, parsers, cons, "free", PRUNE_REFORMAT, **kw)
    assert keys() == before and new == old  # same requests, same cache keys, same replies
    (tmp_path / "keys").unlink()
    tw = TraceWriter()
    outs, got = complete_decoded(client, prompts, ["a", "b", "c"], "m", "prune", tw, parsers, cons, "constrained", **kw)
    assert not set(keys()) & set(before)  # the constraint is part of the key: a different request
    assert all(re.fullmatch(c.value, o) for c, o in zip(cons, outs)) and parse_failures(got) == 0
    assert sorted(r["question_id"] for r in tw.records) == ["a", "b", "c"]
    tw = TraceWriter()
    outs, got = complete_decoded(client, prompts, ["a", "b", "c"], "m", "prune", tw, parsers, [cons[0], None, cons[2]], "decoupled",
                                 PRUNE_REFORMAT, **kw)
    assert outs[1] == old[0][1] and got[1] == old[1][1]  # no declared format: the free reply stands, parsed as before
    assert [r["stage"] for r in tw.records] == ["prune"] * 3 + ["prune: restated"] * 2
    assert all(r["prompt"].endswith(PRUNE_REFORMAT.line) for r in tw.records[3:]) and re.fullmatch(cons[0].value, outs[0])
    with pytest.raises(ValueError, match="restatement line"):
        complete_decoded(client, prompts, ["a", "b", "c"], "m", "prune", None, parsers, cons, "decoupled", **kw)
    with pytest.raises(ValueError, match="decoding="):
        complete_decoded(client, prompts, ["a", "b", "c"], "m", "prune", None, parsers, cons, "grammar", **kw)


@pytest.mark.llm
def test_constrained_rog_and_tog_steps_embedded(embedded_server, tmp_path):
    "BRINK's RoG plan and ToG pruning prompts, constrained on the real server: every reply is in its format and parses."
    import re
    from kgrag_nb.studies.brink.methods import ROG_PLAN_PROMPT, TOG_PRUNE_PROMPT
    from kgrag_nb.llm import LLMClient
    kg = KG.from_triples([("p", "father", "a"), ("p", "father", "b"), ("m", "mother", "a"), ("a", "brother", "b"),
                          ("b", "brother", "a"), ("q", "father", "p")], name="family-mini")
    client = LLMClient(embedded_server.url, cache=tmp_path / "llm.sqlite", progress=False)
    qs = [("a", "What is the uncle of a?"), ("b", "What is the grandfather of b?")]
    cands = [candidate_steps(kg, [kg.entity_index(e)], 12) for e, _ in qs]
    labels = [[step_label(kg, s) for s in c] for c in cands]
    plans = [ROG_PLAN_PROMPT.format(question=q, relations=", ".join(l)) for (_, q), l in zip(qs, labels)]
    cons = [relation_paths_constraint(kg, c, 2, 3) for c in cands]
    outs, got = complete_decoded(client, plans, ["a", "b"], "rog", "rog plan", None, lambda o: parse_relation_paths(o, kg, 2, 3), cons,
                                 "constrained", temperature=0.0, max_tokens=32, stop=["\n\n"])
    assert parse_failures(got) == 0, outs
    prunes = [TOG_PRUNE_PROMPT.format(width=2, question=q, entities=e, relations="; ".join(l)) for (e, q), l in zip(qs, labels)]
    cons = [steps_constraint(kg, c, 2) for c in cands]
    outs, got = complete_decoded(client, prunes, ["a", "b"], "tog", "tog depth 1", None,
                                 [lambda o, c=c: parse_steps(o, kg, c, 2) for c in cands], cons, "constrained",
                                 temperature=0.0, max_tokens=32, stop=["\n"])
    assert parse_failures(got) == 0, outs
    assert all(set(g) <= set(c) for g, c in zip(got, cands))


def test_complete_decoded_sends_brinks_answer_list_requests(stub_server, tmp_path):
    """Under every decoding, `complete_decoded` sends the requests (cache keys) of `BrinkMethod._complete` for an answer list:
    BRINK's methods can route their plan and pruning steps through it without changing the answer steps' keys."""
    from kgrag_nb.studies.brink.methods import ANSWER_LIST, ANSWER_REFORMAT, MethodConfig, parse_answer
    from kgrag_nb.llm import LLMClient
    client = LLMClient(stub_server.url, cache=tmp_path / "c.sqlite", progress=False)
    m, qs = get_method("llm_only"), [Question("a", "Who?", ["e1"]), Question("b", "What?", ["e2"])]
    prompts = ["Question: Who?\nAnswer:", "Question: What?\nAnswer:"]
    for dec in ("free", "constrained", "decoupled"):
        cfg = MethodConfig(decoding=dec)
        for i, run in enumerate((lambda: m._complete(client, qs, prompts, cfg, cfg.max_tokens, "s", None, parse=parse_answer, constraint=ANSWER_LIST),
                                 lambda: complete_decoded(client, prompts, ["a", "b"], m.name, "s", None, parse_answer, ANSWER_LIST, dec,
                                                          ANSWER_REFORMAT, temperature=cfg.temperature, max_tokens=cfg.max_tokens,
                                                          stop=["\n"], desc="s")[0])):
            client.key_log = tmp_path / f"{dec}{i}"
            run()
        keys = (tmp_path / f"{dec}0").read_text().split()
        assert keys == (tmp_path / f"{dec}1").read_text().split() and len(keys) == (4 if dec == "decoupled" else 2), dec
