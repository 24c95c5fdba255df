"""Tests of the `kgrag` console script's argument checks (the runner's own behaviour is tested in test_reproduce.py)."""
import pytest
import nbformat

from kgrag_nb.cli import main


def _project(tmp_path, monkeypatch):
    "A one-notebook project whose parameters cell declares every parameter with a known range; KGRAG_* point at it."
    root = tmp_path / "proj"
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell('profile = "smoke"\nrun_dir = None\nllm_url = None\nmodel = None\n'
                                     'max_tokens = 8\ntemperature = 0.0\nseed = 0\nn_samples = 2\nn_questions = 3')
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, nbformat.v4.new_code_cell(f"from pathlib import Path\nPath({str(tmp_path / 'ran.txt')!r}).write_text('ran')")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "python3", "language": "python"}
    (root / "nbs/studies").mkdir(parents=True)
    nbformat.write(nb, str(root / "nbs/studies/ranged.ipynb"))
    (root / "studies.yaml").write_text("artifacts:\n  ranged: {paper: p, title: t, notebook: nbs/studies/ranged.ipynb, profiles: {smoke: {n: 1}}}\n")
    for k, v in dict(KGRAG_HOME=root, KGRAG_RUNS=tmp_path / "runs", KGRAG_FIGURES=tmp_path / "figures", KGRAG_CACHE=tmp_path / "cache").items():
        monkeypatch.setenv(k, str(v))
    monkeypatch.delenv("KGRAG_LLM_URL", raising=False)
    return root


@pytest.mark.parametrize("args, message", [
    (["--set", "max_tokens=0"], "--set max_tokens=0: max_tokens must be a whole number >= 1"),
    (["--set", "max_tokens=-1"], "--set max_tokens=-1: max_tokens must be a whole number >= 1"),
    (["--set", "temperature=NaN"], "--set temperature=nan: temperature must be a finite number >= 0"),
    (["--set", "temperature=-1"], "--set temperature=-1: temperature must be a finite number >= 0"),
    (["--set", "temperature=Infinity"], "--set temperature=inf: temperature must be a finite number >= 0"),
    (["--set", "seed=-5"], "--set seed=-5: seed must be a whole number >= 0"),
    (["--set", "n_questions=0"], "--set n_questions=0"),
    (["--only", ""], "--only '' names no artefact"),
    (["--only", " , "], "--only ' , ' names no artefact"),
    (["--jobs", "-3"], "--jobs -3: run at least 1 notebook at a time"),
    (["--cell-timeout", "-5"], "--cell-timeout -5: give a number of seconds > 0"),
    (["--cell-timeout", "0"], "--cell-timeout 0: give a number of seconds > 0"),
])
def test_reproduce_refuses_out_of_range_input_before_anything_starts(tmp_path, monkeypatch, capsys, args, message):
    _project(tmp_path, monkeypatch)
    assert main(["reproduce", "--profile", "smoke", *args]) == 1
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1, err  # one line naming the input and the fix
    assert not (tmp_path / "ran.txt").exists() and not (tmp_path / "runs").exists()  # nothing started, no run folder


def test_reproduce_refuses_an_embedded_port_outside_1_to_65535(tmp_path, monkeypatch, capsys):
    _project(tmp_path, monkeypatch)
    for port in ("70000", "0"):
        monkeypatch.setenv("KGRAG_EMBEDDED_PORT", port)
        assert main(["reproduce", "--profile", "smoke"]) == 1
        assert f"KGRAG_EMBEDDED_PORT={port}: a TCP port is 1..65535" in capsys.readouterr().err
    assert not (tmp_path / "ran.txt").exists() and not (tmp_path / "runs").exists()


# --- benchmarks: the general layers know no study (issue 24) --------------------------------------------------------

def test_cli_import_loads_no_study_module():
    "`import kgrag_nb.cli` (and so `bench`) loads general layers only; the study modules load when a command runs."
    import subprocess, sys
    from kgrag_nb.hooks import study_modules
    code = "import sys, kgrag_nb.cli; print(' '.join(m for m in sys.modules if m.startswith('kgrag_nb.')))"
    loaded = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split())
    assert "kgrag_nb.bench" in loaded and "kgrag_nb.cli" in loaded
    assert not loaded & set(study_modules().values()), sorted(loaded & set(study_modules().values()))


def test_bench_list_shows_what_the_studies_registered(capsys):
    "`kgrag bench list`: the general benchmarks and those the installed studies registered through the `benchmark` hook."
    assert main(["bench", "list"]) == 0
    names = {line.split()[0] for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert {"llm", "kg", "embed"} <= names  # bench's own
    assert {"difar", "relation-retrieval"} <= names  # registered by unseen and awaken
    from kgrag_nb.hooks import BENCHMARKS
    assert BENCHMARKS["difar"][0].__module__ == "kgrag_nb.studies.awakening.task2" and BENCHMARKS["embed"][0].__module__ == "kgrag_nb.bench"


def test_bench_unknown_name_names_the_known_ones(capsys):
    with pytest.raises(SystemExit, match="unknown benchmark 'nope'; known: .*difar"):
        main(["bench", "nope"])


def test_bench_llm_stub_json(capsys):
    "`kgrag bench llm --server stub` still runs (the test instrument) and prints JSON."
    import json
    assert main(["bench", "llm", "--server", "stub", "--n", "20", "--concurrency", "4", "--json"]) == 0
    r = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert "TEST INSTRUMENT" in r["model"] and r["warm_requests"] == 0 and r["requests"] == 20 * 10


# --- `kgrag serve embedded` ------------------------------------------------------------------------------------------

@pytest.mark.llm
def test_kgrag_serve_embedded_exits_non_zero_naming_the_cause_when_its_server_dies(tmp_path):
    "Defect: when the server process died (SIGABRT of a grammar llama.cpp could not follow), `kgrag serve embedded`"
    " went on sleeping with a dead server and said nothing; now it exits 1 with the recorded death (signal, log tail)."
    import os, signal, subprocess, sys
    pytest.importorskip("llama_cpp.server")
    from kgrag_nb.config import get_config
    from kgrag_nb.serve import free_port, server_state
    port = free_port()
    env = dict(os.environ, KGRAG_CACHE=str(tmp_path), KGRAG_SERVER_STATE=str(tmp_path / "servers"))
    p = subprocess.Popen([sys.executable, "-c", "import sys; from kgrag_nb.cli import main; sys.exit(main())",
                          "serve", "embedded", "--port", str(port)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert "serving" in p.stdout.readline()
        state = server_state(get_config(cache_dir=tmp_path, server_state_dir=tmp_path / "servers"), port)
        os.kill(state["server_pid"], signal.SIGABRT)  # what llama.cpp's abort does to it
        try: rc = p.wait(30)
        except subprocess.TimeoutExpired: pytest.fail("`kgrag serve embedded` kept running with a dead server")
        err = p.stderr.read()
        assert rc == 1, (rc, err)
        assert "was killed by SIGABRT" in err and f"llama_server_{port}.log" in err and "last lines" in err, err
    finally:
        if p.poll() is None: p.kill()
