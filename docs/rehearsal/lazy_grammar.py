"""Constrained decoding's cost per generated token, with the grammar in the sampler chain (llama-cpp-python's own path,
"eager") and checked on the drawn token first (`kgrag_nb.serve.lazy_grammar`, as llama.cpp's server does).

    python docs/rehearsal/lazy_grammar.py [out.csv]

One in-process `llama_cpp.Llama` per arm (1 decode thread, 2 batch threads, as the embedded server on 2 cores). The
prompt is evaluated once before the timing (KV prefix reuse inside one arm), so the seconds are decoding only. Three
constraints the studies send: none (free), a True/False choice (awakening, CoE) and JCQL's ReAct-step regex; greedy
and temperature 0.7, three seeds each. Greedy answers must be the same bytes in both arms (checked).
"""
import csv, sys, time

import llama_cpp

from kgrag_nb.studies.jcql import kbqa as jcql
from kgrag_nb.llm import Constraint, constraint_gbnf
from kgrag_nb.serve import embedded_model_path, lazy_grammar

PROMPT = ("Question: Which river flows through the capital of the country whose national anthem is 'La Marseillaise'?\n"
          "Answer the question by reasoning step by step.\nThought 1:")
GRAMMARS = {"free": None, "choice True/False": constraint_gbnf(Constraint.choice([" True", " False"])),
            "JCQL ReAct step": constraint_gbnf(jcql.step_constraint(i=1))}


def measure(arm: str, seeds=(0, 1, 2), max_tokens: int = 40) -> tuple[list[dict], dict]:
    llm = llama_cpp.Llama(str(embedded_model_path()), n_ctx=2048, n_threads=1, n_threads_batch=2, logits_all=False, verbose=False)
    if arm == "lazy": lazy_grammar(llm)
    llm.create_completion(PROMPT, max_tokens=1)  # evaluate the prompt once: the timing below is decoding only
    rows, greedy = [], {}
    for name, g in GRAMMARS.items():
        for temperature in (0.0, 0.7):
            for seed in seeds:
                grammar = llama_cpp.LlamaGrammar.from_string(g, verbose=False) if g else None
                t = time.perf_counter()
                out = llm.create_completion(PROMPT, max_tokens=max_tokens, temperature=temperature, seed=seed, grammar=grammar)
                s, n = time.perf_counter() - t, out["usage"]["completion_tokens"]
                rows.append(dict(arm=arm, constraint=name, temperature=temperature, seed=seed, tokens=n, seconds=round(s, 4),
                                 ms_per_token=round(1000 * s / max(n, 1), 1)))
                if temperature == 0.0: greedy[name, seed] = out["choices"][0]["text"]
    return rows, greedy


if __name__ == "__main__":
    (eager, g_eager), (lazy, g_lazy) = measure("eager"), measure("lazy")
    assert g_eager == g_lazy, "greedy answers differ between the arms"
    rows = eager + lazy
    with open(sys.argv[1] if len(sys.argv) > 1 else "docs/rehearsal/lazy_grammar.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0])); w.writeheader(); w.writerows(rows)
    for name in GRAMMARS:
        for temperature in (0.0, 0.7):
            ms = {a: sum(r["seconds"] for r in rows if (r["arm"], r["constraint"], r["temperature"]) == (a, name, temperature)) * 1000
                  / max(1, sum(r["tokens"] for r in rows if (r["arm"], r["constraint"], r["temperature"]) == (a, name, temperature)))
                  for a in ("eager", "lazy")}
            print(f"{name:18s} T={temperature}: eager {ms['eager']:5.1f} ms/token, lazy {ms['lazy']:5.1f} ms/token")
