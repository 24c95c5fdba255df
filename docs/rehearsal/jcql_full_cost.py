"""JCQL KBC at `full` without training (issue 14): full-KB data building, SLM training throughput and per-query scoring
cost at the full profile's T5-small size, timed on this machine; training itself is NOT run (GPU hours).

    nice -n 19 python docs/rehearsal/jcql_full_cost.py   # writes docs/rehearsal/jcql_full_cost.csv
"""
import resource, sys, time
from pathlib import Path

import pandas as pd
import yaml

from kgrag_nb.studies.jcql import kbc as K

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

def rss_mb() -> float: return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

def main(train_steps: int = 2, queries: int = 2, R: int = 500, threads: int = 2):
    full = yaml.safe_load((ROOT / "studies.yaml").read_text())["experiments"]["jcql_kbc"]["profiles"]["full"]
    rows, t0 = [], time.perf_counter()
    def row(what, value, unit, **kw):
        rows.append(dict(what=what, value=value, unit=unit, peak_rss_mb=round(rss_mb(), 1), **kw)); print(rows[-1], flush=True)
    sp = K.fb15k237_splits(); row("load FB15k-237 splits", time.perf_counter() - t0, "s")
    data = {}
    for keep in full["keeps"]:
        t = time.perf_counter(); d = K.build_kbc_data(sp, keep=keep, seed=full["seed"]); data[keep] = d
        row(f"build_kbc_data keep={keep} (whole KG)", time.perf_counter() - t, "s", **d.stats())
    d = data[max(data)]
    slm = {k: v for k, v in full["slm"].items() if k != "device"}
    n_ex = len(d.train)
    cfg = K.SLMConfig(**slm, context=full["variants"][0], epochs=train_steps * 64 / n_ex, lr=full["lr"], R=R, threads=threads,
                      log_every=1)
    t = time.perf_counter(); m = K.train_kbc(d, cfg, full["seed"]); wall = time.perf_counter() - t
    row(f"SLM train {train_steps} steps x 64 (tokenizer + context index + steps)", wall, "s", parameters=m.info["parameters"],
        examples_per_s=m.info["examples_per_s"], kb=n_ex, threads=threads)
    q = d.test[:queries]
    t = time.perf_counter(); [m.sample_scores(h, r, R, exclude=(h, r, x)) for h, r, x in q]
    row(f"SLM sampled score R={R}", (time.perf_counter() - t) / len(q), "s/query", entities=len(d.entities), threads=threads)
    t = time.perf_counter(); [m.exact_scores(h, r, exclude=(h, r, x)) for h, r, x in q]
    row("SLM exact all-entity score", (time.perf_counter() - t) / len(q), "s/query", entities=len(d.entities), threads=threads)
    t = time.perf_counter(); pk = K.PyKEENBaseline(d, "TransE", dim=full["pykeen_dim"], epochs=1, seed=full["seed"], threads=threads)
    row(f"PyKEEN TransE dim {full['pykeen_dim']}, 1 epoch", pk.info.get("epoch_s", time.perf_counter() - t), "s/epoch", kb=n_ex)
    df = pd.DataFrame(rows); df.to_csv(HERE / "jcql_full_cost.csv", index=False)
    return df

if __name__ == "__main__":
    main(*[int(a) for a in sys.argv[1:]])
