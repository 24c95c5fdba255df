"""Tests of constrained decoding in kgrag_nb.llm (issue 21 item 1): `Constraint`, cache keys, the per-backend request
payloads (asserted against local fake HTTP servers that record every body: vLLM-, OpenAI- and llama.cpp-shaped),
loud failures on unsupported constraints, `fill_constraint` (property tests), and the real embedded llama.cpp server.
"""
import json, re, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jsonschema
import pytest
from _http import JSONHandler
from hypothesis import given, settings, strategies as st

from kgrag_nb.llm import (Constraint, LLMClient, ResponseCache, UnsupportedConstraintError, constraint_body, constraint_gbnf,
                          fill_constraint, parse_regex, regex_to_gbnf, request_key, run_sync)

JUDGE = {"type": "object", "properties": {"judge": {"type": "boolean"},
         "queries": {"type": "array", "items": {"type": "string"}, "maxItems": 3}}, "required": ["judge", "queries"]}
YES_NO = Constraint.choice(["True", "False"])


# ---------------------------------------------------------------- a fake server that records request bodies
class Recorder:
    "Real HTTP server on loopback: /v1/models with the given `owned_by`, optional GET /version, POST bodies recorded."
    def __init__(self, owned_by: str, version: str | None = None, text: str = "True"):
        self.owned_by, self.version, self.text = owned_by, version, text
        self.bodies, self.gets = [], []
        rec = self

        class Handler(JSONHandler):
            def do_GET(self):
                rec.gets.append(self.path)
                if self.path.rstrip("/") == "/v1/models":
                    return self._send(200, {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": rec.owned_by}]})
                if self.path == "/version" and rec.version is not None: return self._send(200, {"version": rec.version})
                self._send(404, {"detail": "Not Found"})
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                rec.bodies.append(body)
                usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
                if self.path.endswith("/chat/completions"):
                    choice = {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": rec.text}}
                else: choice = {"index": 0, "text": rec.text, "finish_reason": "stop", "logprobs": None}
                self._send(200, {"id": "x", "object": "text_completion", "created": 0, "model": body["model"],
                                 "choices": [choice], "usage": usage})

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self): self.httpd.shutdown(); self.httpd.server_close()

    def extra(self, i: int = -1) -> dict:
        "The body fields of POST `i` beyond the ordinary ones."
        plain = {"model", "prompt", "messages", "max_tokens", "temperature", "stop", "seed", "top_p"}
        return {k: v for k, v in self.bodies[i].items() if k not in plain}


@pytest.fixture
def server():
    made = []
    def make(*a, **kw): made.append(Recorder(*a, **kw)); return made[-1]
    yield make
    for s in made: s.close()


def _client(url, tmp_path=None, **kw):
    return LLMClient(url, cache=None if tmp_path is None else tmp_path / "c.sqlite", progress=False, max_retries=0, **kw)

CHAT = [[{"role": "user", "content": "Is water wet?"}]]


# ---------------------------------------------------------------- Constraint
def test_constraint_constructors_validate_and_round_trip():
    c = Constraint.json_schema(JUDGE)
    assert c.schema == JUDGE and Constraint.from_spec(c.spec()) == c and c.canonical() == json.dumps(
        {"json": JUDGE}, sort_keys=True, separators=(",", ":"))
    assert Constraint.regex(r"\d+").spec() == {"regex": r"\d+"} and Constraint.grammar('root ::= "a"').kind == "grammar"
    assert {YES_NO: 1}[Constraint.choice(("True", "False"))] == 1  # hashable, equal by content
    for make, msg in [(lambda: Constraint.choice([]), "empty"), (lambda: Constraint.choice(["a", ""]), "non-empty strings"),
                      (lambda: Constraint.json_schema("{}"), "not a dict"), (lambda: Constraint.json_schema({"a": {1, 2}}), "plain JSON"),
                      (lambda: Constraint.regex("(a"), "not a valid regular expression"), (lambda: Constraint.regex(""), "non-empty"),
                      (lambda: Constraint.grammar("x ::= y"), "root ::="), (lambda: Constraint("ebnf", "x"), "kind")]:
        with pytest.raises(ValueError, match=msg): make()
    with pytest.raises(Exception): YES_NO.kind = "regex"  # frozen


# ---------------------------------------------------------------- cache keys
def test_keys_without_constraint_are_the_keys_computed_before_constraints_existed():
    # literals computed with the code as it was before constraints were added
    assert request_key("completion", "gemma-3-270m-q4_k_m", "Q: 1+1?\nA:", {"temperature": 0.0, "max_tokens": 4, "stop": ["\n"]},
                       0) == "698c451762ae5951f488ba830603f257bf4338ba4ad0ec478511fd0769b75975"
    assert request_key("chat", "stub", [{"role": "user", "content": "Is water wet? True or False"}],
                       {"temperature": 0.7, "max_tokens": 8, "seed": 3}, 2, constraint=None) == \
        "67dbbf55b803fb3e911d29c4a0dd6e86e469847c91f84998e1b47eec65e42a6e"


def test_keys_differ_by_constraint():
    args = ("completion", "m", "Q?", {"temperature": 0.0, "max_tokens": 8})
    keys = [request_key(*args)] + [request_key(*args, constraint=c) for c in (
        YES_NO, Constraint.choice(["False", "True"]), Constraint.regex("True|False"), Constraint.json_schema(JUDGE),
        Constraint.json_schema({**JUDGE, "required": ["judge"]}), Constraint.grammar('root ::= "True" | "False"'))]
    assert len(set(keys)) == len(keys)
    assert request_key(*args, constraint=YES_NO) == request_key(*args, constraint={"choice": ["True", "False"]})


def test_client_keys_cache_and_records_by_constraint(server, tmp_path):
    srv = server("vllm", version="0.11.0")
    c = _client(srv.url, tmp_path)
    c.complete(["Q?"], max_tokens=4); c.complete(["Q?"], max_tokens=4, constraint=YES_NO)
    c.complete(["Q?"], max_tokens=4, constraint=YES_NO); c.complete(["Q?"], max_tokens=4)  # both cached now
    assert len(srv.bodies) == 2 and c.usage.cache_hits == 2
    cache = ResponseCache(tmp_path / "c.sqlite")
    recs = [cache.request(k) for k in cache.keys()]
    assert "constraint" not in recs[0] and recs[1]["constraint"] == {"choice": ["True", "False"]}
    # the record re-keys to the same key (what `kgrag plan` does with a rehearsal's requests)
    r = recs[1]
    assert request_key(r["kind"], r["model"], r["payload"], r["params"], r["sample_index"], r.get("constraint")) == cache.keys()[1]
    cache.close()


def test_unconstrained_calls_send_nothing_new_and_never_probe(server):
    srv = server("vllm", version="0.11.0")
    c = _client(srv.url)
    c.complete(["Q?"], max_tokens=4); c.chat(CHAT, max_tokens=4)
    assert srv.extra(0) == {} and srv.extra(1) == {} and "/version" not in srv.gets and c.served_backend is None


# ---------------------------------------------------------------- per-backend payloads
def test_vllm_new_uses_structured_outputs(server):
    srv = server("vllm", version="0.11.0")
    c = _client(srv.url)
    assert c.complete(["Q?"], constraint=YES_NO) == [["True"]]
    assert srv.extra() == {"structured_outputs": {"choice": ["True", "False"]}}
    c.chat(CHAT, constraint=Constraint.json_schema(JUDGE))
    assert srv.extra() == {"structured_outputs": {"json": JUDGE}}
    c.complete(["Q?"], constraint=Constraint.regex(r"(?<=a)b"))  # vLLM takes any regex as it is
    assert srv.extra() == {"structured_outputs": {"regex": r"(?<=a)b"}}
    c.complete(["Q?"], constraint=Constraint.grammar('root ::= "True"'))
    assert srv.extra() == {"structured_outputs": {"grammar": 'root ::= "True"'}}
    assert c.served_backend == ("vllm", "0.11.0") and srv.gets.count("/version") == 1  # detected once per client


@pytest.mark.parametrize("version,new", [("0.10.1.1", False), ("0.8.5.post1", False), ("0.10.2", True), ("0.12.0", True),
                                         ("0.10.2rc1", True), ("1.0.0", True)])
def test_vllm_field_set_follows_the_version(server, version, new):
    srv = server("vllm", version=version)
    c = _client(srv.url)
    c.complete(["Q?"], constraint=YES_NO)
    c.chat(CHAT, constraint=Constraint.json_schema(JUDGE))
    c.complete(["Q?"], constraint=Constraint.regex("[0-9]+"))
    c.complete(["Q?"], constraint=Constraint.grammar('root ::= "1"'))
    if new: assert [srv.extra(i) for i in range(4)] == [{"structured_outputs": s} for s in (
        {"choice": ["True", "False"]}, {"json": JUDGE}, {"regex": "[0-9]+"}, {"grammar": 'root ::= "1"'})]
    else: assert [srv.extra(i) for i in range(4)] == [{"guided_choice": ["True", "False"]}, {"guided_json": JUDGE},
                                                       {"guided_regex": "[0-9]+"}, {"guided_grammar": 'root ::= "1"'}]


def test_vllm_behind_another_owned_by_is_found_by_its_version_route(server):
    srv = server("organization-owner", version="0.9.2")
    c = _client(srv.url)
    c.complete(["Q?"], constraint=YES_NO)
    assert c.served_backend == ("vllm", "0.9.2") and srv.extra() == {"guided_choice": ["True", "False"]}


def test_vllm_without_a_version_fails_before_sending(server):
    srv = server("vllm")
    with pytest.raises(UnsupportedConstraintError, match="GET /version"): _client(srv.url).complete(["Q?"], constraint=YES_NO)
    assert srv.bodies == []


def test_openai_style_chat_gets_a_strict_json_schema_response_format(server):
    srv = server("system", text='{"judge": true, "queries": []}')
    c = _client(srv.url)
    assert c.chat(CHAT, constraint=Constraint.json_schema(JUDGE)) == [['{"judge": true, "queries": []}']]
    assert srv.extra() == {"response_format": {"type": "json_schema",
                                               "json_schema": {"name": "constraint", "schema": JUDGE, "strict": True}}}
    assert c.served_backend == ("openai", None)


@pytest.mark.parametrize("call,constraint,msg", [
    ("chat", Constraint.regex("[0-9]+"), "only JSON-schema"), ("chat", YES_NO, "only JSON-schema"),
    ("chat", Constraint.grammar('root ::= "a"'), "only JSON-schema"),
    ("complete", Constraint.json_schema(JUDGE), "not completions"), ("complete", YES_NO, "not completions")])
def test_openai_style_fails_loudly_before_sending(server, tmp_path, call, constraint, msg):
    srv = server("openai")
    c = _client(srv.url, tmp_path)
    with pytest.raises(UnsupportedConstraintError, match=msg):
        (c.chat(CHAT, constraint=constraint) if call == "chat" else c.complete(["Q?"], constraint=constraint))
    assert srv.bodies == [] and len(ResponseCache(tmp_path / "c.sqlite")) == 0


def test_llama_cpp_server_gets_a_gbnf_grammar(server):
    srv = server("me")  # llama-cpp-python's server reports owned_by "me"
    c = _client(srv.url)
    c.complete(["Q?"], constraint=YES_NO); c.chat(CHAT, constraint=Constraint.regex(r"[A-Z][a-z]+ \d{4}"))
    assert srv.extra(0) == {"grammar": 'root ::= ("True" | "False")\n'}
    assert srv.extra(1) == {"grammar": 'root ::= [A-Z] [a-z]+ " " [0-9] [0-9] [0-9] [0-9]\n'}
    c.complete(["Q?"], constraint=Constraint.json_schema(JUDGE))
    assert 'root ::= "{" space judge-kv "," space queries-kv "}" space' in srv.extra()["grammar"]
    with pytest.raises(UnsupportedConstraintError, match=r"lookaround"):
        c.complete(["Q?"], constraint=Constraint.regex(r"(?=a)a"))
    assert len(srv.bodies) == 3 and c.served_backend == ("llama.cpp", None)


def test_explicit_backend_skips_detection(server):
    srv = server("vllm", version="0.11.0")
    c = _client(srv.url, backend="llama.cpp")
    c.complete(["Q?"], constraint=YES_NO)
    assert set(srv.extra()) == {"grammar"} and "/version" not in srv.gets
    with pytest.raises(ValueError, match="KGRAG_LLM_BACKEND"): LLMClient(srv.url, backend="tgi")


def test_from_config_reads_the_backend_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("KGRAG_LLM_BACKEND", "vllm")
    assert LLMClient.from_config(base_url="http://127.0.0.1:9/v1", cache=None).backend == "vllm"
    monkeypatch.delenv("KGRAG_LLM_BACKEND")
    assert LLMClient.from_config(base_url="http://127.0.0.1:9/v1", cache=None).backend == "auto"


def test_stub_server_is_detected_and_gets_structured_outputs():
    pytest.importorskip("starlette")
    from kgrag_nb.serve import StubServer
    srv = StubServer().start()
    try:
        c = _client(srv.url)
        c.complete(["Is it? True or False"], constraint=YES_NO, max_tokens=4)  # honoured once the stub reads the field
        assert c.served_backend == ("stub", None)
        with pytest.raises(UnsupportedConstraintError, match="raw grammar"):
            c.complete(["Q?"], constraint=Constraint.grammar('root ::= "a"'))
    finally: srv.stop()
    assert constraint_body(Constraint.json_schema(JUDGE), "stub") == {"structured_outputs": {"json": JUDGE}}


def test_a_constraint_must_be_a_constraint(server):
    srv = server("me")
    with pytest.raises(TypeError, match="pass a Constraint"): _client(srv.url).complete(["Q?"], constraint={"choice": ["a"]})


# ---------------------------------------------------------------- regex subset and fill_constraint
REGEX_CASES = [r"True|False", r"^\d{3}-\d{2}$", r"[A-Z][a-z]*( [A-Z][a-z]*)?", r"(yes|no)\.", r"x{,3}y{2,}", r"[^\n\]]+",
               r"a.b", r"\(\d+\)", r"[-+]?\d+(\.\d+)?", r"\w+@\w+\.com", r"(?:ab|c)*d", r"\x41\u00e9\t", r"a{}", r"[a\-z]"]

@pytest.mark.parametrize("pattern", REGEX_CASES)
def test_regex_subset_fill_matches_and_gbnf_builds(pattern):
    assert re.fullmatch(pattern, fill_constraint({"regex": pattern}))
    assert regex_to_gbnf(pattern).startswith("root ::= ")


@pytest.mark.parametrize("pattern,construct", [(r"(?=a)b", "lookaround"), (r"(a)\1", r"\1"), (r"a+?", "lazy"), (r"\bx", r"\b"),
                                               (r"\W", r"\W"), (r"(?P<n>a)", "named group"), (r"a$b", "anchor"),
                                               (r"[^\d]", "negated class"), (r"[[:alpha:]]", "POSIX")])
def test_regex_outside_the_subset_fails_naming_the_construct(pattern, construct):
    with pytest.raises(UnsupportedConstraintError, match=re.escape(construct)): parse_regex(pattern)


def _regex_st():
    "Random patterns of the subset, as text."
    atom = st.one_of(st.sampled_from(list("abcXYZ019 ,")), st.sampled_from([r"\d", r"\w", r"\s", r"\.", r"\(", "[a-f]", "[^x]",
                                                                            "[0-9_]", "."]))
    quant = st.sampled_from(["", "", "?", "*", "+", "{2}", "{1,3}", "{2,}", "{,2}"])
    piece = st.builds(lambda a, q: a + q, atom, quant)
    seq = st.lists(piece, min_size=1, max_size=5).map("".join)
    group = st.lists(seq, min_size=1, max_size=3).map(lambda xs: "(" + "|".join(xs) + ")")
    return st.lists(st.one_of(seq, st.builds(lambda g, q: g + q, group, quant)), min_size=1, max_size=3).map("".join)

@settings(max_examples=300, deadline=None)
@given(pattern=_regex_st(), seed=st.integers(0, 5))
def test_fill_constraint_regex_always_fullmatches(pattern, seed):
    out = fill_constraint({"regex": pattern}, seed)
    assert re.fullmatch(pattern, out), (pattern, out)
    assert regex_to_gbnf(pattern)


@given(options=st.lists(st.text(min_size=1, max_size=8), min_size=1, max_size=6, unique=True), seed=st.integers(0, 100))
def test_fill_constraint_choice_is_an_option(options, seed):
    assert fill_constraint({"choice": options}, seed) == options[seed % len(options)]
    g = constraint_gbnf(Constraint.choice(options))
    assert g.startswith("root ::= (") and g.count(" | ") >= len(options) - 1


def _schema_st():
    leaf = st.one_of(
        st.builds(lambda n: {"type": "string", "minLength": n}, st.integers(0, 5)),
        st.builds(lambda lo: {"type": "integer", "minimum": lo}, st.integers(-5, 50)),
        st.builds(lambda lo: {"type": "number", "minimum": lo}, st.floats(-5, 50, allow_nan=False)),
        st.just({"type": "boolean"}), st.just({"type": "null"}),
        st.builds(lambda xs: {"enum": xs}, st.lists(st.text(max_size=4), min_size=1, max_size=3, unique=True)),
        st.just({"type": "string", "pattern": "^[A-Z]{2}[0-9]+$"}))
    def extend(inner):
        obj = st.dictionaries(st.text("abcdefgh", min_size=1, max_size=6), inner, max_size=4).flatmap(
            lambda props: st.builds(lambda req: {"type": "object", "properties": props, "required": req},
                                    st.lists(st.sampled_from(sorted(props)), unique=True) if props else st.just([])))
        arr = st.builds(lambda it, n: {"type": "array", "items": it, "minItems": n, "maxItems": n + 2}, inner, st.integers(0, 3))
        return st.one_of(obj, arr)
    return st.recursive(leaf, extend, max_leaves=8)

@settings(max_examples=300, deadline=None)
@given(schema=_schema_st(), seed=st.integers(0, 3))
def test_fill_constraint_json_parses_and_validates(schema, seed):
    out = fill_constraint({"json": schema}, seed)
    value = json.loads(out)
    jsonschema.validate(value, schema)  # the output is an instance of the schema
    if schema.get("type") == "object": assert set(value) == set(schema["required"])


def test_fill_constraint_examples_and_grammar_refusal():
    assert json.loads(fill_constraint(Constraint.json_schema(JUDGE).spec())) == {"judge": True, "queries": []}
    assert json.loads(fill_constraint({"json": {"type": "object", "required": ["n"], "properties": {
        "n": {"type": "integer", "exclusiveMinimum": 3}}}})) == {"n": 4}
    with pytest.raises(UnsupportedConstraintError, match="stub cannot fill a raw grammar"):
        fill_constraint({"grammar": 'root ::= "a"'})
    with pytest.raises(ValueError, match="one key"): fill_constraint({"json": {}, "regex": "a"})


# ---------------------------------------------------------------- the real embedded llama.cpp server
QUESTIONS = ["who wrote the novel Dune?", "when did the Berlin wall fall?", "what is the capital of Peru?",
             "who won the 2018 FIFA World Cup?", "how many moons does Mars have?", "who painted the Mona Lisa?"]
ASK = ("Question: {}\nIs knowledge missing to answer it? Reply with a JSON object "
       '{{"judge": true or false, "queries": [search queries for the missing knowledge]}}.\nJSON:')

def _verdict(text: str):
    try: v = json.loads(text)
    except ValueError: return None
    return v if isinstance(v, dict) and isinstance(v.get("judge"), bool) and isinstance(v.get("queries"), list) else None


@pytest.mark.llm
def test_real_server_json_schema_and_choice_constraints(embedded_server, tmp_path):
    c = LLMClient(embedded_server.url, cache=tmp_path / "c.sqlite", progress=False)
    prompts = [ASK.format(q) for q in QUESTIONS]
    free = [t[0] for t in c.complete(prompts, max_tokens=96)]
    constrained = [t[0] for t in c.complete(prompts, max_tokens=96, constraint=Constraint.json_schema(JUDGE))]
    assert c.served_backend == ("llama.cpp", None)
    ok_free, ok_constrained = sum(_verdict(t) is not None for t in free), sum(_verdict(t) is not None for t in constrained)
    print(f"parse rate: free {ok_free}/{len(prompts)}, constrained {ok_constrained}/{len(prompts)}")
    assert ok_constrained >= len(prompts) - 1, constrained  # one may still be cut by max_tokens
    assert all(len(_verdict(t)["queries"]) <= 3 for t in constrained if _verdict(t))
    yes_no = [t[0] for t in c.complete([f"Question: {q}\nIs this question about a person? Answer True or False.\nAnswer:"
                                        for q in QUESTIONS], max_tokens=4, constraint=YES_NO)]
    assert all(t in ("True", "False") for t in yes_no), yes_no
    years = [t[0] for t in c.complete(prompts[:2], max_tokens=8, constraint=Constraint.regex(r"(19|20)\d{2}"))]
    assert all(re.fullmatch(r"(19|20)\d{2}", t) for t in years), years
