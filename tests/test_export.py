"""`kgrag export latex` (kgrag_nb.export) and the LaTeX tables `save_table` writes (kgrag_nb.reproduce).

A run is built in a temporary folder from real `StudyRun.save_table` / `save_figure` outputs (tables with LaTeX specials,
Unicode, negative numbers, NaN, text holding numbers, rows whose keys collide as macro names, a table written before
tables had a `.tex`), exported, and then:
- every macro of `numbers.tex`, read back, equals its CSV cell, and every number of every CSV has a macro;
- `example.tex`, which inputs the macros and every table and includes every figure, compiles with pdfLaTeX.

pdfLaTeX comes from Debian (`apt-get install texlive-latex-base texlive-latex-recommended`: pdflatex, booktabs,
longtable, graphicx). Without it the compile tests skip saying so, except under `CI=true`, where they fail.
"""
from __future__ import annotations
import csv, json, os, shutil, subprocess, warnings
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import given, settings, strategies as st, HealthCheck

from kgrag_nb.config import get_config
from kgrag_nb.export import (EXPORT_MARKER, ExportError, assign_names, export_latex, is_number, macro_name, macro_words,
                             parse_numbers, row_keys, run_numbers)
from kgrag_nb.reproduce import LATEX_ESCAPES, StudyRun, latex_escape, latex_table, save_table

IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
PDFLATEX = shutil.which("pdflatex")
NO_LATEX = ("pdflatex is not installed, so the LaTeX files are not compiled (Debian: apt-get install texlive-latex-base "
            "texlive-latex-recommended)")


def compile_tex(folder: Path, name: str = "example.tex") -> str:
    "Compile `name` in `folder` with pdfLaTeX (twice: longtable widths); the log on failure."
    if PDFLATEX is None:
        if IN_CI: pytest.fail(f"CI=true and {NO_LATEX}: a CI without a LaTeX engine is a failed CI, not a skipped test")
        pytest.skip(NO_LATEX)
    for _ in range(2):
        r = subprocess.run([PDFLATEX, "-interaction=nonstopmode", "-halt-on-error", name], cwd=folder, capture_output=True,
                           text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-3000:]
    assert (folder / name).with_suffix(".pdf").stat().st_size > 1000
    return r.stdout


def make_run(root: Path) -> tuple:
    "A finished run `r1` under `root`: two artefacts written through `StudyRun`, the second's second table without `.tex`."
    import matplotlib; matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    cfg = get_config(figures_dir=root / "figures", runs_dir=root / "runs", root=root)
    run_dir = cfg.runs_dir / "r1"; run_dir.mkdir(parents=True)
    entries = []
    run = StudyRun("demo_table2", params={"profile": "tiny", "decoding": "constrained"}, cfg=cfg, run_dir=str(run_dir), seed=3)
    run.record_sample_size("questions", 4)
    run.save_table(pd.DataFrame({
        "method": ["No RAG", "T1 > No RAG", "a-b", "a_b", "50% & $x_1$ {§4.2} ~ ^ \\ # [k]NN", "naïve – × ≥ κ"],
        "Hits@1": [0.25, -0.5, 1e-05, 12.0, float("nan"), 0.333333333],
        "n": [4, 4, 4, 4, 4, 4],
        "ours": ["+0.000 (no interval)", "0 of 3", "", "17,615", "y", "z"]}), "table2_vs_paper", "Table 2: Hits@1 (95% CI) of #1 & co")
    fig, ax = plt.subplots(figsize=(2, 2)); ax.plot([0, 1], [0, 1]); run.save_figure(fig, "fig"); plt.close(fig)
    entries.append(dict(run.finish(), status="ok"))
    run = StudyRun("claims_ledger", params={"profile": "tiny"}, cfg=cfg, run_dir=str(run_dir))
    run.save_table(pd.DataFrame({"claim": ["brink-f1-drop", "coe-acc-vs-wordp"], "effect": [-0.0416667, 0.0],
                                 "ci_low": [-0.221, float("nan")], "p": [1.0, 0.03125], "verdict": ["not resolved", "no data"]}),
                   "ledger_full", "Claims ledger")
    old = run.save_table(pd.DataFrame({"n": [8, 8], "auroc": [0.4, 0.41]}), "judge_p_yes", "Judge P(yes)")
    old[2].unlink()  # a table written before tables had a LaTeX file
    entries.append(dict(run.finish(), status="ok"))
    entries.append({"artifact": "broken", "status": "failed", "error": "boom"})
    manifest = {"run_id": "r1", "status": "finished", "profile": "tiny", "model": None, "wall_s": 12.5,
                "llm_usage": {"requests": 3, "cache_hits": 1, "wall_s": 0.25}, "artifacts": entries}
    (run_dir / "manifest.json").write_text(json.dumps(manifest))
    return cfg, manifest


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    cfg, manifest = make_run(root)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        res = export_latex("r1", root / "latex", cfg)
    assert not [w for w in caught if "written by" in str(w.message)]  # this run wrote its own figures: nothing stale
    return cfg, manifest, res


def csv_numbers(path: Path) -> list[str]:
    "The text of every number cell of a CSV, read with the csv module (independent of pandas)."
    with open(path, newline="") as f: rows = list(csv.reader(f))
    return [c for row in rows[1:] for c in row if is_number(c)]


def plain(v) -> float:
    "A number as pandas read it or as text with thousands separators (17,615)."
    return float(str(v).replace(",", ""))


def test_save_table_keeps_csv_and_markdown_bytes(tmp_path):
    "Writing the LaTeX table changes neither the CSV nor the Markdown that save_table wrote before."
    paths = save_table(pd.DataFrame({"method": ["No RAG", "a|b"], "Hits@1": [0.25, 1 / 3], "n": [3, 4]}), tmp_path, "t", "Cap",
                       ["model: m", "seed: 0"])
    assert [p.name for p in paths] == ["t.csv", "t.md", "t.tex"]
    assert paths[0].read_bytes() == b"method,Hits@1,n\nNo RAG,0.25,3\na|b,0.333333,4\n"
    assert paths[1].read_bytes() == (b"**Cap**\n\n| method | Hits@1 | n |\n|---|---|---|\n| No RAG | 0.250 | 3 |\n"
                                     b"| a\\|b | 0.333 | 4 |\n\n- model: m\n- seed: 0\n")


def test_odd_frames_still_give_latex(tmp_path):
    "Duplicated column names, no column, no row, lists and NA in cells: save_table writes a LaTeX table that compiles."
    frames = [pd.DataFrame([[1, 2.5]], columns=["a", "a"]), pd.DataFrame(), pd.DataFrame({"a": []}),
              pd.DataFrame({"l": [[1, 2]], "d": [{"x": 1}], "na": [pd.NA], "cat": pd.Categorical(["u"])})]
    for i, df in enumerate(frames): save_table(df, tmp_path, f"t{i}", f"frame {i}")
    assert "a & a" in (tmp_path / "t0.tex").read_text() and "{[}1, 2{]} & \\{'x': 1\\} &  & u" in (tmp_path / "t3.tex").read_text()
    (tmp_path / "doc.tex").write_text("\\documentclass{article}\\usepackage{booktabs,longtable}\\begin{document}"
                                      + "".join(f"\\input{{t{i}}}" for i in range(len(frames))) + "\\end{document}\n")
    compile_tex(tmp_path, "doc.tex")


def test_caption_facts_from_the_run(tmp_path):
    "StudyRun.save_table's LaTeX caption names the model, n, the decodings of the notebook and its experiments, the CI level."
    xp = tmp_path / "xp"; xp.mkdir()
    (xp / "_SUCCESS.json").write_text(json.dumps({"id": "e", "key": "k", "params": {"decoding": "free"}}))
    run = StudyRun("demo", params={"decoding": "constrained"}, cfg=get_config(figures_dir=tmp_path / "figures"),
                   experiment_dirs={"e": str(xp)})
    run.experiment("e"); run.record_sample_size("questions", 5)
    tex = run.save_table(pd.DataFrame({"x": [1.0], "CI low": [0.5]}), "t", "Demo", ci_level=0.9)[2].read_text()
    assert "\\caption{Demo. model: none (no LLM used); n: questions=5; decoding: constrained, free; intervals: 90\\%.}" in tex
    tex = run.save_table(pd.DataFrame({"x": [1.0], "CI low": [0.5]}), "t", "Demo [decoding: free]")[2].read_text()
    assert "decoding: free{]}. model: none (no LLM used); n: questions=5; interval level not stated.}" in tex


def test_latex_table_caption_and_booktabs(exported):
    cfg, _, res = exported
    tex = (res["out"] / "tables" / "demo_table2" / "table2_vs_paper.tex").read_text()
    assert "\\toprule" in tex and "\\midrule" in tex and "\\bottomrule" in tex
    assert ("\\caption{Table 2: Hits@1 (95\\% CI) of \\#1 \\& co. model: none (no LLM used); n: questions=4; "
            "decoding: constrained.}") in tex
    assert "50\\% \\& \\$x\\_1\\$ \\{\\S{}4.2\\} \\textasciitilde{} \\textasciicircum{} \\textbackslash{} \\# {[}k{]}NN" in tex
    assert "T1 \\textgreater{} No RAG & $-0.500$ & $4$" in tex
    assert (cfg.figures_dir / "demo_table2" / "table2_vs_paper.tex").read_text() == tex  # copied as save_table wrote it


def test_macro_names_are_letters_and_unique(exported):
    _, _, res = exported
    macros = parse_numbers((res["out"] / "numbers.tex").read_text())
    assert len(macros) == res["numbers"] and all(n.isascii() and n.isalpha() and n.startswith("kgrag") for n in macros)
    # 'a-b' and 'a_b' both give AB: both get a letters-only suffix, and both values survive
    ab = {n: v for n, v in macros.items() if n.startswith("kgragDemoTableTwoTableTwoVsPaperABHitsOne")}
    assert set(ab.values()) == {"1e-05", "12"} and all(len(n) == len("kgragDemoTableTwoTableTwoVsPaperABHitsOne") + 7 for n in ab)
    assert macros["kgragDemoTableTwoTableTwoVsPaperTOneNoRAGHitsOne"] == "-0.5"
    assert macros["kgragClaimBrinkFOneDropEffect"] == "-0.0416667" and macros["kgragClaimCoeAccVsWordpP"] == "0.03125"
    assert macros["kgragClaimsLedgerJudgePYesRowTwoAuroc"] == "0.41"  # no unique label column: row numbers
    assert macros["kgragRunWallS"] == "12.5" and macros["kgragRunLlmCacheHits"] == "1" and macros["kgragRunArtefactsFailed"] == "1"
    assert macros["kgragDemoTableTwoNQuestions"] == "4" and macros["kgragDemoTableTwoSeed"] == "3"


def test_macros_equal_the_csvs(exported):
    "Every table macro, read back from numbers.tex, equals its CSV cell; every number of every CSV has one."
    cfg, manifest, res = exported
    macros = parse_numbers((res["out"] / "numbers.tex").read_text())
    records = run_numbers(manifest, cfg)
    assert {r["macro"]: r["value"] for r in records} == macros
    n_cells = 0
    for e in manifest["artifacts"]:
        for out in e.get("outputs", []):
            if not out.endswith(".csv"): continue
            path = cfg.root / out if not Path(out).is_absolute() else Path(out)
            cells = csv_numbers(path)
            ours = [r for r in records if r["parts"][0] == e["artifact"] and r["source"].startswith(f"{e['artifact']}/{path.name}:")]
            assert sorted(r["value"] for r in ours) == sorted(cells), path
            frame, keys = pd.read_csv(path), row_keys(pd.read_csv(path, dtype=str, keep_default_na=False))[1]
            for r in ours:  # the value parses back to the number pandas reads from the same cell
                assert plain(macros[r["macro"]]) == plain(frame.at[keys.index(r["parts"][2]), r["parts"][3]])
            n_cells += len(cells)
    assert n_cells == (5 + 6 + 1) + (2 + 1 + 2) + (2 + 2)  # demo (one NaN, one 17,615), ledger_full (one NaN), judge_p_yes
    assert sum(r["parts"][0] == "Claim" for r in records) == 5


def test_export_folder(exported):
    _, _, res = exported
    out = res["out"]
    assert (res["tables"], res["figures"], res["rendered_from_csv"], res["stale"]) == (3, 1, ["tables/claims_ledger/judge_p_yes"], {})
    assert (out / EXPORT_MARKER).exists() and (out / "figures" / "demo_table2" / "fig.pdf").read_bytes()[:5] == b"%PDF-"
    assert (out / "tables.tex").read_text().splitlines() == ["\\input{tables/demo_table2/table2_vs_paper}",
                                                             "\\input{tables/claims_ledger/ledger_full}", "\\input{tables/claims_ledger/judge_p_yes}"]


def test_example_compiles(exported):
    "The document that inputs numbers.tex and every table and includes every figure compiles with pdfLaTeX."
    _, _, res = exported
    log = compile_tex(res["out"])
    assert "Undefined control sequence" not in log


def test_errors_name_the_input(tmp_path, exported):
    cfg, _, res = exported
    with pytest.raises(FileNotFoundError, match="'nope'"): export_latex("nope", tmp_path / "x", cfg)
    with pytest.raises(ExportError, match="--out"): export_latex("r1", None, cfg)
    (tmp_path / "mine").mkdir(); (tmp_path / "mine" / "paper.tex").write_text("mine")
    with pytest.raises(ExportError, match="not made by `kgrag export latex`"): export_latex("r1", tmp_path / "mine", cfg)
    assert (tmp_path / "mine" / "paper.tex").read_text() == "mine"
    empty = get_config(figures_dir=tmp_path / "f", runs_dir=tmp_path / "runs", root=tmp_path)
    (tmp_path / "runs" / "r2").mkdir(parents=True)
    (tmp_path / "runs" / "r2" / "manifest.json").write_text(json.dumps({"run_id": "r2", "status": "finished", "artifacts": [
        {"artifact": "a", "status": "ok", "outputs": []}]}))
    with pytest.raises(ExportError, match="no table to export"): export_latex("r2", tmp_path / "y", empty)


def test_cli_export_latex(exported, tmp_path, capsys, monkeypatch):
    cfg, _, _ = exported
    from kgrag_nb.cli import build_parser
    import kgrag_nb.export as ex
    monkeypatch.setattr(ex, "get_config", lambda: cfg)
    args = build_parser().parse_args(["export", "latex", "--run", "r1", "--out", str(tmp_path / "latex")])
    assert args.func(args) == 0
    assert "3 tables (1 rendered from their CSV), 1 figures" in capsys.readouterr().out
    assert parse_numbers((tmp_path / "latex" / "numbers.tex").read_text())


def test_macro_words_letters_only():
    assert macro_words("Hits@1 CI low") == "HitsOneCILow" and macro_words("p=0.25") == "PZeroPtTwoFive"
    assert macro_name("a", "", "b") == "kgragAB"
    named = assign_names([{"parts": ("x", "a-b"), "value": "1"}, {"parts": ("x", "a b"), "value": "2"}])
    assert len({r["macro"] for r in named}) == 2


@given(st.lists(st.text(alphabet=st.sampled_from(list(LATEX_ESCAPES) + list("aZ09 .,:;!?'\"()-+=*/@")), max_size=30),
                min_size=1, max_size=12))
def test_macro_words_property(texts):
    for t in texts:
        w = macro_words(t)
        assert w == "" or (w.isascii() and w.isalpha() and w[0].isupper())


SPECIALS = list(LATEX_ESCAPES) + list("aZ09 .,:;!?'\"()-+=*/@")


@settings(max_examples=5, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.text(alphabet=st.sampled_from(SPECIALS), min_size=1, max_size=40), min_size=1, max_size=8))
def test_escaped_text_compiles(tmp_path, texts):
    "Any text of LaTeX specials and the mapped Unicode, as cells, headers and caption, compiles; the table keeps every row."
    folder = tmp_path / f"c{abs(hash(tuple(texts))) % 10**8}"; folder.mkdir()
    df = pd.DataFrame({"text " + t[:5]: [t] for t in dict.fromkeys(texts)} | {"n": [1.5]})
    (folder / "t.tex").write_text(latex_table(df, caption=" ".join(texts), label="tab:t"))
    (folder / "doc.tex").write_text("\\documentclass{article}\\usepackage[T1]{fontenc}\\usepackage{booktabs,longtable}"
                                    "\\begin{document}\\input{t}\\end{document}\n")
    compile_tex(folder, "doc.tex")
    assert all(latex_escape(t).count("\n") == 0 for t in texts)


def test_checkout_run_exports(tmp_path):
    "The last finished run of this checkout, when there is one (runs/ is not in git), exports and compiles."
    cfg = get_config()
    try: from kgrag_nb.report import find_run; find_run(None, cfg)
    except FileNotFoundError: pytest.skip("no finished run in this checkout (run `kgrag reproduce --profile tiny` first)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # figures/ may hold another run's files: the export says so
        try: res = export_latex(None, tmp_path / "latex", cfg)
        except ExportError as e: pytest.skip(str(e))
    macros = parse_numbers((res["out"] / "numbers.tex").read_text())
    assert len(macros) == res["numbers"] > 0
    compile_tex(res["out"])
