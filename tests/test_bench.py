"""Tests of the benchmarks: `kgrag_nb.bench` (general: llm, kg, embed) and the Unseen-Entity study's own `difar` benchmark
(registered in `kgrag_nb.unseen` through the `benchmark` hook, issue 24)."""
from kgrag_nb.config import get_config


def test_bench_embed_small():
    from kgrag_nb.bench import bench_embed
    r = bench_embed(n=24, rounds=1)
    assert r["texts"] == 24 and r["max_abs_diff"] < 1e-5 and r["threads_after"] >= 1 and r["before_texts_per_s"] > 0
    assert not any(k.startswith("full_") for k in r)  # the DiFaR projection is the study's benchmark now


def test_full_difar_texts_tiny_empty_cache(tmp_path):
    from kgrag_nb.unseen import full_difar_texts
    rows = full_difar_texts(get_config(cache_dir=tmp_path), profile="tiny")  # an empty cache: everything to encode
    assert [x["dataset"] for x in rows] == ["cwq"] and rows[0]["cached"] == 0
    assert 0 < rows[0]["to_encode"] == rows[0]["new_texts"] == rows[0]["distinct_texts"] <= rows[0]["triples"] <= 200


def test_bench_difar_projects_what_is_left(tmp_path):
    from kgrag_nb.unseen import bench_difar, full_difar_texts
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
