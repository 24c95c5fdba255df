"""JCQL KBQA at `full`: how many questions Algorithm 1 and the test would run on (eligible = topic entity in the KB),
per dataset and KB setting; no SLM, no LLM. Writes docs/rehearsal/jcql_kbqa_sizes.csv.

    nice -n 19 python docs/rehearsal/jcql_kbqa_sizes.py
"""
import resource, time
from pathlib import Path

import pandas as pd
import yaml

from kgrag_nb.studies.jcql import kbqa as J

from kgrag_nb.studies.jcql import kbc as K

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent

if __name__ == "__main__":
    reg = yaml.safe_load((ROOT / "studies.yaml").read_text())["experiments"]
    kbc, kbqa = reg["jcql_kbc"]["profiles"]["full"], reg["jcql_kbqa"]["profiles"]["full"]
    splits = K.fb15k237_splits(); full = splits["all"]
    rel_ids = {n: r for r, n in J.relation_names_of(full).items()}
    rows = []
    for keep in kbc["keeps"]:
        t0 = time.perf_counter()
        data = K.build_kbc_data(splits, keep=keep, seed=kbc["seed"])
        kb = J.AgentKB(J.name_kg(data.train, f"{round(100 * keep)}% KB", rel_ids))
        for d in kbqa["datasets"]:
            _, n_tr = J.select_questions(kb, d, "train", full, 1, kbqa["seed"])
            _, n_te = J.select_questions(kb, d, "test", full, 1, kbqa["seed"])
            rows.append(dict(keep=keep, dataset=d, train_eligible=n_tr, train_run=min(n_tr, kbqa["n_train"]), test_eligible=n_te,
                             test_run=min(n_te, kbqa["n_test"]), seconds=round(time.perf_counter() - t0, 1),
                             peak_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)))
            print(rows[-1], flush=True)
    pd.DataFrame(rows).to_csv(HERE / "jcql_kbqa_sizes.csv", index=False)
