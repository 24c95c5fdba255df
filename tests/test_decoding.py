"""One decode for every study: a contract over every study's decoded steps, checked on the request bodies a recording
fake server receives (real HTTP, the real `LLMClient`), under each decoding.

- free: no request carries a constraint;
- constrained: the free mode's requests, each with the step's constraint (the same temperature, seed and max_tokens);
- decoupled: the free mode's requests exactly, then per free sample one restating request: the free prompt and the
  free answer continued under the constraint, at temperature 0, with the request's seed, one sample, the same max_tokens.
"""
import asyncio, json, threading
from http.server import ThreadingHTTPServer
from types import SimpleNamespace

import pandas as pd
import pytest

from _http import JSONHandler
from kgrag_nb import kgqa
from kgrag_nb.studies.awakening import task1 as awaken
from kgrag_nb.studies.awakening import closed_book as baselines
from kgrag_nb.studies.brink import benchmark as brink
from kgrag_nb.studies.brink import methods as brink_methods
from kgrag_nb.studies.coe import evidence as coe
from kgrag_nb.studies.jcql import kbqa as jcql
from kgrag_nb.studies.misk import rag as missing
from kgrag_nb.studies.awakening import task2 as unseen
from kgrag_nb.studies import awakening, coe as coe_study, jcql as jcql_study, misk as misk_study
from kgrag_nb.decoding import Restatement, decode, plan_first, plan_restatement
from kgrag_nb.llm import DECODINGS, Constraint, LLMClient, fill_constraint

FREE_ANSWER = " a free answer"  # what the fake server writes without a constraint (no trailing whitespace: every strip agrees)


class Recorder(JSONHandler):
    "An OpenAI-compatible fake (owned_by kgrag-stub: constraints arrive as `structured_outputs`) that records every body."
    bodies: list = []

    def do_GET(self):
        self._send(200, {"object": "list", "data": [{"id": "fake", "object": "model", "owned_by": "kgrag-stub"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).bodies.append(body)
        spec = body.get("structured_outputs")
        n = body.get("n") or 1
        texts = [fill_constraint(spec, (body.get("seed") or 0) + i) if spec else FREE_ANSWER for i in range(n)]
        if self.path.endswith("/chat/completions"):
            choices = [{"index": i, "message": {"role": "assistant", "content": t}, "finish_reason": "stop"} for i, t in enumerate(texts)]
        else:
            choices = [{"index": i, "text": t, "finish_reason": "stop", "logprobs": None} for i, t in enumerate(texts)]
        self._send(200, {"id": "x", "object": "text_completion", "created": 0, "model": "fake", "choices": choices,
                         "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})


@pytest.fixture(scope="module")
def fake_url():
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}/v1"
    srv.shutdown()


# ------------------------------------------------------------------------------------------ every study's decoded steps
Q = SimpleNamespace(id="q1", text="Who wrote Hamlet?")
REC = SimpleNamespace(id="q1", question="Who wrote Hamlet?", answers=["Shakespeare"])
COE_ROWS = pd.DataFrame([dict(id="r", question="Where was he born?", answer="Rome", wrong_ans="Paris", CoE="He was born in Rome.")])


def _brink_questions(client, d):
    recs = [dict(removed_triple=("a", "r", "b"), direction="tail", topic_entity="a", hard_answer="b")]
    from kgrag_nb.kg import KG
    kg = KG.from_triples(pd.DataFrame([("a", "r", "b"), ("b", "s", "c")], columns=["head", "relation", "tail"]))
    brink.generate_questions(kg, recs, client, decoding=d)


STEPS = {  # study step -> how the study calls it (its own constraint, restatement and sampling)
    "brink questions (App. D)": _brink_questions,
    "brink/kgqa ToG pruning": lambda c, d: kgqa.complete_decoded(
        c, ["Relations: a; b\nQuestion: x\nRelations:"], ["q1"], "tog", "prune", None, None, Constraint.regex("(a|b)(; (a|b))?"),
        d, kgqa.PRUNE_REFORMAT, temperature=0.0, max_tokens=16, stop=["\n"]),
    "brink method answers": lambda c, d: brink_methods.get_method("llm_only")._complete(
        c, [Q], ["Question: x\nAnswers:"], brink_methods.MethodConfig(decoding=d), 16, "answers", None,
        constraint=brink_methods.ANSWER_LIST),
    "awakening Step 1 (closed book)": lambda c, d: baselines.closed_book(c, [REC], n_probe=2, n_samples=0, decoding=d),
    "awakening NLI-probing": lambda c, d: awaken.probe(c, ["Paris, capital of, France"], "nli", n_probe=2, decoding=d),
    "awakening answers (n = 10)": lambda c, d: awaken.awaken(c, ["Who wrote Hamlet?"], ["Shakespeare wrote Hamlet."], n_samples=10,
                                                             decoding=d),
    "unseen-entity extraction": lambda c, d: unseen._decode_step(
        c, [unseen.extraction_prompt("Who wrote Hamlet?", "Hamlet")], ["q1"], "Ours", "extraction", None, [lambda o: o],
        unseen.EXTRACTION_FORMAT, d, unseen.EXTRACTION_RESTATE, max_tokens=32, stop=["\n"], temperature=0.0, seed=3),
    "jcql agent step (async)": lambda c, d: asyncio.run(jcql.agent_decode(
        c, "Question: x\nThought 1:", d, jcql.step_constraint(), temperature=0.7, max_tokens=64, stop=["\nObservation"], seed=2)),
    "jcql self-consistency (n = 3)": lambda c, d: jcql.SCBaseline().run(
        [SimpleNamespace(id="q1", text="Who wrote Hamlet?", topic=None)], None, c, jcql.BaselineConfig(decoding=d, n_sc=3), None),
    "misk Fig. 4 block (reasoning first)": lambda c, d: missing.complete_as(
        c, ["## Output\n"], 64, ["\n## "], missing.MISSING_JSON, d, reason_tokens=16, reason_stop=["```"],
        lead=missing.MISSING_BLOCK_OPEN, restate=missing.MISSING_RESTATE),
    "misk context-recall judge": lambda c, d: missing.complete_as(
        c, ["Context: x\nJSON: {\"attributed\":"], 24, ["\n"], missing.ATTRIBUTION, d, restate=missing.ATTRIBUTION_RESTATE),
    "coe features and relations (App. A)": lambda c, d: coe.extract_features(c, ["Where was he born?"], ["q1"], decoding=d),
    "coe misinformation (n = 2, seeded)": lambda c, d: coe.make_misinformation(c, COE_ROWS, n_generated=2, decoding=d),
}
REASONING_FIRST = {"misk Fig. 4 block (reasoning first)"}  # constrained: a bounded free reasoning pass, then the block


def _bodies(url, tmp_path, step, decoding) -> list[dict]:
    Recorder.bodies = []
    client = LLMClient(url, cache=tmp_path / f"{decoding}.sqlite", progress=False)
    try: STEPS[step](client, decoding)
    except (ValueError, KeyError, TypeError) as e:  # a study may refuse the fake's answers after the step: the requests are sent
        if not Recorder.bodies: raise AssertionError(f"{step} sent no request under {decoding}: {e!r}") from e
    return [b for b in Recorder.bodies]


def _prompt(b): return b.get("prompt") if "prompt" in b else json.dumps(b.get("messages"))
def _sampling(b): return {k: b.get(k) for k in ("temperature", "seed", "max_tokens")}


@pytest.mark.parametrize("step", list(STEPS))
def test_every_decoded_step_sends_the_contracted_requests(fake_url, tmp_path, step):
    bodies = {d: _bodies(fake_url, tmp_path, step, d) for d in DECODINGS}
    free = bodies["free"]
    assert free and not any("structured_outputs" in b for b in free), f"{step}: a free request carried a constraint"
    con = [b for b in bodies["constrained"] if "structured_outputs" in b]
    assert con, f"{step}: constrained decoding sent no constrained request"
    free_requests = {(_prompt(b), json.dumps(_sampling(b))) for b in free}
    if step not in REASONING_FIRST:
        for b in con:  # the same request as the free mode's, with the constraint (a later stage may only run when parsed)
            if any(p == _prompt(b) for p, _ in free_requests):
                assert (_prompt(b), json.dumps(_sampling(b))) in free_requests, f"{step}: constrained sampling differs from free"
        assert {_prompt(b) for b in con} & {p for p, _ in free_requests}, f"{step}: no constrained request is a free one"
    dec = bodies["decoupled"]
    dec_free, restated = [b for b in dec if "structured_outputs" not in b], [b for b in dec if "structured_outputs" in b]
    assert {(_prompt(b), json.dumps(_sampling(b))) for b in dec_free} >= free_requests, \
        f"{step}: decoupled's free pass is not the free mode's requests"
    assert restated, f"{step}: decoupled decoding sent no restatement"
    for b in restated:
        src = [f for f in dec_free if isinstance(b.get("prompt"), str) and b["prompt"].startswith(f["prompt"] + FREE_ANSWER)
               or "messages" in b and b["messages"][:len(f.get("messages", [])) or 10**6] == f.get("messages")]
        assert src, f"{step}: a restatement does not continue a free prompt and its free answer"
        assert b.get("temperature") == 0.0, f"{step}: the restatement samples (temperature {b.get('temperature')})"
        assert b.get("seed") in {f.get("seed") for f in src}, f"{step}: the restatement's seed {b.get('seed')} is no request's"
        assert (b.get("n") or 1) == 1 and b.get("max_tokens") in {f.get("max_tokens") for f in src}


def test_restatement_plans_are_pure():
    "The plans the contract checks, by hand."
    c, p = Constraint.choice(["yes", "no"]), dict(temperature=0.7, seed=9, max_tokens=5, stop=["\n"], n=3)
    assert plan_restatement(c, p) == dict(temperature=0.0, seed=9, max_tokens=5, stop=["\n"], n=1, constraint=c)
    assert plan_restatement(c, p, grammar_ends=True)["stop"] is None
    assert plan_first(c, "decoupled", p) == p and plan_first(c, "constrained", p)["constraint"] is c
    assert Restatement("\nAgain:", repeat_label=True).prompt("Q\nThought 2:", " x") == "Q\nThought 2: x\nAgain:Thought 2:"


def test_studies_whose_constrained_steps_sample_name_the_sampler():
    "Awakening (Step 1 and probing at drawn temperatures), JCQL (0.7) and CoE (the judges at 0.1) say, when constrained, that"
    " their sampled constrained answers come from the embedded server's lazy sampler; BRINK decodes at temperature 0 (App. F)."
    from kgrag_nb.decoding import SAMPLER_NOTE
    lines = {"awakening Step 1": awakening.STUDY.deviation_lines("closed_book", "constrained"),
             "awakening": awakening.STUDY.deviation_lines("task1", "constrained"),
             "jcql": jcql_study.STUDY.deviation_lines("kbqa", "constrained"),
             "coe": coe_study.STUDY.deviation_lines("evidence", "constrained")}
    missing = [k for k, v in lines.items() if not any(SAMPLER_NOTE in x for x in v)]
    assert not missing, missing
    assert not any(SAMPLER_NOTE in x for x in coe_study.STUDY.deviation_lines("evidence", "decoupled"))  # restatements are greedy: nothing sampled
    assert SAMPLER_NOTE not in brink_methods.decoding_note(dict(decoding="constrained"))  # greedy: nothing sampled



def _check_decoding_calls(source: str, where: str) -> list[str]:
    "Where `source` calls `check_decoding` (as a bare name or an attribute, e.g. `llm.check_decoding(...)`)."
    import ast
    calls = []
    for node in ast.walk(ast.parse(source, filename=where)):
        f = node.func if isinstance(node, ast.Call) else None
        if (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None) == "check_decoding":
            calls.append(f"{where}:{node.lineno}")
    return calls


def test_only_the_decode_layer_and_the_runner_check_the_decoding():
    "`check_decoding` is called by `kgrag_nb.decoding` (when a step decodes) and `kgrag_nb.reproduce` (a run's parameters,"
    " before a run folder is made, and a registered deviation line's lookup), never by a study module or a study notebook"
    " (experiments, artefacts): a study passes its decoding on and the decode call checks it."
    import json
    from pathlib import Path
    import kgrag_nb
    root = Path(kgrag_nb.__file__).parent
    allowed = {root / "decoding.py", root / "reproduce.py"}
    calls = [c for py in sorted(root.rglob("*.py")) if py not in allowed
             for c in _check_decoding_calls(py.read_text(), str(py.relative_to(root.parent)))]
    for nb in sorted((root.parent / "nbs" / "studies").rglob("*.ipynb")):
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            if cell["cell_type"] != "code": continue
            code = "\n".join("" if l.lstrip().startswith(("%", "!")) else l for l in "".join(cell["source"]).splitlines())
            calls += _check_decoding_calls(code, f"{nb.relative_to(root.parent)} cell {i}")
    assert not calls, f"check_decoding called outside the decode layer and the runner: {calls}"
    assert _check_decoding_calls("from kgrag_nb import llm\nllm.check_decoding(d)", "probe")  # the scan sees a call


def test_a_typo_in_a_study_deviation_lookup_names_the_modes():
    "A study's deviation line for a decoding comes from its registered lines (`reproduce.decoding_deviation_lines`): none for"
    " free, the line otherwise, and a typo gets the decode layer's ValueError (the value and the modes), not a bare KeyError."
    from kgrag_nb.reproduce import decoding_deviation_lines
    lines = {"constrained": "Decoding: constrained here."}
    assert decoding_deviation_lines(lines, "free") == [] and decoding_deviation_lines(lines, "constrained") == [lines["constrained"]]
    with pytest.raises(ValueError, match="the study has deviation lines for \\['constrained'\\] only"):
        decoding_deviation_lines(lines, "decoupled")
    lookups = {"closed book": lambda d: awakening.STUDY.deviation_lines("closed_book", d),
               "awakening": lambda d: awakening.STUDY.deviation_lines("task1", d),
               "unseen": lambda d: awakening.STUDY.deviation_lines("task2", d), "brink": lambda d: brink_methods.decoding_note({"decoding": d}),
               "jcql": lambda d: jcql_study.STUDY.deviation_lines("kbqa", d), "coe": lambda d: coe_study.STUDY.deviation_lines("evidence", d),
               "missing": lambda d: misk_study.STUDY.deviation_lines("rag", d)}
    for name, lookup in lookups.items():
        assert lookup("decoupled") != lookup("free"), name
        with pytest.raises(ValueError, match="decoding='json': use 'free'.*'constrained'.*'decoupled'"): lookup("json")
