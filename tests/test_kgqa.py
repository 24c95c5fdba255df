"""Tests of kgrag_nb.kgqa: the KG-QA method layer (records, registry, trace writer, generic KG search operations).

Hand-built tiny KGs with hand-computed relation paths, instantiations and beams; hypothesis properties on random
small KGs (every instantiated path walks its relation path and ends where `path_end` says, beams never revisit an
entity); registry errors; the trace writer round-trip; one `llm` test of `complete_traced` on the real server.
"""
import json

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from kgrag_nb.kg import KG
from kgrag_nb.kgqa import (METHODS, BaseMethod, Method, Prediction, Question, TraceWriter, beam_context, beam_ends,
                           candidate_steps, complete_traced, expand_beam, get_method, instantiate, parse_relation_paths,
                           parse_steps, path_end, path_text, register_method, relation_path_of, relation_paths_to,
                           step_label, triples_of)


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
