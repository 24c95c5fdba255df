"""The claims ledger (`kgrag_nb.claims`): every paper's claims file is complete and consistent with the registry, the
paper numbers and the outcome frames; a ledger built from saved results gives the hand-computed verdicts; the CLI."""
import json

import numpy as np
import pandas as pd
import pytest

from kgrag_nb.claims import OUTCOMES, bill, decisive_plan, evaluate_claim, judge_check, ledger, ledger_table
from kgrag_nb.cli import main
from kgrag_nb.papers import available_papers, ledger_claims, paper_effect
from kgrag_nb.reproduce import ExperimentResults, load_registry, save_result


def test_every_paper_has_at_least_three_claims_with_registered_parts():
    claims, registry = ledger_claims(), load_registry()
    by_paper = pd.Series([c["paper"] for c in claims]).value_counts()
    assert set(by_paper.index) == {f"{p}.txt" for p in available_papers()} and (by_paper >= 3).all(), by_paper
    for c in claims:
        assert c["outcome"] in OUTCOMES, c["id"]
        assert set(c["artefacts"]) <= set(registry), (c["id"], set(c["artefacts"]) - set(registry))
        exp = OUTCOMES[c["outcome"]]["experiment"]
        assert any(exp in registry[a].uses for a in c["artefacts"]), f"{c['id']}: none of {c['artefacts']} reads {exp}"
        e = paper_effect(c)  # every selector matches a row of the paper's numbers
        if e is not None: assert np.isfinite(e["value"]) and e["value"] != 0, c["id"]
        sign = {">": 1, "<": -1}[c["direction"]]
        if e is not None: assert sign * e["value"] > 0, f"{c['id']}: the paper's own effect points against the claim's direction"


def test_paper_effects_are_read_from_the_numbers():
    get = {c["id"]: c for c in ledger_claims()}
    assert paper_effect(get["brink-hits-any-drop"])["value"] == pytest.approx(0.46 - 0.20)  # GoG, FB15k-237, App. C.2 Table 5
    assert paper_effect(get["awakening-t1-vs-closed-book"])["value"] == pytest.approx(0.394)  # Table 4, T1 39.4 vs No RAG 0.0
    assert paper_effect(get["misk-beats-rag-qa"])["value"] == pytest.approx((32.81 - 31.25) / 100)  # Table 1, TopK=4
    coe = paper_effect(get["coe-acc-vs-senp"])
    assert coe["rows_a"] == coe["rows_b"] == 40  # Table 2: 5 models x 2 datasets x 4 p


def _results(tmp_path, exp_id, **saved) -> ExperimentResults:
    for name, obj in saved.items(): save_result(tmp_path, name, obj)
    (tmp_path / "_SUCCESS.json").write_text(json.dumps(dict(id=exp_id, key="0" * 64, params={})))
    return ExperimentResults(tmp_path)


def test_a_yes_to_everything_judge_makes_the_claim_not_decidable(tmp_path):
    "CoE's ACC claim on saved answers: the judge says yes to every answer, right or wrong, so no verdict rests on it."
    rows = [dict(dataset="hotpotqa", id=f"r{i}", variant=v, condition="irrelevant", p=0.0, run=0, acc=True, fr=None, grounded=None,
                 contains_gold=(v == "CoE") or i % 3 == 0, contains_wrong=False) for i in range(30) for v in ("CoE", "SenP", "WordP")]
    xp = _results(tmp_path, "coe_runs", answers=pd.DataFrame(rows))
    t = ledger({"coe_runs": xp}, [c for c in ledger_claims("chain_of_evidence") if c["id"] in ("coe-acc-vs-senp", "coe-containment-vs-senp")])
    acc, cont = t.set_index("claim").loc["coe-acc-vs-senp"], t.set_index("claim").loc["coe-containment-vs-senp"]
    assert acc["verdict"] == "not decidable (judge)" and acc["judge_yes_rate"] == 1.0 and "says yes to 100%" in acc["why"]
    # containment needs no judge: 20 of 30 records favour CoE, none SenP (exact McNemar p = 2 * 0.5**20)
    assert (cont["verdict"], cont["n"]) == ("replicated", 30) and cont["p"] == pytest.approx(2 * 0.5 ** 20)


def test_ledger_of_a_run_without_the_experiment_says_no_data():
    t = ledger({})
    assert set(t["verdict"]) == {"no data"} and t["why"].str.contains("has no finished").all()
    b = bill(t, {e: 1.0 for e in t["experiment"]})
    assert (b.loc[b["n_needed"].notna() & b["full_units"].notna(), "gpu_hours"] > 0).all()
    dp = decisive_plan(b)
    assert dp.iloc[-1]["experiment"] == "TOTAL" and dp.iloc[-1]["gpu_hours_to_decide"] == pytest.approx(dp.iloc[:-1]["gpu_hours_to_decide"].sum())
    assert list(ledger_table(b).columns)[:4] == ["claim", "where", "comparison", "metric"]


def test_cli_names_a_missing_run(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KGRAG_RUNS", str(tmp_path))
    assert main(["claims", "--run", "nope"]) != 0
    assert "--run 'nope'" in capsys.readouterr().err  # the CLI's one-line error names the run and the fix
    assert main(["plan", "--claims"]) == 0  # no run: the paper effects with an assumed spread
    out = capsys.readouterr().out
    assert "no run yet" in out and "TOTAL" in out


def test_report_front_page_opens_with_the_ledger_and_sections_list_their_claims(tmp_path, capsys):
    "A run whose claims_ledger artefact wrote ledger_full.csv: the front page shows the ledger (escaped, linked to the"
    " artefacts of the run), and brink_fig1's section lists the claims it tests with their verdicts."
    import kgrag_nb.report
    from kgrag_nb.config import get_config
    cfg = get_config(runs_dir=tmp_path / "runs", figures_dir=tmp_path / "figures")
    t = ledger({})  # every claim, no data: a real ledger's columns
    t.loc[t["claim"] == "brink-hits-any-drop", ["verdict", "why", "n", "effect"]] = ["not resolved", "n = 3: <too few>", 3, 0.1]
    t = bill(t, {e: 1.0 for e in t["experiment"]})
    folder = cfg.figures_dir / "claims_ledger"; folder.mkdir(parents=True)
    t.to_csv(folder / "ledger_full.csv", index=False)
    arts = [{"artifact": "claims_ledger", "status": "ok", "outputs": [str(folder / "ledger_full.csv")]},
            {"artifact": "brink_fig1", "status": "ok", "outputs": []}]
    (cfg.runs_dir / "r").mkdir(parents=True)
    (cfg.runs_dir / "r" / "manifest.json").write_text(json.dumps(dict(run_id="r", status="finished", experiments=[], artifacts=arts)))
    page = kgrag_nb.report.build_report("r", cfg=cfg).read_text()
    head = page[:page.index("<h2>Run</h2>")]
    assert "Did the papers' claims replicate?" in head and "brink-hits-any-drop" in head and "coe-acc-vs-senp" in head
    assert "n = 3: &lt;too few&gt;" in head and "<too few>" not in page  # escaped
    assert '<a href="#art-brink_fig1">brink_fig1</a>' in head  # the artefact of this run is linked, others are text
    section = page[page.index('<section id="art-brink_fig1">'):]
    section = section[:section.index("</section>")]
    assert "Claims this artefact tests" in section and "not resolved" in section and "§5.1, Fig. 1" in section
    (cfg.runs_dir / "s").mkdir(); (cfg.runs_dir / "s" / "manifest.json").write_text(json.dumps(dict(run_id="s", status="finished", experiments=[], artifacts=[])))
    assert "This run has no claims ledger" in kgrag_nb.report.build_report("s", cfg=cfg).read_text()


def test_plan_claims_passes_the_model_size(capsys):
    "`kgrag plan --claims` prices a model the plan cannot size from its name when `--params` gives the size, and refuses it otherwise."
    import argparse
    from kgrag_nb.claims import _plan_claims
    from kgrag_nb.plan import UnknownModelSize
    with pytest.raises(UnknownModelSize, match="--params"):
        _plan_claims(argparse.Namespace(model="acme/house-model", params=None, json=True))
    assert _plan_claims(argparse.Namespace(model="acme/house-model", params="70e9", json=True)) == 0
    rows = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    hours = [r["gpu_hours_full_profile"] for r in rows]  # priced at the given size (KBC scoring needs no LLM: 0)
    assert rows and all(h >= 0 for h in hours) and sum(hours) > 0
