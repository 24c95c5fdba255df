"""Issue 23 target "prefill tokens evaluated per smoke run <= 1.3 x the tokens in distinct prompts", measured on a real run.

    python docs/rehearsal/prefill_ratio.py <cache_dir> [<server log> ...]

Evaluated: the prompt tokens llama.cpp reports per request in the embedded server's log (`llama_perf_context_print:
prompt eval time = ... / N tokens`; a request served from a prompt snapshot reports 0 or 1). Distinct: the prompt
tokens of each distinct (model, prompt) in the run's LLM response cache (the server's own count, stored with every
answer). Sent: every request's prompt tokens. Run it on a cold run's cache and log (nothing else written to either).
"""
import json, re, sqlite3, sys
from pathlib import Path

EVAL = re.compile(r"prompt eval time =\s*[\d.]+ ms /\s*(\d+) tokens")


def evaluated_tokens(logs) -> tuple[int, int]:
    "(prompt tokens evaluated, requests) from llama.cpp's per-request timing lines."
    n = [int(m.group(1)) for log in logs for m in EVAL.finditer(Path(log).read_text(errors="replace"))]
    return sum(n), len(n)


def cache_tokens(cache_dir) -> dict:
    "Requests, prompt tokens sent and prompt tokens of distinct (model, prompt) of an LLM response cache."
    db = sqlite3.connect(f"file:{Path(cache_dir) / 'llm_cache.sqlite'}?mode=ro", uri=True)
    sent, distinct, n = 0, {}, 0
    for req, resp in db.execute("SELECT request, response FROM responses"):
        r, a = json.loads(req or "{}"), json.loads(resp)
        n += 1; sent += a.get("prompt_tokens", 0)
        distinct[(r.get("model"), json.dumps(r.get("payload"), sort_keys=True))] = a.get("prompt_tokens", 0)
    return dict(requests=n, prompts_distinct=len(distinct), sent=sent, distinct=sum(distinct.values()))


if __name__ == "__main__":
    cache = Path(sys.argv[1])
    logs = sys.argv[2:] or sorted((cache / "logs").glob("llama_server_*.log"))
    ev, reqs = evaluated_tokens(logs)
    c = cache_tokens(cache)
    print(json.dumps(dict(**c, evaluated=ev, server_requests=reqs, evaluated_over_distinct=round(ev / max(1, c["distinct"]), 3),
                          sent_over_distinct=round(c["sent"] / max(1, c["distinct"]), 3)), indent=1))
