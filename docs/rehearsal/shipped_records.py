"""Shipped rehearsal records (issue 23 item 4): `kgrag_nb/rehearsal/full.csv`, read by `kgrag plan --profile full` when
no local rehearsal exists. One row per (LLM-calling experiment or artefact of studies.yaml, model it calls), from what
the stub rehearsals in this folder measured (`plan_full*.md`: `kgrag plan` over the rehearsal runs' key logs), scaled
where a rehearsal ran reduced, and estimated from the code where none ran (labelled in `status`/`source`/`note`).

    python docs/rehearsal/shipped_records.py      # writes kgrag_nb/rehearsal/full.csv

Units: requests = distinct request keys (n samples count n times); prompt_tokens by the stub's rule (4 characters per
token), every request counted (a server that caches prefixes evaluates shared prompts once: an upper bound for prefill);
completion_tokens_max = the requests' max_tokens budgets (an UPPER BOUND: answers that stop early cost less).
`{model}` = the run's own model (`kgrag plan --model`); other ids are the models the full profile names.
"""
import re
from pathlib import Path

import pandas as pd
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
OUT = ROOT / "kgrag_nb" / "rehearsal" / "full.csv"
FT_ARMS = ["free", "constrained", "decoupled"]
COLUMNS = ["id", "kind", "model", "role", "requests", "prompt_tokens", "completion_tokens_max", "n_samples", "status", "source", "note"]


def plan_rows(md: str) -> dict:
    "`{id: row}` of the markdown table(s) `kgrag plan` printed into `md` (a file of this folder)."
    lines = [l for l in (HERE / md).read_text().splitlines() if l.startswith("| ")]
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for l in lines[1:]:
        cells = [c.strip() for c in l.strip("|").split("|")]
        if len(cells) != len(head) or cells[0] in ("id", "TOTAL") or cells[0].startswith("---"): continue
        r = dict(zip(head, cells))
        if r["basis"] in ("no LLM", "no rehearsal"): continue
        rows[r["id"]] = {k: (int(v) if k in ("requests", "other_models", "prompt_tokens", "completion_tokens_max") else v) for k, v in r.items()}
    return rows


def template_tokens(text: str, filled_chars: int = 0) -> int:
    "Stub-rule tokens (4 characters each) of a prompt template plus the characters its fields add."
    return round((len(re.sub(r"\{[a-zA-Z_]+\}", "", text)) + filled_chars) / 4)


def row(id, kind, model, role, requests, prompt_tokens, completion, n_samples, status, source, note=""):
    return dict(id=id, kind=kind, model=model, role=role, requests=round(requests), prompt_tokens=round(prompt_tokens),
                completion_tokens_max=round(completion), n_samples=n_samples, status=status, source=source, note=note)


def main():
    reg = yaml.safe_load((ROOT / "studies.yaml").read_text())
    full = {k: v["profiles"]["full"] for sec in ("experiments", "artifacts") for k, v in reg[sec].items()}
    p1, p3, p4 = plan_rows("plan_full.md"), plan_rows("plan_full_coe_misk_jcql.md"), plan_rows("plan_full_4.md")
    rows = []

    # awakening: closed-book baseline (exact: prompts from the data only) and Task 1 (main + six other paper models)
    r = p1["closed_book_baseline"]
    rows.append(row("closed_book_baseline", "artifact", "{model}", "answers (Step 1 + samples)", r["requests"], r["prompt_tokens"],
                    r["completion_tokens_max"], full["closed_book_baseline"]["n_samples"], "measured", "rehearsal reh-closed_book (plan_full.md)",
                    "exact: its prompts depend on the data only"))
    r = p1["awaken_task1"]
    others = [m for m in full["awaken_task1"]["models"] if m != "meta-llama/Llama-3.1-8B-Instruct"]  # the default run model is the main one
    per_other = r["other_models"] / len(others)
    main_req = r["requests"] - r["other_models"]
    tok_per_req, comp_per_req = r["prompt_tokens"] / r["requests"], r["completion_tokens_max"] / r["requests"]
    rows.append(row("awaken_task1", "experiment", "{model}", "main model: every type, probe, query and temperature", main_req,
                    main_req * tok_per_req, main_req * comp_per_req, full["awaken_task1"]["n_samples"], "measured",
                    "rehearsal reh-awaken-gates (plan_full.md)", "tokens split between models by request share"))
    by_model = full["awaken_task1"].get("max_tokens_by_model") or {}
    for m in others:
        long = m in by_model  # R1-distilled models think before answering: a longer budget per request (studies.yaml)
        rows.append(row("awaken_task1", "experiment", m, "Figs. 5/6 model: main six types, NLI-probing, main temperature", per_other,
                        per_other * tok_per_req, per_other * (by_model[m] if long else comp_per_req), full["awaken_task1"]["n_samples"],
                        "estimated" if long else "measured",
                        "rehearsal reh-awaken-gates, stand-ins stub-2..7 (plan_full.md)",
                        f"completion budget max_tokens_by_model={by_model[m]} on every request (stand-ins had 24)" if long else
                        "one of six stand-ins: other_models / 6"))
    r = p4["unseen_entity"]
    rows.append(row("unseen_entity", "experiment", "{model}", "shared stages + ten Table 3 methods", r["requests"], r["prompt_tokens"],
                    r["completion_tokens_max"], full["unseen_entity"]["n_samples"], "measured", "rehearsal reh4-unseen (plan_full_4.md)"))

    # BRINK: questions (App. D) and the methods; the methods ran in private_id mode only
    r = p4["brink_benchmarks"]
    rows.append(row("brink_benchmarks", "experiment", "{model}", "App. D questions", r["requests"], r["prompt_tokens"],
                    r["completion_tokens_max"], 1, "measured", "rehearsal reh4-brink3 (plan_full_4.md)"))
    r = p4["brink_methods"]
    test_q = {"family": 416, "fb15k237": 7117}  # test questions per benchmark at full (README.md, fourth session: splits 416 and 7,117)
    fb_share = test_q["fb15k237"] / sum(test_q.values())
    extra_modes = len(set(full["brink_methods"]["label_modes"]) - {"private_id"})
    scale = 1 + extra_modes * fb_share  # each extra mode re-runs every method on FB15k-237's test questions (label_methods = methods)
    rows.append(row("brink_methods", "experiment", "{model}", "six method families, complete/incomplete KG, three label modes",
                    r["requests"] * scale, r["prompt_tokens"] * scale, r["completion_tokens_max"] * scale, 1, "extrapolated",
                    "rehearsal reh4-brink4 with label_modes=[private_id] (plan_full_4.md), scaled",
                    f"x{scale:.3f}: kg_id and text modes each repeat the FB15k-237 share ({test_q['fb15k237']:,} of "
                    f"{sum(test_q.values()):,} test questions); their prompts (Freebase ids, labels) differ in length"))

    # CoE: the run model and the five paper models answer (key-logged); the judge's client is not key-logged
    from kgrag_nb import coe, missing
    r = p4["coe_runs"]
    cf = full["coe_runs"]
    per_other = r["other_models"] / len(cf["models"])
    tok_per_req = r["prompt_tokens"] / r["requests"]
    other_comp = per_other * coe.ANSWER_TOKENS
    for m in cf["models"]:
        rows.append(row("coe_runs", "experiment", m, "answers: contexts x p x runs", per_other, per_other * tok_per_req, other_comp,
                        len(cf["seeds"]), "measured", "rehearsal reh4-coe-full, stand-ins stub-2..6 (plan_full_4.md)",
                        "other_models / 5; prompt tokens by request share"))
    main_req = r["requests"] - r["other_models"]
    rows.append(row("coe_runs", "experiment", "{model}", "answers + features, discrimination, misinformation, rebuild, usability",
                    main_req, main_req * tok_per_req, r["completion_tokens_max"] - len(cf["models"]) * other_comp, len(cf["seeds"]),
                    "measured", "rehearsal reh4-coe-full (plan_full_4.md)", "prompt tokens by request share"))
    usability = 30720  # requests of the 2Wiki index + usability stage at full (README.md, fourth session)
    judged = (len(cf["models"]) + 1) * per_other + usability  # at most one verdict per answer (ACC always, FR unless it follows)
    judge_prompt = (template_tokens(coe.CORRECTNESS_JUDGE_PROMPT, 300) + template_tokens(coe.GROUNDEDNESS_JUDGE_PROMPT, 900)) / 2
    rows.append(row("coe_runs", "experiment", cf["judge_model"], "ACC/FR judge", judged, judged * judge_prompt, judged * coe.JUDGE_TOKENS,
                    len(cf["seeds"]), "estimated", "not rehearsed: estimated from the answers of reh4-coe-full (the judge client is not key-logged)",
                    f"upper bound: one verdict per answer of the 6 answer models ({per_other:,.0f} each) and per usability request; "
                    f"prompt ~{judge_prompt:.0f} tokens (templates + question, reference, answer or passage)"))

    # missing-knowledge RAG: generator measured; the context-recall judge (its own endpoint) is not key-logged
    r = p3["misk_runs"]
    mf = full["misk_runs"]
    rows.append(row("misk_runs", "experiment", "{model}", "generator: DirectGen, RAG, 2-way, Misk rows x TopK", r["requests"], r["prompt_tokens"],
                    r["completion_tokens_max"], 1, "measured", "rehearsal reh-misk2 (plan_full_coe_misk_jcql.md)",
                    "embedders substituted (MiniLM, BM25): request counts unchanged"))
    n_q = min(mf["llm_judge_questions"], mf["n_nq"]) + min(mf["llm_judge_questions"], mf["n_med"])
    ctx = 3 * max(mf["topks"]) * 2  # distinct contexts per question: 3 KBs x top-8, original and missing-knowledge queries
    gt_p, attr_p = template_tokens(missing.JUDGE_GT_PROMPT, 700), template_tokens(missing.JUDGE_ATTR_PROMPT, 600 + 300)
    rows.append(row("misk_runs", "experiment", "{model}", "context-recall judge (judge_url/judge_model via --set)", n_q * (1 + ctx),
                    n_q * (gt_p + ctx * attr_p), n_q * (64 + ctx * 24), 1, "estimated",
                    "not rehearsed: estimated from missing.llm_judge (the judge client is not key-logged)",
                    f"{n_q} judged questions x (1 ground-truth call, 64 tokens + <= {ctx} attribution calls, 24 tokens); priced as the run's model"))

    # JCQL agent side: not rehearsed (needs the GPU-trained jcql_kbc checkpoints); sizes measured (jcql_kbqa_sizes.csv)
    jf = full["jcql_kbqa"]
    sizes = pd.read_csv(HERE / "jcql_kbqa_sizes.csv")
    n_test, n_train = int(sizes["test_run"].sum()), int(sizes["train_run"].sum())
    L, step, aux = jf["max_steps"], 128, 96  # jcql.AgentConfig: step_tokens 128, aux_tokens 96 (Prompts 3-7)
    agent_calls, agent_comp, agent_prompt = 2 * L, L * (step + aux), L * (750 + 250)  # <= one step + one aux call per step
    methods = dict(io=(1, 96, 100), cot=(1, 96, 400), sc=(jf["n_sc"], 96 * jf["n_sc"], 400 * jf["n_sc"]),
                   tog=(jf["tog_depth"] + 1, 48 * jf["tog_depth"] + 96, 400 * (jf["tog_depth"] + 1)))
    n_agents = sum(m.startswith("jcql") and m.split()[-1] not in ("io", "cot", "sc", "tog") for m in jf["methods"])
    calls = sum(c for c, _, _ in methods.values()) + n_agents * agent_calls
    comp = sum(c for _, c, _ in methods.values()) + n_agents * agent_comp
    prompt = sum(p for _, _, p in methods.values()) + n_agents * agent_prompt
    note = ("upper bound per question; step prompts ~750 tokens (history elided beyond 6,000 characters), aux ~250; "
            "the profile calls the run's model only: the paper's GPT-4o-mini, Llama-3.1-70B and Qwen3-30B-A3B are one run each (--model)")
    rows.append(row("jcql_kbqa", "experiment", "{model}", f"KBQA test: IO, CoT, SC, ToG-style, {n_agents} agent variants", n_test * calls,
                    n_test * prompt, n_test * comp, jf["n_sc"], "estimated",
                    "not rehearsed: estimated from jcql_kbqa_sizes.csv and the per-question call bounds (README.md)",
                    f"{n_test:,} test questions (2 KB settings) x <= {calls} calls; " + note))
    rows.append(row("jcql_kbqa", "experiment", "{model}", "Algorithm 1 training questions (agent + Parse)", n_train * (agent_calls + 1),
                    n_train * (agent_prompt + 400), n_train * (agent_comp + aux), 1, "estimated",
                    "not rehearsed: estimated from jcql_kbqa_sizes.csv and the per-question call bounds (README.md)",
                    f"{n_train:,} training questions (2 KB settings) x <= {agent_calls + 1} calls; " + note))

    # format tax (issue 21): each study's format_tax_arm under free, constrained and decoupled on `n` items; not rehearsed.
    # Requests per item and arm as the arms send them cold (helpers' measurements on the embedded server, issue 21 notes):
    # awakening 6 (3 NLI + 3 QA probes), unseen 4 (+2 restating), brink 1, jcql <= 9 (L=2 agent + restating), misk 4,
    # coe 17 (+11 restating); decoupled re-uses the free answers and adds only the restating pass.
    ft = full["format_tax_runs"]
    per_item = {"awakening": (6, 6, 6), "unseen_entity": (4, 4, 2), "brink": (1, 1, 1), "jcql": (5, 9, 3), "misk": (3, 4, 2),
                "coe": (17, 17, 11)}
    arms = ft["decodings"]
    req = ft["n"] * sum(per_item[s][FT_ARMS.index(a)] for s in ft["studies"] for a in arms)
    rows.append(row("format_tax_runs", "experiment", "{model}", "format tax: every study's parsed step x 3 decodings", req, req * 500,
                    req * 96, 1, "estimated", "not rehearsed: requests per item from the arms' cold runs on the embedded server (issue 21)",
                    f"{ft['n']} items x {len(ft['studies'])} studies x {len(arms)} decodings; ~500 prompt tokens and <= 96 completion "
                    "tokens per request assumed (the arms' prompts are the studies' own)"))

    df = pd.DataFrame(rows, columns=COLUMNS)
    llm_ids = {k for sec in ("experiments", "artifacts") for k, v in reg[sec].items() if v.get("needs_llm")}
    assert set(df["id"]) == llm_ids, (set(df["id"]) ^ llm_ids)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(OUT, index=False)
    print(f"wrote {OUT.relative_to(ROOT)}: {len(df)} rows, {df['requests'].sum():,} requests, "
          f"{df['prompt_tokens'].sum():,} prompt tokens, <= {df['completion_tokens_max'].sum():,} completion tokens")


if __name__ == "__main__":
    main()
