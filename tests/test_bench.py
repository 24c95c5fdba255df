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
