"""CoE at `full` from reduced stub rehearsals (issue 14): fit each stage's growth over the records per dataset and
extrapolate to the full released set (HotpotQA 656 + 2Wiki 661 de-duplicated records).

    python docs/rehearsal/coe_growth.py reh-coe-n10 reh-coe-n30 reh-coe-n60 --stage5=reh-coe-n30,reh-coe-n60
    # writes docs/rehearsal/coe_growth.{csv,md}, coe_full_extrapolated.csv
"""
import json, sys
from pathlib import Path

import pandas as pd

from kgrag_nb.config import get_config
from kgrag_nb.plan import fit_growth
from kgrag_nb.reproduce import markdown_table

HERE = Path(__file__).resolve().parent
FULL = {"hotpotqa": 656, "2wiki": 661}  # de-duplicated released records (coe.sample_records caps n_records at these)
SCOPE_N, N_HOTPOT_SCOPE = 200, 200  # full profile: scope_n per dataset (released), and hp[:scope_n] rebuilt HotpotQA questions
STAGES = {1: "features (App. A)", 2: "discrimination (App. B)", 3: "contexts x p x runs x 6 models + judges",
          4: "HotpotQA rebuild (n_rebuild=500, fixed)", 5: "Table 5 usability (RAG vs ScopeCoE)", 6: "save"}

def size(stage: int, n: int) -> float:
    "What a stage grows with: records (stages 1-3, 6), usability questions (5), nothing (4)."
    recs = sum(min(n, v) for v in FULL.values())
    if stage == 5: return sum(min(n, v, SCOPE_N) for v in FULL.values()) + N_HOTPOT_SCOPE
    return 1.0 if stage == 4 else recs

def main(runs, stage5_runs=None):
    "`stage5_runs`: the runs whose usability stage is fitted (runs before the batched ScopeCoE change are left out)."
    cfg, rows = get_config(), []
    for rid in runs:
        u = json.loads((cfg.runs_dir / rid / "experiments" / "coe_runs.json").read_text()) if (cfg.runs_dir / rid / "experiments" / "coe_runs.json").exists() \
            else json.loads((cfg.runs_dir / rid / "experiments" / "coe_runs.usage.json").read_text())
        n = json.loads((cfg.runs_dir / rid / "manifest.json").read_text())["overrides"]["n_records"]
        for s in u["stages"]:
            # the runs share one cache folder: a smaller run's answers are hits in a larger one, so requests = sent + hits
            # and tokens are scaled by the same factor (the stub's token counts per request are alike within a stage)
            need = s["requests"] + s.get("cache_hits", 0); f = need / s["requests"] if s["requests"] else 0.0
            rows.append(dict(run=rid, n_records=n, stage=s["stage"], what=STAGES.get(s["stage"], s["code"][:40]), size=size(s["stage"], n),
                             wall_s=s["wall_s"], peak_rss_mb=s["peak_rss_mb"], requests=need, sent=s["requests"],
                             prompt_tokens=round(s["prompt_tokens"] * f), completion_tokens=round(s["completion_tokens"] * f)))
    df = pd.DataFrame(rows); df.to_csv(HERE / "coe_growth.csv", index=False)
    out = []
    for st, g in df.groupby("stage"):
        if st == 5 and stage5_runs: g = g[g["run"].isin(stage5_runs)]
        g = g.sort_values("n_records"); full_size = size(st, 10**6)
        row = dict(stage=st, what=STAGES.get(st, ""), sizes=list(g["size"]), full_size=full_size)
        for col in ("requests", "wall_s", "prompt_tokens", "completion_tokens", "peak_rss_mb"):
            x, y = list(g["size"]), list(g[col])
            if st == 4 or len(set(x)) < 2 or min(y) <= 0:  # fixed size (or nothing to fit): the largest value measured
                row[col] = float(max(y)); row[col + "_growth"] = "fixed" if st == 4 else "-"; continue
            a = (y[-1] - y[-2]) / (x[-1] - x[-2]); b = y[-1] - a * x[-1]  # linear through the two largest sizes
            if len(set(x)) >= 3: f = fit_growth(x, y); row[col + "_growth"] = f"{f['growth']} (slope {f['loglog_slope']})"
            else: row[col + "_growth"] = "linear (2 sizes)"
            row[col] = max(float(y[-1]), a * full_size + b)  # never below what the largest run measured
            if col == "wall_s" and g["sent"].iloc[-1] > 0:  # cache hits make smaller runs' walls optimistic: price every
                per = float(g["wall_s"].iloc[-1] / g["sent"].iloc[-1])  # full-size request at the largest run's s per sent request
                row["wall_s"] = max(row["wall_s"], per * row.get("requests", 0)) if "requests" in row else row["wall_s"]
                row["wall_s_growth"] += f"; {1000 * per:.1f} ms per sent request"
        out.append(row)
    ex = pd.DataFrame(out)
    total = dict(stage="all", what="TOTAL (extrapolated)", wall_s=ex["wall_s"].sum(), requests=ex["requests"].sum(),
                 prompt_tokens=ex["prompt_tokens"].sum(), completion_tokens=ex["completion_tokens"].sum(), peak_rss_mb=ex["peak_rss_mb"].max())
    ex = pd.concat([ex, pd.DataFrame([total])], ignore_index=True)
    ex.to_csv(HERE / "coe_full_extrapolated.csv", index=False)
    cols = ["stage", "what", "full_size", "wall_s", "wall_s_growth", "requests", "requests_growth", "prompt_tokens", "completion_tokens", "peak_rss_mb", "peak_rss_mb_growth"]
    (HERE / "coe_growth.md").write_text(
        "**CoE (`coe_runs`) at reduced `n_records`, stub = TEST INSTRUMENT, niced, under load; per stage**\n\n"
        + markdown_table(df, ".1f") + "\n\n**Extrapolated to full (1,317 released records; usability 600 questions)**\n\n"
        + markdown_table(ex[cols], ".0f") + "\n")
    print(ex[cols].to_string())

if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--stage5=")]
    s5 = next((a.split("=", 1)[1].split(",") for a in sys.argv[1:] if a.startswith("--stage5=")), None)
    main(args, s5)
