"""Tests of kgrag_nb.llm: cache keys, the SQLite cache, cache modes, model checks, retries, concurrency, malformed
responses, usage up to a failure, and one request in flight per key across processes (issue 10).

Tests marked `llm` talk to the real embedded llama.cpp server (session fixture `embedded_server` in conftest.py).
Retry, header and concurrency tests use a tiny real HTTP server on 127.0.0.1 that speaks the OpenAI wire format.
"""
import asyncio, hashlib, json, multiprocessing as mp, os, re, socket, subprocess, sys, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import openai
import pytest
from _http import JSONHandler
from hypothesis import given, settings, strategies as st

from kgrag_nb.config import EMBEDDED_MODEL_ALIAS, get_config
from kgrag_nb.llm import (engine_fingerprint, CacheMissError, EndpointUnreachableError, LLMClient, MalformedResponseError, ModelNotServedError,
                          ResponseCache, Usage, canonical_json, parse_response, process_alive, request_key, run_sync)
from kgrag_nb.serve import free_port

FEW_SHOT = ("Q: What is the capital of Italy?\nA: Rome\nQ: What is the capital of Japan?\nA: Tokyo\n"
            "Q: What is the capital of {}?\nA:")
PROMPTS = [FEW_SHOT.format(c) for c in ("France", "Germany", "Spain")]


# ---------------------------------------------------------------- a tiny OpenAI-compatible HTTP server
class FakeOpenAI:
    "Real HTTP server on loopback: /v1/models, /v1/completions, /v1/chat/completions; scripted error statuses."
    " `owned_by='vllm'` with a `version` (GET /version) fakes vLLM, which answers `n` samples per request, sample i"
    " with the seed `seed + i` (vLLM's V1 engine); the default `owned_by='me'` is llama-cpp-python's server."
    def __init__(self, statuses=(), delay=0.0, models=("fake-model",), raw=(), owned_by="me", version=None):
        self.statuses, self.delay, self.models = list(statuses), delay, list(models)
        self.owned_by, self.version, self.gets = owned_by, version, []
        self.raw = list(raw)  # (content type, body bytes) answered with HTTP 200 to the next POSTs, in order
        self.release = threading.Event()  # prompts starting with "hold" wait for it (at most 30 s)
        self.posts, self.auth, self.bodies, self.inflight, self.max_inflight = 0, [], [], 0, 0
        self.lock = threading.Lock()
        fake = self

        class Handler(JSONHandler):
            def do_GET(self):
                fake.gets.append(self.path)
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": m, "object": "model", "owned_by": fake.owned_by} for m in fake.models]})
                elif self.path == "/version" and fake.version: self._send(200, {"version": fake.version})
                else: self._send(404, {"error": {"message": "not found"}})
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with fake.lock:
                    fake.posts += 1; fake.auth.append(self.headers.get("Authorization")); fake.bodies.append(body)
                    status = fake.statuses.pop(0) if fake.statuses else 200
                    raw = fake.raw.pop(0) if fake.raw and status == 200 else None
                    fake.inflight += 1; fake.max_inflight = max(fake.max_inflight, fake.inflight)
                time.sleep(fake.delay)
                if str(body.get("prompt", "")).startswith("hold"): fake.release.wait(30)
                with fake.lock: fake.inflight -= 1
                if status != 200: return self._send(status, {"error": {"message": f"scripted {status}", "type": "x"}})
                if raw is not None:
                    self.send_response(200); self.send_header("Content-Type", raw[0])
                    self.send_header("Content-Length", str(len(raw[1]))); self.end_headers(); return self.wfile.write(raw[1])
                n, seed = int(body.get("n") or 1), body.get("seed")
                usage = {"prompt_tokens": 3, "completion_tokens": 2 * n, "total_tokens": 3 + 2 * n}
                if self.path.endswith("/chat/completions"):
                    text = "re:" + body["messages"][-1]["content"]
                    self._send(200, {"id": "c1", "object": "chat.completion", "created": 0, "model": body["model"], "usage": usage,
                                     "choices": [{"index": i, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
                                                 for i in range(n)]})
                else:
                    texts = [f"echo:{body['prompt']}|t={body.get('temperature')}|s={None if seed is None else seed + i}" for i in range(n)]
                    self._send(200, {"id": "c1", "object": "text_completion", "created": 0, "model": body["model"], "usage": usage,
                                     "choices": [{"index": i, "text": t, "finish_reason": "stop", "logprobs": None}
                                                 for i, t in reversed(list(enumerate(texts)))]})  # (any order: `index` tells)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self): self.release.set(); self.httpd.shutdown(); self.httpd.server_close()


@pytest.fixture
def fake():
    servers = []
    def make(**kw):
        servers.append(FakeOpenAI(**kw)); return servers[-1]
    yield make
    for s in servers: s.close()


# ---------------------------------------------------------------- keys
def test_request_key_hand_computed():
    body = '{"kind":"completion","model":"m","params":{"max_tokens":4,"temperature":0.0},"payload":"hi","sample_index":0}'
    assert request_key("completion", "m", "hi", {"temperature": 0.0, "max_tokens": 4, "seed": None}) == hashlib.sha256(body.encode()).hexdigest()


def test_request_key_without_constraint_is_unchanged():
    "Issue 21: a constraint enters the key only when given, so every key (and cache) made before constraints stays valid."
    old = "698c451762ae5951f488ba830603f257bf4338ba4ad0ec478511fd0769b75975"  # computed with the code before constraints
    prm = {"temperature": 0.0, "max_tokens": 4, "stop": ["\n"]}
    assert request_key("completion", "gemma-3-270m-q4_k_m", "Q: 1+1?\nA:", prm, 0) == old
    assert request_key("completion", "gemma-3-270m-q4_k_m", "Q: 1+1?\nA:", prm, 0, constraint=None) == old
    assert request_key("completion", "gemma-3-270m-q4_k_m", "Q: 1+1?\nA:", prm, 0, constraint={"choice": ["2", "3"]}) != old


def test_request_key_rejects_bad_input():
    with pytest.raises(ValueError, match="completion"): request_key("embed", "m", "hi", {})
    with pytest.raises(ValueError, match="model"): request_key("completion", "", "hi", {})


params_st = st.dictionaries(st.sampled_from(["temperature", "max_tokens", "top_p", "seed", "stop"]),
                            st.one_of(st.floats(0, 2), st.integers(0, 1000), st.lists(st.text(max_size=3), max_size=2)), min_size=1)

@settings(max_examples=200, deadline=None)
@given(params=params_st, payload=st.text(max_size=50), model=st.text(min_size=1, max_size=10), idx=st.integers(0, 10))
def test_request_key_properties(params, payload, model, idx):
    k = request_key("completion", model, payload, params, idx)
    reordered = dict(reversed(list(params.items())))
    assert request_key("completion", model, payload, {**reordered, "unset": None}, idx) == k  # order and None-free
    assert request_key("completion", model + "x", payload, params, idx) != k
    assert request_key("completion", model, payload, params, idx + 1) != k
    assert request_key("chat", model, [{"role": "user", "content": payload}], params, idx) != k
    name = next(iter(params))
    assert request_key("completion", model, payload, {**params, name: "changed"}, idx) != k


# ---------------------------------------------------------------- cache
def _write_many(path, tag, count):
    cache = ResponseCache(path)
    for i in range(count): cache.put(f"{tag}-{i}", {"text": f"{tag} {i}"}, request={"i": i})
    cache.close()


def test_cache_concurrent_writers_lose_nothing(tmp_path):
    path = tmp_path / "llm.sqlite"
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_write_many, args=(path, tag, 200)) for tag in ("a", "b")]
    for p in procs: p.start()
    for p in procs: p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    cache = ResponseCache(path)
    assert len(cache) == 400
    assert cache.get("a-199") == {"text": "a 199"} and cache.get("b-0") == {"text": "b 0"}
    assert cache.request("b-7") == {"i": 7}


def test_usage_as_dict():
    u = Usage(requests=3, completion_tokens=30, wall_s=1.5) + Usage(requests=1, cache_hits=2, wall_s=0.5)
    d = u.as_dict()
    assert (d["requests"], d["cache_hits"], d["wall_s"], d["requests_per_s"], d["completion_tokens_per_s"]) == (4, 2, 2.0, 2.0, 15.0)


def test_replay_needs_model_and_cache(tmp_path):
    with pytest.raises(ValueError, match="model"): LLMClient(None, mode="replay", cache=tmp_path / "c.sqlite")
    with pytest.raises(ValueError, match="cache"): LLMClient(None, model="m", mode="replay")
    with pytest.raises(ValueError, match="base_url"): LLMClient(None)


def test_replay_miss_raises_naming_prompt_and_model(tmp_path):
    client = LLMClient(None, model="some-model", cache=tmp_path / "c.sqlite", mode="replay")
    with pytest.raises(CacheMissError, match="some-model") as e: client.complete(["Q: Who painted the Mona Lisa?\nA:"])
    assert "Who painted the Mona Lisa" in str(e.value)
    assert client.usage.requests == 0


def test_from_config(tmp_path):
    cfg = get_config(cache_dir=tmp_path, llm_cache_mode="replay", model="m")
    c = LLMClient.from_config(cfg)
    assert (c.base_url, c.model, c.mode, c.cache.path) == (cfg.embedded_url, "m", "replay", tmp_path / "llm_cache.sqlite")
    assert LLMClient.from_config(cfg, base_url="http://h:1/v1").base_url == "http://h:1/v1"


# ---------------------------------------------------------------- endpoint errors, retries, headers (tiny real server)
def test_unreachable_endpoint_fails_fast():
    url = f"http://127.0.0.1:{free_port()}/v1"
    client = LLMClient(url, max_retries=1, backoff=0.05, progress=False)
    t0 = time.perf_counter()
    with pytest.raises(EndpointUnreachableError) as e: client.complete(["hi"])
    assert time.perf_counter() - t0 < 5
    assert url in str(e.value) and "kgrag serve embedded" in str(e.value) and "--llm-url" in str(e.value)


def test_a_client_made_after_the_server_died_names_the_recorded_death(tmp_path, monkeypatch):
    "A client created after the embedded server died asked /v1/models first, and that path said 'cannot reach the LLM"
    " endpoint ... start the embedded server' without reading the death its owner had recorded (signal, log, rebuild)."
    from kgrag_nb.llm import ServerDiedError
    port, dead = free_port(), subprocess.Popen(["true"])
    dead.wait()
    monkeypatch.setenv("KGRAG_SERVER_STATE", str(tmp_path / "servers"))
    (tmp_path / "servers").mkdir()
    died = ("the embedded llama.cpp server http://127.0.0.1:%d/v1 (pid %d) was killed by SIGILL (an instruction this CPU "
            "lacks); Log /x/server.log\nRebuild llama-cpp-python with portable flags: python tools/llama_wheel.py --install" % (port, dead.pid))
    (tmp_path / "servers" / f"{port}.json").write_text(json.dumps({"server_pid": dead.pid, "died": died}))
    client = LLMClient(f"http://127.0.0.1:{port}/v1", max_retries=1, backoff=0.01, progress=False)
    t0 = time.perf_counter()
    with pytest.raises(ServerDiedError) as e: client.complete(["hi"])
    assert "SIGILL" in str(e.value) and "tools/llama_wheel.py --install" in str(e.value) and time.perf_counter() - t0 < 5
    with pytest.raises(ServerDiedError, match="SIGILL"): client.resolve_model()


def test_503_is_retried_with_backoff(fake):
    srv = fake(statuses=[503, 503])
    client = LLMClient(srv.url, model="fake-model", max_retries=3, backoff=0.05, progress=False)
    t0 = time.perf_counter()
    out = client.complete(["hello"])
    assert out == [["echo:hello|t=0.0|s=None"]]
    assert srv.posts == 3 and (client.usage.requests, client.usage.errors, client.usage.retries) == (3, 2, 2)
    assert time.perf_counter() - t0 >= 0.05 * 0.5 + 0.1 * 0.5  # two backoff sleeps (jitter >= 0.5x)


def test_429_is_retried_and_exhaustion_raises(fake):
    srv = fake(statuses=[429, 500, 500])
    client = LLMClient(srv.url, model="fake-model", max_retries=1, backoff=0.01, progress=False)
    with pytest.raises(openai.InternalServerError): client.complete(["x"])
    assert srv.posts == 2 and client.usage.retries == 1


def test_400_is_not_retried(fake):
    srv = fake(statuses=[400, 400, 400])
    client = LLMClient(srv.url, model="fake-model", max_retries=5, backoff=0.01, progress=False)
    with pytest.raises(openai.BadRequestError): client.complete(["bad request"])
    assert srv.posts == 1 and client.usage.retries == 0 and client.usage.errors == 1


def test_api_key_sent_but_never_in_repr_or_cache(fake, tmp_path, monkeypatch):
    secret = "sk-kgrag-test-SECRET-4711"
    monkeypatch.setenv("KGRAG_TEST_KEY", secret)
    srv = fake()
    client = LLMClient(srv.url, cache=tmp_path / "llm.sqlite", api_key_env="KGRAG_TEST_KEY", progress=False)
    monkeypatch.delenv("KGRAG_TEST_KEY")  # read at construction only
    assert client.complete(["a", "b"]) == [["echo:a|t=0.0|s=None"], ["echo:b|t=0.0|s=None"]]
    assert srv.auth == [f"Bearer {secret}"] * 2
    assert secret not in repr(client) and secret not in str(client.usage.as_dict())
    client.cache.close()
    files = [p for p in tmp_path.iterdir() if p.name.startswith("llm.sqlite")]
    assert files and all(secret.encode() not in p.read_bytes() for p in files)
    assert b"echo:a" in b"".join(p.read_bytes() for p in files)  # the scan does see the stored answers


def test_model_resolution_against_models_list(fake):
    srv = fake(models=("m1", "m2"))
    with pytest.raises(ModelNotServedError, match="m1") as e: LLMClient(srv.url, progress=False).complete(["x"])
    assert "2 models" in str(e.value)
    with pytest.raises(ModelNotServedError) as e: LLMClient(srv.url, model="m3", progress=False).complete(["x"])
    assert all(s in str(e.value) for s in ("'m3'", srv.url, "m1", "m2"))
    assert srv.posts == 0
    assert LLMClient(srv.url, model="m2", progress=False).complete(["x"]) == [["echo:x|t=0.0|s=None"]]
    assert srv.bodies[-1]["model"] == "m2"


def test_bounded_concurrency_and_in_call_dedupe(fake, tmp_path):
    srv = fake(delay=0.15)
    client = LLMClient(srv.url, cache=tmp_path / "c.sqlite", max_concurrency=3, progress=False)
    prompts = [f"p{i}" for i in range(12)]
    out = client.complete(prompts + prompts[:4])  # the 4 repeats are sent once
    assert [o[0] for o in out] == [f"echo:{p}|t=0.0|s=None" for p in prompts + prompts[:4]]
    assert srv.posts == 12 and srv.max_inflight == 3


def test_seeds_temperatures_and_samples_reach_server_and_key(fake, tmp_path):
    srv = fake()
    client = LLMClient(srv.url, cache=tmp_path / "c.sqlite", progress=False)
    texts, recs = client.complete(["q1", "q2"], n=3, temperature=[0.2, 0.9], seed=10, return_records=True)
    assert texts[0] == [f"echo:q1|t=0.2|s={s}" for s in (10, 11, 12)]
    assert texts[1] == [f"echo:q2|t=0.9|s={s}" for s in (10, 11, 12)]
    keys = [r["key"] for row in recs for r in row]
    assert len(set(keys)) == 6
    stored = client.cache.request(recs[1][2]["key"])
    assert stored["params"]["temperature"] == 0.9 and stored["params"]["seed"] == 12 and stored["sample_index"] == 2
    assert recs[1][2]["key"] == request_key("completion", "fake-model", "q2", {"temperature": 0.9, "seed": 12, "max_tokens": 64}, 2)




ASSIGNED_METHOD = re.compile(r"^[A-Z]\w*\.\w+(?:\s*,\s*[A-Z]\w*\.\w+)*\s*=(?!=).*$", flags=re.M)  # `Cls.name = f`, `A.x, A.y = ...`

def test_methods_are_attached_one_way():
    "Issue 24: the methods llm adds to its classes outside the class body are attached with fastcore's `@patch`,"
    " never by assignment (`LLMClient._send = _send`)."
    import kgrag_nb.llm as llm
    assert ASSIGNED_METHOD.findall("LLMClient._send = _send\nA.x, A.y = f, g\nA.x == 1\nx = A.y\n") == ["LLMClient._send = _send", "A.x, A.y = f, g"]
    assert not ASSIGNED_METHOD.findall(Path(llm.__file__).read_text())
    assert LLMClient._send.__qualname__ == "LLMClient._send" and ResponseCache.claim.__qualname__ == "ResponseCache.claim"

# ---------------------------------------------------------------- n samples in one request where the server takes `n` (issue 23)
def _keys(recs): return [r["key"] for row in recs for r in row]


def test_vllm_gets_one_request_with_n_and_the_cache_keys_of_n_requests(fake, tmp_path):
    vllm, llama = fake(owned_by="vllm", version="0.11.0"), fake()
    kw = dict(n=3, temperature=[0.2, 0.9], seed=10, max_tokens=8, return_records=True)
    cv = LLMClient(vllm.url, cache=tmp_path / "v.sqlite", progress=False)
    cl = LLMClient(llama.url, cache=tmp_path / "l.sqlite", progress=False)
    tv, rv = cv.complete(["q1", "q2"], **kw)
    tl, rl = cl.complete(["q1", "q2"], **kw)
    assert tv == tl == [[f"echo:{q}|t={t}|s={s}" for s in (10, 11, 12)] for q, t in (("q1", 0.2), ("q2", 0.9))]
    assert _keys(rv) == _keys(rl) and len(set(_keys(rv))) == 6
    assert vllm.posts == 2 and sorted((b["prompt"], b["n"], b["seed"]) for b in vllm.bodies) == [("q1", 3, 10), ("q2", 3, 10)]
    assert llama.posts == 6 and all("n" not in b for b in llama.bodies) and "/version" not in llama.gets
    assert [cv.cache.request(k) for k in _keys(rv)] == [cl.cache.request(k) for k in _keys(rl)]  # the same stored requests
    u = cv.usage
    assert (u.requests, u.answers_cached, u.prompt_tokens, u.completion_tokens) == (2, 6, 2 * 3, 2 * 6)  # prompt once per request
    assert [r["completion_tokens"] for row in rv for r in row] == [2] * 6  # 6 tokens shared by 3 equally long samples
    assert cl.usage.prompt_tokens == 6 * 3 and cl.usage.completion_tokens == 6 * 2
    # a cache filled either way serves the other: nothing is sent
    again_v = LLMClient(vllm.url, cache=cl.cache, progress=False)
    again_l = LLMClient(llama.url, cache=cv.cache, progress=False)
    assert again_v.complete(["q1", "q2"], **kw)[0] == again_l.complete(["q1", "q2"], **kw)[0] == tv
    assert (again_v.usage.requests, again_l.usage.requests, vllm.posts, llama.posts) == (0, 0, 2, 6)
    assert LLMClient(None, model="fake-model", cache=cv.cache, mode="replay").complete(["q1", "q2"], **kw)[0] == tv


def test_only_the_missing_samples_are_asked_for_in_runs_of_consecutive_seeds(fake, tmp_path):
    srv = fake(owned_by="vllm", version="0.11.0")
    client = LLMClient(srv.url, cache=tmp_path / "c.sqlite", progress=False)
    client.complete(["q"], n=2, seed=10)
    assert [(b["n"], b["seed"]) for b in srv.bodies] == [(2, 10)]
    assert client.complete(["q"], n=5, seed=10) == [[f"echo:q|t=0.0|s={s}" for s in range(10, 15)]]
    assert [(b["n"], b["seed"]) for b in srv.bodies] == [(2, 10), (3, 12)] and client.usage.cache_hits == 2
    # sample 2 cached by hand: samples 0-1 and 3-4 are two requests (seeds 20 and 23), sample 2 is served from the cache
    key2 = request_key("completion", "fake-model", "r", {"temperature": 0.0, "max_tokens": 64, "seed": 22}, 2)
    client.cache.put(key2, {"text": "cached", "finish_reason": "stop", "prompt_tokens": 0, "completion_tokens": 0})
    assert client.complete(["r"], n=5, seed=20) == [["echo:r|t=0.0|s=20", "echo:r|t=0.0|s=21", "cached",
                                                      "echo:r|t=0.0|s=23", "echo:r|t=0.0|s=24"]]
    assert sorted((b["n"], b["seed"]) for b in srv.bodies[2:]) == [(2, 20), (2, 23)]
    # unseeded samples are interchangeable: all the missing ones in one request, without a seed
    key1 = request_key("completion", "fake-model", "u", {"temperature": 0.7, "max_tokens": 64}, 1)
    client.cache.put(key1, {"text": "cached", "finish_reason": "stop", "prompt_tokens": 0, "completion_tokens": 0})
    assert client.complete(["u"], n=4, temperature=0.7) == [["echo:u|t=0.7|s=None", "cached"] + ["echo:u|t=0.7|s=None"] * 2]
    assert srv.bodies[-1]["n"] == 3 and "seed" not in srv.bodies[-1] and srv.posts == 5
    # one missing sample is a plain request, without `n`
    client.complete(["q"], n=6, seed=10)
    assert "n" not in srv.bodies[-1] and srv.bodies[-1]["seed"] == 15 and srv.posts == 6


def test_n_in_one_request_for_chat_and_a_prompt_repeated_in_the_call(fake, tmp_path):
    srv = fake(owned_by="vllm", version="0.11.0")
    client = LLMClient(srv.url, cache=tmp_path / "c.sqlite", progress=False)
    msgs = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}], [{"role": "user", "content": "hi"}]]
    assert client.chat(msgs, n=2, seed=1) == [["re:hi"] * 2, ["re:yo"] * 2, ["re:hi"] * 2]
    assert srv.posts == 2 and all(b["n"] == 2 for b in srv.bodies) and client.usage.answers_cached == 4


def test_seeded_samples_go_one_by_one_to_a_vllm_older_than_its_v1_only_engine(fake, tmp_path):
    srv = fake(owned_by="vllm", version="0.10.2")
    client = LLMClient(srv.url, cache=tmp_path / "c.sqlite", progress=False)
    client.complete(["q"], n=3, seed=10)
    assert srv.posts == 3 and all("n" not in b for b in srv.bodies)
    client.complete(["q"], n=3, temperature=0.5)  # unseeded: any vLLM takes them in one request
    assert srv.posts == 4 and srv.bodies[-1]["n"] == 3


def test_n_calls_of_one_sample_never_probe_the_backend(fake, tmp_path):
    srv = fake(owned_by="somebody", version="0.11.0")  # an unknown listing would be probed with GET /version
    client = LLMClient(srv.url, cache=tmp_path / "c.sqlite", progress=False)
    client.complete(["a", "b"], seed=3)
    assert srv.gets.count("/version") == 0 and client.served_backend is None
    client.complete(["a"], n=2, seed=3)  # sample 0 is cached: one sample is missing, nothing to group
    assert srv.gets.count("/version") == 0 and srv.posts == 3
    client.complete(["c"], n=2, seed=3)
    assert srv.gets.count("/version") == 1 and client.served_backend == ("vllm", "0.11.0") and srv.bodies[-1]["n"] == 2


def test_an_n_response_with_missing_samples_is_malformed_retried_and_never_cached(fake, tmp_path):
    one_choice = json.dumps({"model": "fake-model", "choices": [{"index": 0, "text": "x", "finish_reason": "stop"}]}).encode()
    srv = fake(owned_by="vllm", version="0.11.0", raw=[(J, one_choice)] * 2)
    client = LLMClient(srv.url, cache=tmp_path / "c.sqlite", max_retries=1, backoff=0.01, progress=False)
    with pytest.raises(MalformedResponseError, match=r"asked for n=2 samples, got choices with index \[0\]"):
        client.complete(["q"], n=2, seed=1)
    assert srv.posts == 2 and len(client.cache) == 0 and client.usage.malformed == 2 and client.usage.retries == 1
    assert client.complete(["q"], n=2, seed=1) == [["echo:q|t=0.0|s=1", "echo:q|t=0.0|s=2"]] and len(client.cache) == 2


def test_chat_and_async_inside_running_loop(fake):
    srv = fake()
    client = LLMClient(srv.url, progress=False)
    msgs = [[{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}]]

    async def inside_loop():  # Jupyter-like: a loop is running; the sync wrapper must still work
        sync = client.chat(msgs, max_tokens=5)
        direct = await client.achat(msgs, max_tokens=5)
        return sync, direct
    sync, direct = asyncio.run(inside_loop())
    assert sync == direct == [["re:hi"], ["re:yo"]]
    with pytest.raises(TypeError, match="message lists"): client.chat(msgs[0])


# ---------------------------------------------------------------- malformed responses (issue 10)
J = "application/json"
KEY_Q = request_key("completion", "fake-model", "q", {"temperature": 0.0, "max_tokens": 64}, 0)


def _body(text="ok", **top) -> bytes:
    d = {"id": "x", "object": "text_completion", "created": 0, "model": "fake-model",
         "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
         "choices": [{"index": 0, "text": text, "finish_reason": "stop"}]}
    d.update(top)
    return json.dumps(d).encode()


MALFORMED = {  # what issue 10 saw before the fix: AttributeError, IndexError, TypeError, "" cached, 42 cached
    "html_body": ("text/html", b"<html><body>502 Bad Gateway</body></html>", "the body is not JSON (Content-Type 'text/html'"),
    "empty_choices": (J, _body(choices=[]), "'choices' is empty"),
    "error_with_http_200": (J, json.dumps({"error": {"message": "model overloaded", "code": 503}}).encode(),
                            "HTTP 2xx with an error object and no choices: 'model overloaded'"),
    "text_null": (J, _body(text=None), "choices[0].text is null, not a string"),
    "text_integer": (J, _body(text=42), "choices[0].text is int '42', not a string"),
    "negative_tokens": (J, _body(usage={"prompt_tokens": -3}), "usage.prompt_tokens is int '-3'"),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_response_names_the_endpoint_is_retried_and_never_cached(fake, tmp_path, case):
    ctype, body, problem = MALFORMED[case]
    srv = fake(raw=[(ctype, body)] * 2)
    client = LLMClient(srv.url, cache=tmp_path / "c.sqlite", max_retries=1, backoff=0.01, progress=False)
    with pytest.raises(MalformedResponseError) as e: client.complete(["q"])
    msg = str(e.value)
    assert f"{srv.url}/completions sent a malformed response (after 2 attempt(s)): {problem}" in msg, msg
    assert "Nothing was cached" in msg and "--llm-url" in msg
    assert srv.posts == 2 and len(client.cache) == 0 and client.cache.claim_holder(KEY_Q) is None  # claim released
    u = client.usage
    assert (u.requests, u.errors, u.malformed, u.retries, u.answers_cached) == (2, 2, 2, 1, 0)
    assert client.complete(["q"]) == [["echo:q|t=0.0|s=None"]] and len(client.cache) == 1  # a good answer is cached


def test_a_malformed_answer_then_a_good_one_caches_the_good_one(fake, tmp_path):
    srv = fake(raw=[MALFORMED["empty_choices"][:2]])
    client = LLMClient(srv.url, cache=tmp_path / "c.sqlite", max_retries=2, backoff=0.01, progress=False)
    assert client.complete(["q"]) == [["echo:q|t=0.0|s=None"]]
    assert client.cache.get(KEY_Q)["text"] == "echo:q|t=0.0|s=None"
    u = client.usage
    assert (srv.posts, u.requests, u.malformed, u.retries, u.answers_cached) == (2, 2, 1, 1, 1)


def test_chat_null_content_is_malformed_unless_the_token_budget_ran_out(fake, tmp_path):
    def chat(content, finish):
        return (J, json.dumps({"model": "fake-model", "choices": [{"index": 0, "finish_reason": finish,
                                                                   "message": {"role": "assistant", "content": content}}]}).encode())
    srv = fake(raw=[chat(None, "stop"), chat(None, "length")])
    client = LLMClient(srv.url, cache=tmp_path / "c.sqlite", max_retries=0, progress=False)
    msgs = [[{"role": "user", "content": "hi"}]]
    with pytest.raises(MalformedResponseError, match=r"/chat/completions .*choices\[0\]\.message\.content is null"): client.chat(msgs)
    assert len(client.cache) == 0
    texts, recs = client.chat(msgs, return_records=True)
    assert texts == [[""]] and recs[0][0]["finish_reason"] == "length" and len(client.cache) == 1


def test_lone_surrogates_are_replaced_counted_and_cached(fake, tmp_path):
    escaped = b'{"model": "fake-model", "choices": [{"text": "a\\ud800b\\ud83d\\ude00", "finish_reason": "stop"}]}'
    raw_bytes = b'{"model": "fake-model", "choices": [{"text": "x\xed\xa0\x80y", "finish_reason": "stop"}]}'
    srv = fake(raw=[(J, escaped), (J, raw_bytes)])
    client = LLMClient(srv.url, cache=tmp_path / "c.sqlite", progress=False)
    assert client.complete(["q"]) == [["a\ufffdb\U0001F600"]]  # the escaped pair is one valid character
    assert client.usage.surrogates_replaced == 1 and client.cache.get(KEY_Q)["text"] == "a\ufffdb\U0001F600"
    assert client.complete(["r"]) == [["x\ufffd\ufffd\ufffdy"]]  # one U+FFFD per byte that is not UTF-8
    assert client.usage.surrogates_replaced == 4 and client.usage.malformed == 0
    replay = LLMClient(None, model="fake-model", cache=client.cache, mode="replay")
    assert replay.complete(["q", "r"]) == [["a\ufffdb\U0001F600"], ["x\ufffd\ufffd\ufffdy"]]


def test_credentials_in_the_url_never_reach_error_messages_or_repr(fake):
    srv = fake(raw=[MALFORMED["html_body"][:2]])
    url = srv.url.replace("http://", "http://alice:SECRET-pw@")
    client = LLMClient(url, model="fake-model", max_retries=0, progress=False)
    with pytest.raises(MalformedResponseError) as e: client.complete(["q"])
    assert "SECRET" not in str(e.value) and "http://***@127.0.0.1" in str(e.value)
    assert "SECRET" not in repr(client)


def _reference(text: str) -> tuple[str, int]:
    "What JSON decoding and the surrogate rule give, by hand: an escaped high+low pair is one character, any other"
    " surrogate one U+FFFD."
    out, i, n = [], 0, 0
    while i < len(text):
        c = text[i]
        if "\ud800" <= c <= "\udbff" and i + 1 < len(text) and "\udc00" <= text[i + 1] <= "\udfff":
            out.append(chr(0x10000 + ((ord(c) - 0xD800) << 10) + ord(text[i + 1]) - 0xDC00)); i += 2; continue
        if "\ud800" <= c <= "\udfff": out.append("\ufffd"); n += 1
        else: out.append(c)
        i += 1
    return "".join(out), n


with_surrogates = st.text(st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr)), max_size=30)

@settings(max_examples=300, deadline=None)
@given(text=with_surrogates)
def test_parse_response_text_matches_the_hand_rule_and_is_storable(text):
    rec, n = parse_response("completion", json.dumps({"choices": [{"text": text}]}))
    assert (rec["text"], n) == _reference(text)
    rec["text"].encode("utf-8")  # storable as UTF-8 (the SQLite cache)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.floats(allow_nan=False) | with_surrogates,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["choices", "text", "message", "content", "error", "usage", "prompt_tokens",
                         "completion_tokens", "model", "finish_reason"]) | st.text(max_size=3), inner, max_size=4),
    max_leaves=12)

@settings(max_examples=400, deadline=None)
@given(data=json_values, kind=st.sampled_from(["completion", "chat"]), junk=st.binary(max_size=20))
def test_parse_response_returns_a_storable_record_or_raises_malformed(data, kind, junk):
    for body in (json.dumps(data), junk):
        try: rec, n = parse_response(kind, body)
        except MalformedResponseError: continue
        assert isinstance(rec["text"], str) and n >= 0
        assert all(isinstance(rec[k], int) and not isinstance(rec[k], bool) and rec[k] >= 0 for k in ("prompt_tokens", "completion_tokens"))
        assert all(rec[k] is None or isinstance(rec[k], str) for k in ("finish_reason", "model"))
        canonical_json(rec).encode("utf-8")  # what the cache stores


# ---------------------------------------------------------------- usage up to a failure (issue 10)
def test_usage_counts_everything_up_to_a_failure(fake, tmp_path):
    srv = fake(statuses=[200, 200, 200, 400])  # the 4th request is refused
    client = LLMClient(srv.url, model="fake-model", cache=tmp_path / "c.sqlite", max_concurrency=1, progress=False)
    seen = []
    client.on_usage.append(seen.append)
    with pytest.raises(openai.BadRequestError): client.complete([f"p{i}" for i in range(6)])
    u = client.usage
    assert (srv.posts, u.requests, u.answers_cached, u.errors, len(client.cache)) == (4, 4, 3, 1, 3)
    assert seen and seen[-1] == u and seen[-1] is not u  # a copy of the final counters, after the failure
    assert client.cache.claim_holder(request_key("completion", "fake-model", "p3", {"temperature": 0.0, "max_tokens": 64}, 0)) is None


def _run_until_killed(url, run_dir, cfg_dir):
    from kgrag_nb.reproduce import StudyRun
    cfg = get_config(cache_dir=cfg_dir)
    run = StudyRun("probe", run_dir=run_dir, llm_url=url, cfg=cfg)
    client = run.llm(max_concurrency=1, progress=False)  # usage written at most every 0.5 s (the default)
    client.complete(["a", "b", "c", "hold-d", "e"])  # "hold-d" hangs: the process is killed there


def test_usage_of_a_run_killed_mid_call_is_on_disk(fake, tmp_path):
    srv = fake()
    run_dir = tmp_path / "run"
    p = mp.get_context("spawn").Process(target=_run_until_killed, args=(srv.url, run_dir, tmp_path / "cache"))
    p.start()
    try:
        deadline = time.time() + 60
        while srv.posts < 4 and time.time() < deadline and p.is_alive(): time.sleep(0.05)
        assert srv.posts == 4, "the run did not reach the hanging request"
        time.sleep(1.0)  # > usage_every_s: the 4th attempt's count reaches the file although nothing changes after it
    finally:
        p.kill(); p.join(10)  # like a cell timeout or the OOM killer: no post_run_cell, no finish()
    rec = json.loads((run_dir / "artifacts" / "probe.usage.json").read_text())
    u = rec["usage"]
    assert (u["requests"], u["answers_cached"], u["errors"], u["cache_hits"]) == (4, 3, 0, 0) and rec["models"] == ["fake-model"]
    from kgrag_nb.reproduce import _read_record
    assert _read_record(run_dir, "artifacts", "probe")["usage"]["requests"] == 4  # what the manifest reads


# ---------------------------------------------------------------- one request in flight per key across processes (issue 10)
def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"]); p.wait()
    return p.pid


def test_claims_hand_cases(tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite")
    conn = cache._connect()
    host = socket.gethostname()
    def claim_by(owner, pid, age_s=0.0, host=host):
        conn.execute("INSERT OR REPLACE INTO claims VALUES (?,?,?,?,?,?)", ("k", owner, host, pid, None, time.time() - age_s))
    claim_by("dead", _dead_pid())
    state, holder = cache.claim("k", "me")
    assert state == "taken_over" and holder["owner"] == "dead" and cache.claim_holder("k")["pid"] == os.getpid()
    claim_by("alive", os.getpid())
    assert cache.claim("k", "me")[0] == "busy" and cache.claim("k", "alive") == ("mine", None)
    assert cache.claim("k", "me", ttl_s=10)[0] == "busy"
    claim_by("alive", os.getpid(), age_s=11)
    assert cache.claim("k", "me", ttl_s=10)[0] == "taken_over"  # older than the ttl: stale although alive
    claim_by("remote", 1, host="another-host")  # another host: only the age tells
    assert cache.claim("k", "me", ttl_s=10)[0] == "busy"
    claim_by("remote", 1, age_s=11, host="another-host")
    assert cache.claim("k", "me", ttl_s=10)[0] == "taken_over"
    cache.release("k", "someone-else"); assert cache.claim_holder("k")["owner"] == "me"
    cache.release("k", "me"); assert cache.claim_holder("k") is None
    cache.claim("k", "me"); cache.put("k", {"text": "t"})
    assert cache.claim("k", "other") == ("answered", {"text": "t"}) and cache.claim_holder("k") is None


def test_process_alive_tells_zombies_and_reused_pids():
    z = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.time() + 20
    while Path(f"/proc/{z.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z" and time.time() < deadline: time.sleep(0.02)
    try: assert not process_alive(z.pid)  # exited, not yet reaped
    finally: z.wait()
    assert not process_alive(_dead_pid()) and process_alive(os.getpid())
    assert not process_alive(os.getpid(), started="1")  # the pid now belongs to a process started at another time


def test_a_waiting_client_takes_the_answer_of_the_claim_holder_or_sends_after_a_release(fake, tmp_path):
    srv = fake()
    client = LLMClient(srv.url, model="fake-model", cache=tmp_path / "c.sqlite", progress=False)
    other = ResponseCache(tmp_path / "c.sqlite")  # another process's view of the cache
    key_r = request_key("completion", "fake-model", "r", {"temperature": 0.0, "max_tokens": 64}, 0)
    for key in (KEY_Q, key_r): assert other.claim(key, "other-run") == ("mine", None)
    out = []
    t = threading.Thread(target=lambda: out.append(client.complete(["q", "r"])))
    t.start(); time.sleep(0.6)
    assert t.is_alive() and srv.posts == 0  # both keys are claimed by a live owner: the client waits, sends nothing
    other.put(KEY_Q, {"text": "from the other run", "finish_reason": "stop", "prompt_tokens": 0, "completion_tokens": 0})
    other.release(key_r, "other-run")  # its request for "r" failed: the waiter sends it itself
    t.join(10)
    assert out == [[["from the other run"], ["echo:r|t=0.0|s=None"]]]
    u = client.usage
    assert (srv.posts, u.requests, u.inflight_waits, u.answers_cached, u.claims_taken_over) == (1, 1, 1, 1, 0)


def _hold_one(url, cache_path):
    LLMClient(url, model="fake-model", cache=cache_path, progress=False).complete(["hold-1"])


def test_the_claim_of_a_killed_process_is_taken_over_at_once(fake, tmp_path):
    srv = fake()
    key = request_key("completion", "fake-model", "hold-1", {"temperature": 0.0, "max_tokens": 64}, 0)
    cache = ResponseCache(tmp_path / "c.sqlite")
    p = mp.get_context("spawn").Process(target=_hold_one, args=(srv.url, tmp_path / "c.sqlite"))
    p.start()
    try:
        deadline = time.time() + 60
        while (cache.claim_holder(key) is None or srv.posts < 1) and time.time() < deadline: time.sleep(0.05)
        assert cache.claim_holder(key)["pid"] == p.pid
    finally:
        p.kill(); p.join(10)  # SIGKILL: no chance to release the claim
    srv.release.set()
    assert cache.claim_holder(key)["pid"] == p.pid  # the claim outlived its process
    client = LLMClient(srv.url, model="fake-model", cache=cache, claim_timeout_s=60, progress=False)
    t0 = time.perf_counter()
    assert client.complete(["hold-1"]) == [["echo:hold-1|t=0.0|s=None"]]
    assert time.perf_counter() - t0 < 5  # not the 60 s claim timeout
    assert client.usage.claims_taken_over == 1 and srv.posts == 2 and cache.claim_holder(key) is None


DEDUP_PROMPTS = [f"question {i}" for i in range(16)]

def _dedup_worker(url, cache_path, barrier, out_path):
    client = LLMClient(url, model="fake-model", cache=cache_path, max_concurrency=4, progress=False)
    client.resolve_model()
    barrier.wait(60)  # both processes start sending at the same moment
    texts = client.complete(DEDUP_PROMPTS)
    Path(out_path).write_text(json.dumps({"texts": texts, "usage": client.usage.as_dict()}))


def test_two_processes_sharing_a_cache_send_each_request_once(fake, tmp_path):
    srv = fake(delay=0.1)
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_dedup_worker, args=(srv.url, tmp_path / "c.sqlite", barrier, tmp_path / f"out{i}.json"))
             for i in range(2)]
    for p in procs: p.start()
    for p in procs: p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    outs = [json.loads((tmp_path / f"out{i}.json").read_text()) for i in range(2)]
    expected = [[f"echo:{q}|t=0.0|s=None"] for q in DEDUP_PROMPTS]
    assert all(o["texts"] == expected for o in outs)
    u = [o["usage"] for o in outs]
    assert srv.posts == 16  # not 32: every distinct request was sent once, by one of the two processes
    assert sum(x["requests"] for x in u) == 16 and sum(x["answers_cached"] for x in u) == 16
    assert all(x["requests"] + x["inflight_waits"] + x["cache_hits"] == 16 for x in u)
    assert len(ResponseCache(tmp_path / "c.sqlite")) == 16


# ---------------------------------------------------------------- the real embedded server
@pytest.mark.llm
def test_completions_deterministic_at_temperature_zero(embedded_server):
    a = LLMClient(embedded_server.url, progress=False)
    b = LLMClient(embedded_server.url, progress=False)
    ta, recs = a.complete(PROMPTS, max_tokens=8, stop="\n", return_records=True)
    tb = b.complete(PROMPTS, max_tokens=8, stop="\n")
    assert ta == tb and len(ta) == 3 and all(len(t) == 1 for t in ta)
    assert any(t[0].strip() for t in ta), ta
    assert all(r[0]["completion_tokens"] > 0 and r[0]["prompt_tokens"] > 20 and not r[0]["cached"] for r in recs)
    assert a.usage.requests == 3 and a.usage.completion_tokens == sum(r[0]["completion_tokens"] for r in recs)
    # the key uses the model the server reports
    assert recs[0][0]["key"] == request_key("completion", EMBEDDED_MODEL_ALIAS, PROMPTS[0], {"temperature": 0.0, "max_tokens": 8, "stop": ["\n"]}, 0,
                                            engine=engine_fingerprint())  # the embedded server's answers are keyed with its engine


@pytest.mark.llm
def test_cache_hit_sends_no_request(embedded_server, tmp_path):
    cache = ResponseCache(tmp_path / "llm.sqlite")
    first = LLMClient(embedded_server.url, cache=cache, progress=False).complete(PROMPTS, max_tokens=8, stop="\n")
    again = LLMClient(embedded_server.url, cache=cache, progress=False)
    second, recs = again.complete(PROMPTS, max_tokens=8, stop="\n", return_records=True)
    assert second == first and again.usage.requests == 0 and again.usage.cache_hits == 3
    assert all(r[0]["cached"] for r in recs) and len(cache) == 3


@pytest.mark.llm
def test_other_model_name_is_another_key(embedded_server, tmp_path):
    cache = ResponseCache(tmp_path / "llm.sqlite")
    LLMClient(embedded_server.url, cache=cache, progress=False).complete(PROMPTS[:1], max_tokens=8, stop="\n")
    assert LLMClient(None, model=EMBEDDED_MODEL_ALIAS, cache=cache, mode="replay").complete(PROMPTS[:1], max_tokens=8, stop="\n")
    with pytest.raises(CacheMissError, match="gemma-2b"):
        LLMClient(None, model="gemma-2b", cache=cache, mode="replay").complete(PROMPTS[:1], max_tokens=8, stop="\n")


@pytest.mark.llm
def test_record_overwrites_and_live_trusts_cache(embedded_server, tmp_path):
    cache = ResponseCache(tmp_path / "llm.sqlite")
    key = request_key("completion", EMBEDDED_MODEL_ALIAS, PROMPTS[0], {"temperature": 0.0, "max_tokens": 8, "stop": ["\n"]}, 0,
                      engine=engine_fingerprint())
    cache.put(key, {"text": "SENTINEL", "finish_reason": "stop", "prompt_tokens": 0, "completion_tokens": 0})
    live = LLMClient(embedded_server.url, cache=cache, progress=False)
    assert live.complete(PROMPTS[:1], max_tokens=8, stop="\n") == [["SENTINEL"]] and live.usage.requests == 0
    rec = LLMClient(embedded_server.url, cache=cache, mode="record", progress=False)
    out = rec.complete(PROMPTS[:1], max_tokens=8, stop="\n")
    assert out != [["SENTINEL"]] and rec.usage.requests == 1
    assert cache.get(key)["text"] == out[0][0] and len(cache) == 1


@pytest.mark.llm
def test_wrong_model_name_is_refused(embedded_server):
    client = LLMClient(embedded_server.url, model="gpt-4o", progress=False)
    with pytest.raises(ModelNotServedError) as e: client.complete(PROMPTS[:1], max_tokens=4)
    assert "'gpt-4o'" in str(e.value) and EMBEDDED_MODEL_ALIAS in str(e.value) and embedded_server.url in str(e.value)
    assert client.usage.requests == 0


@pytest.mark.llm
def test_per_prompt_temperatures_reach_the_key(embedded_server, tmp_path):
    client = LLMClient(embedded_server.url, cache=tmp_path / "llm.sqlite", progress=False)
    texts, recs = client.complete([PROMPTS[0]] * 2, temperature=[0.0, 0.8], seed=3, max_tokens=6, stop="\n", return_records=True)
    k0, k1 = recs[0][0]["key"], recs[1][0]["key"]
    assert k0 != k1 and client.usage.requests == 2
    assert client.cache.request(k0)["params"]["temperature"] == 0.0 and client.cache.request(k1)["params"]["temperature"] == 0.8


# ---------------------------------------------------------------- issue 25 items 4, 10, 14
def test_a_server_that_drips_one_byte_at_a_time_hits_the_total_deadline(tmp_path):
    "httpx's timeout is per read: a server sending a byte every second held a request for ever. Now each attempt has"
    " a total deadline and the error says so (not 'cannot reach the endpoint')."
    class Drip(BaseHTTPRequestHandler):
        def log_message(self, *a): pass
        def do_GET(self):
            data = json.dumps({"object": "list", "data": [{"id": "drip", "object": "model", "owned_by": "me"}]}).encode()
            self.send_response(200); self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200); self.send_header("Content-Type", "application/json"); self.send_header("Content-Length", "100000")
            self.end_headers()
            try:
                for _ in range(60): self.wfile.write(b" "); self.wfile.flush(); time.sleep(1)
            except OSError: pass
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Drip); threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        client = LLMClient(f"http://127.0.0.1:{httpd.server_address[1]}/v1", cache=tmp_path / "c.sqlite", timeout=3,
                           max_retries=0, progress=False)
        t0 = time.monotonic()
        with pytest.raises(TimeoutError, match="no complete answer within 3 s"): client.complete(["q"])
        assert time.monotonic() - t0 < 10 and len(client.cache) == 0
    finally: httpd.shutdown(); httpd.server_close()


def test_damaged_cache_rows_are_never_served_and_are_asked_again(fake, tmp_path):
    "A row {'text': 42} (caches from before the response check), invalid JSON, or a changed byte: each counts as"
    " missing (a warning names the file), is asked again and replaced; in replay mode it is a miss."
    import sqlite3
    srv = fake()
    client = LLMClient(srv.url, cache=tmp_path / "c.sqlite", progress=False)
    assert client.complete(["q"]) == [["echo:q|t=0.0|s=None"]] and srv.posts == 1
    stored = sqlite3.connect(tmp_path / "c.sqlite").execute("SELECT response FROM responses").fetchone()[0]
    assert '"_sha256"' in stored and "_sha256" not in client.cache.get(KEY_Q)  # sealed on disk, plain to callers
    for damaged in ('{"text": 42}', "{not json", stored.replace("echo:q", "echo:Q")):
        with sqlite3.connect(tmp_path / "c.sqlite") as con: con.execute("UPDATE responses SET response=?", (damaged,))
        posts = srv.posts
        with pytest.warns(UserWarning, match=r"c\.sqlite: 1 cached answer\(s\) failed validation"):
            assert client.complete(["q"]) == [["echo:q|t=0.0|s=None"]]
        assert srv.posts == posts + 1 and client.cache.get(KEY_Q)["text"] == "echo:q|t=0.0|s=None"  # replaced by a valid one
    with sqlite3.connect(tmp_path / "c.sqlite") as con: con.execute("UPDATE responses SET response=?", ('{"text": 42}',))
    replay = LLMClient(None, model="fake-model", cache=tmp_path / "c.sqlite", mode="replay", progress=False)
    with pytest.warns(UserWarning, match="failed validation"), pytest.raises(CacheMissError): replay.complete(["q"])


def test_an_answer_far_longer_than_its_token_budget_is_refused_and_never_cached(fake, tmp_path):
    huge = json.dumps({"model": "fake-model", "choices": [{"index": 0, "text": "x" * 1_000_000, "finish_reason": "length"}],
                       "usage": {"prompt_tokens": 1, "completion_tokens": 8}}).encode()
    srv = fake(raw=[("application/json", huge)] * 2)
    client = LLMClient(srv.url, cache=tmp_path / "c.sqlite", max_retries=1, backoff=0.01, progress=False)
    with pytest.raises(MalformedResponseError, match="an answer of 1,000,000 characters for max_tokens=8"):
        client.complete(["q"], max_tokens=8)
    assert len(client.cache) == 0


@pytest.mark.parametrize("kw, problem", [(dict(max_tokens=0), "max_tokens=0"), (dict(max_tokens=-1), "max_tokens=-1"),
                                         (dict(temperature=float("nan")), "temperature=nan"), (dict(temperature=-0.5), "temperature=-0.5"),
                                         (dict(seed=-5), "seed=-5")])
def test_sampling_values_a_server_would_refuse_fail_before_any_request(fake, tmp_path, kw, problem):
    srv = fake()
    client = LLMClient(srv.url, cache=tmp_path / "c.sqlite", progress=False)
    with pytest.raises(ValueError, match=re.escape(problem)): client.complete(["q"], **kw)
    assert srv.posts == 0


def test_a_full_disk_names_the_cache_file_and_the_real_sqlite_error(tmp_path):
    "Issue 25 item 9: a full cache disk surfaced as 'cannot rollback - no transaction is active'. A real process with"
    " a 256 KiB file-size limit stands in for the full disk."
    script = r'''
import resource, signal, sys
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead of killing us
from kgrag_nb.llm import ResponseCache
cache = ResponseCache(sys.argv[1])
cache.put("warm", {"text": "x"})
resource.setrlimit(resource.RLIMIT_FSIZE, (256 * 1024, 256 * 1024))
try:
    for i in range(10_000): cache.put(f"k{i}", {"text": "y" * 4000})
except Exception as e: print(type(e).__name__, e); sys.exit(0)
sys.exit("no error at all")
'''
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "llm_cache.sqlite")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "cannot rollback" not in out.stdout and f"LLM response cache {tmp_path / 'llm_cache.sqlite'}" in out.stdout, out.stdout
    assert "Free disk space" in out.stdout
