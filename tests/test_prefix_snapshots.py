"""Chunk-aligned prompt evaluation and prefix snapshots of the embedded server (`kgrag_nb.serve.make_deterministic`).

Pure parts (chunk spans, the reusable boundary, the snapshot store, the engine fingerprint) with hand-computed
expectations and properties; the exactness of prefix reuse on real smoke prompts against a fresh server that evaluates
every prompt from scratch in the same chunks (`llm`; the few-hundred-prompt variant is also `slow`).
"""
import json, random
from pathlib import Path

import httpx
import pytest
from hypothesis import given, strategies as st

from kgrag_nb.config import EMBEDDED_MODEL_ALIAS, get_config
from kgrag_nb.serve import (CHUNK_TOKENS, EmbeddedServer, PrefixSnapshots, chunk_spans, engine_fingerprint, free_port,
                            reusable_boundary)

DATA = Path(__file__).parent / "data" / "prefix_prompts.json"


def test_chunk_spans_end_at_multiples_of_b_hand_computed():
    assert chunk_spans(0, 70, 32) == [(0, 32), (32, 64), (64, 70)]
    assert chunk_spans(30, 70, 32) == [(30, 32), (32, 64), (64, 96), (96, 100)]  # a restored prefix of 30: same ends
    assert chunk_spans(64, 1, 32) == [(64, 65)] and chunk_spans(5, 0, 32) == []
    with pytest.raises(ValueError, match="chunk=0"): chunk_spans(0, 5, 0)


@given(st.integers(0, 3000), st.integers(0, 3000), st.integers(1, 200), st.integers(0, 3000))
def test_chunk_boundaries_depend_on_positions_alone(start, n, chunk, cut):
    "Evaluating from `start`, or from any boundary in between, ends chunks at the same positions (the point of the scheme)."
    spans = chunk_spans(start, n, chunk)
    assert sum(b - a for a, b in spans) == n and all(b % chunk == 0 or b == start + n for a, b in spans)
    assert all(a < b and b - a <= chunk for a, b in spans)
    m = start + (cut % (n + 1))  # resume at a later position that is a chunk end (or the start)
    if m == start or m % chunk == 0:
        assert [s for s in spans if s[0] >= m] == chunk_spans(m, start + n - m, chunk)


def test_reusable_boundary_hand_computed():
    assert reusable_boundary(100, 200, 32) == 96
    assert reusable_boundary(200, 200, 32) == 192  # the whole prompt shared: one token at least is evaluated (199 -> 192)
    assert reusable_boundary(64, 65, 32) == 64 and reusable_boundary(64, 64, 32) == 32
    assert reusable_boundary(31, 200, 32) == 0
    assert reusable_boundary(700, 800, 32, window=512) == 480  # below Gemma 3's 512-token sliding window
    assert reusable_boundary(700, 800, 16, window=512) == 496


def test_the_store_finds_the_deepest_shared_boundary_and_evicts_lru():
    s = PrefixSnapshots(chunk=4, max_entries=2, budget_bytes=10_000)
    a = list(range(10))  # boundaries 4 and 8
    s.put(a, b"A" * 100, b"L" * 10)
    assert s.deepest(a[:8] + [99, 98], limit=9) == (8, tuple(a))
    assert s.deepest(a[:6] + [99] * 4, limit=9) == (4, tuple(a))
    assert s.deepest([1] + a[1:], limit=9) == (0, None)
    assert s.deepest(a, limit=7) == (4, tuple(a))  # never past the limit
    assert s.whole(a) == (b"A" * 100, b"L" * 10) and s.whole(a[:8]) is None
    s.put(a[:8], b"B" * 50)  # a boundary state (no logits): found by prefix, never served as a whole prompt
    assert s.whole(a[:8]) is None and s.bytes == 160
    s.put([7] * 8, b"C" * 10)  # a third entry: `a`, the least recently used, goes
    assert tuple(a) not in s.entries and len(s.entries) == 2 and s.bytes == 60
    assert s.deepest(a[:8] + [0, 0], limit=9) == (8, tuple(a[:8]))
    s.put(list(range(100, 140)), b"D" * 9_990)  # over the byte budget with the others: they go first
    assert list(s.entries) == [tuple(range(100, 140))] and s.bytes == 9_990 and all(len(h) for h in s.index.values())
    s.put(list(range(200, 240)), b"E" * 20_000)  # larger than the whole budget: never kept
    assert tuple(range(200, 240)) not in s.entries


@given(st.lists(st.lists(st.integers(0, 3), min_size=1, max_size=40), min_size=1, max_size=12), st.integers(1, 8))
def test_deepest_is_the_longest_shared_boundary_of_any_kept_state(prompts, chunk):
    s = PrefixSnapshots(chunk=chunk, max_entries=100, budget_bytes=1e9)
    for p in prompts[:-1]: s.put(p, b"x")
    q = prompts[-1]
    limit = len(q)
    best = max([min(next((i for i, (x, y) in enumerate(zip(p, q)) if x != y), min(len(p), len(q))), limit) // chunk * chunk
                for p in prompts[:-1]] or [0])
    m, key = s.deepest(q, limit)
    assert m == best and (m == 0 or list(key[:m]) == q[:m])


def test_the_engine_fingerprint_names_build_scheme_and_b():
    f = engine_fingerprint(32)
    assert "llama-cpp-python" in f and "B=32" in f and f != engine_fingerprint(64) and f != engine_fingerprint(32, deterministic=False)


# ---- exactness on the real server ------------------------------------------------------------------------------------

GRAMMAR = r'root ::= " "? [^,\n]{1,30} ("," " "? [^,\n]{1,30}){0,3}'  # a comma-separated list, like the cache's regexes


def _ask(url, prompt, kind):
    body = dict(model=EMBEDDED_MODEL_ALIAS, prompt=prompt, max_tokens=8, stop=["\n"])
    body.update({"greedy": dict(temperature=0.0), "seeded": dict(temperature=1.0, seed=7),
                 "constrained": dict(temperature=0.8, seed=3, grammar=GRAMMAR)}[kind])
    r = httpx.post(f"{url}/completions", timeout=300, json=body)
    r.raise_for_status()
    return r.json()["choices"][0]["text"]


def _engine(srv):
    return httpx.get(srv.url.removesuffix("/v1") + "/kgrag/engine", timeout=30).json()


def _exact_in_every_order(prompts, tmp_path, orders):
    requests = [(p, k) for p in prompts for k in ("greedy", "seeded", "constrained")]
    with EmbeddedServer(get_config(cache_dir=tmp_path), port=free_port(), prompt_snapshots=0, log_path=tmp_path / "plain.log") as plain:
        expected = {r: _ask(plain.url, *r) for r in requests}  # every prompt from scratch, in the same chunks
        assert _engine(plain)["stats"].get("prefix_hits", 0) == 0
    got = []
    with EmbeddedServer(get_config(cache_dir=tmp_path), port=free_port(), log_path=tmp_path / "snap.log") as srv:
        for order in orders:
            seq = order(list(requests))
            got.append({r: _ask(srv.url, *r) for r in seq})
        stats = _engine(srv)["stats"]
    for answers in got:
        assert answers == expected, [r for r in requests if answers[r] != expected[r]][:3]
    assert len(set(expected.values())) > len(prompts)  # seeds and constraints vary the answers: the comparison is not vacuous
    assert stats["prefix_hits"] > 0 and stats["snapshot_hits"] > 0, stats  # reuse happened, both kinds
    assert stats["prompt_tokens_evaluated"] < stats["prompt_tokens"] / 2, stats
    return stats


@pytest.mark.llm
def test_prefix_reuse_gives_the_bytes_of_a_chunked_from_scratch_evaluation(tmp_path):
    "Pins: a prompt that restores a shared chunk boundary (or its whole snapshot) answers what a fresh server computing"
    " it from scratch in the same chunks answers, greedy, seeded and constrained, in three orders (12 real smoke prompts,"
    " in four groups of three that share prefixes, one group longer than Gemma 3's 512-token window)."
    prompts = json.loads(DATA.read_text())["ci"][:12]
    _exact_in_every_order(prompts, tmp_path, [lambda rs: rs, lambda rs: rs[::-1], lambda rs: random.Random(1).sample(rs, len(rs))])


@pytest.mark.llm
@pytest.mark.slow
def test_prefix_reuse_is_exact_over_two_hundred_smoke_prompts(tmp_path):
    "The same over 200 distinct prompts of a stretch of a smoke run, in the run's order and reversed."
    prompts = json.loads(DATA.read_text())["slow"]
    _exact_in_every_order(prompts, tmp_path, [lambda rs: rs, lambda rs: rs[::-1]])


# ---- the engine fingerprint in the LLM cache keys --------------------------------------------------------------------

def test_a_key_differs_when_the_engine_differs_and_other_endpoints_keep_their_keys():
    "Pins: answers computed by another evaluation scheme never share a cache row; keys without an engine are unchanged."
    from kgrag_nb.llm import LLMClient, request_key
    args = ("completion", "gemma-3-270m-q4_k_m", "Q: 1+1?\nA:", {"temperature": 0.0, "max_tokens": 4, "stop": ["\n"]}, 0)
    old = "698c451762ae5951f488ba830603f257bf4338ba4ad0ec478511fd0769b75975"  # the key before engines (tests/test_llm.py)
    assert request_key(*args) == request_key(*args, engine=None) == old
    keys = {request_key(*args, engine=e) for e in (None, engine_fingerprint(32), engine_fingerprint(64), engine_fingerprint(32, False))}
    assert len(keys) == 4
    vllm = LLMClient("http://127.0.0.1:9/v1", cache=None, progress=False)
    vllm._engines = {"Qwen/Qwen2.5-7B-Instruct": None}  # what a vLLM `/v1/models` listing gives: no kgrag_engine
    assert vllm._engine_of("Qwen/Qwen2.5-7B-Instruct") is None and vllm._engine_of("gpt-4o") is None
    assert vllm._engine_of(EMBEDDED_MODEL_ALIAS) == engine_fingerprint()  # model given or replay: this installation's engine
    vllm._engines = {EMBEDDED_MODEL_ALIAS: "llama-cpp-python 0.0.0; chunked prefill B=64"}  # a server started with another B
    assert vllm._engine_of(EMBEDDED_MODEL_ALIAS) == "llama-cpp-python 0.0.0; chunked prefill B=64"


@pytest.mark.llm
def test_the_embedded_server_reports_its_engine_and_its_answers_are_keyed_with_it(embedded_server, tmp_path):
    from kgrag_nb.llm import LLMClient, request_key
    listed = httpx.get(f"{embedded_server.url}/models", timeout=30).json()["data"]
    assert [m.get("kgrag_engine") for m in listed] == [engine_fingerprint()]
    cl = LLMClient(embedded_server.url, cache=tmp_path / "c.sqlite", progress=False)
    cl.key_log = tmp_path / "keys"
    cl.complete(["Q: What is 2+2?\nA:"], max_tokens=2, stop="\n")
    prm = {"max_tokens": 2, "stop": ["\n"], "temperature": 0.0}
    assert cl.key_log.read_text().split() == [request_key("completion", EMBEDDED_MODEL_ALIAS, "Q: What is 2+2?\nA:", prm, 0,
                                                          engine=engine_fingerprint())]
    assert _engine(embedded_server)["fingerprint"] == engine_fingerprint()


# ---- documentation ---------------------------------------------------------------------------------------------------

def test_the_snapshot_functions_docstrings_are_whole():
    ("Pins: a docstring written as string literals on separate lines kept only its first line (`reusable_boundary`'s"
     " ended in '(one'), so `help()` and the docs showed half a sentence.")
    from kgrag_nb import serve
    for f in (serve.chunk_spans, serve.reusable_boundary, serve.PrefixSnapshots, serve.PrefixSnapshots.deepest,
              serve.make_deterministic, serve.run_llama_server):
        assert f.__doc__.rstrip().endswith((".", ")")), (f.__qualname__, f.__doc__[-60:])
    assert "window" in serve.reusable_boundary.__doc__ and "engine fingerprint" in serve.PrefixSnapshots.__doc__
