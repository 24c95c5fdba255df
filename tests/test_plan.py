"""`kgrag plan`: GPU-time arithmetic, the bill of a fresh clone from the shipped records, and on the tiny profile the plan's request count equals what a real run sends."""
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
    assert p == dict(requests=3, other_models=1, prompt_tokens=9, prefill_tokens=9, completion_tokens_max=37, in_cache=1, unknown=0,
                     to_send_tokens_max=8 + 5, to_send_prompt_tokens=3 + 3, to_send_prefill_tokens=3 + 3, models=["M", "stub-2"],
                     by_model={"stub-2": dict(requests=1, prompt_tokens=3, prefill_tokens=3, completion_tokens_max=5, prefill_tokens_min=3),
                               "M": dict(requests=1, prompt_tokens=3, prefill_tokens=3, completion_tokens_max=8, prefill_tokens_min=3)},
                     prefill_tokens_min=9, to_send_prefill_tokens_min=3 + 3)  # no prefix shared at a 4-character piece (Q: a|?, Q: b|?)


@pytest.mark.llm
def test_tiny_plan_counts_the_requests_a_real_tiny_run_sends(embedded_server, tmp_path):
    only = "awakening_closed_book"
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


from hypothesis import example, given, settings, strategies as st
from kgrag_nb.plan import GROWTH_FORMS, fit_growth


# the log-log slope of b f(n) (a = 0): exactly 1 and 2 for linear and quadratic; for n log n the local slope is
# 1 + 1/ln n, in (1.07, 1.44) for 10 <= n <= 400,000, so the least-squares slope lies in that interval too
SLOPE = {"linear": (1.0, 1.0), "quadratic": (2.0, 2.0), "n log n": (1.07, 1.44)}


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(10, 100_000), min_size=3, max_size=5, unique=True), form=st.sampled_from(sorted(GROWTH_FORMS)),
       a=st.floats(0, 1), b=st.floats(1, 100))
@example(sizes=[10, 1_000, 100_000], form="n log n", a=0.0, b=1.0)
@example(sizes=[10, 1_000, 100_000], form="linear", a=0.0, b=3.0)
@example(sizes=[10, 1_000, 100_000], form="quadratic", a=0.0, b=2.0)
def test_fit_growth_recovers_the_form_of_exact_data(sizes, form, a, b):
    sizes = sorted(sizes)
    if sizes[-1] < 2 * sizes[0]: sizes.append(sizes[-1] * 4)  # spread enough to tell the forms apart
    costs = [a + b * GROWTH_FORMS[form](n) for n in sizes]
    fit = fit_growth(sizes, costs)
    assert fit["rel_residual"] < 1e-6
    assert fit["growth"] == form  # exact data: only the true form fits with no residual
    assert set(SLOPE) == set(GROWTH_FORMS)  # every form has its expected slope (none compared with itself)
    lo, hi = SLOPE[form]
    if a == 0: assert lo - 1e-6 <= fit["loglog_slope"] <= hi + 1e-6, (form, fit["loglog_slope"])


def test_embed_device_is_configurable_for_gpu_nodes(monkeypatch):
    from kgrag_nb.config import get_config
    assert get_config().embed_device in ("cpu", __import__("os").environ.get("KGRAG_EMBED_DEVICE"))
    monkeypatch.setenv("KGRAG_EMBED_DEVICE", "cuda:1")
    assert get_config().embed_device == "cuda:1" and get_config(embed_device="cpu").embed_device == "cpu"


# --- issue 23 item 4: a bill on a fresh clone (shipped records, prefill and decode priced apart) ---
import os, subprocess, sys
from pathlib import Path

from kgrag_nb.plan import SIZE_CLASSES, phase_hours, shipped_records, size_class
from kgrag_nb.reproduce import _read_registry


def test_phase_hours_hand_computed():
    assert SIZE_CLASSES["7-8B"] == (8e9, 30919, 5000)  # 0.5 x 989.4e12 / (2 x 8e9) = 30,918.75
    assert SIZE_CLASSES["13B"][1:] == (19027, 3077) and SIZE_CLASSES["32B"][1:] == (7730, 1250) and SIZE_CLASSES["70B+"][1:] == (3534, 571)
    assert phase_hours(30919 * 3600, 5000 * 7200, "meta-llama/Llama-3.1-8B-Instruct") == (1.0, 2.0)
    assert phase_hours(3534 * 1800, 571 * 3600, "Qwen/Qwen2.5-72B-Instruct", replicas=2) == (0.25, 0.5)
    assert phase_hours(0, 9_000, "meta-llama/Llama-2-13b-chat-hf", throughput=2.5) == (0.0, 1.0)  # --throughput: decode rate
    assert [size_class(m) for m in ("Qwen/Qwen3-30B-A3B", "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "stub-3")] == ["MoE 30B/3B active", "32B", "7-8B"]


def test_shipped_records_cover_every_llm_notebook_of_studies_yaml():
    exps, arts = _read_registry()
    llm = {s.id for s in [*exps.values(), *arts.values()] if s.needs_llm}
    rec = shipped_records("full")
    assert set(rec["id"]) == llm
    assert rec[["requests", "prompt_tokens", "completion_tokens_max", "n_samples"]].gt(0).all().all()
    assert set(rec["status"]) <= {"measured", "extrapolated", "estimated"} and rec["source"].str.len().gt(0).all()
    full = {**{k: e.profiles["full"] for k, e in exps.items()}, **{k: a.profiles["full"] for k, a in arts.items()}}
    for sid in ("awakening_task1", "coe_runs"):  # every model the full profile names, and the run's own
        named = set(full[sid]["models"]) | ({full[sid]["judge_model"]} if full[sid].get("judge_model") else set())
        got = set(rec.loc[rec["id"] == sid, "model"])
        assert "{model}" in got and named - {"meta-llama/Llama-3.1-8B-Instruct"} <= got, (sid, named - got)


def _check_fresh_bill(df):
    llm = df[(df["basis"] != "no LLM") & (df["id"] != "TOTAL")]
    assert len(llm) == len(set(shipped_records("full")["id"]))
    assert llm["basis"].str.startswith("shipped record").all()
    assert {"prefill_hours", "decode_hours", "gpu_hours"} <= set(df.columns)
    assert not llm[["requests", "prefill_hours", "decode_hours", "gpu_hours"]].isna().any().any()
    assert (llm["prefill_hours"] > 0).all() and (llm["decode_hours"] > 0).all()
    assert df["gpu_hours"].iloc[-1] > 0


def test_full_plan_in_a_clean_checkout_prices_every_llm_notebook(tmp_path):
    df = plan(profile="full", cfg=get_config(runs_dir=tmp_path / "runs", cache_dir=tmp_path / "cache"))
    _check_fresh_bill(df)
    by = df.attrs["by_model"].set_index("model")
    assert abs(by.loc["TOTAL", "gpu_hours"] - df["gpu_hours"].iloc[-1]) < 1e-9
    assert by.loc["TOTAL", "gpu_hours"] == pytest.approx(by.drop("TOTAL")["gpu_hours"].sum())
    assert {"meta-llama/Llama-3.1-70B-Instruct", "Qwen/Qwen2.5-72B-Instruct", "deepseek-ai/DeepSeek-R1-Distill-Llama-70B"} <= set(by.index)
    # --model names the run's model; --throughput replaces every decode rate (prefill unchanged)
    other = plan(profile="full", model="Qwen/Qwen2.5-72B-Instruct", throughput=1000.0, cfg=get_config(runs_dir=tmp_path / "runs", cache_dir=tmp_path / "cache"))
    assert "meta-llama/Llama-3.1-8B-Instruct" not in set(other.attrs["by_model"]["model"])
    assert other["decode_hours"].iloc[-1] == pytest.approx(df["completion_tokens_max"].iloc[-1] / 1000 / 3600)


def test_kgrag_plan_cli_on_a_fresh_clone(tmp_path):
    (tmp_path / "runs").mkdir()
    env = dict(os.environ, KGRAG_RUNS=str(tmp_path / "runs"), KGRAG_CACHE=str(tmp_path / "cache"))
    cli = [sys.executable, "-c", "import sys; from kgrag_nb.cli import main; sys.exit(main())", "plan", "--profile", "full"]
    out = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "prefill_hours" in out.stdout and "decode_hours" in out.stdout and "GPU-hours per model" in out.stdout
    assert "prefill tokens (no prefix cache)" in out.stdout and "prefill tokens (ideal prefix cache)" in out.stdout
    assert "prefill_tokens_min" in out.stdout and "gpu_hours_min" in out.stdout  # both columns, both prices
    assert "throughput model" in out.stdout and "MLPerf Inference v5.1" in out.stdout and "no rehearsal yet" not in out.stdout
    js = subprocess.run(cli + ["--json", "--replicas", "2"], env=env, capture_output=True, text=True, timeout=300)
    import pandas as pd
    df = pd.DataFrame(json.loads(js.stdout))
    _check_fresh_bill(df)


# --- issue 23 item 4: every model an experiment calls; prefill priced once per distinct (model, prompt) ---
from kgrag_nb.plan import PREFILL_RULE


def _sampled_rehearsal(d: Path, n: int = 3, prompt_tokens: int = 100, max_tokens: int = 8, model: str = STUB_MODEL):
    "A hand-made rehearsal of awakening_closed_book (tiny): one prompt x `n` samples, `prompt_tokens` each; its config."
    run = d / "runs" / "reh"; (run / "artifacts").mkdir(parents=True); (d / "reh_cache").mkdir()
    params, keys = {"max_tokens": max_tokens, "temperature": 0.7, "seed": 0}, []
    with ResponseCache(d / "reh_cache" / "llm_cache.sqlite") as c:
        for i in range(n):
            keys.append(request_key("completion", model, "Q: who?", params, i))
            c.put(keys[-1], {"text": "x", "prompt_tokens": prompt_tokens},
                  request=dict(kind="completion", model=model, payload="Q: who?", params=params, sample_index=i))
    (run / "artifacts" / "awakening_closed_book.keys").write_text("\n".join(keys) + "\n")
    (run / "artifacts" / "awakening_closed_book.json").write_text("{}")
    (run / "manifest.json").write_text(json.dumps(dict(run_id="reh", profile="tiny", config={"cache_dir": str(d / "reh_cache")})))
    return get_config(runs_dir=d / "runs", cache_dir=d / "real_cache")


def test_prefill_counts_one_prompt_of_n_samples_once(tmp_path):
    # 3 requests = 1 prompt x 3 samples of 100 prompt tokens, max_tokens 8: prompt 300 sent, prefill 100, decode 3 x 8 = 24
    cfg = _sampled_rehearsal(tmp_path)
    keys = tmp_path / "runs" / "reh" / "artifacts" / "awakening_closed_book.keys"
    p = price_keys(keys, tmp_path / "reh_cache" / "llm_cache.sqlite", None, "meta-llama/Llama-3.1-8B-Instruct")
    assert (p["requests"], p["prompt_tokens"], p["prefill_tokens"], p["completion_tokens_max"]) == (3, 300, 100, 24)
    assert p["by_model"] == {"meta-llama/Llama-3.1-8B-Instruct": dict(requests=3, prompt_tokens=300, prefill_tokens=100, completion_tokens_max=24,
                                                                      prefill_tokens_min=100)}
    row = plan("tiny", only="awakening_closed_book", cfg=cfg).set_index("id").loc["awakening_closed_book"]
    assert (row["requests"], row["models"], row["prompt_tokens"], row["prefill_tokens"], row["completion_tokens_max"]) == (3, 1, 300, 100, 24)
    # Llama-3.1-8B: prefill 30,919 tok/s, decode 5,000 tok/s (SIZE_CLASSES["7-8B"])
    assert row["prefill_hours"] == pytest.approx(100 / 30919 / 3600) and row["decode_hours"] == pytest.approx(24 / 5000 / 3600)
    assert "distinct (model, prompt)" in PREFILL_RULE


def test_prefill_is_per_model_and_per_prompt(tmp_path):
    # the same prompt for two models is two prefills; two prompts for one model are two; the stub's id is the run's model
    src = ResponseCache(tmp_path / "r.sqlite")
    reqs = [(STUB_MODEL, "A", 0), (STUB_MODEL, "A", 1), (STUB_MODEL, "B", 0), ("stub-2", "A", 0), ("stub-2", "A", 1)]
    keys = []
    for m, prompt, i in reqs:
        params = {"max_tokens": 4, "temperature": 0.7}
        keys.append(request_key("completion", m, prompt, params, i))
        src.put(keys[-1], {"text": "x", "prompt_tokens": 10}, request=dict(kind="completion", model=m, payload=prompt, params=params, sample_index=i))
    src.close()
    (tmp_path / "k.keys").write_text("\n".join(keys))
    p = price_keys(tmp_path / "k.keys", tmp_path / "r.sqlite", None, "M")
    assert (p["prompt_tokens"], p["prefill_tokens"], p["to_send_prefill_tokens"]) == (50, 30, 30)  # M: A, B; stub-2: A
    assert {m: (b["prompt_tokens"], b["prefill_tokens"], b["completion_tokens_max"]) for m, b in p["by_model"].items()} == \
        {"M": (30, 20, 12), "stub-2": (20, 10, 8)}


def test_shipped_models_cover_every_model_the_full_profile_names():
    exps, _ = _read_registry()
    full = {k: e.profiles["full"] for k, e in exps.items()}
    named = {"awakening_task1": full["awakening_task1"]["models"],
             "coe_runs": [*full["coe_runs"]["models"], full["coe_runs"]["judge_model"]],
             "misk_runs": list(full["misk_runs"]["generators"].values()),
             "jcql_kbqa": full["jcql_kbqa"]["models"]}
    assert len(named["jcql_kbqa"]) == 3 and len(named["misk_runs"]) == 2  # the "JCQL's 3", "MisK's 2 plus judge"
    rec = shipped_records("full")
    assert not rec.duplicated(["id", "model"]).any()  # one row per (experiment, model it calls)
    for sid, models in named.items():
        got = set(rec.loc[rec["id"] == sid, "model"])
        assert set(models) - {"meta-llama/Llama-3.1-8B-Instruct"} <= got, (sid, set(models) - got)  # the default run model is {model}
    misk = rec[rec["id"] == "misk_runs"].set_index("model")
    assert misk.loc["{model}", "role"].startswith("context-recall judge")  # judge_model null: the run's model prices the judge
    # prefill: never more than sent; n-sampled rows (awakening, CoE's seeded runs, JCQL's SC) evaluate fewer than they send
    assert (rec["prefill_tokens"] <= rec["prompt_tokens"]).all() and (rec["prefill_tokens"] > 0).all()
    for sid in ("awakening_closed_book", "awakening_task1", "awakening_task2", "coe_runs", "jcql_kbqa"):
        r = rec[(rec["id"] == sid) & (rec["n_samples"] > 1)]
        assert len(r) and (r["prefill_tokens"] < r["prompt_tokens"]).all(), sid
    cb = rec.set_index("id").loc["awakening_closed_book"]
    assert cb["prefill_tokens"] == round(cb["prompt_tokens"] / 13)  # 3 Step-1 answers + 10 samples of one prompt per question


def test_fresh_plan_shows_every_model_and_prefill_apart(tmp_path):
    df = plan(profile="full", cfg=get_config(runs_dir=tmp_path / "runs", cache_dir=tmp_path / "cache")).set_index("id")
    assert df.loc["jcql_kbqa", "models"] == 4 and df.loc["misk_runs", "models"] == 3  # run's model + 3 LLMs; 2 generators + judge
    assert df.loc["TOTAL", "prefill_tokens"] < df.loc["TOTAL", "prompt_tokens"]
    by = df.attrs["by_model"].set_index("model")
    assert {"gpt-4o-mini", "Qwen/Qwen3-30B-A3B", "meta-llama/Llama-3.3-70B-Instruct"} <= set(by.index)
    assert by.loc["TOTAL", "prefill_tokens"] == df.loc["TOTAL", "prefill_tokens"]
    # prefill hours price prefill_tokens, not prompt_tokens: Qwen3-30B-A3B runs only JCQL_<LLM>; a mixture of experts with
    # 3B active parameters, it prefills at the 7-8B class's 30,919 tok/s and decodes at the 32B class's 1,250 (30B read)
    q = by.loc["Qwen/Qwen3-30B-A3B"]
    assert q["prefill_hours"] == pytest.approx(q["prefill_tokens"] / 30919 / 3600)
    assert q["decode_hours"] == pytest.approx(q["completion_tokens_max"] / 1250 / 3600)


# --- hostile inputs and model sizes (reliability round 3, items 7 and 8) ---
import csv, math as _math

from kgrag_nb.cli import main as kgrag_main


def _cli(capsys, *args):
    "Run `kgrag plan ARGS` in this process: (exit code, stdout, stderr); argparse errors exit with 2."
    try: rc = kgrag_main(["plan", *args])
    except SystemExit as e: rc = e.code
    out = capsys.readouterr()
    return rc, out.out, out.err


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "-inf", "fast"])
def test_throughput_refused_up_front(capsys, value):
    "`--throughput 0` was silently the default, `nan` printed NaN hours and `inf` 0 decode hours, all with exit 0."
    rc, out, err = _cli(capsys, f"--throughput={value}", "--only", "awakening_closed_book")
    assert rc == 2 and "--throughput" in err and repr(value) in err and "> 0" in err, (rc, err)
    assert "TOTAL" not in out


@pytest.mark.parametrize("value", [0.0, -1.0, _math.nan, _math.inf])
def test_plan_api_refuses_bad_throughput(tmp_path, value):
    with pytest.raises(ValueError, match="throughput="):
        plan("full", only="awakening_closed_book", throughput=value, cfg=get_config(runs_dir=tmp_path / "runs", cache_dir=tmp_path))
    with pytest.raises(ValueError, match="throughput="): gpu_hours(1, throughput=value)


def test_unknown_profile_refused(capsys, tmp_path):
    rc, out, err = _cli(capsys, "--profile", "bogus")
    assert rc == 2 and "bogus" in err and all(p in err for p in ("tiny", "smoke", "full")), err
    with pytest.raises(ValueError, match=r"profile 'bogus'.*tiny, smoke, full"):
        plan("bogus", cfg=get_config(runs_dir=tmp_path / "runs", cache_dir=tmp_path))


from kgrag_nb.plan import ModelSize, UnknownModelSize, model_rates, model_size, parse_params  # noqa: E402


@pytest.fixture
def no_hf_cache(tmp_path, monkeypatch):
    "An empty Hugging Face cache: sizes come from names and KNOWN_SIZES, not from a config.json a download left here."
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-empty"))


def test_model_sizes_from_names_hand_computed(no_hf_cache):
    "DeepSeek-V3 was priced as 8B, Llama-3.1-405B at 70B rates, Mixtral-8x22B as a 32B model."
    ds = model_size("deepseek-ai/DeepSeek-V3")
    assert (ds.total, ds.active) == (671e9, 37e9) and "DeepSeek-V3" in ds.source
    assert model_size("deepseek-ai/DeepSeek-R1-Distill-Llama-70B").total == 70e9  # a dense distillation, not R1 itself
    big = model_size("meta-llama/Llama-3.1-405B-Instruct")
    assert (big.total, big.active) == (405e9, 405e9)
    # NxS: S's non-expert share (23 %) once plus N experts of 77 % of S, 2 of them active (Mixtral's top-2)
    mx = model_size("mistralai/Mixtral-8x22B-Instruct-v0.1")
    assert mx.total == pytest.approx(22e9 * 0.23 + 8 * 22e9 * 0.77) and mx.active == pytest.approx(22e9 * 0.23 + 2 * 22e9 * 0.77)
    assert 140e9 < mx.total < 141.5e9 and 38.5e9 < mx.active < 39.5e9  # Mistral: 141B total, 39B active
    q = model_size("Qwen/Qwen3-30B-A3B")
    assert (q.total, q.active) == (30e9, 3e9)
    # rates: prefill by the active parameters' class, decode by the total's (weights read per step); above 100B the
    # model's own count: 0.5 x 989.4e12 / (2 x 405e9) = 610.7; 5,000 x 8 / 405 = 98.8; 5,000 x 8 / 671 = 59.6; / 140.58 = 284.5
    assert model_rates(big) == ("405B", 611, 99)
    assert model_rates(ds) == ("MoE 671B/37B active", 7730, 60)
    assert model_rates(mx) == ("MoE 141B/39B active", 7730, 285)
    assert model_rates(q) == ("MoE 30B/3B active", 30919, 1250)
    assert phase_hours(611 * 3600, 99 * 3600, "meta-llama/Llama-3.1-405B-Instruct") == (1.0, 1.0)


def test_names_priced_right_keep_their_classes(no_hf_cache):
    for m, c in [("meta-llama/Llama-3.1-8B-Instruct", "7-8B"), ("Qwen/Qwen2.5-7B-Instruct", "7-8B"), ("gemma-3-270m-q4_k_m", "7-8B"),
                 ("meta-llama/Llama-2-13b-chat-hf", "13B"), ("Qwen/Qwen2.5-32B-Instruct", "32B"), ("gpt-4o-mini", "7-8B"),
                 ("deepseek-ai/DeepSeek-R1-Distill-Qwen-32B", "32B"), ("Qwen/Qwen2.5-72B-Instruct", "70B+"), ("stub", "7-8B"), ("stub-3", "7-8B"),
                 ("meta-llama/Llama-3.3-70B-Instruct", "70B+")]:
        assert model_rates(model_size(m)) == (c, *SIZE_CLASSES[c][1:]), m


def test_unsizable_names_refused_unless_params(no_hf_cache):
    for m in ("my-org/house-model", "deepseek-ai/DeepSeek-V4", "meta-llama/Llama-4-17B-16E-Custom"):
        with pytest.raises(UnknownModelSize, match="--params"): model_size(m)
    assert model_size("my-org/house-model", params="70e9") == ModelSize(70e9, 70e9, "--params 70e9")
    assert parse_params("671B/37B") == (671e9, 37e9) and parse_params("1.5e9") == (1.5e9, 1.5e9) and parse_params("270M") == (270e6, 270e6)
    for bad in ("70", "nan", "-8B", "inf", "8B/70B", "big", "0B"):
        with pytest.raises(ValueError, match="params"): parse_params(bad)


def _write_config(d: Path, **cfg) -> Path:
    d.mkdir(parents=True); (d / "config.json").write_text(json.dumps(cfg)); return d


LLAMA_31_8B = dict(model_type="llama", hidden_size=4096, num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8,
                   intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False)
MIXTRAL_8X22B = dict(model_type="mixtral", hidden_size=6144, num_hidden_layers=56, num_attention_heads=48, num_key_value_heads=8,
                     intermediate_size=16384, vocab_size=32768, num_local_experts=8, num_experts_per_tok=2, tie_word_embeddings=False)
DEEPSEEK_V3 = dict(model_type="deepseek_v3", hidden_size=7168, num_hidden_layers=61, num_attention_heads=128, num_key_value_heads=128,
                   intermediate_size=18432, moe_intermediate_size=2048, vocab_size=129280, n_routed_experts=256, n_shared_experts=1,
                   num_experts_per_tok=8, first_k_dense_replace=3, moe_layer_freq=1, q_lora_rank=1536, kv_lora_rank=512,
                   qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, tie_word_embeddings=False)
QWEN3_30B_A3B = dict(model_type="qwen3_moe", hidden_size=2048, num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4,
                     head_dim=128, intermediate_size=6144, moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                     decoder_sparse_step=1, mlp_only_layers=[], vocab_size=151936, tie_word_embeddings=False)


@pytest.mark.parametrize("cfg, total, active", [
    (LLAMA_31_8B, 8.03e9, 8.03e9),  # Meta: 8B (8.03B)
    (MIXTRAL_8X22B, 140.6e9, 39.2e9),  # Mistral: 141B total, 39B active
    (DEEPSEEK_V3, 671e9, 37.5e9),  # DeepSeek-V3 report: 671B total, 37B activated (the MTP module not counted)
    (QWEN3_30B_A3B, 30.5e9, 3.35e9),  # Qwen3: 30.5B total, 3.3B activated
])
def test_model_size_from_config(tmp_path, cfg, total, active):
    "A local model folder (what vLLM serves) is sized from its config.json, whatever its name."
    d = _write_config(tmp_path / "served-model", **cfg)
    s = model_size(str(d))
    assert s.total == pytest.approx(total, rel=0.005) and s.active == pytest.approx(active, rel=0.01), s
    assert s.source == f"config {d / 'config.json'}"


def test_plan_names_the_class_and_prices_big_models(tmp_path, no_hf_cache):
    cfg = get_config(runs_dir=tmp_path / "runs", cache_dir=tmp_path / "cache")
    base = plan("full", only="awakening_closed_book", cfg=cfg).set_index("id").loc["awakening_closed_book"]
    assert (base["prefill_hours"], base["decode_hours"]) == (pytest.approx(base["prefill_tokens"] / 30919 / 3600),
                                                             pytest.approx(base["completion_tokens_max"] / 5000 / 3600))
    for m, cls, pre, dec in [("deepseek-ai/DeepSeek-V3", "MoE 671B/37B active", 7730, 60), ("meta-llama/Llama-3.1-405B-Instruct", "405B", 611, 99),
                             ("mistralai/Mixtral-8x22B-Instruct-v0.1", "MoE 141B/39B active", 7730, 285)]:
        p = plan("full", only="awakening_closed_book", model=m, cfg=cfg)
        by = p.attrs["by_model"].set_index("model")
        assert (by.loc[m, "size_class"], by.loc[m, "prefill_tok_s"], by.loc[m, "decode_tok_s"]) == (cls, pre, dec) and by.loc[m, "sized_from"]
        row = p.set_index("id").loc["awakening_closed_book"]
        assert row["prefill_hours"] == pytest.approx(row["prefill_tokens"] / pre / 3600), m
        assert row["decode_hours"] == pytest.approx(row["completion_tokens_max"] / dec / 3600), m
    with pytest.raises(UnknownModelSize, match="house-model"):
        plan("full", only="awakening_closed_book", model="my-org/house-model", cfg=cfg)
    p = plan("full", only="awakening_closed_book", model="my-org/house-model", params="70e9", cfg=cfg)
    assert p.attrs["by_model"].set_index("model").loc["my-org/house-model", "size_class"] == "70B+"


def test_kgrag_plan_cli_names_the_assumed_class(capsys, no_hf_cache):
    rc, out, err = _cli(capsys, "--model", "deepseek-ai/DeepSeek-V3", "--only", "awakening_closed_book")
    assert rc == 0, err
    assert "deepseek-ai/DeepSeek-V3: MoE 671B/37B active" in out and "| MoE 671B/37B active |" in out
    rc, out, err = _cli(capsys, "--model", "my-org/house-model", "--only", "awakening_closed_book")
    assert rc == 1 and "house-model" in err and "--params" in err
    rc, out, err = _cli(capsys, "--model", "my-org/house-model", "--params", "671B/37B", "--only", "awakening_closed_book")
    assert rc == 0 and "my-org/house-model: MoE 671B/37B active (--params 671B/37B)" in out, out + err


# --- a damaged records file names the file, the line and the column ---

def _damaged(tmp_path, edit) -> Path:
    src = Path(str(__import__("importlib.resources").resources.files("kgrag_nb") / "rehearsal" / "full.csv"))
    rows = list(csv.DictReader(src.open(newline="")))
    fields = list(rows[0])
    fields, rows = edit(fields, rows)
    out = tmp_path / "full.csv"
    with out.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore"); w.writeheader(); w.writerows(rows)
    return out


def test_shipped_records_validate_on_load(tmp_path):
    good = shipped_records("full")
    assert len(good) == 27 and str(good["requests"].dtype) == "int64"

    def negative(f, r): r[2]["completion_tokens_max"] = "-5"; return f, r
    def text(f, r): r[4]["prompt_tokens"] = "lots"; return f, r
    def blank(f, r): r[0]["requests"] = ""; return f, r
    def dropped(f, r): return [c for c in f if c != "prefill_tokens"], r
    for edit, where in [(negative, "line 4 (record 3, id 'awakening_task1'), column 'completion_tokens_max': '-5'"),
                        (text, "line 6 (record 5"), (blank, "line 2 (record 1, id 'awakening_closed_book'), column 'requests': ''"),
                        (dropped, "column 'prefill_tokens' is missing")]:
        d = tmp_path / edit.__name__; d.mkdir()
        path = _damaged(d, edit)
        with pytest.raises(ValueError) as e: shipped_records("full", path=path)
        msg = str(e.value)
        assert str(path) in msg and where in msg, msg
        assert "shipped_records.py" in msg  # how to fix it


@settings(max_examples=200, deadline=None)
@given(a=st.floats(0.1, 3000), b=st.floats(0.1, 3000), active=st.floats(0.01, 1))
def test_rates_never_rise_with_size(a, b, active):
    "A bigger model is never cheaper: prefill follows the active parameters, decode the total, both non-increasing."
    small, big = ModelSize(min(a, b) * 1e9, min(a, b) * 1e9 * active, "t"), ModelSize(max(a, b) * 1e9, max(a, b) * 1e9 * active, "t")
    (_, ps, ds), (_, pb, db) = model_rates(small), model_rates(big)
    assert pb <= ps and db <= ds
    dense = ModelSize(big.total, big.total, "t")
    assert model_rates(dense)[2] == db and model_rates(dense)[1] <= pb  # experts change prefill, not decode


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 3000), tenth=st.integers(0, 9), suffix=st.sampled_from(["", "-Instruct", "-chat-hf", "-Base-v0.2"]))
def test_dense_size_read_from_any_name(n, tenth, suffix):
    x = f"{n}.{tenth}" if tenth else str(n)
    s = model_size(f"some-org/Family-{x}B{suffix}")
    assert s.total == s.active == pytest.approx(float(x) * 1e9)
    assert parse_params(f"{x}B") == (pytest.approx(float(x) * 1e9),) * 2


# --- prefix caching: a lower bound on prefill (the token trie of an experiment's prompts) beside the upper bound ---
import itertools, random

from kgrag_nb.plan import chunked_trie_tokens, stub_pieces, trie_tokens
from kgrag_nb.serve import stub_tokens


def test_trie_tokens_hand_computed():
    # abcdef: 6 new; abcdxy shares abcd: 2 new; abz shares ab: 1 new -> 9 of 15
    p = ["abcdef", "abcdxy", "abz"]
    assert trie_tokens(p) == 9 and trie_tokens(p[::-1]) == 9
    assert trie_tokens([[1, 2, 3], [1, 2, 4], [5]]) == 5  # token ids: 3 + 1 + 1
    assert trie_tokens(["ab", "ab"]) == 2 and trie_tokens(["abcd", "ab"]) == 4  # a repeat and a prefix cost nothing
    assert trie_tokens([]) == 0 and trie_tokens([""]) == 0
    # reuse only at multiples of B: prefixes of length kB evaluated once (B each), every distinct prompt's tail (len mod B)
    assert chunked_trie_tokens(p, 1) == 9
    assert chunked_trie_tokens(p, 2) == 9  # ab, abcd, abcdef, abcdxy: 4 x 2; tails 0, 0, 1
    assert chunked_trie_tokens(p, 3) == 12  # abc, abz, abcdef, abcdxy: 4 x 3; tails 0
    assert chunked_trie_tokens(p, 4) == 11  # abcd: 4; tails 2, 2, 3 (abz, then abcdef: 6, then abcdxy reuses abcd: 2)
    assert chunked_trie_tokens(p, 7) == 15  # no prompt reaches a boundary: every distinct prompt whole
    assert chunked_trie_tokens(["abcd", "ab"], 3) == 6  # abc: 3; tails 1 and 2


@pytest.mark.parametrize("block", [0, -1, 1.5, "2", None])
def test_chunked_trie_refuses_a_bad_block(block):
    with pytest.raises(ValueError, match=f"block={block!r}"): chunked_trie_tokens(["ab"], block)


def _sequential(prompts, block):
    "The definition: distinct prompts in order, each reusing the deepest multiple of `block` within its longest common"
    " prefix with any earlier prompt, evaluating the rest."
    done, total = [], 0
    for p in dict.fromkeys(tuple(x) for x in prompts):
        lcp = max((len(os.path.commonprefix([p, q])) for q in done), default=0)
        total += len(p) - block * (lcp // block); done.append(p)
    return total


prompts_st = st.lists(st.lists(st.integers(0, 3), max_size=12), max_size=12)  # a 4-token vocabulary: many shared prefixes


@settings(max_examples=300, deadline=None)
@given(prompts=prompts_st, block=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
def test_trie_is_a_lower_bound_invariant_to_order(prompts, block, seed):
    distinct = sum(len(p) for p in {tuple(p) for p in prompts})  # the upper bound: every distinct prompt whole
    lo, chunked = trie_tokens(prompts), chunked_trie_tokens(prompts, block)
    assert lo <= chunked <= distinct
    assert lo == _sequential(prompts, 1) and chunked == _sequential(prompts, block)  # the sort-based count is the definition
    shuffled = prompts[:]; random.Random(seed).shuffle(shuffled)
    assert (trie_tokens(shuffled), chunked_trie_tokens(shuffled, block)) == (lo, chunked)
    assert chunked_trie_tokens(prompts, 1) == lo and chunked_trie_tokens(prompts, 2 * block) >= chunked  # coarser: less reuse


@settings(max_examples=200, deadline=None)
@given(prompts=st.dictionaries(st.integers(0, 50), st.lists(st.integers(0, 3), max_size=10), max_size=10), block=st.integers(1, 6))
def test_trie_equals_upper_bound_when_no_first_token_is_shared(prompts, block):
    ps = [[first, *rest] for first, rest in prompts.items()]  # distinct first tokens
    assert trie_tokens(ps) == chunked_trie_tokens(ps, block) == sum(map(len, ps))


@settings(max_examples=200, deadline=None)
@given(text=st.text(max_size=40))
def test_stub_pieces_are_the_stub_tokens(text):
    pieces = stub_pieces(text)
    assert len(pieces) == stub_tokens(text) and "".join(pieces) == text and all(len(x) <= 4 for x in pieces)
    assert trie_tokens([pieces]) == stub_tokens(text)  # one prompt: its whole stub count


def _prefix_rehearsal(d: Path):
    "A rehearsal of awakening_closed_book (tiny) whose prompts share stub pieces: `abcdefgh1` x 2 samples, `abcdefgh2`"
    " (3 stub tokens each: abcd efgh 1) for the run's model; `abcdefgh3` for a stand-in (stub-2); its config."
    run = d / "runs" / "reh"; (run / "artifacts").mkdir(parents=True); (d / "reh_cache").mkdir()
    keys = []
    with ResponseCache(d / "reh_cache" / "llm_cache.sqlite") as c:
        for m, prompt, i in [(STUB_MODEL, "abcdefgh1", 0), (STUB_MODEL, "abcdefgh1", 1), (STUB_MODEL, "abcdefgh2", 0), ("stub-2", "abcdefgh3", 0)]:
            params = {"max_tokens": 4, "temperature": 0.7}
            keys.append(request_key("completion", m, prompt, params, i))
            c.put(keys[-1], {"text": "x", "prompt_tokens": stub_tokens(prompt)},
                  request=dict(kind="completion", model=m, payload=prompt, params=params, sample_index=i))
    (run / "artifacts" / "awakening_closed_book.keys").write_text("\n".join(keys) + "\n")
    (run / "artifacts" / "awakening_closed_book.json").write_text("{}")
    (run / "manifest.json").write_text(json.dumps(dict(run_id="reh", profile="tiny", config={"cache_dir": str(d / "reh_cache")})))
    return get_config(runs_dir=d / "runs", cache_dir=d / "real_cache")


def test_price_keys_counts_the_prefix_trie(tmp_path):
    # run's model: abcdefgh1, abcdefgh2 = 6 stub tokens whole, trie abcd efgh 1 2 = 4; stub-2: abcdefgh3 = 3 (its own cache)
    cfg = _prefix_rehearsal(tmp_path)
    p = price_keys(tmp_path / "runs" / "reh" / "artifacts" / "awakening_closed_book.keys", tmp_path / "reh_cache" / "llm_cache.sqlite",
                   None, "M")
    assert (p["prompt_tokens"], p["prefill_tokens"], p["prefill_tokens_min"], p["to_send_prefill_tokens_min"]) == (12, 9, 7, 7)
    assert {m: (b["prefill_tokens"], b["prefill_tokens_min"]) for m, b in p["by_model"].items()} == {"M": (6, 4), "stub-2": (3, 3)}
    row = plan("tiny", only="awakening_closed_book", cfg=cfg).set_index("id").loc["awakening_closed_book"]
    assert (row["prefill_tokens"], row["prefill_tokens_min"]) == (9, 7)
    # both at the 7-8B prefill rate (30,919 tok/s); decode (4 requests x 4) the same in both
    assert row["prefill_hours"] == pytest.approx(9 / 30919 / 3600) and row["prefill_hours_min"] == pytest.approx(7 / 30919 / 3600)
    assert row["gpu_hours_min"] == pytest.approx(row["prefill_hours_min"] + row["decode_hours"]) and row["gpu_hours_min"] < row["gpu_hours"]


def test_shipped_records_without_a_trie_count_leave_the_lower_bound_unknown(tmp_path):
    df = plan(profile="full", cfg=get_config(runs_dir=tmp_path / "runs", cache_dir=tmp_path / "cache")).set_index("id")
    shipped = df[df["rehearsal"] == "shipped"]
    if "prefill_tokens_min" not in pd.read_csv(_shipped_path(), nrows=0).columns:  # not shipped (yet): unknown, not guessed
        assert shipped["prefill_tokens_min"].isna().all() and shipped["gpu_hours_min"].isna().all()
        assert pd.isna(df.loc["TOTAL", "prefill_tokens_min"]) and pd.isna(df.loc["TOTAL", "gpu_hours_min"])  # never a partial sum
    else:  # shipped where estimated; a blank row stays unknown, and so does the total
        blank = set(pd.read_csv(_shipped_path()).loc[lambda d: d["prefill_tokens_min"].isna(), "id"])
        known = shipped[~shipped.index.isin(blank)]
        assert known["prefill_tokens_min"].notna().all() and (known["prefill_tokens_min"] <= known["prefill_tokens"]).all()
        assert shipped.loc[shipped.index.isin(blank), "prefill_tokens_min"].isna().all()
        assert pd.isna(df.loc["TOTAL", "prefill_tokens_min"]) == bool(blank)
    assert (df.loc[df["basis"] == "no LLM", "prefill_tokens_min"] == 0).all()


def test_shipped_records_carry_an_optional_trie_count(tmp_path):
    def with_min(f, r):
        for x in r: x["prefill_tokens_min"] = str(int(x["prefill_tokens"]) // 2)
        return [*(c for c in f if c != "prefill_tokens_min"), "prefill_tokens_min"], r
    rec = shipped_records("full", path=_damaged(tmp_path, with_min))
    assert (rec["prefill_tokens_min"] == rec["prefill_tokens"] // 2).all()
    def too_many(f, r):
        f, r = with_min(f, r); r[0]["prefill_tokens_min"] = str(int(r[0]["prefill_tokens"]) + 1); return f, r
    d = tmp_path / "bad"; d.mkdir()
    with pytest.raises(ValueError, match="column 'prefill_tokens_min': .* exceeds prefill_tokens"): shipped_records("full", path=_damaged(d, too_many))
    def one_blank(f, r):  # a row whose prompts no rehearsal kept: unknown there, known elsewhere
        f, r = with_min(f, r); r[0]["prefill_tokens_min"] = ""; return f, r
    d = tmp_path / "blank"; d.mkdir()
    rec = shipped_records("full", path=_damaged(d, one_blank))
    assert pd.isna(rec["prefill_tokens_min"].iloc[0]) and rec["prefill_tokens_min"].iloc[1:].notna().all()
    def text(f, r):
        f, r = with_min(f, r); r[1]["prefill_tokens_min"] = "some"; return f, r
    d = tmp_path / "text"; d.mkdir()
    with pytest.raises(ValueError, match="line 3 .*column 'prefill_tokens_min': 'some' is not a whole number >= 0"):
        shipped_records("full", path=_damaged(d, text))


def _shipped_path():
    from importlib.resources import files
    return Path(str(files("kgrag_nb") / "rehearsal" / "full.csv"))


import pandas as pd


def test_shipped_trie_counts_are_priced(tmp_path, monkeypatch):
    import kgrag_nb.plan as plan_mod
    def half(f, r):
        for x in r: x["prefill_tokens_min"] = str(int(x["prefill_tokens"]) // 2)
        return [*(c for c in f if c != "prefill_tokens_min"), "prefill_tokens_min"], r
    rec = shipped_records("full", path=_damaged(tmp_path, half))
    monkeypatch.setattr(plan_mod, "shipped_records", lambda profile: rec if profile == "full" else rec.iloc[:0])
    df = plan(profile="full", only="awakening_closed_book", cfg=get_config(runs_dir=tmp_path / "runs", cache_dir=tmp_path / "cache")).set_index("id")
    cb = df.loc["awakening_closed_book"]
    assert cb["prefill_tokens_min"] == 174468 // 2  # the shipped closed-book row: 174,468 prefill tokens, its run's model (7-8B)
    assert cb["prefill_hours_min"] == pytest.approx(87234 / 30919 / 3600) and cb["gpu_hours_min"] == pytest.approx(cb["prefill_hours_min"] + cb["decode_hours"])
    assert df.loc["TOTAL", "prefill_tokens_min"] == 87234 and df.loc["TOTAL", "gpu_hours_min"] == pytest.approx(cb["gpu_hours_min"])
    by = df.attrs["by_model"].set_index("model")
    assert by.loc["TOTAL", "prefill_tokens_min"] == 87234 and by.loc["TOTAL", "gpu_hours_min"] == pytest.approx(cb["gpu_hours_min"])


@settings(max_examples=300, deadline=None)
@given(texts=st.lists(st.text(alphabet="ab", max_size=13), max_size=10))
def test_stub_trie_on_texts_is_the_trie_of_their_pieces(texts):
    "price_keys counts the stub-piece trie on the texts (no tuple of pieces per prompt held in memory): the same number."
    from kgrag_nb.plan import _stub_trie
    assert _stub_trie(texts) == trie_tokens([stub_pieces(t) for t in texts])
