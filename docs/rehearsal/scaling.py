"""Scaling of the stage that dominates the full rehearsal (issue 14, item 5): the Unseen-Entity KG (union of the 2-hop
subgraphs of the questions' topic entities, capped at 40,000 triples per entity, awakening §5.1 / App. C) and the DiFaR
embedding of its verbalised triples. Each size runs in a fresh process, so its peak memory is its own.

    nice -n 19 python docs/rehearsal/scaling.py          # writes docs/rehearsal/scaling.{csv,md,png}
"""
import json, subprocess, sys, time
from pathlib import Path

HERE = Path(__file__).resolve().parent
UNION = """
import json, time
from kgrag_nb.backends import LocalBackend
from kgrag_nb.datasets import load_kg
from kgrag_nb.reproduce import peak_rss_mb
from kgrag_nb.unseen import build_incomplete_kg, sample_questions
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
    rows = measure(UNION, [50, 150, 474]) + measure(EMBED, [500, 1500, 4500])
    df = pd.DataFrame(rows); df.to_csv(HERE / "scaling.csv", index=False)
    fits = []
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for stage, g in df.groupby("stage", sort=False):
        for col in ("wall_s", "peak_rss_mb", "triples"):
            if col == "triples" and g["unit"].iloc[0] == "triples": continue
            fits.append(dict(stage=stage, measure=col, sizes=list(g["size"]), values=[round(v, 2) for v in g[col]], **fit_growth(list(g["size"]), list(g[col]))))
        axes[0 if g["unit"].iloc[0] == "questions" else 1].plot(g["size"], g["wall_s"], "o-", label=stage)
        axes[2].plot(g["size"] / g["size"].max(), g["peak_rss_mb"], "o-", label=stage)
    axes[0].set(xlabel="questions", ylabel="wall s", title="incomplete KG build"); axes[1].set(xlabel="triples", ylabel="wall s", title="triple embedding")
    axes[2].set(xlabel="size / largest size", ylabel="peak RSS MiB", title="peak memory"); axes[2].legend(fontsize=6)
    fig.text(0, -0.05, "measured on a shared 2-core CPU machine (nice 19, other jobs running): times are upper bounds", fontsize=7)
    fig.savefig(HERE / "scaling.png", dpi=130, bbox_inches="tight")
    f = pd.DataFrame(fits)
    (HERE / "scaling.md").write_text("**Scaling of the dominant full-profile stage (Unseen-Entity QA)**\n\n" + markdown_table(df) + "\n\n"
                                     + markdown_table(f) + "\n")
    print(f.to_string())
