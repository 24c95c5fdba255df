"""Study notebooks run the way a reader runs them: plain `papermill` (or Jupyter), no `kgrag reproduce`.

A notebook executed outside the runner (its `run_dir` is None) records itself as a run of its own,
`runs/nb-<id>-<UTC time>-<pid>/` with a manifest, so `kgrag report` finds its artefact; it takes its profile's values
from studies.yaml for every parameter left at the notebook's own default, and computes or reuses the experiments it
reads. The run's decoding is the run's: recorded once in provenance, its deviation line added by `StudyRun.deviations`.
Its kernel talks over IPC, as the runner's do: the venv's python3 kernelspec names the project's IPC provisioner, so
ipykernel prints no "running over TCP without encryption" warning (papermill, nbconvert and Jupyter servers alike).
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
TCP_WARNING = "without encryption"  # ipykernel's "Kernel is running over TCP without encryption." (kernelapp.init_sockets)
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
    assert TCP_WARNING not in p.stdout + p.stderr  # the kernel talked over IPC (the venv's python3 kernelspec)
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
    "awakening_task2 (an experiment) and awakening_table3 (its artefact) run by plain papermill at tiny; `kgrag report` finds the artefact."
    env = _env(tmp_path, KGRAG_LLM_URL=embedded_server.url)
    exp_nb, art_nb = ROOT / "nbs/studies/awakening/experiments/awakening_task2.ipynb", ROOT / "nbs/studies/awakening/artefacts/awakening_table3.ipynb"
    code0 = code_version(get_config(), "nbs/studies/awakening/experiments/awakening_task2.ipynb")
    p, t_exp = _papermill(exp_nb, tmp_path / "awakening_task2.ipynb", env, ROOT, "-p", "profile", "tiny")
    assert p.returncode == 0, p.stderr[-3000:]
    p2, t_art = _papermill(art_nb, tmp_path / "awakening_table3.ipynb", env, ROOT, "-p", "profile", "tiny")
    assert p2.returncode == 0, p2.stderr[-3000:]
    assert TCP_WARNING not in p.stdout + p.stderr + p2.stdout + p2.stderr
    print(f"plain papermill at tiny: awakening_task2 {t_exp:.1f} s, awakening_table3 {t_art:.1f} s")
    runs = _runs(tmp_path)
    (exp_run,) = [m for r, m in runs.items() if r.startswith("nb-awakening_task2-")]
    (art_id, art_run), = [(r, m) for r, m in runs.items() if r.startswith("nb-awakening_table3-")]
    assert exp_run["status"] == art_run["status"] == "finished" and exp_run["model"] == embedded_server.model
    assert exp_run["experiments"][0]["params"]["n_questions"] == 1 and exp_run["llm_usage"]["requests"] > 0
    if code_version(get_config(), "nbs/studies/awakening/experiments/awakening_task2.ipynb") == code0:  # else other work changed the code meanwhile
        assert [x["status"] for x in art_run["experiments"]] == ["reused"] and art_run["llm_usage"].get("requests", 0) == 0
    (a,) = art_run["artifacts"]
    assert a["status"] == "ok" and a["decoding"] == {"awakening_task2": "constrained"}
    from kgrag_nb.studies.awakening import STUDY
    assert sum(STUDY.decoding_deviations["task2"]["constrained"] in d for d in a["deviations"]) == 1  # the study's line, once
    r = subprocess.run([KGRAG, "report"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    index = (tmp_path / "runs" / art_id / "report" / "index.html").read_text()
    assert 'id="art-awakening_table3"' in index and "table3_hits" in index


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
    nb = tmp_path / "t.ipynb"
    _notebook(nb, [("print(6 * 7)", [])])
    p = subprocess.run([str(Path(sys.executable).parent / "jupyter"), "nbconvert", "--to", "notebook", "--execute", str(nb),
                        "--output", "t.out.ipynb", "--ExecutePreprocessor.kernel_manager_class=kgrag_nb.reproduce.NiceKernelManager"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "42" in (tmp_path / "t.out.ipynb").read_text(), p.stderr[-2000:]
    assert TCP_WARNING not in p.stdout + p.stderr


# what the kernel says about its own connection, and the socket files it leaves
CONN = ("import ipykernel, json\nc = json.loads(ipykernel.get_connection_info())\n"
        "print('transport=' + c['transport'])\nprint('ip=' + c['ip'])")


def _connection(executed: Path) -> dict:
    outs = "".join(o.get("text", "") for c in nbformat.read(str(executed), as_version=4).cells for o in c.get("outputs", []))
    return dict(line.split("=", 1) for line in outs.splitlines() if "=" in line)


def _assert_ipc(conn: dict, out: str):
    from kgrag_nb.reproduce import kernel_socket_dir
    assert conn.get("transport") == "ipc", conn
    assert Path(conn["ip"]).parent == kernel_socket_dir(), conn  # a private folder of this user
    assert not list(Path(conn["ip"]).parent.glob(Path(conn["ip"]).name + "-*"))  # sockets removed with the kernel
    assert TCP_WARNING not in out


@pytest.mark.slow
def test_plain_papermill_and_nbconvert_kernels_talk_over_ipc(tmp_path):
    "Plain `papermill` and `jupyter nbconvert --execute` (no flags) started the venv's python3 kernel on loopback TCP, and"
    " ipykernel warned 'Kernel is running over TCP without encryption' (defect pinned): the kernelspec that `make setup`"
    " installs names the project's IPC provisioner."
    nb = tmp_path / "t.ipynb"
    _notebook(nb, [(CONN, [])])
    p = subprocess.run([*PAPERMILL, str(nb), str(tmp_path / "pm.ipynb")], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    _assert_ipc(_connection(tmp_path / "pm.ipynb"), p.stdout + p.stderr)
    p = subprocess.run([str(Path(sys.executable).parent / "jupyter"), "nbconvert", "--to", "notebook", "--execute", str(nb),
                        "--output", "nbc.ipynb"], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    _assert_ipc(_connection(tmp_path / "nbc.ipynb"), p.stdout + p.stderr)


def _execute_over_websocket(base: str, token: str, kernel_id: str, code: str) -> str:
    "Run `code` in a kernel of a Jupyter server as JupyterLab does (the kernel's channels over a websocket); its stdout."
    import uuid, websocket  # websocket-client (dev requirement)
    ws = websocket.create_connection(f"ws://{base}/api/kernels/{kernel_id}/channels?token={token}", timeout=120)
    msg_id = uuid.uuid4().hex
    ws.send(json.dumps({"header": {"msg_id": msg_id, "username": "test", "session": uuid.uuid4().hex, "msg_type": "execute_request",
                                   "version": "5.3"}, "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                        "content": {"code": code, "silent": False, "store_history": False, "user_expressions": {},
                                    "allow_stdin": False, "stop_on_error": True}}))
    out = ""
    try:
        while True:
            m = json.loads(ws.recv())
            if m.get("parent_header", {}).get("msg_id") != msg_id: continue
            if m["msg_type"] == "stream": out += m["content"]["text"]
            if m["msg_type"] == "error": raise AssertionError(m["content"])
            if m["msg_type"] == "status" and m["content"]["execution_state"] == "idle": return out  # after its outputs
    finally: ws.close()


@pytest.mark.slow
def test_jupyter_server_kernels_talk_over_ipc(tmp_path):
    "A kernel that JupyterLab opens (through its Jupyter server) used loopback TCP and warned 'without encryption' in the"
    " server's log (defect pinned): the server's kernels use the python3 kernelspec's IPC provisioner too."
    import httpx
    from kgrag_nb.serve import free_port
    port, token = free_port(), "t" + os.urandom(8).hex()
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    log = (tmp_path / "server.log").open("w")
    srv = subprocess.Popen([str(Path(sys.executable).parent / "jupyter"), "server", "--no-browser", f"--port={port}",
                            "--ip=127.0.0.1", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={tmp_path}",
                            *(["--allow-root"] if os.getuid() == 0 else [])],
                           env=env, stdout=log, stderr=subprocess.STDOUT)
    base, h = f"127.0.0.1:{port}", {"Authorization": f"token {token}"}
    try:
        for _ in range(240):
            assert srv.poll() is None, (tmp_path / "server.log").read_text()[-2000:]
            try:
                if httpx.get(f"http://{base}/api/status", headers=h).status_code == 200: break
            except httpx.HTTPError: pass
            time.sleep(0.5)
        k = httpx.post(f"http://{base}/api/kernels", headers=h, json={"name": "python3"}, timeout=120).json()
        conn = dict(line.split("=", 1) for line in _execute_over_websocket(base, token, k["id"], CONN).splitlines())
        # JupyterLab's "Restart Kernel": the new kernel process reads the same connection file, IPC again
        assert httpx.post(f"http://{base}/api/kernels/{k['id']}/restart", headers=h, timeout=120).status_code == 200
        again = dict(line.split("=", 1) for line in _execute_over_websocket(base, token, k["id"], CONN).splitlines())
        assert again == conn, (again, conn)
        assert httpx.delete(f"http://{base}/api/kernels/{k['id']}", headers=h, timeout=120).status_code == 204
    finally:
        srv.terminate(); srv.wait(60); log.close()
    _assert_ipc(conn, (tmp_path / "server.log").read_text())


def test_install_kernelspec_names_the_ipc_provisioner(tmp_path):
    "The kernelspec `make setup` installs names a provisioner registered under jupyter_client's entry points."
    from jupyter_client.kernelspec import KernelSpecManager
    from jupyter_client.provisioning import KernelProvisionerFactory
    from kgrag_nb.reproduce import IPCProvisioner, install_kernelspec
    dest = install_kernelspec(prefix=tmp_path)
    assert dest == tmp_path / "share/jupyter/kernels/python3"
    spec = KernelSpecManager(kernel_dirs=[str(tmp_path / "share/jupyter/kernels")]).get_kernel_spec("python3")
    assert spec.display_name == "Python 3 (kgrag_nb)" and spec.argv[0] == sys.executable and "{connection_file}" in spec.argv
    name = spec.metadata["kernel_provisioner"]["provisioner_name"]
    assert KernelProvisionerFactory.instance().provisioners[name].load() is IPCProvisioner
    assert install_kernelspec(prefix=tmp_path) == dest  # installing again replaces it


def test_install_kernelspec_refuses_without_the_provisioner_registered(tmp_path, monkeypatch):
    "A kernelspec naming an unregistered provisioner would stop every python3 kernel from starting: refused, with the fix."
    import kgrag_nb.reproduce as rp
    monkeypatch.setattr(rp, "entry_points", lambda **kw: [])  # as before `pip install -e .` registered it
    with pytest.raises(RuntimeError, match=r"'kgrag-ipc' is not registered .*run `pip install -e \.`"):
        rp.install_kernelspec(prefix=tmp_path)
    assert not (tmp_path / "share").exists()


@pytest.mark.slow
def test_a_kernel_is_not_sent_sigint_when_it_is_shut_down(tmp_path):
    "Pins: jupyter_client interrupts a kernel (SIGINT to its process group) before every shutdown request, and an idle"
    " ipykernel then logs 'ERROR | KeyboardInterrupt caught in kernel' (4-6 times in a run's output, read as a failure)."
    " The provisioner drops that one signal; an interrupt asked for (nbclient's cell timeout) still arrives. A child of"
    " the kernel, in its process group, records every SIGINT the group gets (ipykernel resets its own handler per cell)."
    from jupyter_client.manager import KernelManager
    mark, pid = tmp_path / "sigint", tmp_path / "pid"
    child = ("import os, signal, sys, time\n"
             f"signal.signal(signal.SIGINT, lambda *a: open({str(mark)!r}, 'a').write('x'))\n"
             f"open({str(pid)!r}, 'w').write(str(os.getpid()))\n"
             "time.sleep(120)\n")
    km = KernelManager(kernel_name="python3")
    km.start_kernel()
    try:
        assert type(km.provisioner).__name__ == "IPCProvisioner"
        kc = km.client(); kc.start_channels(); kc.wait_for_ready(timeout=60)
        kc.execute_interactive(f"import subprocess, sys\nsubprocess.Popen([sys.executable, '-c', {child!r}])", timeout=60)
        for _ in range(100):
            if pid.exists() and pid.read_text(): break
            time.sleep(0.1)
        km.interrupt_kernel()  # asked for: arrives
        for _ in range(100):
            if mark.exists(): break
            time.sleep(0.1)
        assert mark.read_text() == "x"
        mark.unlink(); kc.stop_channels()
        km.shutdown_kernel()  # jupyter_client's own interrupt before the shutdown request: dropped
        time.sleep(1)
        assert not mark.exists()
    finally:
        if km.has_kernel: km.shutdown_kernel(now=True)
        if pid.exists() and pid.read_text():
            try: os.kill(int(pid.read_text()), 9)
            except ProcessLookupError: pass
