"""Tests of kgrag_nb.llm: cache keys, the SQLite cache, cache modes, model checks, retries, concurrency.

Tests marked `llm` talk to the real embedded llama.cpp server (session fixture `embedded_server` in conftest.py).
Retry, header and concurrency tests use a tiny real HTTP server on 127.0.0.1 that speaks the OpenAI wire format.
"""
import asyncio, hashlib, json, multiprocessing as mp, os, threading, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import openai
import pytest
from hypothesis import given, settings, strategies as st

from kgrag_nb.config import EMBEDDED_MODEL_ALIAS, get_config
from kgrag_nb.llm import (CacheMissError, EndpointUnreachableError, LLMClient, ModelNotServedError, ResponseCache,
                          Usage, canonical_json, request_key, run_sync)
from kgrag_nb.serve import free_port

FEW_SHOT = ("Q: What is the capital of Italy?\nA: Rome\nQ: What is the capital of Japan?\nA: Tokyo\n"
            "Q: What is the capital of {}?\nA:")
PROMPTS = [FEW_SHOT.format(c) for c in ("France", "Germany", "Spain")]


# ---------------------------------------------------------------- a tiny OpenAI-compatible HTTP server
class FakeOpenAI:
    "Real HTTP server on loopback: /v1/models, /v1/completions, /v1/chat/completions; scripted error statuses."
    def __init__(self, statuses=(), delay=0.0, models=("fake-model",), raw=()):
        self.statuses, self.delay, self.models = list(statuses), delay, list(models)
        self.raw = list(raw)  # (content type, body bytes) answered with HTTP 200 to the next POSTs, in order
        self.release = threading.Event()  # prompts starting with "hold" wait for it (at most 30 s)
        self.posts, self.auth, self.bodies, self.inflight, self.max_inflight = 0, [], [], 0, 0
        self.lock = threading.Lock()
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a): pass
            def _send(self, status, obj):
                data = json.dumps(obj).encode()
                self.send_response(status); self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data))); self.end_headers(); self.wfile.write(data)
            def do_GET(self):
                if self.path.rstrip("/") == "/v1/models":
                    self._send(200, {"object": "list", "data": [{"id": m, "object": "model", "owned_by": "me"} for m in fake.models]})
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
                usage = {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}
                if self.path.endswith("/chat/completions"):
                    text = "re:" + body["messages"][-1]["content"]
                    self._send(200, {"id": "c1", "object": "chat.completion", "created": 0, "model": body["model"], "usage": usage,
                                     "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}]})
                else:
                    text = f"echo:{body['prompt']}|t={body.get('temperature')}|s={body.get('seed')}"
                    self._send(200, {"id": "c1", "object": "text_completion", "created": 0, "model": body["model"], "usage": usage,
                                     "choices": [{"index": 0, "text": text, "finish_reason": "stop", "logprobs": None}]})

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
    assert recs[0][0]["key"] == request_key("completion", EMBEDDED_MODEL_ALIAS, PROMPTS[0], {"temperature": 0.0, "max_tokens": 8, "stop": ["\n"]}, 0)


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
    key = request_key("completion", EMBEDDED_MODEL_ALIAS, PROMPTS[0], {"temperature": 0.0, "max_tokens": 8, "stop": ["\n"]}, 0)
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
