"""BRINK rule mining at the full profile's thresholds, measured (issue 14): one configuration per process.

    nice -n 19 /usr/bin/time -v python docs/rehearsal/rules_mining.py fb15k237 4 [fraction of triples]

Mines with `kgrag_nb.studies.brink.rules.mine_rules` directly (not through the rules cache) at App. A.2 thresholds (head coverage 0.1,
std confidence 0.3, PCA confidence 0.4) with every head relation (`min_initial_support=1`, as `brink_table1`), and prints
one JSON line per stage of the breadth-first search (items, wall seconds, peak RSS) and a final line with the rules.
A fraction < 1 mines a seeded uniform sample of the triples (for the scaling rows of rules_mining.csv).
"""
import json, resource, sys, time
import numpy as np
from kgrag_nb.studies.brink import rules as R
from kgrag_nb.datasets import load_kg
from kgrag_nb.kg import KG

def peak_mb() -> int: return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)

def main(name: str, max_len: int, frac: float = 1.0):
    kg = load_kg(name, split="all")
    if frac < 1:
        keep = np.sort(np.random.default_rng(0).choice(kg.num_triples, int(frac * kg.num_triples), replace=False))
        kg = KG.from_arrays(kg.triples[keep], kg.entities, kg.relations, dedup=False)
    run = R._run
    def logged(fn, ix, items, arg_fn, pool, progress, desc, deadline):  # one line per stage of _mine
        t0 = time.perf_counter(); out = run(fn, ix, items, arg_fn, pool, False, desc, deadline)
        print(json.dumps(dict(stage=desc, items=len(items), seconds=round(time.perf_counter() - t0, 1), peak_mb=peak_mb())), flush=True)
        return out
    R._run = logged
    t0 = time.perf_counter()
    rules = R.mine_rules(kg, max_len=max_len, min_hc=0.1, min_pca=0.4, min_std=0.3, min_initial_support=1, progress=False)
    print(json.dumps(dict(kg=name, frac=frac, triples=kg.num_triples, max_len=max_len, rules=len(rules),
                          seconds=round(time.perf_counter() - t0, 1), peak_mb=peak_mb())), flush=True)

if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]) if len(sys.argv) > 3 else 1.0)
