"""Paper numbers as data (kgrag_nb.papers): every CSV in kgrag_nb/papers/ checked against the paper's text.

The table checks re-read each table from the plain text in shared/papers/ (tab-separated rows) and compare every
cell the CSV holds for it; the prose checks recompute from the CSV each aggregate the text states (a difference, a
maximum, a ratio) and assert the quoted sentence is in the text. Where the text disagrees with its own table the CSV
keeps the table value and says so in `note`; those tests check the note is there.
"""
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml
from hypothesis import given, settings, strategies as st

from kgrag_nb.config import get_config
from kgrag_nb.papers import (CLAIM_COLUMNS, COLUMNS, KEY, available_papers, compare, paper_file, paper_claims, paper_numbers,
                             paper_text, papers_dir, papers_text_dir)

AW, BR = "awakening_unseen_entity_kgqa", "brink_incomplete_kg_benchmark"
JC = "jcql_joint_kbc_kbqa"
CE = "chain_of_evidence"
MK = "missing_knowledge_rag"
needs_text = pytest.mark.skipif(not papers_text_dir().is_dir(), reason="shared/papers/ (the papers' text) not present")


# ---------------------------------------------------------------- reading a table out of the text
NUM = re.compile(r"-?\d{1,3}(?:,\d{3})+|-?\d+(?:\.\d+)?")
MARKERS = {"Base": ("variant", "base"), "Instruct": ("variant", "instruct"), "2Wiki": ("dataset", "2wiki"),
           "CWQ": ("dataset", "cwq"), "Original": ("block", "original"), "Intersection": ("block", "intersection")}


def block(paper: str, start: str, end: str) -> list[str]:
    "Lines of the paper's text from the first line containing `start` up to the next line containing `end`."
    lines = paper_text(paper).splitlines()
    i = next(k for k, l in enumerate(lines) if start in l)
    j = next(k for k in range(i + 1, len(lines)) if end in lines[k])
    return lines[i:j]


def table_rows(lines: list[str]) -> list[tuple[dict, list[str], list[float]]]:
    "Data rows as (markers seen so far, non-numeric fields, numbers in order); marker lines (2Wiki, Base...) set context."
    ctx, out = {}, []
    for line in lines:
        fields = [f.strip() for f in re.sub(r"<[^>]+>", "", line).split("\t")]
        filled = [f for f in fields if f]
        if len(filled) == 1 and filled[0] in MARKERS:
            k, v = MARKERS[filled[0]]; ctx[k] = v; continue
        nums = [float(f.replace(",", "")) for f in fields[1:] if NUM.fullmatch(f)]
        if nums: out.append((dict(ctx), [f for f in fields if f and not NUM.fullmatch(f)], nums))
    return out


def knowledge_type(label: str) -> str:
    "The awakening type code (T1..T8, No RAG) of a row label in any of the paper's spellings."
    key = re.sub(r"\\text|\\cdot|[\s${}\\\-_^·]", "", label).lower()
    return {"norag": "No RAG", "aqrq1b": "T1", "aqrqb": "T1", "aqrxb": "T1",  # Table 5 prints T1 as A_q - R_x - B
            "aqrxbx": "T2", "bxrxaq": "T3", "brxax": "T5", "axrq1bx": "T7", "axrqbx": "T7", "aqrxzrxb": "T6",
            "aqinstanceof": "T4", "axrq2bx": "T8", "t3": "T3", "t8": "T8"}[key]


def lookup(paper: str, table: str) -> dict:
    "(model, dataset, setting, metric) -> value of one table."
    t = paper_numbers(paper, table=table)
    return {(r.model, r.dataset, r.setting, r.metric): r.value for r in t.itertuples()}


def v(paper, table, model, dataset, setting, metric) -> float:
    return lookup(paper, table)[(model, dataset, setting, metric)]


# ---------------------------------------------------------------- the files themselves
def test_files_schema_keys_and_values():
    assert set(available_papers()) >= {AW, BR, JC, CE, MK}
    for stem in available_papers():
        raw = pd.read_csv(paper_file(stem), dtype=str, keep_default_na=False)
        assert tuple(raw.columns) == COLUMNS
        assert pd.to_numeric(raw["value"], errors="coerce").notna().all(), f"{stem}: non-numeric value"
        assert set(raw["paper"]) == {f"{stem}.txt"}
        assert not raw.duplicated(list(KEY)).any(), raw[raw.duplicated(list(KEY), keep=False)]
        assert (raw["table"] != "").all() and (raw["metric"] != "").all()
    claims = paper_claims()
    assert tuple(claims.columns) == CLAIM_COLUMNS and len(claims[claims["paper"].isin([f"{AW}.txt", f"{BR}.txt"])]) == 4 and (claims["claim"].str.len() > 20).all()


def test_artefacts_are_registered_studies_of_the_same_paper():
    from kgrag_nb.reproduce import _read_registry  # the root studies.yaml and every study folder's study.yaml
    exps, arts = _read_registry(cfg=get_config())
    studies = {k: {"paper": v.paper} for k, v in {**exps, **arts}.items()}
    rows = pd.concat([paper_numbers()[["paper", "artefact"]], paper_claims()[["paper", "artefact"]]])
    for paper, art in set(map(tuple, rows[rows["artefact"] != ""].to_numpy())):
        assert art in studies, f"{art!r} (rows of {paper}) is not in studies.yaml"
        assert studies[art]["paper"] == paper, (art, paper)


@needs_text
def test_every_paper_file_exists():
    for p in set(paper_numbers()["paper"]) | set(paper_claims()["paper"]):
        assert (papers_text_dir() / p).is_file(), p


def test_moved_numbers_are_not_hard_coded_in_modules():
    "Distinctive values moved into the CSVs appear in no module of the package any more (stored once)."
    # The datasets registry describes the Family mirror with its BRINK Table 3 size (17,615 triples) in prose.
    distinctive = ["1066", "69.54", "43.97", "57.59", "45.26", "62.97", "1443", "1668", "1421", "133.0", "51.3", "35.4", "18.8",
                   "0.96", "204087", "198183", "14541"]
    numbers = paper_numbers()["value"].tolist()
    assert all(float(d) in numbers for d in distinctive)  # each is a value of the CSVs
    spelled = lambda d: re.escape(d[:-3]) + "[,_]?" + d[-3:] if d.isdigit() and len(d) > 4 else re.escape(d)  # 17615, 17,615, 17_615
    pattern = re.compile("|".join(rf"(?<![\w.]){spelled(d)}(?![\w.])" for d in distinctive))
    for py in sorted((Path(papers_dir()).parent).glob("*.py")):
        if py.name == "_modidx.py": continue
        hits = pattern.findall(py.read_text(encoding="utf-8"))
        assert not hits, f"{py.name} hard-codes paper numbers {hits}; read them with kgrag_nb.papers.paper_numbers"


# ---------------------------------------------------------------- awakening paper: tables
WIDE_MODELS = ["Llama3.1-8B", "Llama3.1-70B", "Qwen2.5-7B", "Qwen2.5-32B", "Qwen2.5-72B"]  # column order of Tables 2, 4, 5, 10, 11
WIDE = {"Table 2": ("Table 2: The awaken", "6 Evaluation and Results"),
        "Table 4": ("Table 4: The awaken", "samples were identified through NLI probing"),
        "Table 5": ("Table 5: The awaken", "architectural factors such as model depth"),
        "Table 10": ("Table 10: Impact", "Table 11:"),
        "Table 11": ("Table 11: Performance", "D Datasets and Baselines")}


@needs_text
@pytest.mark.parametrize("table", ["Table 2", "Table 4", "Table 5", "Table 10", "Table 11"])
def test_awakening_wide_tables_match_text(table):
    "Every cell of the CSV for the table is in the text's row for its dataset, block and knowledge type, in order."
    rows = table_rows(block(AW, *WIDE[table]))
    have, seen = lookup(AW, table), set()
    if table == "Table 5":  # its Instruct block reprints Table 2 (stored once, as Table 2)
        have |= {k: x for k, x in lookup(AW, "Table 2").items()}
    for ctx, labels, nums in rows:
        variant = "Base" if ctx.get("variant") == "base" else "Instruct"
        tab = "Table 2" if table == "Table 5" and variant == "Instruct" else table
        keys = [(f"{m}-{variant}", ctx["dataset"], knowledge_type(labels[0]), k) for m in WIDE_MODELS for k in ("F", "Hits@1", "Hits@10")]
        assert nums == [lookup(AW, tab)[k] for k in keys], (table, ctx, labels)
        seen |= {(tab, k) for k in keys}
    assert {(table, k) for k in lookup(AW, table)} <= seen  # nothing in the CSV that the text does not print


@needs_text
def test_awakening_table3_matches_text():
    rows = table_rows(block(AW, "Table 3: The performance", "Figure 6:"))
    name = {"QD+DiFaR (question)": "QD-DiFaR (question)", "QD+DiFaR (entity)": "QD-DiFaR (entity)",
            "Ours (T7 and T1*)": "Ours (T7+T1*)", "Ours (T7, T1* and T4)": "Ours (T7+T1*+T4)"}
    have = lookup(AW, "Table 3")
    models = ["Llama3.1-8B-Instruct", "Qwen2.5-32B-Instruct", "Llama3.1-70B-Instruct"]
    got = []
    for _, labels, nums in rows:  # the extraction repeats columns after the 18th: three models x three datasets x 2
        method = name.get(labels[0], labels[0])
        expected = [have[(m, ds, method, k)] for m in models for ds in ("mintaka", "2wiki", "cwq") for k in ("Hits@1", "Hits@10")]
        assert nums[:18] == expected, method
        got.append(method)
    assert len(got) == 10 and len(have) == 10 * 18


@needs_text
def test_awakening_table7_matches_text():
    have = lookup(AW, "Table 7")
    rows = table_rows(block(AW, "Table 7: Awakening results", "For Unanswerable Question Selection"))
    for ctx, labels, nums in rows:
        t = knowledge_type(labels[0])
        expected = [have[("Llama3.1-8B-Instruct", "cwq", f"{p}/{ctx['block']}/{t}", k)] for p in ("qa", "nli") for k in ("F", "Hits@1", "Hits@10")]
        assert nums == expected, (ctx, t)
    assert len(rows) * 6 == len(have) == 84


@needs_text
def test_awakening_tables_8_9_match_text():
    t8 = lookup(AW, "Table 8")
    rows = table_rows(block(AW, "Table 8: The awakening performance", "Table 9:"))
    groups = [["Qwen2.5-7B-Instruct", "Llama3.1-8B-Instruct", "Qwen2.5-32B-Instruct"],
              ["Llama3.1-70B-Instruct", "DeepSeek-R1-Distill-Llama-70B", "Qwen2.5-72B-Instruct"]]  # Table 8 prints two row groups
    assert [labels[0] for _, labels, _ in rows] == ["T3", "T8", "T3", "T8"]
    for i, (_, labels, nums) in enumerate(rows):
        assert nums == [t8[(m, "cwq", labels[0], k)] for m in groups[i // 2] for k in ("F", "Hits@1")]
    assert len(t8) == 4 * 6
    t9 = lookup(AW, "Table 9")
    models = ["Qwen2.5-7B-Instruct", "Llama3.1-8B-Instruct", "Qwen2.5-32B-Instruct", "Llama3.1-70B-Instruct", "Qwen2.5-72B-Instruct"]
    rows = table_rows(block(AW, "Table 9: Impact of the distance", "Figure 7:"))
    assert [knowledge_type(l[0]) for _, l, _ in rows] == ["T7", "T8"]
    for _, labels, nums in rows:
        assert nums == [t9[(m, "cwq", knowledge_type(labels[0]), k)] for m in models for k in ("F", "Hits@1")]
    assert len(t9) == 2 * 10


@needs_text
def test_awakening_table6_api_models_match_text():
    t6 = lookup(AW, "Table 6")
    rows = table_rows(block(AW, "Table 6: Performance on API-based", "Table 7:"))
    ds = [r for r in rows[:7]]  # DeepSeek-V3 block: F, Hits@1, Hits@5 on 2Wiki and CWQ
    for _, labels, nums in ds:
        t = knowledge_type(labels[0])
        assert nums == [t6[("DeepSeek-V3-250324", d, t, k)] for d in ("2wiki", "cwq") for k in ("F", "Hits@1", "Hits@5")]
    gpt = rows[7:]
    assert len(gpt) == 7
    for i, (_, labels, nums) in enumerate(gpt):
        t = "No RAG" if i == 0 else knowledge_type(labels[0])  # the extraction lost the No RAG label (and T1's 2Wiki F)
        keys = [("GPT4.1-mini", d, t, k) for d in ("2wiki", "cwq") for k in ("F", "Hits@1", "Hits@10")]
        assert nums == [t6[k] for k in keys if k in t6], t
    assert len(t6) == 7 * 6 * 2 - 1


@needs_text
def test_awakening_table12_and_figure_quotes_match_text():
    rows = table_rows(block(AW, "Table 12: Statistics of Evaluation Datasets", "QD-DiFaR. Question decomposition"))
    t12 = lookup(AW, "Table 12")
    assert [(l[0], n) for _, l, n in rows] == [("Mintaka", [t12[("", "mintaka", "", "questions")]]),
                                               ("2Wiki", [t12[("", "2wiki", "", "questions")]]),
                                               ("CWQ", [t12[("", "cwq", "", "questions")]])]
    text = " ".join(paper_text(AW).split())
    f6, f7 = lookup(AW, "Fig. 6"), lookup(AW, "Fig. 7")
    assert (f"Instruct version with A_q-R_q-B knowledge scores {f6[('Qwen2.5-32B-Instruct', '', 'T1', 'Hits@1')]}%, whereas the "
            f"distilled R1 version achieves {f6[('DeepSeek-R1-Distill-Qwen-32B', '', 'T1', 'Hits@1')]}%") in text
    m = ("Llama3.1-8B-Instruct", "", "T7")
    assert (f"best Hits@1 score of {f7[(*m, 'best Hits@1')]}% at a temperature of {f7[(*m, 'temperature of best Hits@1')]}, "
            f"and the best Hits@10 score at a temperature of {f7[(*m, 'temperature of best Hits@10')]}") in text


# ---------------------------------------------------------------- awakening paper: aggregates stated in the prose
L8, L70, Q7, Q32 = "Llama3.1-8B-Instruct", "Llama3.1-70B-Instruct", "Qwen2.5-7B-Instruct", "Qwen2.5-32B-Instruct"


@needs_text
def test_awakening_prose_aggregates():
    "Each difference, maximum or value the text quotes, recomputed from the CSV (quote, recomputed, quoted)."
    text = " ".join(paper_text(AW).split())
    t2 = lambda m, d, s, k: v(AW, "Table 2", m, d, s, k)
    t3 = lambda m, d, s, k: v(AW, "Table 3", m, d, s, k)
    t4 = lambda m, d, s, k: v(AW, "Table 4", m, d, s, k)
    best = lambda table, m, d, k, among: max(v(AW, table, m, d, s, k) for s in among)
    types = ["T1", "T2", "T5", "T7", "T6", "T4"]
    methods = list(dict.fromkeys(paper_numbers(AW, table="Table 3").setting))
    checks = [
        # §6.2: T7 is the best type on 2Wiki with (as printed) "Qwen2.5-32B" -- the numbers are Qwen2.5-7B's (note) -- and Llama3.1-70B
        ("achieves the highest scores with Qwen2.5-32B (4.2% Hits@1, 7.3% Hits@10)", t2(Q7, "2wiki", "T7", "Hits@1"), 4.2),
        ("achieves the highest scores with Qwen2.5-32B (4.2% Hits@1, 7.3% Hits@10)", best("Table 2", Q7, "2wiki", "Hits@10", types), 7.3),
        ("and 6.1% Hits@1 with Llama3.1-70B on 2Wiki", best("Table 2", L70, "2wiki", "Hits@1", types), 6.1),
        ("records 34.3% and 46.1% in Hits@1 and Hits@10 on CWQ using Llama3.1-70B", t2(L70, "cwq", "T5", "Hits@10"), 46.1),
        # §6.3 (2): Fig. 6, R1 distillation minus Instruct
        ("showing a 16.2% improvement", v(AW, "Fig. 6", "DeepSeek-R1-Distill-Qwen-32B", "", "T1", "Hits@1") - v(AW, "Fig. 6", "Qwen2.5-32B-Instruct", "", "T1", "Hits@1"), 16.2),
        # §6.4 (1): gains over No RAG
        ("boosts Hits@1 by 5.8% and Hits@10 by 8.5%", t3(L70, "mintaka", "Ours (T7+T1*)", "Hits@1") - t3(L70, "mintaka", "No RAG", "Hits@1"), 5.8),
        ("boosts Hits@1 by 5.8% and Hits@10 by 8.5%", t3(L70, "mintaka", "Ours (T7+T1*)", "Hits@10") - t3(L70, "mintaka", "No RAG", "Hits@10"), 8.5),
        ("Hits@1 and Hits@10 improving by 9.9% and 6.4%", t3(L8, "2wiki", "Ours (T4)", "Hits@1") - t3(L8, "2wiki", "No RAG", "Hits@1"), 9.9),
        ("Hits@1 and Hits@10 improving by 9.9% and 6.4%", t3(L8, "2wiki", "Ours (T4)", "Hits@10") - t3(L8, "2wiki", "No RAG", "Hits@10"), 6.4),
        # §6.4 (2): T7+T1* gives Qwen2.5-32B its best Hits@1 on 2Wiki and CWQ
        ("gives the best Hits@1 scores on 2Wiki and CWQ at 41.3% and", best("Table 3", Q32, "2wiki", "Hits@1", methods), 41.3),
        ("gives the best Hits@1 scores on 2Wiki and CWQ at 41.3% and", t3(Q32, "2wiki", "Ours (T7+T1*)", "Hits@1"), 41.3),
        ("49.6%. The awaken rule-based method", best("Table 3", Q32, "cwq", "Hits@1", methods), 49.6),
        ("49.6%. The awaken rule-based method", t3(Q32, "cwq", "Ours (T7+T1*)", "Hits@1"), 49.6),
        # §6.4 (3): DiFaR (question) vs No RAG on Mintaka; entity vs question queries with Qwen-32B
        ("DiFaR (question) scores 25.9% Hits@1, which is 25.4% lower than No RAG", t3(L8, "mintaka", "DiFaR (question)", "Hits@1"), 25.9),
        ("DiFaR (question) scores 25.9% Hits@1, which is 25.4% lower than No RAG", t3(L8, "mintaka", "No RAG", "Hits@1") - t3(L8, "mintaka", "DiFaR (question)", "Hits@1"), 25.4),
        ("achieve 23.9% and 27.9% Hits@1 with Qwen-32B", t3(Q32, "mintaka", "DiFaR (entity)", "Hits@1"), 23.9),
        ("achieve 23.9% and 27.9% Hits@1 with Qwen-32B", t3(Q32, "mintaka", "QD-DiFaR (entity)", "Hits@1"), 27.9),
        ("below the question embedding methods' performance of 32.5% and 35.8%", t3(Q32, "mintaka", "DiFaR (question)", "Hits@1"), 32.5),
        ("below the question embedding methods' performance of 32.5% and 35.8%", t3(Q32, "mintaka", "QD-DiFaR (question)", "Hits@1"), 35.8),
        # App. B.1: Base models on 2Wiki (Table 4), Instruct Llama3.1-70B with B-R_x-A_x
        ("achieves 2.3% Hits@1 and 11.0% Hits@10, outperforming No RAG", t4("Llama3.1-8B-Base", "2wiki", "T1", "Hits@1"), 2.3),
        ("achieves 2.3% Hits@1 and 11.0% Hits@10, outperforming No RAG", t4("Llama3.1-8B-Base", "2wiki", "T1", "Hits@10"), 11.0),
        ("underperforming it in Hits@10 (3.0%) on 2Wiki", t4("Llama3.1-8B-Base", "2wiki", "No RAG", "Hits@10") - t4("Llama3.1-8B-Base", "2wiki", "T1", "Hits@10"), 3.0),
        ("achieves 5.6% Hits@1 and 17.6% Hits@10 on 1,421 samples", t4(L70, "2wiki", "T5", "Hits@1"), 5.6),
        ("achieves 5.6% Hits@1 and 17.6% Hits@10 on 1,421 samples", t4(L70, "2wiki", "T5", "Hits@10"), 17.6),
        ("achieves 5.6% Hits@1 and 17.6% Hits@10 on 1,421 samples", t4(L70, "2wiki", "T5", "F"), 1421),
        # App. B.2: Qwen2.5-32B-Base with B-R_x-A_x on CWQ (Table 5)
        ("Qwen2.5-32B-Base achieves 34.8% Hits@1 and 66.7% Hits@10", v(AW, "Table 5", "Qwen2.5-32B-Base", "cwq", "T5", "Hits@1"), 34.8),
        ("Qwen2.5-32B-Base achieves 34.8% Hits@1 and 66.7% Hits@10", v(AW, "Table 5", "Qwen2.5-32B-Base", "cwq", "T5", "Hits@10"), 66.7),
        # App. B.3: API models (Table 6)
        ("achieves a Hits@1 score of 16.1% and a Hits@5 score", v(AW, "Table 6", "DeepSeek-V3-250324", "2wiki", "T5", "Hits@1"), 16.1),
        ("of 25.9% on 2Wiki using DeepSeek", v(AW, "Table 6", "DeepSeek-V3-250324", "2wiki", "T5", "Hits@5"), 25.9),
        ("reach a Hits@1 score of 38.1% and Hits@10 score of 45.0% on CWQ with GPT4.1-mini", v(AW, "Table 6", "GPT4.1-mini", "cwq", "T4", "Hits@1"), 38.1),
        ("reach a Hits@1 score of 38.1% and Hits@10 score of 45.0% on CWQ with GPT4.1-mini", v(AW, "Table 6", "GPT4.1-mini", "cwq", "T6", "Hits@1"), 38.1),
        ("reach a Hits@1 score of 38.1% and Hits@10 score of 45.0% on CWQ with GPT4.1-mini", v(AW, "Table 6", "GPT4.1-mini", "cwq", "T6", "Hits@10"), 45.0),
        # App. B.4: QA-probing keeps 110 samples for A_q-R_q-B
        ("110 samples were identified through QA probing", v(AW, "Table 7", L8, "cwq", "qa/original/T1", "F"), 110),
        # App. B.5: second-hop vs first-hop knowledge with Qwen-7B (Table 9)
        ("Qwen-7B-Instruct achieves a Hits@1 score of 38.7% with second-hop knowledge", v(AW, "Table 9", Q7, "cwq", "T8", "Hits@1"), 38.7),
        ("compared to only 8.4% with first-hop knowledge", v(AW, "Table 9", Q7, "cwq", "T7", "Hits@1"), 8.4),
    ]
    for quote, got, quoted in checks:
        assert quote in text, quote
        assert round(got, 1) == quoted, (quote, got, quoted)


@needs_text
def test_awakening_prose_claims_on_tables():
    "Qualitative statements the text makes about its tables, checked on the CSV."
    text = " ".join(paper_text(AW).split())
    # App. B.4: "Under the same evaluation set (Intersection), the two probing methods detect comparable amounts" -> equal F
    t7 = lookup(AW, "Table 7")
    for t in ("No RAG", "T1", "T2", "T5", "T7", "T6", "T4"):
        assert t7[(L8, "cwq", f"qa/intersection/{t}", "F")] == t7[(L8, "cwq", f"nli/intersection/{t}", "F")]
    # App. B.5: "knowledge closer to the correct answer tends to be more effective": T8 beats T7 for every model of Table 9
    t9 = paper_numbers(AW, table="Table 9", metric="Hits@1").pivot(index="model", columns="setting", values="value")
    assert (t9["T8"] > t9["T7"]).all()
    # §6.2 / Table 2 caption: an intersection per model -> one F per (model, dataset)
    assert (paper_numbers(AW, table="Table 2", metric="F").groupby(["model", "dataset"]).value.nunique() == 1).all()
    # §6.3 (1) / Fig. 5 (Table 10, CWQ): Qwen2.5 improves a lot from 7B to 32B, much less from 32B to 72B (mean Hits@1 over types)
    assert "within the Qwen2.5 series, performance improves significantly as the model scales from 7B" in text
    m = paper_numbers(AW, table="Table 10", dataset="cwq", metric="Hits@1").groupby("model").value.mean()
    assert m["Qwen2.5-32B-Instruct"] - m["Qwen2.5-7B-Instruct"] > 2 * (m["Qwen2.5-72B-Instruct"] - m["Qwen2.5-32B-Instruct"]) > 0
    # §6.4 (2): "after incorporating A_q-instance-of (T4), all evaluated LLMs achieved their highest performance on the
    # Mintaka dataset" holds for Llama3.1-8B and Qwen2.5-32B; for Llama3.1-70B T7+T1* is higher (noted in the CSV)
    t3 = paper_numbers(AW, table="Table 3", dataset="mintaka", metric="Hits@1")
    top = t3.loc[t3.groupby("model").value.idxmax()].set_index("model").setting.to_dict()
    assert top == {L8: "Ours (T4)", Q32: "Ours (T4)", L70: "Ours (T7+T1*)"}
    assert "highest" in t3[(t3.model == L70) & (t3.setting == "Ours (T4)")].note.item()


@needs_text
def test_awakening_known_inconsistencies_are_noted():
    "Where the text quotes a number its table does not print, the CSV keeps the table value and `note` says so."
    text = " ".join(paper_text(AW).split())
    notes = {  # (table, model, dataset, setting, metric): (value kept from the table, what the text says)
        ("Table 3", L8, "cwq", "Ours (T7)", "Hits@1"): (40.0, "achieves Hits@1 of 40.1% and 54.0% on Llama3.1-8B-Instruct and Qwen2.5-32B-Instruct"),
        ("Table 3", Q32, "cwq", "Ours (T7)", "Hits@1"): (48.5, "achieves Hits@1 of 40.1% and 54.0% on Llama3.1-8B-Instruct and Qwen2.5-32B-Instruct"),
        ("Table 2", Q7, "2wiki", "T7", "Hits@1"): (4.2, "achieves the highest scores with Qwen2.5-32B (4.2% Hits@1, 7.3% Hits@10)"),
        ("Table 2", L70, "cwq", "T5", "Hits@1"): (34.4, "records 34.3% and 46.1% in Hits@1 and Hits@10 on CWQ using Llama3.1-70B"),
        ("Table 7", L8, "cwq", "nli/original/T1", "F"): (446, "110 samples were identified through QA probing, while 436"),
        ("Table 11", L8, "2wiki", "T7", "Hits@1"): (2.1, "achieves 2.8% and 13.4% on Hits@1 and Hits@10 scores with Llama3.1-8B-Instruct"),
        ("Table 4", L70, "2wiki", "T6", "F"): (133, "133.0"),
    }
    for (table, model, dataset, setting, metric), (kept, quote) in notes.items():
        row = paper_numbers(AW, table=table, model=model, dataset=dataset, setting=setting, metric=metric)
        assert row.value.item() == kept and row.note.item(), (table, model, setting)
        assert quote in text, quote
    # the 54.0 the text gives Qwen2.5-32B is Llama3.1-70B's cell; the 2.8 / 13.4 of App. B.8 are Table 4's Llama3.1-8B-Base 2Wiki T7
    assert v(AW, "Table 3", L70, "cwq", "Ours (T7)", "Hits@1") == 54.0
    assert (v(AW, "Table 4", "Llama3.1-8B-Base", "2wiki", "T7", "Hits@1"), v(AW, "Table 4", "Llama3.1-8B-Base", "2wiki", "T7", "Hits@10")) == (2.8, 13.4)


# ---------------------------------------------------------------- BRINK
DS = {"Family": "family", "FB15k-237": "fb15k237", "Wikidata5m": "wikidata5m"}


@needs_text
def test_brink_tables_match_text():
    t1 = lookup(BR, "Table 1")
    rows = table_rows(block(BR, "Rule Type\tFamily", "Table 1: Statistics of mined rules."))
    assert len(rows) == 6 and len(t1) == 18
    for _, labels, nums in rows:
        rule_type = labels[0].split(":")[0].lower()
        assert nums == [t1[("AMIE 3", d, rule_type, "rules")] for d in DS.values()], rule_type
    t3 = lookup(BR, "Table 3")
    rows = table_rows(block(BR, "Dataset\t#Triples", "Table 3: Statistics of BRINK."))
    assert len(rows) == 6 and len(t3) == 30
    for _, labels, nums in rows:
        name, setting = labels[0].rsplit("-", 1)
        assert nums == [t3[("", DS[name], setting.lower(), k)] for k in ("triples", "train", "val", "test", "total questions")]
    t5 = lookup(BR, "Table 5")
    rows = table_rows(block(BR, "Table 5: Performance of GoG", "Figure 5:"))
    assert len(rows) == 4 and len(t5) == 12
    for _, labels, nums in rows:
        name, setting = labels[0].rsplit(" ", 1)
        assert nums == [t5[("GoG", DS[name], setting.lower(), k)] for k in ("hits_any", "hhr", "f1")]
    t6 = lookup(BR, "Table 6")
    rows = table_rows(block(BR, "Table 6: Performance of backbone", "## I Results"))
    assert len(rows) == 2 and len(t6) == 6
    for _, labels, nums in rows:
        assert nums == [t6[(labels[0], d, "incomplete", "hits_hard")] for d in DS.values()]
    t7 = lookup(BR, "Table 7")
    rows = table_rows(block(BR, "Table 7: Performance of representative", "The consistent performance gap"))
    assert len(rows) == 4 and len(t7) == 16
    for _, (method, setting), nums in rows:
        assert nums == [t7[(method, "", setting.removesuffix(" KG"), k)] for k in ("perm_hits_at_1", "perm_f1", "perm_recall", "perm_precision")]


@needs_text
def test_brink_prose_numbers_and_aggregates():
    text = " ".join(paper_text(BR).split())
    n = lambda table, **f: paper_numbers(BR, table=table, **f).value.item()
    # §3.3: the KGs' sizes quoted in the text
    assert f"spans {n('§3.3', dataset='fb15k237', metric='entities'):,.0f} entities and {n('§3.3', dataset='fb15k237', metric='relations'):.0f} predicates" in text
    assert f"about {n('§3.3', dataset='wikidata5m', metric='entities') / 1e6:.1f} million entities, {n('§3.3', dataset='wikidata5m', metric='relations'):.0f} relations, and over 20 million triples" in text
    assert n("Table 3", dataset="wikidata5m", setting="complete", metric="triples") > 20e6  # "over 20 million triples"
    # Table 1: Total = sum of the rule types
    t1 = paper_numbers(BR, table="Table 1").pivot(index="setting", columns="dataset", values="value")
    assert (t1.drop("total").sum() == t1.loc["total"]).all() and t1.loc["total"].tolist() == [145, 1066, 235]
    # Table 3: Total Qs = train + val + test; "randomly partitioned into training, validation, and test sets using an 8:1:1 ratio";
    # the incomplete KG keeps the questions and loses triples
    assert "using an 8:1:1 ratio" in text
    t3 = paper_numbers(BR, table="Table 3").pivot(index=["dataset", "setting"], columns="metric", values="value")
    assert (t3[["train", "val", "test"]].sum(axis=1) == t3["total questions"]).all()
    for k, share in (("train", 0.8), ("val", 0.1), ("test", 0.1)):
        assert ((t3[k] / t3["total questions"] - share).abs() < 0.01).all(), k
    for d in DS.values():
        assert t3.loc[(d, "incomplete"), "triples"] < t3.loc[(d, "complete"), "triples"]
        assert (t3.loc[(d, "incomplete")].drop("triples") == t3.loc[(d, "complete")].drop("triples")).all()
    # App. C.2: GoG declines "particularly in HHR": the complete -> incomplete drop is larger in HHR than in Hits@Any
    assert "significant performance decline, particularly in HHR" in text
    t5 = paper_numbers(BR, table="Table 5").pivot(index=["dataset", "setting"], columns="metric", values="value")
    for d in ("family", "fb15k237"):
        drop = t5.loc[(d, "complete")] - t5.loc[(d, "incomplete")]
        assert drop["hhr"] > drop["hits_any"] > 0, d
    # App. H: "LLMs answer most questions correctly" with sufficient information
    assert "LLMs answer most questions correctly" in text and (paper_numbers(BR, table="Table 6").value > 0.5).all()
    # App. I: "substantial performance differences between complete and incomplete KGs" -> every metric drops, both methods
    t7 = paper_numbers(BR, table="Table 7").pivot(index=["model", "metric"], columns="setting", values="value")
    assert (t7["complete"] > t7["incomplete"]).all()
    # App. J: retrieval : reasoning failures "approximately 7:3" -> share of retrieval failures 7 / (7 + 3)
    assert "the ratio between these two categories is approximately 7:3" in text
    assert n("App. J", metric="retrieval_share") == 7 / (7 + 3)


@needs_text
def test_brink_claims_are_in_the_text():
    "Each claim's section is in the paper and the claim's key phrase appears in that section's text."
    text = " ".join(paper_text(BR).split())
    key = {"brink_fig1": "both metrics drop noticeably when moving from the complete to the incomplete KG setting",
           "brink_fig2": "we observe a significant drop in HHR when moving from the complete to the incomplete KG setting",
           "brink_fig3": "5.3 Fine-Grained Analysis by Rule Type", "brink_fig4": "5.4 Influence of Entity Labeling"}
    for c in paper_claims(BR).itertuples():
        assert f"{c.section.lstrip('§')} " in text and key[c.artefact] in text, c.artefact


# ---------------------------------------------------------------- compare: properties on generated frames
_keys = st.sampled_from(["a", "b", "c", "d"])


@settings(max_examples=60, deadline=None)
@given(ours_keys=st.lists(_keys, unique=True, max_size=4), paper_keys=st.lists(_keys, unique=True, min_size=1, max_size=4),
       x=st.floats(0, 100, allow_nan=False), long=st.booleans())
def test_compare_keeps_every_value_once(ours_keys, paper_keys, x, long):
    ours = pd.DataFrame({"setting": ours_keys, "m1": [x + i for i in range(len(ours_keys))]})
    paper = pd.DataFrame([dict(paper="p.txt", artefact="", table="Table 9", model="", dataset="", setting=k, metric=m,
                               value=float(i * 10 + j), note="") for i, k in enumerate(paper_keys) for j, m in enumerate(("m1", "m2"))])
    out = compare(ours, paper, on=["setting"], metrics=["m1", "m2"], ours_label="t", long=long)
    wide = out if not long else out.pivot(index=["source", "setting"], columns="metric", values="value").reset_index()
    assert len(wide) == len(ours_keys) + len(paper_keys)
    assert set(out["source"]) <= {"ours (t)", "paper (Table 9)"}
    mine = wide[wide.source == "ours (t)"].set_index("setting")
    theirs = wide[wide.source == "paper (Table 9)"].set_index("setting")
    assert mine["m1"].to_dict() == dict(zip(ours_keys, ours["m1"])) and mine["m2"].isna().all()
    assert theirs["m1"].to_dict() == {k: i * 10.0 for i, k in enumerate(paper_keys)}
    assert theirs["m2"].to_dict() == {k: i * 10.0 + 1 for i, k in enumerate(paper_keys)}
    if not long:  # rows grouped by key: ours first, then the paper's, keys in order of first appearance
        keys = list(dict.fromkeys(ours_keys + paper_keys))
        assert list(dict.fromkeys(out["setting"])) == keys
        assert out["source"].tolist() == [s for k in keys for s in (["ours (t)"] if k in ours_keys else []) + (["paper (Table 9)"] if k in paper_keys else [])]


# ---------------------------------------------------------------- JCQL paper (KBC side: Tables 1, 5, 6, 8, 9; Fig. 3 claim)
JC_COLS = [(d, s, m) for d, s in [("WebQSP", "30% KB"), ("WebQSP", "50% KB"), ("CWQ", "30% KB"), ("CWQ", "50% KB")]
           for m in ["MRR", "Hits@1", "Hits@3", "Hits@10"]]
JC_T1 = ["TransE", "DistMult", "ComplEx", "RotatE", "SimKGC", "KGT5", "BiNet", "CSProm-KG", "DIFT", "IVR", "GoldE",
         "RAA-KGC", "SATKGC", "JCQL_BART-small", "JCQL_Flan-T5-small", "JCQL_T5-small"]


def jc_numbers(line: str) -> list[float]:
    return [float(x) for x in re.findall(r"\d\.\d{3}", line)]


@needs_text
def test_jcql_table1_matches_text():
    lines = block(JC, "TransE (NeurIPS", "Table 1:")
    assert len(lines) == 16
    for model, line in zip(JC_T1, lines):
        nums = jc_numbers(line)
        assert len(nums) == 16
        for (d, s, m), x in zip(JC_COLS, nums): assert v(JC, "Table 1", model, d, s, m) == x, (model, d, s, m)
    assert len(paper_numbers(JC, table="Table 1")) == 16 * 16


@needs_text
def test_jcql_table1_prose_best_and_marks():
    "§4.2: JCQL beats the 13 baselines; true for the best JCQL variant everywhere, for every variant except some Hits@10."
    t = lookup(JC, "Table 1")
    base, ours = JC_T1[:13], JC_T1[13:]
    assert "compared with 1313 SOTA methods" in paper_text(JC) or "13 SOTA methods" in paper_text(JC)
    for d, s, m in JC_COLS:
        best_base = max(t[(b, d, s, m)] for b in base)
        assert max(t[(o, d, s, m)] for o in ours) > best_base, (d, s, m)
        if m != "Hits@10": assert min(t[(o, d, s, m)] for o in ours) > best_base, (d, s, m)
    assert t[("JCQL_BART-small", "WebQSP", "30% KB", "Hits@10")] < t[("SATKGC", "WebQSP", "30% KB", "Hits@10")]
    run = set(paper_numbers(JC, table="Table 1").query("note == ''")["model"])
    assert run == {"TransE", "DistMult", "ComplEx", "RotatE", "KGT5", "JCQL_T5-small"}


@needs_text
def test_jcql_tables_5_6_8_9_match_text():
    text = paper_text(JC)
    for tab, d, line in [("Table 5", "WebQSP", "WebQSP 749,492 1,251 1,714,822 20,000 20,000 130,179"),
                         ("Table 5", "CWQ", "CWQ 672,970 1,232 1,479,924 20,000 20,000 119,654"),
                         ("Table 6", "WebQSP", "WebQSP 749,492 1,251 1,217,899 20,000 20,000 267,114"),
                         ("Table 6", "CWQ", "CWQ 672,970 1,232 1,060,601 20,000 20,000 244,439")]:
        assert line in text
        got = [v(JC, tab, "-", d, "50% KB" if tab == "Table 5" else "30% KB", m)
               for m in ["entities", "relations", "train", "valid", "test", "isolated"]]
        assert got == [float(x.replace(",", "")) for x in line.split()[1:]]
    for d in ("WebQSP", "CWQ"):  # the 30% KB keeps fewer edges and leaves more entities isolated
        assert v(JC, "Table 6", "-", d, "30% KB", "train") < v(JC, "Table 5", "-", d, "50% KB", "train")
        assert v(JC, "Table 6", "-", d, "30% KB", "isolated") > v(JC, "Table 5", "-", d, "50% KB", "isolated")
    assert "WebQSP 8,623 27 0.31" in text and "CWQ 39,776 73 0.18" in text
    for d in ("WebQSP", "CWQ"):  # the ratio column is a percentage; App. A: "less than 1% of the KBC test triples"
        path, test = (v(JC, "Table 8", "JCQL_GPT-4o-mini", d, "reasoning paths", m) for m in ("Number_path", "Number_test"))
        ratio = v(JC, "Table 8", "JCQL_GPT-4o-mini", d, "reasoning paths", "Number_test/Number_path")
        assert round(100 * test / path, 2) == ratio and ratio < 1
    rows = block(JC, "Table 9: Ablation", "Appendix C")  # the 4 data rows sit just above the caption
    lines = paper_text(JC).splitlines()
    i = next(k for k, l in enumerate(lines) if l.startswith("Table 9:"))
    settings = ["[U;D;T]", "ablation row 2", "ablation row 3", "[U] (w/o T, w/o D)"]
    for s, line in zip(settings, lines[i - 4:i]):
        for (d, st, m), x in zip(JC_COLS, jc_numbers(line)): assert v(JC, "Table 9", "JCQL_T5-small", d, f"{st} {s}", m) == x
    assert rows
    for d, st, m in JC_COLS:  # row 1 is Table 1's JCQL_T5-small; row 4 (no D, no T) is KGT5 within 0.001
        assert v(JC, "Table 9", "JCQL_T5-small", d, f"{st} [U;D;T]", m) == v(JC, "Table 1", "JCQL_T5-small", d, st, m)
        assert abs(v(JC, "Table 9", "JCQL_T5-small", d, f"{st} [U] (w/o T, w/o D)", m) - v(JC, "Table 1", "KGT5", d, st, m)) <= 0.0011
        full = v(JC, "Table 9", "JCQL_T5-small", d, f"{st} [U;D;T]", m)  # App. D.1: removing D or T lowers every cell
        assert all(v(JC, "Table 9", "JCQL_T5-small", d, f"{st} {s}", m) < full for s in settings[1:])


@needs_text
def test_jcql_claims_are_in_the_text():
    text = paper_text(JC)
    assert "the performance improves rapidly at lower values, then grows slowly at high values until it stabilizes" in text
    assert "the inference paths involve less than 1% of the KBC test triples" in text
    assert len(paper_claims(JC)) >= 3


# ---------------------------------------------------------------- Chain-of-Evidence paper (coe study)
CE_COLS = [(d, v) for d in ("hotpotqa", "2wiki") for v in ("CoE", "SenP", "WordP")]


def ce_wide(title: str) -> dict:
    "(model, dataset, setting) -> (value, starred) of Tables 2-4 re-read from the text (model on the first row of its block)."
    lines, out, model = block(CE, title, "* indicates"), {}, None
    for l in lines:
        f = [x.strip() for x in l.split("\t")]
        vals = [x for x in f if re.fullmatch(r"\d+\.\d%\*?", x)]
        if len(vals) != 6: continue
        model = f[0] or model
        p = float(next(x for x in f[1:] if re.fullmatch(r"0(\.\d+)?", x)))
        for (d, v), x in zip(CE_COLS, vals): out[(model, d, f"p={p:g} {v}")] = (float(x.rstrip("*%")), x.endswith("*"))
    return out


@needs_text
@pytest.mark.parametrize("table,title", [("Table 2", "Table 2: LLMs’ Accuracy"), ("Table 3", "Table 3: LLMs’ Following Rate"),
                                         ("Table 4", "Table 4: LLMs’ Accuracy (ACC) with CoE")])
def test_coe_wide_tables_match_text(table, title):
    text = ce_wide(title)
    csv = paper_numbers(CE, table=table)
    assert len(text) == len(csv) == 5 * 4 * 6
    for r in csv.itertuples():
        value, star = text[(r.model, r.dataset, r.setting)]
        assert r.value == value and ("*" in r.note) == star, (table, r.model, r.dataset, r.setting)
    assert {r.setting.split()[1] for r in csv.itertuples() if "*" in r.note} == {"SenP", "WordP"}  # every Non-CoE cell starred, no CoE cell


@needs_text
def test_coe_tables_1_and_5_match_text():
    t1 = lookup(CE, "Table 1")
    rows = table_rows(block(CE, "Table 1: The details", "4.2 Non-CoE"))
    got = {}
    ds = None
    for _, fields, nums in rows:
        if fields and fields[0] in ("HotpotQA", "2WikiMultihopQA"): ds = "hotpotqa" if fields[0] == "HotpotQA" else "2wiki"
        got[(ds, fields[-1])] = nums
    for (d, v), (n, k) in got.items():
        assert t1[("", d, v, "samples")] == n and t1[("", d, v, "knowledge pieces")] == k
    t5 = lookup(CE, "Table 5")
    for _, fields, nums in table_rows(block(CE, "Table 5: LLMs’ Accuracy", "we reuse its process")):
        if len(nums) != 4: continue
        for (d, s), x in zip([("hotpotqa", "RAG"), ("hotpotqa", "RAG+ScopeCoE"), ("2wiki", "RAG"), ("2wiki", "RAG+ScopeCoE")], nums):
            assert t5[(fields[0], d, s, "ACC")] == x
    assert len(paper_numbers(CE, table="Table 5", metric="ACC")) == 20


def _ce_agrees(got: float, quoted: float) -> bool:
    "The paper's one-decimal figure is `got` rounded or truncated."
    return any(abs(x - quoted) < 1e-6 for x in (round(got + 1e-9, 1), round(got - 1e-9, 1), int(got * 10 + 1e-9) / 10))


def _ce_frame(table):
    d = paper_numbers(CE, table=table)
    return d.assign(p=d.setting.str.extract(r"p=([\d.]+)")[0].astype(float), v=d.setting.str.split().str[1])


@needs_text
def test_coe_prose_aggregates():
    "Every aggregate §4.1, §5.2, §6.2, §7.2 and §8.4 state, recomputed from the tables (means over models, datasets and p)."
    text = " ".join(paper_text(CE).split())
    t2, t3, t4 = _ce_frame("Table 2"), _ce_frame("Table 3"), _ce_frame("Table 4")
    mean = lambda d, v: d[d.v == v].value.mean()
    drop = lambda d, v, models=None: (lambda g: g[g.p == 0].value.mean() - g[g.p == 0.75].value.mean())(d[(d.v == v) & (d.model.isin(models) if models else True)])
    t5 = paper_numbers(CE, table="Table 5", metric="ACC").groupby(["dataset", "setting"]).value.mean()
    weak, strong = ["GPT-3.5", "Llama2-13B"], ["GPT-4", "Llama3-70B", "Qwen2.5-32B"]
    checks = [
        ("we obtained 676 and 660 samples that contain CoE", v(CE, "Table 1", "", "hotpotqa", "CoE", "samples"), 676),
        ("CoE achieves an average accuracy of 92.0% across five LLMs", mean(t2, "CoE"), 92.0),
        ("outperforming Non-CoE variants SenP and WordP by 22.5% and 16.3%", mean(t2, "CoE") - mean(t2, "SenP"), 22.5),
        ("outperforming Non-CoE variants SenP and WordP by 22.5% and 16.3%", mean(t2, "CoE") - mean(t2, "WordP"), 16.3),
        ("the ACC of LLMs with CoE only decreases by 1.8%", drop(t2, "CoE"), 1.8),
        ("the ACC decreases by 12.9% and 9.0% under the Non-CoE variants", drop(t2, "SenP"), 12.9),
        ("the ACC decreases by 12.9% and 9.0% under the Non-CoE variants", drop(t2, "WordP"), 9.0),
        ("CoE outperforms Non-CoE by 14.6% in ACC", t2[(t2.p == 0) & (t2.v == "CoE")].value.mean() - t2[(t2.p == 0) & (t2.v != "CoE")].value.mean(), 14.6),
        ("under CoE, the average FR reaches 85.4%", mean(t3, "CoE"), 85.4),
        ("which is 20.6% and 16.2% higher than the SenP and WordP", mean(t3, "CoE") - mean(t3, "SenP"), 20.6),
        ("which is 20.6% and 16.2% higher than the SenP and WordP", mean(t3, "CoE") - mean(t3, "WordP"), 16.2),
        ("the FR of LLMs with CoE decreases by 3.6%", drop(t3, "CoE"), 3.6),
        ("demonstrate a 6.6% reduction in FR when processing CoE", mean(t2, "CoE") - mean(t3, "CoE"), 6.6),
        ("under CoE, the average ACC of LLMs reaches 84.1%", mean(t4, "CoE"), 84.1),
        ("shows 6.2% and 6.3% smaller decreases", drop(t4, "SenP") - drop(t4, "CoE"), 6.2),
        ("shows 6.2% and 6.3% smaller decreases", drop(t4, "WordP") - drop(t4, "CoE"), 6.3),
        ("results in an 18.0% ACC drop for LLMs equipped with CoE", drop(t4, "CoE"), 18.0),
        ("(with average ACC decreasing by 34.5%)", drop(t4, "CoE", weak), 34.5),
        ("(with average ACC decreasing by 7.1%)", drop(t4, "CoE", strong), 7.1),
        ("achieves average ACC of 77.8% and 81.6% on HotpotQA", t5[("hotpotqa", "RAG+ScopeCoE")], 77.8),
        ("achieves average ACC of 77.8% and 81.6% on HotpotQA", t5[("2wiki", "RAG+ScopeCoE")], 81.6),
        ("outperforming RAG by 10.4% and 28.7%", t5[("hotpotqa", "RAG+ScopeCoE")] - t5[("hotpotqa", "RAG")], 10.4),
        ("outperforming RAG by 10.4% and 28.7%", t5[("2wiki", "RAG+ScopeCoE")] - t5[("2wiki", "RAG")], 28.7),
        ("fewer knowledge pieces (4.6 for HotpotQA and 4.8 for 2WikiMultihopQA)", v(CE, "Table 5", "", "2wiki", "RAG+ScopeCoE", "snippets"), 4.8),
    ]
    for quote, got, quoted in checks:
        assert quote in text, quote
        assert _ce_agrees(got, quoted), (quote, got, quoted)  # the paper rounds or truncates to one decimal


@needs_text
def test_coe_prose_disagrees_with_tables():
    "Where the prose quotes an aggregate its tables do not give (recomputed as above, every other aggregate matches)."
    text = " ".join(paper_text(CE).split())
    t3, t4 = _ce_frame("Table 3"), _ce_frame("Table 4")
    mean = lambda d, v: d[d.v == v].value.mean()
    drop = lambda d, v: d[(d.v == v) & (d.p == 0)].value.mean() - d[(d.v == v) & (d.p == 0.75)].value.mean()
    wrong = [  # (quote, recomputed, quoted)
        ("which is 21.4% and 15.3% higher than the SenP and WordP types", mean(t4, "CoE") - mean(t4, "SenP"), 21.4),  # tables: 18.6
        ("which is 21.4% and 15.3% higher than the SenP and WordP types", mean(t4, "CoE") - mean(t4, "WordP"), 15.3),  # tables: 15.5
        ("while the FR drops by 9.7% and 7.9% under Non-CoE", drop(t3, "SenP"), 9.7),  # tables: 9.6
        ("while the FR drops by 9.7% and 7.9% under Non-CoE", drop(t3, "WordP"), 7.9),  # tables: 7.8
    ]
    for quote, got, quoted in wrong:
        assert quote in text, quote
        assert not _ce_agrees(got, quoted), (quote, got, quoted)
    # Table 4's p = 0 rows repeat Table 2's (the same contexts: no misinformation added)
    t2 = _ce_frame("Table 2")
    assert t2[t2.p == 0].set_index(["model", "dataset", "setting"]).value.equals(t4[t4.p == 0].set_index(["model", "dataset", "setting"]).value)


# ---------------------------------------------------------------- missing-knowledge RAG paper (missing_knowledge_rag.txt)
def _mk(table, metric, setting, dataset=None) -> float:
    t = paper_numbers(MK, table=table, metric=metric, setting=setting)
    return float((t if dataset is None else t[t["dataset"] == dataset])["value"].iloc[0])


@needs_text
@pytest.mark.parametrize("table,first,last", [("Table 1", "EM\tF1", "Table 1: A comparison"),
                                              ("Table 3", "ROUGE_1\tROUGE_2", "Table 3: A comparison"),
                                              ("Table 4", "QA Pairs Recall", "Table 4: Results")])
def test_missing_tables_match_text(table, first, last):
    "Every row of the CSV is a row of the text's table: its label, then exactly its numbers in column order."
    text = paper_text(MK)
    block = text[text.index(first):text.index(last)]
    t = paper_numbers(MK, table=table)
    for (ds, setting), g in t.groupby(["dataset", "setting"], sort=False):
        label = setting.split(", ")[-1]
        squash = lambda x: re.sub(r"\s+", "", x)  # the text writes "QA Pairs + QA Pairs" once
        found = [[float(x) for x in re.findall(r"\d+\.\d+|\d+", "\t".join(cells[i + 1:]))]
                 for cells in (l.split("\t") for l in block.splitlines()) for i, c in enumerate(cells) if squash(c) == squash(label)]
        assert g["value"].tolist() in found, (table, ds, setting, found)


@needs_text
def test_missing_table2_matches_text_and_sums():
    text = paper_text(MK)
    for v in paper_numbers(MK, table="Table 2")["value"]: assert f"{int(v):,}" in text
    for ds in ("NQ", "Huatuo-26M"):  # the merged KB is exactly the sum: the union's md5 de-duplication removed nothing
        assert _mk("Table 2", "#Text Chunks", "Wikipedia", ds) + _mk("Table 2", "#Text Chunks", "History QA Pairs", ds) \
            == _mk("Table 2", "#Text Chunks", "Merged KB", ds)
    # §3.1 rounds the NQ Wikipedia and merged counts (4.8 and 7.3 million) but says the QA pairs number 128,000,
    # which Table 2 contradicts (2,500,931): recorded, not reconciled
    assert "4.8 million" in text and "7.3 million" in text and "128,000 QA pairs" in text


def test_missing_table1_em_exceeds_f1_in_every_row():
    "The oddity the study reports strict and containment EM for: the paper's EM > F1 in all 12 rows."
    t = paper_numbers(MK, table="Table 1").pivot(index="setting", columns="metric", values="value")
    assert len(t) == 12 and (t["EM"] > t["F1"]).all()


# (§, delta quoted in the text, table, metric, (setting, dataset) minuend, (setting, dataset) subtrahend)
MK_DELTAS = [
    ("3.3", 3.91, "Table 1", "EM", "TopK=2, QA Pairs", "TopK=2, Wiki"),
    ("3.3", 4.24, "Table 1", "F1", "TopK=2, QA Pairs", "TopK=2, Wiki"),
    ("3.3", 1.56, "Table 1", "EM", "TopK=4, QA Pairs", "TopK=4, Wiki"),
    ("3.3", 2.85, "Table 1", "F1", "TopK=4, QA Pairs", "TopK=4, Wiki"),
    ("3.3", 1.56, "Table 1", "EM", "TopK=4, Misk QA Pairs+QA Pairs", "TopK=4, QA Pairs"),
    ("3.3", 1.09, "Table 1", "F1", "TopK=4, Misk QA Pairs+QA Pairs", "TopK=4, QA Pairs"),
    ("3.3", 2.34, "Table 1", "EM", "TopK=4, Misk QA Pairs+QA Pairs", "TopK=4, Misk Wiki+Wiki"),
    ("3.3", 3.36, "Table 1", "F1", "TopK=4, Misk QA Pairs+QA Pairs", "TopK=4, Misk Wiki+Wiki"),
    ("3.3", 3.52, "Table 1", "EM", "TopK=4, Misk QA Pairs+Wiki", "TopK=4, 2-way retrieval"),
    ("3.3", 3.33, "Table 1", "F1", "TopK=4, Misk QA Pairs+Wiki", "TopK=4, 2-way retrieval"),
    ("3.4", 0.14, "Table 3", "ROUGE_1", "TopK=2, QA Pairs", "TopK=2, Wiki"),
    ("3.4", 0.8, "Table 3", "BLEU_1", "TopK=2, QA Pairs", "TopK=2, Wiki"),
    ("3.4", 1.37, "Table 3", "ROUGE_1", "TopK=4, Misk QA Pairs+QA Pairs", "TopK=4, QA Pairs"),
    ("3.4", 1.35, "Table 3", "ROUGE_1", "TopK=4, Misk Wiki+Wiki", "TopK=4, Wiki"),
    ("3.4", 3.4, "Table 3", "BLEU_1", "TopK=4, Misk QA Pairs+QA Pairs", "TopK=4, QA Pairs"),
    ("3.4", 3.52, "Table 3", "BLEU_1", "TopK=4, Misk Wiki+Wiki", "TopK=4, Wiki"),
    ("3.5", 8.09, "Table 4", "QA Pairs Recall", ("Mis Wiki+QA pairs", "NQ"), ("2-way-retrieval", "NQ")),
    ("3.5", 2.41, "Table 4", "QA Pairs Recall", ("Mis Wiki+QA pairs", "Huatuo-26M"), ("2-way-retrieval", "Huatuo-26M")),
    ("3.5", 1.93, "Table 4", "Wiki Recall", ("Mis QA Pairs+Wiki", "NQ"), ("2-way-retrieval", "NQ")),
    ("3.5", 1.7, "Table 4", "Wiki Recall", ("Mis QA Pairs+Wiki", "Huatuo-26M"), ("2-way-retrieval", "Huatuo-26M")),
]
# recall deltas between the OrigQ and MisQ columns of one row (§3.3, §3.4)
MK_RECALL_DELTAS = [("3.3", 2.69, "Table 1", "TopK=4, Misk Wiki+Wiki"), ("3.3", 25.84, "Table 1", "TopK=4, Misk QA Pairs+Wiki"),
                    ("3.3", 3.96, "Table 1", "TopK=4, Misk Wiki+QA Pairs"), ("3.4", 2.17, "Table 3", "TopK=4, Misk QA Pairs+QA Pairs"),
                    ("3.4", 0.45, "Table 3", "TopK=4, Misk Wiki+Wiki"), ("3.4", 1.88, "Table 3", "TopK=4, Misk Merged KB")]


@pytest.mark.parametrize("sec,delta,table,metric,a,b", MK_DELTAS)
def test_missing_deltas_quoted_in_text(sec, delta, table, metric, a, b):
    va = _mk(table, metric, *a) if isinstance(a, tuple) else _mk(table, metric, a)
    vb = _mk(table, metric, *b) if isinstance(b, tuple) else _mk(table, metric, b)
    assert round(va - vb, 2) == delta, (sec, va, vb)


@pytest.mark.parametrize("sec,delta,table,setting", MK_RECALL_DELTAS)
def test_missing_recall_deltas_quoted_in_text(sec, delta, table, setting):
    assert round(_mk(table, "Context_Recall_MisQ", setting) - _mk(table, "Context_Recall_OrigQ", setting), 2) == delta


@needs_text
def test_missing_deltas_and_headlines_are_in_text():
    text = paper_text(MK)
    for sec, delta, *_ in MK_DELTAS + MK_RECALL_DELTAS: assert f"{delta}%" in text, (sec, delta)
    assert _mk("Table 1", "EM", "TopK=4, Misk Merged KB") == 37.11 and "37.11%" in text and "25.74%" in text
    assert _mk("Table 3", "ROUGE_1", "TopK=4, Misk Merged KB") == 18.63 and "18.63%" in text and "19.13%" in text


# ---------------------------------------------------------------- JCQL paper (KBQA side: Tables 2, 3, 4; Figs. 2, 4, 5 claims)
JQ_COLS = [("WebQSP", "30% KB"), ("WebQSP", "50% KB"), ("CWQ", "30% KB"), ("CWQ", "50% KB")]
JQ_T2 = {"GPT-4o-mini": "GPT-4o-mini 0", "CoT": "CoT (NeurIPS", "SC": "SC (ICLR", "DecAF_Ans": "DECAFAns", "KGT5": "KGT5 (ACL",
         "BiNet": "BiNet (SIGKDD", "KG-CoT": "KG-CoT (IJCAI", "ToG": "ToG (ICLR", "GoG": "GoG (EMNLP", "PoG": "PoG (NeurIPS",
         "LMP": "LMP (ACL", "PDRR": "PDRR (AAAI", "JCQL_Qwen3-30B-A3B": "JCQLQwen3-30B-A3B ", "JCQL_LLaMA3.1-70B": "JCQLLLaMA3.1-70B ",
         "JCQL_GPT-4o-mini": "JCQLGPT-4o-mini "}


def jq_line(start: str, after: str) -> list[float]:
    "The three-decimal numbers of the first line starting with `start` after the first line starting with `after`."
    lines = paper_text(JC).splitlines()
    i = next(k for k, l in enumerate(lines) if l.startswith(after))
    line = next(l for l in lines[i:] if l.startswith(start))
    return [float(x) for x in re.findall(r"(?<![\w.])\d\.\d{3}(?![\w.])", line)]


@needs_text
def test_jcql_kbqa_tables_2_3_4_match_text():
    for model, start in JQ_T2.items():
        nums = jq_line(start, "Method WebQSP CWQ")
        cols = [("WebQSP", "w/o KB"), ("CWQ", "w/o KB")] if len(nums) == 2 else JQ_COLS
        assert len(nums) == len(cols) and (model in ("GPT-4o-mini", "CoT", "SC")) == (len(nums) == 2)
        for (d, s), x in zip(cols, nums): assert v(JC, "Table 2", model, d, s, "Hits@1") == x, (model, d, s)
    for model, start in [("JCQL", "JCQL 0"), ("JCQL w/o generate", "JCQL w/o generate"), ("JCQL w/o complete", "JCQL w/o complete")]:
        for (d, s), x in zip(JQ_COLS, jq_line(start, "Table 2:")): assert v(JC, "Table 3", model, d, s, "Hits@1") == x
    lines = block(JC, "Data set Method 30% KB 50% KB", "Table 4:")[2:]
    assert len(lines) == 14
    d = None
    for line in lines:
        parts = line.split()
        if parts[0] in ("CWQ", "WebQSP"): d, parts = parts[0], parts[1:]
        for (s, m), x in zip([("30% KB", "LLM call"), ("30% KB", "Time (s)"), ("50% KB", "LLM call"), ("50% KB", "Time (s)")], parts[1:]):
            assert v(JC, "Table 4", parts[0], d, s, m) == float(x), (parts[0], d, s, m)
    assert len(paper_numbers(JC, table="Table 2")) == 3 * 2 + 12 * 4 and len(paper_numbers(JC, table="Table 4")) == 14 * 4
    run = set(paper_numbers(JC, table=["Table 2", "Table 3", "Table 4"]).query("note == ''")["model"])
    assert run == {"GPT-4o-mini", "CoT", "SC", "ToG", "JCQL_Qwen3-30B-A3B", "JCQL_LLaMA3.1-70B", "JCQL_GPT-4o-mini", "JCQL",
                   "JCQL w/o generate", "JCQL w/o complete", "JCQL-SLM"}


@needs_text
def test_jcql_kbqa_prose_aggregates():
    text = " ".join(paper_text(JC).split())
    t2, t3, t4 = lookup(JC, "Table 2"), lookup(JC, "Table 3"), lookup(JC, "Table 4")
    # §4.3: JCQL with GPT-4o-mini is best in every KB column, above every baseline that also uses GPT-4o-mini
    assert "achieves the best performance, outperforming all baselines that also employ GPT-4o-mini" in text
    for d, s in JQ_COLS:
        col = {m: x for (m, dd, ss, _), x in t2.items() if (dd, ss) == (d, s)}
        assert max(col, key=col.get) == "JCQL_GPT-4o-mini", (d, s)
        # Table 3's JCQL row is Table 2's JCQL_GPT-4o-mini row
        assert t3[("JCQL", d, s, "Hits@1")] == t2[("JCQL_GPT-4o-mini", d, s, "Hits@1")]
        # §4.4: removing complete costs more than removing generate, and both cost something
        full, wo_g, wo_c = (t3[(m, d, s, "Hits@1")] for m in ("JCQL", "JCQL w/o generate", "JCQL w/o complete"))
        assert full > wo_g > wo_c, (d, s)
    assert "the absence of complete causes a more substantial performance decline in JCQL than the absence of generate" in text
    # §4.5: JCQL has the fewest LLM calls and the shortest time in every column, and beats JCQL-SLM
    assert "JCQL achieves the best performance in terms of" in text and "JCQL outperforms JCQL-SLM" in text
    for d in ("CWQ", "WebQSP"):
        for s in ("30% KB", "50% KB"):
            for m in ("LLM call", "Time (s)"):
                col = {k[0]: x for k, x in t4.items() if k[1:] == (d, s, m)}
                assert len(col) == 7 and min(col, key=col.get) == "JCQL" and col["JCQL"] < col["JCQL-SLM"], (d, s, m)
    # §3.4: N = 2 LLM calls per step besides the thought (the text extraction doubles inline math: "NN is 22")
    assert "Thus the value of NN is 22" in text and "LL is set to 1010" in text


@needs_text
def test_jcql_kbqa_claims_are_in_the_text():
    text = " ".join(paper_text(JC).split())
    key = {"jcql_fig2": "without reasoning paths, the performance of JCQL declines by at least",
           "jcql_fig4": "the total running time is approximately linear to the number of questions in the training data set",
           "jcql_fig5": "performance growth diminishes when the sample size exceeds 10"}
    got = paper_claims(JC).set_index("artefact")
    for art, phrase in key.items():
        assert phrase in text and got.loc[art, "section"].lstrip("§").split(".")[0].replace("App ", "") in text, art
