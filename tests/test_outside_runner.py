"""Study notebooks run the way a reader runs them: plain `papermill` (or Jupyter), no `kgrag reproduce`.

A notebook executed outside the runner (its `run_dir` is None) records itself as a run of its own,
`runs/nb-<id>-<UTC time>-<pid>/` with a manifest, so `kgrag report` finds its artefact; it takes its profile's values
from studies.yaml for every parameter left at the notebook's own default, and computes or reuses the experiments it
reads. The run's decoding is the run's: recorded once in provenance, its deviation line added by `StudyRun.deviations`.
"""
import json, os, subprocess, sys, time
from pathlib import Path

import nbformat
import pytest

from kgrag_nb.config import get_config
from kgrag_nb.reproduce import code_version

ROOT = get_config().root
PAPERMILL = [sys.executable, "-m", "papermill"]
KGRAG = str(Path(sys.executable).parent / "kgrag")  # the console script
RUNNER = 'profile = "smoke"\nrun_dir = None\nllm_url = None\nmodel = None\nexperiment_dirs = {}\n'


def _notebook(path: Path, cells: list[tuple[str, list]]):
    nb = nbformat.v4.new_notebook()
    for src, tags in cells:
        cell = nbformat.v4.new_code_cell(src)
        if tags: cell.metadata["tags"] = tags
        nb.cells.append(cell)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "python3", "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))


def _env(tmp_path, root=None, **extra) -> dict:
    "The environment of a reader's shell: the checkout, and (for the test) its own runs, figures and cache folders."
    env = dict(os.environ, KGRAG_RUNS=str(tmp_path / "runs"), KGRAG_FIGURES=str(tmp_path / "figures"),
               KGRAG_CACHE=str(tmp_path / "cache"), **{k: str(v) for k, v in extra.items()})
    if root: env["KGRAG_HOME"] = str(root)
    for k in ("KGRAG_LLM_URL", "KGRAG_MODEL", "KGRAG_PROFILE"): env.pop(k, None) if k not in extra else None
    return env


def _papermill(nb: Path, out: Path, env: dict, cwd: Path, *args) -> tuple[subprocess.CompletedProcess, float]:
    t0 = time.time()
    p = subprocess.run([*PAPERMILL, str(nb), str(out), "--cwd", str(cwd), *args], env=env, capture_output=True, text=True, timeout=900)
    return p, time.time() - t0


def _runs(tmp_path) -> dict[str, dict]:
    return {m.parent.name: json.loads(m.read_text()) for m in sorted((tmp_path / "runs").glob("*/manifest.json"))}


def _project(tmp_path) -> Path:
    "A checkout with one experiment (`exp`, parameter n: notebook default 1, tiny profile 3) and one artefact reading it."
    root = tmp_path / "proj"
    root.mkdir(parents=True)
    (root / "settings.ini").write_text("[DEFAULT]\nlib_name = kgrag_nb\n")
    _notebook(root / "nbs/studies/experiments/exp.ipynb", [
        ('artifact = "exp"\n' + RUNNER + "n = 1\ndecoding = \"free\"", ["parameters"]),
        ("import pandas as pd\nfrom kgrag_nb.reproduce import ExperimentRun\nxp = ExperimentRun.from_papermill(globals())\n"
         "xp.save('table', pd.DataFrame({'x': list(range(n))}))\nxp.finish()", [])])
    _notebook(root / "nbs/studies/art.ipynb", [
        ('artifact = "art"\n' + RUNNER, ["parameters"]),
        ("import pandas as pd\nfrom kgrag_nb.reproduce import StudyRun, register_decoding_deviation\n"
         "register_decoding_deviation('exp', {'constrained': 'Decoding: constrained here, free in the paper.'})\n"
         "run = StudyRun.from_papermill(globals())\nt = run.experiment('exp').load('table')\n"
         "run.save_table(pd.DataFrame({'rows': [len(t)]}), 'rows_vs_paper', 'rows')\n"
         "run.deviations(['a study deviation'], ['an artefact deviation'])\nrun.finish()", [])])
    entry = lambda nb, uses="": (f"{{paper: p.txt, title: 't', notebook: {nb}{', uses: ' + uses if uses else ''}, "
                                 f"profiles: {{tiny: {{}}, smoke: {{}}}}}}")
    (root / "studies.yaml").write_text(
        "defaults:\n  tiny: {decoding: constrained}\n"
        "experiments:\n"
        "  exp: {paper: p.txt, title: 't', notebook: nbs/studies/experiments/exp.ipynb, profiles: {tiny: {n: 3}, smoke: {n: 1}}}\n"
        f"artifacts:\n  art: {entry('nbs/studies/art.ipynb', 'exp')}\n")
    return root


@pytest.mark.slow
def test_plain_papermill_runs_are_runs_the_report_finds(tmp_path):
    "Run by hand, a notebook wrote its files under figures/ but no run: `kgrag report` could not find it (defect pinned)."
    root = _project(tmp_path)
    env = _env(tmp_path, root=root)
    code = lambda: code_version(get_config(root=root), "nbs/studies/experiments/exp.ipynb")  # other work may change the package meanwhile
    code0 = code()
    p, _ = _papermill(root / "nbs/studies/experiments/exp.ipynb", tmp_path / "exp.out.ipynb", env, root, "-p", "profile", "tiny")
    assert p.returncode == 0, p.stderr[-3000:]
    (exp_id, exp_run), = _runs(tmp_path).items()
    assert exp_id.startswith("nb-exp-") and exp_run["status"] == "finished" and exp_run["profile"] == "tiny"
    e = exp_run["experiments"][0]
    assert e["experiment"] == "exp" and e["status"] == "computed" and e["params"] == {"n": 3, "decoding": "constrained", "profile": "tiny"}
    assert "parameters from studies.yaml (profile tiny): n=3, decoding='constrained'" in (tmp_path / "exp.out.ipynb").read_text()
    p, _ = _papermill(root / "nbs/studies/art.ipynb", tmp_path / "art.out.ipynb", env, root, "-p", "profile", "tiny")
    assert p.returncode == 0, p.stderr[-3000:]
    art_id = next(r for r in _runs(tmp_path) if r.startswith("nb-art-"))
    m = _runs(tmp_path)[art_id]
    assert m["status"] == "finished" and m["run_id"] == art_id and m["only"] == "art" and m["interactive"]
    (a,) = m["artifacts"]
    assert a["artifact"] == "art" and a["status"] == "ok" and a["outputs"]
    if code() == code0:  # the experiment run by hand is the one the artefact reads (same key): reused
        assert a["experiments"] == {"exp": e["key"]} and [x["status"] for x in m["experiments"]] == ["reused"]
    else: assert [x["status"] for x in m["experiments"]] == ["computed"]  # the code changed in between: a new key
    # the decoding is the run's: recorded once, its line added after the study's list, never twice
    assert a["decoding"] == {"exp": "constrained"}
    assert a["deviations"] == ["a study deviation", "Decoding: constrained here, free in the paper.", "an artefact deviation"]
    r = subprocess.run([KGRAG, "report"], env=env, cwd=root, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    index = tmp_path / "runs" / art_id / "report" / "index.html"
    assert str(index) in r.stdout and 'id="art-art"' in index.read_text() and "rows_vs_paper" in index.read_text()


@pytest.mark.slow
def test_a_failing_notebook_run_by_hand_says_failed(tmp_path):
    root = _project(tmp_path)
    nb = root / "nbs/studies/art.ipynb"
    book = nbformat.read(str(nb), as_version=4)
    book.cells.insert(2, nbformat.v4.new_code_cell("run.experiment('exp')\nraise RuntimeError('boom')"))
    nbformat.write(book, str(nb))
    p, _ = _papermill(nb, tmp_path / "art.out.ipynb", _env(tmp_path, root=root), root, "-p", "profile", "tiny")
    assert p.returncode != 0
    (m,) = _runs(tmp_path).values()
    assert m["status"] == "failed" and "RuntimeError: boom" in m["error"]
    assert [x["status"] for x in m["experiments"]] == ["computed"]  # the experiment it computed on the way is recorded
    assert (tmp_path / "runs" / m["run_id"] / m["experiments"][0]["executed"]).exists()


@pytest.mark.llm
@pytest.mark.slow
def test_study_notebooks_run_with_plain_papermill_on_the_embedded_server(tmp_path, embedded_server):
    "unseen_entity (an experiment) and awaken_table3 (its artefact) run by plain papermill at tiny; `kgrag report` finds the artefact."
    env = _env(tmp_path, KGRAG_LLM_URL=embedded_server.url)
    exp_nb, art_nb = ROOT / "nbs/studies/awakening/experiments/unseen_entity.ipynb", ROOT / "nbs/studies/awakening/artefacts/awaken_table3.ipynb"
    code0 = code_version(get_config(), "nbs/studies/awakening/experiments/unseen_entity.ipynb")
    p, t_exp = _papermill(exp_nb, tmp_path / "unseen_entity.ipynb", env, ROOT, "-p", "profile", "tiny")
    assert p.returncode == 0, p.stderr[-3000:]
    p2, t_art = _papermill(art_nb, tmp_path / "awaken_table3.ipynb", env, ROOT, "-p", "profile", "tiny")
    assert p2.returncode == 0, p2.stderr[-3000:]
    print(f"plain papermill at tiny: unseen_entity {t_exp:.1f} s, awaken_table3 {t_art:.1f} s")
    runs = _runs(tmp_path)
    (exp_run,) = [m for r, m in runs.items() if r.startswith("nb-unseen_entity-")]
    (art_id, art_run), = [(r, m) for r, m in runs.items() if r.startswith("nb-awaken_table3-")]
    assert exp_run["status"] == art_run["status"] == "finished" and exp_run["model"] == embedded_server.model
    assert exp_run["experiments"][0]["params"]["n_questions"] == 1 and exp_run["llm_usage"]["requests"] > 0
    if code_version(get_config(), "nbs/studies/awakening/experiments/unseen_entity.ipynb") == code0:  # else other work changed the code meanwhile
        assert [x["status"] for x in art_run["experiments"]] == ["reused"] and art_run["llm_usage"].get("requests", 0) == 0
    (a,) = art_run["artifacts"]
    assert a["status"] == "ok" and a["decoding"] == {"unseen_entity": "constrained"}
    from kgrag_nb.studies.awakening.task2 import DECODING_DEVIATION
    assert sum(DECODING_DEVIATION["constrained"] in d for d in a["deviations"]) == 1  # the study's line, once
    r = subprocess.run([KGRAG, "report"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    index = (tmp_path / "runs" / art_id / "report" / "index.html").read_text()
    assert 'id="art-awaken_table3"' in index and "table3_hits" in index


def test_ensure_experiment_keys_an_llm_experiment_as_the_runner_does(tmp_path):
    "ensure_experiment left the endpoint and model out of an LLM experiment's key: it never found the runner's (or a"
    " by-hand run's) results and executed the experiment again (defect pinned)."
    from kgrag_nb.reproduce import ensure_experiment, llm_identity, load_experiments, plan_experiments, write_json_atomic
    root = tmp_path / "proj"
    _notebook(root / "nbs/studies/experiments/exp.ipynb", [('artifact = "exp"\n' + RUNNER + "n = 1", ["parameters"]),
                                                           ("raise RuntimeError('executed again')", [])])
    (root / "studies.yaml").write_text("experiments:\n  exp: {paper: p.txt, title: 't', notebook: nbs/studies/experiments/exp.ipynb, "
                                       "needs_llm: true, profiles: {smoke: {n: 2}}}\nartifacts: {}\n")
    cfg = get_config(root=root, runs_dir=tmp_path / "runs", figures_dir=tmp_path / "figures", cache_dir=tmp_path / "cache")
    plan = plan_experiments(list(load_experiments(cfg=cfg).values()), "smoke", cfg, llm=llm_identity("http://h:1/v1", "m"))["exp"]
    plan["path"].mkdir(parents=True)
    write_json_atomic(plan["path"] / "_SUCCESS.json", {"id": "exp", "key": plan["key"], "params": plan["params"]})
    res = ensure_experiment("exp", "smoke", cfg=cfg, llm_url="http://h:1/v1", model="m")
    assert res.key == plan["key"] and res.path == plan["path"]


@pytest.mark.slow
def test_nbconvert_with_the_runners_kernel_manager_has_no_tcp_warning(tmp_path):
    "`jupyter nbconvert --execute` with `NiceKernelManager` talks to its kernel over IPC: no 'without encryption' warning."
    " (Plain `papermill` offers no way to choose the kernel manager: its kernels use loopback TCP, and ipykernel warns.)"
    nb = tmp_path / "t.ipynb"
    _notebook(nb, [("print(6 * 7)", [])])
    p = subprocess.run([str(Path(sys.executable).parent / "jupyter"), "nbconvert", "--to", "notebook", "--execute", str(nb),
                        "--output", "t.out.ipynb", "--ExecutePreprocessor.kernel_manager_class=kgrag_nb.reproduce.NiceKernelManager"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "42" in (tmp_path / "t.out.ipynb").read_text(), p.stderr[-2000:]
    assert "without encryption" not in p.stdout + p.stderr
