"""Scaling of the stage that dominates the full rehearsal (issue 14, item 5): the Unseen-Entity KG (union of the 2-hop
subgraphs of the questions' topic entities, capped at 40,000 triples per entity, awakening §5.1 / App. C) and the DiFaR
embedding of its verbalised triples. Each size runs in a fresh process, so its peak memory is its own.

    nice -n 19 python docs/rehearsal/scaling.py [union embed awaken]   # writes docs/rehearsal/scaling.{csv,md,png}
"""
import json, subprocess, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
UNION = """
import json, time
from kgrag_nb.backends import LocalBackend
from kgrag_nb.datasets import load_kg
from kgrag_nb.reproduce import peak_rss_mb
from kgrag_nb.studies.awakening.task2 import build_incomplete_kg, sample_questions
kg = load_kg("fb15k237"); backend = LocalBackend(kg)
sample, _ = sample_questions("cwq", kg, {n}, 0)
t0 = time.perf_counter(); inc = build_incomplete_kg(sample, backend, max_triples=40_000, name="cwq")
print(json.dumps(dict(stage="incomplete KG (2-hop union, cap 40k)", size={n}, unit="questions", wall_s=time.perf_counter() - t0,
                      peak_rss_mb=peak_rss_mb(), triples=inc.kg.num_triples)))
"""
EMBED = """
import json, time
from kgrag_nb.datasets import load_kg
from kgrag_nb.reproduce import peak_rss_mb
from kgrag_nb.retrieval import embed, load_embedder
texts = load_kg("fb15k237").verbalize()[:{n}]
model = load_embedder(); embed(texts[:32], model, cache_dir=False)  # load and warm up outside the timing
t0 = time.perf_counter(); embed(texts, model, cache_dir=False)
print(json.dumps(dict(stage="DiFaR triple embedding (MiniLM, CPU)", size={n}, unit="triples", wall_s=time.perf_counter() - t0,
                      peak_rss_mb=peak_rss_mb(), triples={n})))
"""
AWAKEN = """
import json, time
import numpy as np
from kgrag_nb.studies.awakening import task1 as awaken
from kgrag_nb.reproduce import peak_rss_mb
records, backend, map_id = awaken.task1_data("cwq")
texts = []
def counting_scorer(query, cands):  # no embedding: count the texts the MiniLM reranker would embed
    texts.extend(cands); return np.zeros(len(cands))
awaken.extract_knowledge(records[0], backend, map_id, scorer=counting_scorer)  # adjacency built outside the timing
texts.clear(); t0 = time.perf_counter(); sizes = []
for r in records[1:{n} + 1]:
    ex = awaken.extract_knowledge(r, backend, map_id, scorer=counting_scorer); sizes.append(ex["question"].get("n_subgraph", 0))
print(json.dumps(dict(stage="awakening Step 2 without embedding (subgraph, candidates, distances)", size={n}, unit="questions",
                      wall_s=time.perf_counter() - t0, peak_rss_mb=peak_rss_mb(), triples=int(np.mean(sizes)),
                      texts_to_embed=len(texts), unique_texts=len(set(texts)))))
"""

def measure(code: str, sizes: list) -> list:
    out = []
    for n in sizes:
        r = subprocess.run([sys.executable, "-c", code.format(n=n)], capture_output=True, text=True)
        if r.returncode: raise RuntimeError(r.stderr[-2000:])
        out.append(json.loads(r.stdout.strip().splitlines()[-1])); print(out[-1], flush=True)
    return out

if __name__ == "__main__":
    import pandas as pd, matplotlib; matplotlib.use("Agg"); import matplotlib.pyplot as plt
    from kgrag_nb.plan import fit_growth
    from kgrag_nb.reproduce import markdown_table
    plan = {"union": (UNION, [50, 150, 474]), "embed": (EMBED, [500, 1500, 4500]), "awaken": (AWAKEN, [5, 15, 45])}
    which = sys.argv[1:] or list(plan)  # measure these again; keep the other stages' rows of scaling.csv
    rows = [r for w in which if w in plan for r in measure(*plan[w])]  # `replot`: measure nothing
    old = pd.read_csv(HERE / "scaling.csv") if (HERE / "scaling.csv").exists() else pd.DataFrame(columns=["stage"])
    new = pd.DataFrame(rows, columns=["stage"] if not rows else None)
    df = pd.concat([old[~old["stage"].isin(set(new["stage"]))], new], ignore_index=True)
    df = df.astype({c: "Int64" for c in ("size", "triples", "texts_to_embed", "unique_texts") if c in df})
    df.to_csv(HERE / "scaling.csv", index=False)
    fits = []
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    import numpy as np
    colors = dict(zip(df["stage"].unique(), ["tab:blue", "tab:orange", "tab:green", "tab:red"]))
    for stage, g in df.groupby("stage", sort=False):
        for col in ("wall_s", "peak_rss_mb", "triples"):
            if col == "triples" and not stage.startswith("incomplete KG"): continue
            fits.append(dict(stage=stage, measure=col, sizes=[int(v) for v in g["size"]], values=[round(float(v), 2) for v in g[col]],
                             **fit_growth([int(v) for v in g["size"]], [float(v) for v in g[col]])))
        axes[0 if g["unit"].iloc[0] == "questions" else 1].plot(g["size"], g["wall_s"], "o-", label=stage, color=colors[stage])
        axes[2].plot(g["size"] / g["size"].max(), g["peak_rss_mb"], "o-", label=stage, color=colors[stage])
    axes[0].set(xlabel="questions", ylabel="wall s", title="per-question stages"); axes[0].legend(fontsize=6); axes[1].set(xlabel="triples", ylabel="wall s", title="triple embedding")
    axes[2].set(xlabel="size / largest size", ylabel="peak RSS MiB", title="peak memory"); axes[2].legend(fontsize=6)
    fig.text(0, -0.05, "measured on a shared 2-core CPU machine (nice 19, other jobs running): times are upper bounds", fontsize=7)
    fig.savefig(HERE / "scaling.png", dpi=130, bbox_inches="tight")
    f = pd.DataFrame(fits)
    (HERE / "scaling.md").write_text("**Scaling of the dominant full-profile stage (Unseen-Entity QA)**\n\n" + markdown_table(df) + "\n\n"
                                     + markdown_table(f) + "\n")
    print(f.to_string())
