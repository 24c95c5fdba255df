"""Shipped rehearsal records (issue 23 item 4): `kgrag_nb/rehearsal/full.csv`, read by `kgrag plan --profile full` when
no local rehearsal exists. One row per (LLM-calling experiment or artefact of studies.yaml, model it calls), from what
the stub rehearsals in this folder measured (`plan_full*.md`: `kgrag plan` over the rehearsal runs' key logs), scaled
where a rehearsal ran reduced, and estimated from the code where none ran (labelled in `status`/`source`/`note`).

    python docs/rehearsal/shipped_records.py      # writes kgrag_nb/rehearsal/full.csv

Units: requests = distinct request keys (n samples count n times); prompt_tokens by the stub's rule (4 characters per
token), every request counted (what is SENT); prefill_tokens = the prompt tokens the server EVALUATES: once per distinct
(model, prompt), since vLLM evaluates a prompt once for a request with `n` samples and its automatic prefix cache reuses
a repeated prompt (the same question's Step-1 answers and samples, CoE's seeded runs, JCQL's SC samples); how each row's
share of repeated prompts was counted is in its note. n_samples = requests per distinct prompt in a row's sampled part.
completion_tokens_max = the requests' max_tokens budgets (an UPPER BOUND: answers that stop early cost less), every
sample counted. `{model}` = the run's own model (`kgrag plan --model`); other ids are the models the full profile names.
"""
import re
from pathlib import Path

import pandas as pd
import yaml

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
OUT = ROOT / "kgrag_nb" / "rehearsal" / "full.csv"
FT_ARMS = ["free", "constrained", "decoupled"]
COLUMNS = ["id", "kind", "model", "role", "requests", "prompt_tokens", "prefill_tokens", "prefill_tokens_min", "completion_tokens_max",
           "n_samples", "status", "source", "note"]
# prefill_tokens_min (what an ideal prefix cache still evaluates) = prefill_tokens x the trie ratio measured on the smoke
# run `smoke-ledger` (its key logs, prompts tokenised with Gemma-3's vocabulary: `plan.trie_tokens` / distinct-prompt
# tokens per experiment). An ESTIMATE: the full profile's prompts are not on this machine, and more questions share
# more, so a full-size ratio is likely lower. Blank where no smoke key log exists (brink_benchmarks, claims_ledger).
SMOKE_TRIE_RATIO = {"awakening_closed_book": 0.254, "awakening_task1": 0.148, "brink_methods": 0.443, "coe_runs": 0.263,
                    "format_tax_runs": 0.308, "jcql_kbqa": 0.150, "misk_runs": 0.312, "awakening_task2": 0.347}


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


def row(id, kind, model, role, requests, prompt_tokens, completion, n_samples, status, source, note="", prefill=None):
    "One record; `prefill` = prompt tokens of the distinct prompts (None: every request's prompt is distinct)."
    prefill = prompt_tokens if prefill is None else prefill
    assert 0 < prefill <= prompt_tokens, (id, model, prefill, prompt_tokens)
    return dict(id=id, kind=kind, model=model, role=role, requests=round(requests), prompt_tokens=round(prompt_tokens),
                prefill_tokens=round(prefill), completion_tokens_max=round(completion), n_samples=n_samples, status=status,
                source=source, note=note)


def awakening_prefill(requests: float, tok_per_req: float, step1_requests: float, group: int, n_probe: int) -> float:
    "Prefill of an awakening model's requests: Step 1's `group` requests per question share one prompt (exact); the rest"
    " (probing: n_probe repeats of an item; awakening: n_samples per temperature of a pair) at 1 in n_probe (an upper bound)."
    return step1_requests * tok_per_req / group + (requests - step1_requests) * tok_per_req / n_probe


def main():
    reg = yaml.safe_load((ROOT / "studies.yaml").read_text())
    full = {k: v["profiles"]["full"] for sec in ("experiments", "artifacts") for k, v in reg[sec].items()}
    p1, p3, p4 = plan_rows("plan_full.md"), plan_rows("plan_full_coe_misk_jcql.md"), plan_rows("plan_full_4.md")
    rows = []

    # awakening: closed-book baseline (exact: prompts from the data only) and Task 1 (main + six other paper models)
    r = p1["awakening_closed_book"]
    n_step1 = 3  # closed_book's n_probe (the notebook's default; the profile keeps it)
    cb_group = n_step1 + full["awakening_closed_book"]["n_samples"]  # Step-1 answers and Hits@k samples: one prompt per question
    rows.append(row("awakening_closed_book", "artifact", "{model}", "answers (Step 1 + samples)", r["requests"], r["prompt_tokens"],
                    r["completion_tokens_max"], full["awakening_closed_book"]["n_samples"], "measured", "rehearsal reh-closed_book (plan_full.md)",
                    f"exact: its prompts depend on the data only; prefill: the {n_step1} Step-1 answers and "
                    f"{full['awakening_closed_book']['n_samples']} samples of a question share its one prompt (1 in {cb_group})",
                    prefill=r["prompt_tokens"] / cb_group))
    r = p1["awakening_task1"]
    others = [m for m in full["awakening_task1"]["models"] if m != "meta-llama/Llama-3.1-8B-Instruct"]  # the default run model is the main one
    per_other = r["other_models"] / len(others)
    main_req = r["requests"] - r["other_models"]
    tok_per_req, comp_per_req = r["prompt_tokens"] / r["requests"], r["completion_tokens_max"] / r["requests"]
    af = full["awakening_task1"]
    aw_group, aw_step1 = 3 + af["n_samples"], (3 + af["n_samples"]) * 88  # 88 CWQ questions had a gold path (README.md, first session)
    aw_note = (f"prefill: Step 1's {aw_group} requests per question (88 questions) share one prompt; probing and awakening "
               f"requests at 1 in n_probe={af['n_probe']} (an upper bound: awakening's n_samples per temperature share more)")
    rows.append(row("awakening_task1", "experiment", "{model}", "main model: every type, probe, query and temperature", main_req,
                    main_req * tok_per_req, main_req * comp_per_req, af["n_samples"], "measured",
                    "rehearsal reh-awaken-gates (plan_full.md)", "tokens split between models by request share; " + aw_note,
                    prefill=awakening_prefill(main_req, tok_per_req, aw_step1, aw_group, af["n_probe"])))
    by_model = full["awakening_task1"].get("max_tokens_by_model") or {}
    for m in others:
        long = m in by_model  # R1-distilled models think before answering: a longer budget per request (studies.yaml)
        rows.append(row("awakening_task1", "experiment", m, "Figs. 5/6 model: main six types, NLI-probing, main temperature", per_other,
                        per_other * tok_per_req, per_other * (by_model[m] if long else comp_per_req), full["awakening_task1"]["n_samples"],
                        "estimated" if long else "measured",
                        "rehearsal reh-awaken-gates, stand-ins stub-2..7 (plan_full.md)",
                        (f"completion budget max_tokens_by_model={by_model[m]} on every request (stand-ins had 24)" if long else
                         "one of six stand-ins: other_models / 6") + "; " + aw_note,
                        prefill=awakening_prefill(per_other, tok_per_req, aw_step1, aw_group, af["n_probe"])))
    r = p4["awakening_task2"]
    ue_q, ue_n = 474 + 644, full["awakening_task2"]["n_samples"]  # CWQ and WebQSP questions at full (README.md, fourth session)
    ue_shared = 4 * ue_q  # <= 4 shared stages a question (extraction, disambiguation, type, decomposition), one request each
    rows.append(row("awakening_task2", "experiment", "{model}", "shared stages + ten Table 3 methods", r["requests"], r["prompt_tokens"],
                    r["completion_tokens_max"], ue_n, "measured", "rehearsal reh4-unseen (plan_full_4.md)",
                    f"prefill: <= {ue_shared:,} shared-stage requests ({ue_q:,} questions x <= 4 stages) each its own prompt, "
                    f"the methods' answers {ue_n} samples of one prompt; tokens by request share (an upper bound)",
                    prefill=r["prompt_tokens"] / r["requests"] * (ue_shared + (r["requests"] - ue_shared) / ue_n)))

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
    from kgrag_nb.studies.coe import evidence as coe
    from kgrag_nb.studies.misk import rag as missing
    r = p4["coe_runs"]
    cf = full["coe_runs"]
    per_other = r["other_models"] / len(cf["models"])
    tok_per_req = r["prompt_tokens"] / r["requests"]
    other_comp = per_other * coe.ANSWER_TOKENS
    runs = len(cf["seeds"])  # the runs answer the same prompts (one seed each): one distinct prompt per `runs` requests
    for m in cf["models"]:
        rows.append(row("coe_runs", "experiment", m, "answers: contexts x p x runs", per_other, per_other * tok_per_req, other_comp,
                        runs, "measured", "rehearsal reh4-coe-full, stand-ins stub-2..6 (plan_full_4.md)",
                        f"other_models / 5; prompt tokens by request share; prefill: the {runs} runs (seeds) share each answer prompt",
                        prefill=per_other * tok_per_req / runs))
    main_req = r["requests"] - r["other_models"]
    rows.append(row("coe_runs", "experiment", "{model}", "answers + features, discrimination, misinformation, rebuild, usability",
                    main_req, main_req * tok_per_req, r["completion_tokens_max"] - len(cf["models"]) * other_comp, runs,
                    "measured", "rehearsal reh4-coe-full (plan_full_4.md)",
                    f"prompt tokens by request share; prefill: its {per_other:,.0f} answers (as many as each other model's) at 1 in "
                    f"{runs} runs, the other stages' requests each its own prompt (usability's runs too: an upper bound)",
                    prefill=(main_req - per_other + per_other / runs) * tok_per_req))
    usability = 30720  # requests of the 2Wiki index + usability stage at full (README.md, fourth session)
    judged = (len(cf["models"]) + 1) * per_other + usability  # at most one verdict per answer (ACC always, FR unless it follows)
    judge_prompt = (template_tokens(coe.CORRECTNESS_JUDGE_PROMPT, 300) + template_tokens(coe.GROUNDEDNESS_JUDGE_PROMPT, 900)) / 2
    rows.append(row("coe_runs", "experiment", cf["judge_model"], "ACC/FR judge", judged, judged * judge_prompt, judged * coe.JUDGE_TOKENS,
                    1, "estimated", "not rehearsed: estimated from the answers of reh4-coe-full (the judge client is not key-logged)",
                    f"upper bound: one verdict per answer of the 6 answer models ({per_other:,.0f} each) and per usability request; "
                    f"prompt ~{judge_prompt:.0f} tokens (templates + question, reference, answer or passage); prefill: every "
                    "verdict's prompt holds its run's answer, so each is its own prompt"))

    # missing-knowledge RAG: each dataset's generator (the profile's `generators`: NQ and the medical set on their own
    # models, misk.generator_clients) measured per stage; the context-recall judge (its own endpoint) is not key-logged
    r = p3["misk_runs"]
    mf = full["misk_runs"]
    # the rehearsal's two LLM stages (stages.csv, reh-misk): NQ (misk.run_nq) and the medical set (misk.run_med)
    stage = {"nq": (7873, 4343689), "med": (4194, 2537146)}
    assert sum(q for q, _ in stage.values()) == r["requests"] and sum(t for _, t in stage.values()) == r["prompt_tokens"]
    n_q = {"nq": mf["n_nq"], "med": mf["n_med"]}
    n_missing = 3 * len(mf["topks"])  # Fig. 4/5 calls a question: one per first KB (wiki, qa, merged) and TopK
    budget = {d: n_q[d] * n_missing * mf["max_tokens_missing"]  # the rest answer with max_tokens_<dataset>; NQ's pseudo QA: 48
              + (stage[d][0] - n_q[d] * n_missing - (n_q[d] if d == "nq" else 0)) * mf[f"max_tokens_{d}"]
              + (48 * n_q[d] if d == "nq" else 0) for d in stage}
    scale = r["completion_tokens_max"] / sum(budget.values())
    label = {"nq": "NQ", "med": "medical"}
    for d, m in mf["generators"].items():
        q, t = stage[d]
        rows.append(row("misk_runs", "experiment", m, f"{label[d]} generator: DirectGen, RAG, 2-way, Misk rows x TopK", q, t,
                        budget[d] * scale, 1, "measured", f"rehearsal reh-misk2, its {label[d]} stage (stages.csv, plan_full_coe_misk_jcql.md)",
                        f"requests and prompt tokens of the {label[d]} stage; completion budgets split by today's per-request budgets "
                        f"({n_missing} Fig. 4/5 calls x {mf['max_tokens_missing']} a question, answers x {mf[f'max_tokens_{d}']}"
                        + (", 256 pseudo QA x 48" if d == "nq" else "") + f") scaled to the rehearsal's total (x{scale:.3f}); "
                        "embedders substituted (MiniLM, BM25): request counts unchanged"))
    n_j = {d: min(mf["llm_judge_questions"], n_q[d]) for d in n_q}
    ctx = 3 * max(mf["topks"]) * 2  # distinct contexts per question: 3 KBs x top-8, original and missing-knowledge queries
    gt_p, attr_p = template_tokens(missing.JUDGE_GT_PROMPT, 700), template_tokens(missing.JUDGE_ATTR_PROMPT, 600 + 300)
    nj = sum(n_j.values())
    rows.append(row("misk_runs", "experiment", mf["judge_model"] or "{model}", "context-recall judge of both datasets (judge_url, judge_model)",
                    nj * (1 + ctx), nj * (gt_p + ctx * attr_p), nj * (64 + ctx * 24), 1, "estimated",
                    "not rehearsed: estimated from missing.llm_judge (the judge client is not key-logged)",
                    f"{nj} judged questions (NQ {n_j['nq']}, medical {n_j['med']}) x (1 ground-truth call, 64 tokens + <= {ctx} "
                    "attribution calls, 24 tokens); judge_model null = the judge endpoint's model, priced as the run's model"))

    # JCQL agent side: not rehearsed (needs the GPU-trained jcql_kbc checkpoints); sizes measured (jcql_kbqa_sizes.csv).
    # The run's model runs every method and Algorithm 1; each model of the profile's `models` (other than the run's)
    # runs Algorithm 1 and the full agent on the test questions again (Table 2's JCQL_<LLM>, the jcql_kbqa notebook)
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
    train_calls, train_prompt, train_comp = agent_calls + 1, agent_prompt + 400, agent_comp + aux  # agent + Parse
    src = "not rehearsed: estimated from jcql_kbqa_sizes.csv and the per-question call bounds (README.md)"
    bound = "upper bound per question; step prompts ~750 tokens (history elided beyond 6,000 characters), aux ~250"
    rows.append(row("jcql_kbqa", "experiment", "{model}", f"KBQA test: IO, CoT, SC, ToG-style, {n_agents} agent variants; "
                    "Algorithm 1 training questions (agent + Parse)", n_test * calls + n_train * train_calls,
                    n_test * prompt + n_train * train_prompt, n_test * comp + n_train * train_comp, jf["n_sc"], "estimated", src,
                    f"{n_test:,} test questions (2 KB settings) x <= {calls} calls + {n_train:,} training questions x <= {train_calls} "
                    f"calls; {bound}; prefill: SC's {jf['n_sc']} samples are of CoT's prompt (counted once, with CoT)",
                    prefill=n_test * (prompt - methods["sc"][2]) + n_train * train_prompt))
    for m in jf["models"]:
        rows.append(row("jcql_kbqa", "experiment", m, "Table 2 JCQL_<LLM>: Algorithm 1 + the full agent on the test questions",
                        n_test * agent_calls + n_train * train_calls, n_test * agent_prompt + n_train * train_prompt,
                        n_test * agent_comp + n_train * train_comp, 1, "estimated", src,
                        f"{n_test:,} test questions x <= {agent_calls} agent calls + {n_train:,} training questions x <= {train_calls} "
                        f"calls; {bound}; run once more unless it is the run's model (then its {{model}} row covers it)"
                        + ("; an API model (OpenAI): priced as the 7-8B class on an H100, its size is not public" if "/" not in m else "")))

    # format tax (issue 21): each study's format_tax_arm under free, constrained and decoupled on `n` items; not rehearsed.
    # Requests per item and arm as the arms send them cold (helpers' measurements on the embedded server, issue 21 notes):
    # awakening 6 (3 NLI + 3 QA probes), unseen 4 (+2 restating), brink 1, jcql <= 9 (L=2 agent + restating), misk 4,
    # coe 17 (+11 restating); decoupled re-uses the free answers and adds only the restating pass.
    ft = full["format_tax_runs"]
    per_item = {"awakening": (6, 6, 6), "awakening_task2": (4, 4, 2), "brink": (1, 1, 1), "jcql": (5, 9, 3), "misk": (3, 4, 2),
                "coe": (17, 17, 11)}
    arms = ft["decodings"]
    req = ft["n"] * sum(per_item[s][FT_ARMS.index(a)] for s in ft["studies"] for a in arms)
    rows.append(row("format_tax_runs", "experiment", "{model}", "format tax: every study's parsed step x 3 decodings", req, req * 500,
                    req * 96, 1, "estimated", "not rehearsed: requests per item from the arms' cold runs on the embedded server (issue 21)",
                    f"{ft['n']} items x {len(ft['studies'])} studies x {len(arms)} decodings; ~500 prompt tokens and <= 96 completion "
                    "tokens per request assumed (the arms' prompts are the studies' own)"))

    rows.append(row("claims_ledger", "artifact", "meta-llama/Llama-3.1-70B-Instruct", "CoE judge P(yes) probe", 1000, 322000, 1000, 1,
                    "estimated", "not rehearsed: probe_prompts=1,000 at full x a ~322-token CoE correctness-judge prompt (the coe_runs judge record)",
                    "max_tokens 1 with logprobs; the judge's model (coe_runs judge_model); each prompt holds its own answer, so each is its own prefill"))
    for r in rows:
        ratio = SMOKE_TRIE_RATIO.get(r["id"])
        r["prefill_tokens_min"] = round(r["prefill_tokens"] * ratio) if ratio is not None else None
        if ratio is not None: r["note"] = (r["note"] + "; " if r["note"] else "") + f"prefill_tokens_min: estimated, x {ratio} (smoke-ledger trie ratio)"
    df = pd.DataFrame(rows, columns=COLUMNS)
    df["prefill_tokens_min"] = df["prefill_tokens_min"].astype("Int64")
    llm_ids = {k for sec in ("experiments", "artifacts") for k, v in reg[sec].items() if v.get("needs_llm")}
    assert set(df["id"]) == llm_ids, (set(df["id"]) ^ llm_ids)
    named = {"awakening_task1": full["awakening_task1"]["models"], "coe_runs": [*full["coe_runs"]["models"], full["coe_runs"]["judge_model"]],
             "misk_runs": list(full["misk_runs"]["generators"].values()), "jcql_kbqa": full["jcql_kbqa"]["models"]}
    for sid, ms in named.items():  # every model the full profile names for an experiment has its row (or is the default run model)
        left = set(ms) - set(df.loc[df["id"] == sid, "model"]) - {"meta-llama/Llama-3.1-8B-Instruct"}
        assert not left, (sid, left)
    assert not df.duplicated(["id", "model"]).any(), "one row per (experiment, model)"
    OUT.parent.mkdir(parents=True, exist_ok=True)
    df.to_csv(OUT, index=False)
    print(f"wrote {OUT.relative_to(ROOT)}: {len(df)} rows, {df['requests'].sum():,} requests, "
          f"{df['prompt_tokens'].sum():,} prompt tokens sent ({df['prefill_tokens'].sum():,} to prefill, "
          f"{df['prefill_tokens_min'].sum():,} with an ideal prefix cache where estimated), "
          f"<= {df['completion_tokens_max'].sum():,} completion tokens")


if __name__ == "__main__":
    main()
