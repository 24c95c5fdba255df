"""`kgrag plan`: GPU-time arithmetic, and on the tiny profile the plan's request count equals what a real run sends."""
import json

import pytest

from kgrag_nb.config import EMBEDDED_MODEL_ALIAS, get_config
from kgrag_nb.plan import DEFAULT_THROUGHPUT, gpu_hours, plan, price_keys
from kgrag_nb.llm import ResponseCache, request_key
from kgrag_nb.reproduce import reproduce
from kgrag_nb.serve import STUB_MODEL, StubServer


def test_gpu_hours_hand_computed():
    assert DEFAULT_THROUGHPUT == 5000.0
    assert gpu_hours(36_000_000) == 2.0 and gpu_hours(36_000_000, replicas=4) == 0.5
    assert gpu_hours(9_000, throughput=2.5, replicas=1) == 1.0
    with pytest.raises(ValueError, match="replicas=0"): gpu_hours(1, replicas=0)
    with pytest.raises(ValueError, match="throughput=-1"): gpu_hours(1, throughput=-1)


def test_price_keys_rekeys_for_the_target_model(tmp_path):
    src, dst = ResponseCache(tmp_path / "rehearsal.sqlite"), ResponseCache(tmp_path / "real.sqlite")
    reqs = [("completion", STUB_MODEL, "Q: a?", {"max_tokens": 8, "temperature": 0.0}, 0),
            ("completion", STUB_MODEL, "Q: b?", {"max_tokens": 24, "temperature": 0.7, "seed": 1}, 1),
            ("chat", "stub-2", [{"role": "user", "content": "c"}], {"max_tokens": 5}, 0)]
    keys = []
    for kind, model, payload, params, s in reqs:
        k = request_key(kind, model, payload, params, s); keys.append(k)
        src.put(k, {"text": "x", "prompt_tokens": 3, "completion_tokens": 1},
                request={"kind": kind, "model": model, "payload": payload, "params": params, "sample_index": s})
    dst.put(request_key("completion", "M", "Q: b?", reqs[1][3], 1), {"text": "y"})  # the real cache holds the second one
    log = tmp_path / "x.keys"; log.write_text("\n".join(keys + keys[:1]) + "\n")  # a repeated key is one request
    src.close(); dst.close()
    p = price_keys(log, tmp_path / "rehearsal.sqlite", tmp_path / "real.sqlite", "M")
    assert p == dict(requests=3, other_models=1, prompt_tokens=9, completion_tokens_max=37, in_cache=1, unknown=0,
                     to_send_tokens_max=8 + 5)


@pytest.mark.llm
def test_tiny_plan_counts_the_requests_a_real_tiny_run_sends(embedded_server, tmp_path):
    only = "closed_book_baseline"
    common = dict(runs_dir=tmp_path / "runs", figures_dir=tmp_path / "figures")
    rehearsal_cfg = get_config(cache_dir=tmp_path / "rehearsal_cache", **common)
    real_cfg = get_config(cache_dir=tmp_path / "real_cache", **common)
    with StubServer() as stub:
        m = reproduce(profile="tiny", only=only, llm_url=stub.url, model=STUB_MODEL, run_id="rehearsal", cfg=rehearsal_cfg, progress=False)
    assert m["status"] == "finished" and not m["failed"] and "TEST INSTRUMENT" in m["test_instrument"]
    before = plan("tiny", only=only, model=embedded_server.model, cfg=real_cfg)
    row = before.set_index("id").loc[only]
    assert row["basis"] == "exact" and row["rehearsal"] == "rehearsal" and row["in_cache"] == 0 and row["requests"] > 0
    real = reproduce(profile="tiny", only=only, llm_url=embedded_server.url, run_id="real", cfg=real_cfg, progress=False)
    assert not real["failed"] and real["model"] == EMBEDDED_MODEL_ALIAS
    assert real["llm_usage"]["requests"] - real["llm_usage"].get("retries", 0) == row["requests"]  # exactly what the plan said
    after = plan("tiny", only=only, model=embedded_server.model, cfg=real_cfg).set_index("id").loc[only]
    assert after["rehearsal"] == "real"  # the newest record of the notebook: the real run's own key log
    assert (after["requests"], after["in_cache"], after["to_send"], after["gpu_hours"]) == (row["requests"], row["requests"], 0, 0.0)


from hypothesis import given, settings, strategies as st
from kgrag_nb.plan import GROWTH_FORMS, fit_growth


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(10, 100_000), min_size=3, max_size=5, unique=True), form=st.sampled_from(sorted(GROWTH_FORMS)),
       a=st.floats(0, 1), b=st.floats(1, 100))
def test_fit_growth_recovers_the_form_of_exact_data(sizes, form, a, b):
    sizes = sorted(sizes)
    if sizes[-1] < 2 * sizes[0]: sizes.append(sizes[-1] * 4)  # spread enough to tell the forms apart
    costs = [a + b * GROWTH_FORMS[form](n) for n in sizes]
    fit = fit_growth(sizes, costs)
    assert fit["rel_residual"] < 1e-6
    assert fit["growth"] == form  # exact data: only the true form fits with no residual
    if a == 0: assert abs(fit["loglog_slope"] - {"linear": 1, "quadratic": 2}.get(form, fit["loglog_slope"])) < 1e-6


def test_embed_device_is_configurable_for_gpu_nodes(monkeypatch):
    from kgrag_nb.config import get_config
    assert get_config().embed_device in ("cpu", __import__("os").environ.get("KGRAG_EMBED_DEVICE"))
    monkeypatch.setenv("KGRAG_EMBED_DEVICE", "cuda:1")
    assert get_config().embed_device == "cuda:1" and get_config(embed_device="cpu").embed_device == "cpu"
