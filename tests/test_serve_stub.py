"""The stand-in server (`kgrag serve stub`): a test instrument for rehearsals, exercised over real HTTP with the project's client."""
import os, signal, subprocess, sys, time
from pathlib import Path

import httpx
import pytest
from hypothesis import given, settings, strategies as st

from kgrag_nb.llm import LLMClient, ResponseCache
from kgrag_nb.serve import STUB_MODEL, StubServer, free_port, port_in_use, served_models, stub_reply, stub_tokens


@pytest.fixture(scope="module")
def stub():
    with StubServer() as srv: yield srv


def test_stub_tokens_hand_computed():
    assert [stub_tokens(t) for t in ("", "a", "abcd", "abcde", "x" * 400)] == [1, 1, 1, 2, 100]


@settings(max_examples=200, deadline=None)
@given(prompt=st.text(max_size=200), max_tokens=st.integers(1, 40), seed=st.none() | st.integers(0, 10**6),
       stop=st.none() | st.lists(st.text(min_size=1, max_size=3), max_size=2))
def test_stub_reply_properties(prompt, max_tokens, seed, stop):
    text, finish = stub_reply(prompt, max_tokens, seed, 0.7, stop)
    assert (text, finish) == stub_reply(prompt, max_tokens, seed, 0.7, stop)  # deterministic
    assert finish in ("stop", "length") and len(text) <= 4 * max_tokens
    words = (set(__import__("re").findall(r"\w+", prompt)) or {"none"}) | {"True", "Yes"}
    if prompt.rstrip().endswith("Output:") and "\nOutput: " in prompt: assert text.strip() in prompt; return  # few-shot JSON rule
    if text.startswith(" What is ") and text.endswith("?"): return  # question-generation rule
    assert all(w in words or any(w in v for v in words) for w in text.split())  # pieces of the prompt's words only
    assert not any(s in text for s in stop or [])


def test_true_false_and_yes_no_prompts_open_the_gate():
    assert stub_reply("Claim: Paris is in France. True or False?", 8, 1)[0] == " True"
    assert stub_reply("Answer Yes or No.", 8)[0] == " Yes"
    assert stub_reply("Trueish falsehood", 8, 2)[0] != " True"  # whole words only
    assert stub_reply('Please output only "yes" or "no".\nOutput:', 3)[0] == " Yes"
    assert stub_reply("Answer with only yes/no.", 3)[0] == " Yes"
    assert stub_reply("yesterday nobody came", 8, 2)[0] != " Yes"


def test_question_generation_prompts_get_a_question_that_brink_reads():
    # BRINK App. D also says "Do not ask a yes/no question": before this rule the stub answered " Yes", no question
    # parsed, and the full rehearsal's benchmark had no test question (brink_benchmarks failed its closing check)
    from kgrag_nb.studies.brink.benchmark import QG_PROMPT, parse_question
    p = QG_PROMPT.format(entity_h="4", predicate_T="wife_of", entity_t="9", topic_entity="9", answer_entity="4")
    text, finish = stub_reply(p, 64, 0, 0.3)
    assert text.startswith(" What is ") and parse_question(text) == text.strip() and finish == "stop"
    assert stub_reply("Now, generate the question for:", 64)[0].endswith("?")
    for other in ("Write one short factual-sounding sentence that answers the question with the given answer.",
                  "you will generate 'I can not answer the question because of insufficient knowledge'",
                  "please think step by step and generate new triples related to the current question"):
        assert not stub_reply(other, 64, 1)[0].endswith("?")  # CoE and JCQL prompts keep the word rule


def test_few_shot_json_prompts_get_the_last_example():
    p = 'Question: a?\nOutput: { "Intent": "x", "Keywords": ["a"] }\n\nQuestion: b?\nOutput: []\nQuestion: c?\nOutput:'
    assert stub_reply(p, 48, 0, 0.0, ["\n"]) == (" []", "stop")
    p2 = p.replace("Output: []\n", "")
    assert stub_reply(p2, 48, 0, 0.0, ["\n"]) == (' { "Intent": "x", "Keywords": ["a"] }', "stop")
    assert stub_reply(p2, 3, 0)[1] == "length"  # the budget still cuts it
    assert "Intent" not in stub_reply(p2 + " Answer", 48, 0)[0]  # only when the prompt ends with the cue


def test_client_completions_are_the_stub_rule_and_counted(stub, tmp_path):
    client = LLMClient(stub.url, model=STUB_MODEL, cache=ResponseCache(tmp_path / "c.sqlite"), progress=False)
    prompts = [f"- Question: Who wrote book number {i}?\n- Short Answer:" for i in range(20)]
    out = client.complete(prompts, max_tokens=8, seed=5, stop=["\n"])
    assert out == [[stub_reply(p, 8, 5, 0.0, ["\n"])[0]] for p in prompts]
    u = client.usage
    assert u.requests == 20 and u.answers_cached == 20 and u.prompt_tokens == sum(stub_tokens(p) for p in prompts)
    assert u.completion_tokens == sum(stub_tokens(t[0]) if t[0] else 0 for t in out)
    assert client.complete(prompts, max_tokens=8, seed=5, stop=["\n"]) == out and client.usage.requests == 20  # cached


def test_client_chat_and_samples(stub):
    client = LLMClient(stub.url, model=None, progress=False)
    msgs = [[{"role": "system", "content": "be brief"}, {"role": "user", "content": "name a river in Peru"}]]
    out = client.chat(msgs, n=3, temperature=0.7, seed=10, max_tokens=12)
    assert client.model is None and out == [[stub_reply("be brief\nname a river in Peru", 12, 10 + s, 0.7)[0] for s in range(3)]]


def test_many_requests_in_parallel(stub):
    client = LLMClient(stub.url, model=STUB_MODEL, max_concurrency=64, progress=False)
    prompts = [f"item {i} alpha beta" for i in range(600)]
    t0 = time.perf_counter(); out = client.complete(prompts, max_tokens=4); dt = time.perf_counter() - t0
    assert len(out) == 600 and client.usage.requests == 600 and client.usage.errors == 0
    assert dt < 60, f"600 stub requests took {dt:.1f} s"


def test_bad_requests_are_refused_with_a_reason(stub):
    r = httpx.post(f"{stub.url}/completions", json={"model": "meta-llama/Llama-3.1-8B-Instruct", "prompt": "x"})
    assert r.status_code == 404 and "stub" in r.json()["error"]["message"]
    assert httpx.post(f"{stub.url}/completions", json={"prompt": ["a", "b"]}).status_code == 400
    assert httpx.post(f"{stub.url}/completions", json={"prompt": "a", "max_tokens": 0}).status_code == 400
    assert httpx.post(f"{stub.url}/chat/completions", json={"messages": []}).status_code == 400
    with pytest.raises(ValueError, match="loopback"): StubServer(host="0.0.0.0")


def test_kgrag_serve_stub_command_serves_and_stops_on_sigterm():
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "kgrag_nb.cli", "serve", "stub", "--port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while served_models(f"http://127.0.0.1:{port}/v1") is None and time.monotonic() < deadline: time.sleep(0.2)
        assert served_models(f"http://127.0.0.1:{port}/v1") == [STUB_MODEL]
        proc.send_signal(signal.SIGTERM); proc.wait(20)
        assert "test instrument" in proc.stdout.read() and not port_in_use("127.0.0.1", port)
    finally:
        if proc.poll() is None: proc.kill()


# --- the client's group commit (cache writes of one event-loop turn in one transaction), measured on the stub ---

def test_claim_many_and_put_many_hand_cases(tmp_path):
    cache = ResponseCache(tmp_path / "c.sqlite")
    cache.put_many([("a", {"text": "A"}, {"p": 1})])
    assert cache.claim_many(["b"], "other-owner") == [("mine", None)]  # this (live) process holds b for another call
    states = cache.claim_many(["a", "b", "c"], "me")
    assert states[0] == ("answered", {"text": "A"}) and states[1][0] == "busy" and states[2] == ("mine", None)
    assert cache.claim_holder("c")["owner"] == "me"
    cache.put_many([("b", {"text": "B"}, None), ("c", {"text": "C"}, None)])
    assert cache.get_many(["a", "b", "c", "zz"]) == {"a": {"text": "A"}, "b": {"text": "B"}, "c": {"text": "C"}}
    assert cache.claim_holder("b") is None and cache.claim_holder("c") is None and cache.request("a") == {"p": 1}


def test_group_commit_stores_every_answer_in_few_transactions(stub, tmp_path, monkeypatch):
    cache = ResponseCache(tmp_path / "c.sqlite")
    calls, original = [], ResponseCache.put_many
    def counting(self, items):
        calls.append(len(items)); return original(self, items)
    monkeypatch.setattr(ResponseCache, "put_many", counting)
    client = LLMClient(stub.url, model=STUB_MODEL, cache=cache, max_concurrency=64, progress=False)
    prompts = [f"question {i} about rivers" for i in range(300)]
    out = client.complete(prompts, max_tokens=4)
    assert sum(calls) == 300 and len(calls) < 300  # every answer written, grouped
    stored = cache.get_many([r["key"] for row in client.complete(prompts, max_tokens=4, return_records=True)[1] for r in row])
    assert len(stored) == 300 and client.usage.requests == 300 and client.usage.cache_hits == 300
    assert [[stored[k]["text"]] for k in [r["key"] for row in client.complete(prompts, max_tokens=4, return_records=True)[1] for r in row]] == out


# --- `kgrag reproduce --jobs 2` stops its running kernels promptly on SIGTERM ---

def test_sigterm_stops_parallel_notebooks_promptly(tmp_path):
    import json as _json
    root = tmp_path / "proj"; (root / "nbs" / "studies").mkdir(parents=True)
    params = 'profile = "tiny"\nrun_dir = None\nllm_url = None\nmodel = None\n'
    for sid in ("s1", "s2", "s3"):
        nb = {"cells": [{"cell_type": "code", "id": "p", "metadata": {"tags": ["parameters"]}, "execution_count": None, "outputs": [], "source": params},
                        {"cell_type": "code", "id": "b", "metadata": {}, "execution_count": None, "outputs": [],
                         "source": f"import os, time, pathlib\npathlib.Path(r'{tmp_path}', '{sid}.started').write_text(str(os.getpid()))\ntime.sleep(300)"}],
              "metadata": {"kernelspec": {"name": "python3", "display_name": "python3", "language": "python"}}, "nbformat": 4, "nbformat_minor": 5}
        (root / "nbs" / "studies" / f"{sid}.ipynb").write_text(_json.dumps(nb))
    (root / "studies.yaml").write_text("artifacts:\n" + "".join(
        f"  {s}: {{paper: p.txt, title: t, notebook: nbs/studies/{s}.ipynb, profiles: {{tiny: {{}}}}}}\n" for s in ("s1", "s2", "s3")))
    env = dict(os.environ, KGRAG_HOME=str(root), KGRAG_RUNS=str(tmp_path / "runs"), KGRAG_FIGURES=str(tmp_path / "fig"),
               KGRAG_CACHE=str(tmp_path / "cache"))
    proc = subprocess.Popen([sys.executable, "-m", "kgrag_nb.cli", "reproduce", "--profile", "tiny", "--jobs", "2", "--run-id", "r"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not ((tmp_path / "s1.started").exists() and (tmp_path / "s2.started").exists()) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert (tmp_path / "s2.started").exists(), "two notebooks never started"
        t0 = time.monotonic(); proc.send_signal(signal.SIGTERM); rc = proc.wait(60); dt = time.monotonic() - t0
        assert rc == 143 and dt < 30, f"exit {rc} after {dt:.1f} s (the notebooks sleep 300 s)"
        assert not (tmp_path / "s3.started").exists()  # the queued notebook never started
        kernels = [int((tmp_path / f"{s}.started").read_text()) for s in ("s1", "s2")]
        time.sleep(1)
        assert not [pid for pid in kernels if Path(f"/proc/{pid}").exists()], "a kernel outlived the run"
    finally:
        if proc.poll() is None: proc.kill()


def test_the_stub_honours_constraints_through_the_client(tmp_path):
    "Issue 21: the rehearsal's stand-in fills a constrained request with a valid output (vLLM's structured_outputs form)."
    import json as _json
    from kgrag_nb.llm import Constraint, LLMClient
    from kgrag_nb.serve import StubServer
    schema = {"type": "object", "properties": {"judge": {"type": "boolean"}, "queries": {"type": "array", "items": {"type": "string"},
              "minItems": 1}}, "required": ["judge", "queries"]}
    with StubServer() as stub:
        client = LLMClient(stub.url, cache=tmp_path / "c.sqlite", progress=False)
        [[out]] = client.complete(["Is more knowledge needed?"], max_tokens=64, temperature=0, constraint=Constraint.json_schema(schema))
        got = _json.loads(out)
        assert isinstance(got["judge"], bool) and len(got["queries"]) >= 1 and all(isinstance(q, str) for q in got["queries"])
        [[yes_no]] = client.complete(["True or False?"], max_tokens=4, temperature=0, constraint=Constraint.choice(["True", "False"]))
        assert yes_no in ("True", "False") and client.served_backend[0] == "stub"
