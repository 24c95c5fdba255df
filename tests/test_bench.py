"""Tests of the benchmarks: `kgrag_nb.bench` (general: llm, kg, embed) and the Unseen-Entity study's own `difar` benchmark
(registered in `kgrag_nb.studies.awakening.task2` through the `benchmark` hook, issue 24)."""
import pytest
from kgrag_nb.config import get_config


def test_bench_embed_small():
    from kgrag_nb.bench import bench_embed
    r = bench_embed(n=24, rounds=1)
    assert r["texts"] == 24 and r["max_abs_diff"] < 1e-5 and r["threads_after"] >= 1 and r["before_texts_per_s"] > 0
    assert not any(k.startswith("full_") for k in r)  # the DiFaR projection is the study's benchmark now


def test_full_difar_texts_tiny_empty_cache(tmp_path):
    from kgrag_nb.studies.awakening.task2 import full_difar_texts
    rows = full_difar_texts(get_config(cache_dir=tmp_path), profile="tiny")  # an empty cache: everything to encode
    assert [x["dataset"] for x in rows] == ["cwq"] and rows[0]["cached"] == 0
    assert 0 < rows[0]["to_encode"] == rows[0]["new_texts"] == rows[0]["distinct_texts"] <= rows[0]["triples"] <= 200


def test_bench_difar_projects_what_is_left(tmp_path):
    from kgrag_nb.studies.awakening.task2 import bench_difar, full_difar_texts
    cfg = get_config(cache_dir=tmp_path)
    r = bench_difar(n=32, profile="tiny", cfg=cfg)
    left = sum(x["to_encode"] for x in full_difar_texts(cfg, profile="tiny"))
    assert r["texts_timed"] == 32 and r["texts_per_s"] > 0 and r["tiny_cwq_texts_to_encode"] == r["tiny_texts_to_encode"] == left
    assert abs(r["tiny_hours"] - round(left / r["texts_per_s"] / 3600, 2)) <= 0.01


# issue 23 item 1: the stage arithmetic of `kgrag bench llm-stages` (pure parts, hand-computed)
def test_stage_split_hand_computed():
    import pytest
    from kgrag_nb.bench import stage_split
    s = stage_split(2.0, [(120, 1.2), (1, 0.2), (1, 0.25), (1, 0.15)], http_s=2.5)
    assert (s["prompt_tokens_evaluated"], s["decode_steps"]) == (120, 3)
    assert s["prefill_s"] == pytest.approx(1.2) and s["decode_s"] == pytest.approx(0.6)
    assert s["python_s"] == pytest.approx(0.2) and s["http_overhead_s"] == pytest.approx(0.5)
    restored = stage_split(0.3, [(1, 0.1)])  # a snapshot hit: no prompt evaluation, one decoded token, no HTTP side
    assert restored["prefill_s"] == 0 and restored["decode_steps"] == 1 and "http_overhead_s" not in restored
    with pytest.raises(ValueError, match="shorter than its evaluations"): stage_split(1.0, [(50, 1.5)])


def test_summarize_stages_ratios_are_per_request_medians():
    import pytest
    from kgrag_nb.bench import stage_split, summarize_stages
    def row(req, setting, pre, dec, http, text):  # 0.1 s of Python per request; prompt of 10 tokens, 4 decode steps
        return dict(request=req, setting=setting, completion_tokens=5, text=text,
                    **stage_split(pre + dec + 0.1, [(10, pre)] + [(1, dec / 4)] * 4, http_s=http))
    rows = [row(0, "today", 1.0, 0.4, 2.0, "a"), row(1, "today", 2.0, 0.4, 3.0, "b"), row(2, "today", 3.0, 0.4, 4.0, "c"),
            row(0, "new", 0.5, 0.4, 1.0, "a"), row(1, "new", 1.0, 0.4, 2.4, "b"), row(2, "new", 2.0, 0.4, 3.6, "x")]
    today, new = summarize_stages(rows, "today")
    assert today["http_s"] == 9.0 and today["prompt_tokens"] == 30 and today["completion_tokens"] == 15
    assert today["prefill_share"] == pytest.approx(6.0 / 9.0, abs=1e-3) and today["python_share"] == pytest.approx(0.3 / 9.0, abs=1e-3)
    assert today["prefill_tok_per_s"] == 5.0 and today["decode_tok_per_s"] == 10.0  # 30 tokens / 6 s; 12 steps / 1.2 s
    assert new["http_over_baseline"] == 0.8  # median of 0.5, 0.8, 0.9 (not the ratio of totals, 7.0 / 9.0)
    assert new["prefill_over_baseline"] == 0.5 and new["same_text_as_baseline"] == 2
    with pytest.raises(ValueError, match="not among the settings"): summarize_stages(rows, "other")


def test_workload_requests_one_per_distinct_prompt(tmp_path):
    from kgrag_nb.bench import stage_request_body, workload_requests
    from kgrag_nb.config import EMBEDDED_MODEL_ALIAS
    from kgrag_nb.llm import ResponseCache
    cfg = get_config(cache_dir=tmp_path)
    assert workload_requests(2, cfg=cfg)[1] == "synthetic"
    with ResponseCache(cfg.llm_cache_path) as cache:
        for i in range(6):  # 3 prompts, each sent twice (two seeds)
            cache.put(f"k{i}", {"text": " x"}, request={"kind": "completion", "model": EMBEDDED_MODEL_ALIAS, "payload": f"P{i % 3}",
                                                       "params": {"max_tokens": 4, "temperature": 0.7, "seed": i}, "constraint": None})
    reqs, source = workload_requests(10, cfg=cfg)
    assert [r["payload"] for r in reqs] == ["P0", "P1", "P2"] and [r["params"]["seed"] for r in reqs] == [0, 1, 2]
    assert "3 distinct prompts" in source
    two = workload_requests(2, seed=5, cfg=cfg)[0]
    assert len(two) == 2 and two == workload_requests(2, seed=5, cfg=cfg)[0]  # seeded
    assert stage_request_body(reqs[0]) == {"model": EMBEDDED_MODEL_ALIAS, "prompt": "P0", "max_tokens": 4, "temperature": 0.7, "seed": 0}


# issue 23 "Done means": `kgrag bench llm-studies`, each study's real requests before vs after (pure parts, hand-computed)
def test_study_groups_by_paper_experiments_first():
    from kgrag_nb.bench import study_groups
    manifest = {"experiments": [{"experiment": "coe_runs", "paper": "chain_of_evidence.txt"},
                                {"experiment": "awakening_task1", "paper": "awakening_unseen_entity_kgqa.txt"},
                                {"experiment": "misk_runs", "paper": "missing_knowledge_rag.txt"},
                                {"experiment": "awakening_task2", "paper": "awakening_unseen_entity_kgqa.txt"},
                                {"experiment": "format_tax_runs", "paper": "all"}],
                "artifacts": [{"artifact": "awakening_closed_book", "paper": "awakening_unseen_entity_kgqa.txt"},
                              {"artifact": "jcql_table2", "paper": "jcql_joint_kbc_kbqa.txt"}]}
    g = study_groups(manifest)
    assert list(g) == ["coe", "awakening", "misk", "format_tax", "jcql"]
    assert g["awakening"] == [("experiments", "awakening_task1"), ("experiments", "awakening_task2"), ("artifacts", "awakening_closed_book")]
    assert g["jcql"] == [("artifacts", "jcql_table2")] and g["format_tax"] == [("experiments", "format_tax_runs")]


def _key_log_run(tmp_path):
    "A run folder with two key logs and a ResponseCache holding their requests (one of another model, one key unknown)."
    from kgrag_nb.config import EMBEDDED_MODEL_ALIAS
    from kgrag_nb.llm import ResponseCache, request_key
    run = tmp_path / "runs" / "r1"; (run / "experiments").mkdir(parents=True); (run / "artifacts").mkdir()
    keys = {}
    with ResponseCache(tmp_path / "cache" / "llm_cache.sqlite") as cache:
        for name, prompt, seed, model in (("p0s0", "Q: a?", 0, EMBEDDED_MODEL_ALIAS), ("p0s1", "Q: a?", 1, EMBEDDED_MODEL_ALIAS),
                                          ("p1s0", "Q: b?", 0, EMBEDDED_MODEL_ALIAS), ("stub", "Q: c?", 0, "stub")):
            params = {"max_tokens": 4, "seed": seed, "temperature": 0.7}
            keys[name] = request_key("completion", model, prompt, params, seed)
            cache.put(keys[name], {"text": f" {name}"}, request={"kind": "completion", "model": model, "payload": prompt,
                                                                 "params": params, "sample_index": seed})
    (run / "experiments" / "awakening_task1.keys").write_text("".join(f"{keys[k]}\n" for k in ("p0s0", "p0s1", "stub", "p0s0")) + "\n" + "f" * 64 + "\n")
    (run / "artifacts" / "awakening_closed_book.keys").write_text(f"{keys['p1s0']}\n{keys['p0s1']}\n")
    return run, keys


def test_study_requests_in_key_log_order(tmp_path):
    from kgrag_nb.bench import read_key_log, study_requests
    from kgrag_nb.llm import ResponseCache
    run, keys = _key_log_run(tmp_path)
    assert read_key_log(run / "experiments" / "awakening_task1.keys") == [keys["p0s0"], keys["p0s1"], keys["stub"], keys["p0s0"], "f" * 64]
    assert read_key_log(run / "experiments" / "absent.keys") == []
    members = [("experiments", "awakening_task1"), ("experiments", "awakening_task2"), ("artifacts", "awakening_closed_book")]
    with ResponseCache(tmp_path / "cache" / "llm_cache.sqlite") as cache:
        reqs, skipped = study_requests(run, members, cache, n=10)
        # repeats and samples kept, in order; the stub's request and the unknown key skipped; the artefact's log after the experiment's
        assert [r["key"] for r in reqs] == [keys[k] for k in ("p0s0", "p0s1", "p0s0", "p1s0", "p0s1")] and skipped == 2
        assert [(r["payload"], r["params"]["seed"], r["sample_index"], r["source"]) for r in reqs[:2]] == [
            ("Q: a?", 0, 0, "awakening_task1"), ("Q: a?", 1, 1, "awakening_task1")]
        assert reqs[3]["source"] == "awakening_closed_book"
        first3, skipped3 = study_requests(run, members, cache, n=3)
        assert [r["key"] for r in first3] == [keys["p0s0"], keys["p0s1"], keys["p0s0"]] and skipped3 == 1


def test_find_bench_run_newest_finished_smoke(tmp_path):
    import json
    import pytest
    from kgrag_nb.bench import find_bench_run
    cfg = get_config(runs_dir=tmp_path)
    with pytest.raises(FileNotFoundError, match="kgrag reproduce --profile smoke"): find_bench_run(cfg)
    for rid, profile, started, exps in (("a", "smoke", "2026-11-01T00:00:00", ["e"]), ("b", "smoke", "2026-11-02T00:00:00", ["e"]),
                                        ("c", "smoke", "2026-11-03T00:00:00", []), ("d", "full", "2026-11-04T00:00:00", ["e"])):
        (tmp_path / rid).mkdir()
        (tmp_path / rid / "manifest.json").write_text(json.dumps({"profile": profile, "started": started, "experiments": exps}))
    assert find_bench_run(cfg).name == "b" and find_bench_run(cfg, "a").name == "a"
    with pytest.raises(FileNotFoundError, match="known runs: a, b, c, d"): find_bench_run(cfg, "zz")


def test_summarize_llm_studies_hand_computed():
    from kgrag_nb.bench import summarize_llm_studies
    def row(study, prompt, before, after, same=True):
        return dict(study=study, prompt=prompt, prompt_tokens=100, before_s=before, after_s=after, same_text=same,
                    same_as_cache=True, load_1min=2.0)
    rows = [row("a", "p", 1.0, 0.5), row("a", "p", 1.0, 0.25), row("b", "q", 3.0, 2.0, same=False), row("b", "r", 1.0, 1.0)]
    a, b, total = summarize_llm_studies(rows, {"a": 0, "b": 3})
    assert (a["requests"], a["distinct_prompts"], a["prompt_tokens"], a["before_s"], a["after_s"]) == (2, 1, 200, 2.0, 0.75)
    assert (a["speedup"], a["speedup_median"], a["identical"]) == (2.67, 3.0, 2)  # 2/0.75; median of 2 and 4
    assert (b["speedup"], b["speedup_median"], b["identical"], b["skipped"]) == (1.33, 1.25, 1, 3)  # 4/3; median of 1.5 and 1
    assert (total["study"], total["requests"], total["distinct_prompts"], total["before_s"], total["after_s"]) == ("total", 4, 3, 6.0, 3.75)
    assert (total["speedup"], total["identical"], total["skipped"]) == (1.6, 3, 3)  # 6/3.75


def test_arm_settings_read_from_the_server_command():
    from pathlib import Path
    from kgrag_nb.bench import arm_name, arm_settings
    from kgrag_nb.serve import EmbeddedServer
    argv = EmbeddedServer(get_config(), n_threads=3, prompt_snapshots=16)._command(Path("m.gguf"))
    assert arm_settings(argv) == dict(decode_threads=3, batch_threads=3, logits_all=False, snapshots=16)
    before = arm_settings(argv + ["--logits_all", "True"])  # `_stage_server` appends the flag: the last one counts
    assert before["logits_all"] is True and arm_name(before) == "decode3 batch3 all-logits snap16"


@pytest.mark.llm
def test_llm_studies_replay_identical_on_real_servers(tmp_path):
    "Two servers, before (llama-cpp-python's defaults, no snapshots) and after (today's): same answers, a repeat included."
    import json
    pytest.importorskip("llama_cpp.server", reason='llama-cpp-python[server] missing: pip install -e ".[cpu]"')
    from kgrag_nb.bench import profile_llm_studies, summarize_llm_studies
    from kgrag_nb.serve import PROMPT_SNAPSHOTS
    run, keys = _key_log_run(tmp_path)
    (run / "manifest.json").write_text(json.dumps({
        "profile": "smoke", "started": "2026-11-01T00:00:00", "config": {"cache_dir": str(tmp_path / "cache")},
        "experiments": [{"experiment": "awakening_task1", "paper": "awakening_unseen_entity_kgqa.txt"}],
        "artifacts": [{"artifact": "awakening_closed_book", "paper": "awakening_unseen_entity_kgqa.txt"}]}))
    cfg = get_config(runs_dir=tmp_path / "runs")  # the model from the project cache; the LLM cache is the run's
    rows, facts = profile_llm_studies(n=3, cfg=cfg)
    assert [r["key"] for r in rows] == [keys["p0s0"], keys["p0s1"], keys["p0s0"]]  # the third is a repeat: a snapshot hit after
    assert all(r["same_text"] for r in rows) and facts["mismatched_keys"] == [] and facts["skipped"] == {"awakening": 1}
    assert not any(r["same_as_cache"] for r in rows)  # the cached answers here are made up
    assert facts["arms"]["before"]["logits_all"] is True and facts["arms"]["before"]["snapshots"] == 0
    assert facts["arms"]["after"]["logits_all"] is False and facts["arms"]["after"]["snapshots"] == PROMPT_SNAPSHOTS
    assert all(r["prompt_tokens"] > 0 and r["before_s"] > 0 and r["after_s"] > 0 for r in rows)
    (study, total) = summarize_llm_studies(rows, facts["skipped"])
    assert (study["study"], study["requests"], study["distinct_prompts"], study["identical"]) == ("awakening", 3, 1, 3)
