"""`kgrag report` (issue 8, item 7): pure parts with hand-computed expectations and properties, and a report of a real
run opened in a real headless Chromium (Debian's `chromium` package) driven over the DevTools protocol.

The browser tests build one run with `kgrag reproduce --profile tiny --only brink_kg_statistics,awakening_closed_book` (the
second on the real embedded llama.cpp server), build its report with `kgrag report`, open `index.html` from `file://`
and check: it loads, every link resolves (pages are opened, files read back by the browser), every image has a natural
width, and no console error, exception or failed load happens on any page. `test_the_checker_finds_broken_pages`
shows that the same checker fails on a page with a missing image, a dangling link and a script error.
They skip, saying why, only when no Chromium is installed (`apt-get install chromium`; `.ci/run` installs it) and the
environment is not a CI: under `CI=true` a missing Chromium fails them (issue 22 item 14: a CI without Chromium is a failed CI).
"""
from __future__ import annotations
import collections, html, json, os, re, shutil, subprocess, time, urllib.request
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest
import websocket  # websocket-client (dev requirement; a jupyter dependency too)
from hypothesis import given, strategies as st

import kgrag_nb.report  # registers `kgrag report` even where the installed entry points predate it
from kgrag_nb.cli import main
from kgrag_nb.config import get_config
from kgrag_nb.reproduce import load_registry, reproduce
from kgrag_nb.report import Link, href, html_table, index_rows, paper_ref

CHROMIUM = next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)
NO_CHROMIUM = "no Chromium on PATH: `apt-get install chromium` (Debian; .ci/run does it)"
IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")  # GitHub Actions, GitLab CI, ... set CI=true
needs_chromium = pytest.mark.skipif(CHROMIUM is None and not IN_CI, reason=NO_CHROMIUM)  # in CI: never skipped (the fixture fails)


# ---------------------------------------------------------------- pure parts

@pytest.mark.parametrize("title, expected", [
    ("BRINK Table 1: mined Horn rules by type (AMIE semantics, App. A.2 thresholds) vs the paper", "Table 1"),
    ("Awakening Table 4 (App. B.1): Hits@1/Hits@10 per knowledge type", "Table 4 (App. B.1)"),
    ("BRINK Figure 3: HHR by rule type on FB15k-237", "Figure 3"),
    ("Awakening Fig. 5 / Table 10 (App. B.6): awakening vs model size", "Fig. 5 / Table 10 (App. B.6)"),
    ("BRINK App. J: retrieval vs reasoning failures", "App. J"),
    ("Closed-book (No RAG) Hits@1/Hits@10 (awakening App. E prompt; cf. Table 3 No RAG)", "cf. Table 3"),
    ("no reference at all", ""),
])
def test_paper_ref_hand_cases(title, expected):
    assert paper_ref(title) == expected


def test_every_registered_artefact_names_its_place_in_the_paper():
    missing = {a.id: a.title for a in load_registry().values() if not paper_ref(a.title)}
    assert not missing, f"titles in studies.yaml that name no table, figure or appendix: {missing}"


def test_index_rows_hand_case():
    manifest = {"artifacts": [
        {"artifact": "a1", "paper": "papers/x_paper.txt", "status": "ok", "models": ["m1", "m2"],
         "sample_sizes": {"cwq": 3, "webqsp": 4}, "wall_s": 1.5},
        {"artifact": "b2", "status": "skipped"}]}
    rows = index_rows(manifest, {"a1": "X Table 2: <scores>"}, notebooks={"a1"})
    assert rows == [
        {"artefact": Link("a1", "#art-a1"), "title": "X Table 2: <scores>", "paper": "x_paper", "in the paper": "Table 2",
         "status": "ok", "model": "m1, m2", "sample sizes": "cwq=3, webqsp=4", "wall s": 1.5,
         "notebook": Link("notebook", "notebooks/a1.html")},
        {"artefact": Link("b2", "#art-b2"), "title": "b2", "paper": "", "in the paper": "", "status": "skipped",
         "model": "none", "sample sizes": "", "wall s": None, "notebook": ""}]
    table = html_table(rows)
    assert table.count("<tr>") == 3 and "X Table 2: &lt;scores&gt;" in table and '<a href="#art-a1">a1</a>' in table
    assert "<td>1.5</td>" in table and "<td>cwq=3, webqsp=4</td>" in table


def test_html_table_columns_and_limit():
    t = html_table([{"a": 1, "b": 2.0}, {"b": 0.333333, "c": "z"}], max_rows=1)
    assert "<th>a</th><th>b</th><th>c</th>" in t and "<td>1</td><td>2</td><td></td>" in t and "0.3333" not in t
    assert t.endswith('<p class="note">1 more rows in the CSV.</p>')


@given(st.text())
def test_html_table_escapes_every_text(text):
    cell = re.findall(r"<td>(.*?)</td>", html_table([{"col": text}]), re.S)[0]
    assert "<" not in cell and ">" not in cell and html.unescape(cell) == text


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1))
def test_href_is_a_quoted_relative_path(path):
    h = href(path)
    assert not re.search(r'[\s"<>\']', h) and ":" not in h.split("/")[0]
    assert unquote(html.unescape(h)) == path


# ---------------------------------------------------------------- the browser

class Chromium:
    "Headless Chromium over the DevTools protocol: open pages, read files, collect console errors and failed loads."

    def __init__(self, profile_dir: Path):
        self.proc = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
             "--allow-file-access-from-files",  # lets the checker read linked files (CSV, PDF) with XMLHttpRequest
             "--remote-debugging-port=0", f"--user-data-dir={profile_dir}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        port_file, t0 = profile_dir / "DevToolsActivePort", time.time()
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None or time.time() - t0 > 60:
                self.close(); raise RuntimeError(f"{CHROMIUM} did not open its DevTools port within 60 s")
            time.sleep(0.2)
        port = port_file.read_text().split()[0]
        targets = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=30).read())
        page = next(t for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        self.n, self.events = 0, []
        for domain in ("Page", "Runtime", "Log", "Network"): self.call(f"{domain}.enable")

    def call(self, method: str, **params) -> dict:
        self.n += 1
        self.ws.send(json.dumps({"id": self.n, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self.n:
                if "error" in msg: raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def eval(self, expression: str):
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in res: raise RuntimeError(f"{expression[:60]}: {res['exceptionDetails']}")
        return res["result"].get("value")

    def _wait(self, name: str, timeout: float = 60):
        t0 = time.time()
        while not any(e.get("method") == name for e in self.events):
            if time.time() - t0 > timeout: raise TimeoutError(f"no {name} within {timeout} s")
            self.events.append(json.loads(self.ws.recv()))

    def open(self, url: str) -> list[str]:
        "Navigate to `url`; the problems seen while it loads (navigation error, exceptions, console errors, failed loads)."
        self.events = []
        res = self.call("Page.navigate", url=url)
        if res.get("errorText"): return [f"{url}: {res['errorText']}"]
        self._wait("Page.loadEventFired")
        self.eval("new Promise(r => setTimeout(r, 200))")  # late errors (scripts after load)
        return self.problems(url)

    def problems(self, url: str) -> list[str]:
        out = []
        for e in self.events:
            m, p = e.get("method"), e.get("params", {})
            if m == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]; out.append(f"{url}: exception {d.get('exception', {}).get('description') or d.get('text')}")
            elif m == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                out.append(f"{url}: console.{p['type']} {[a.get('value', a.get('description')) for a in p.get('args', [])]}")
            elif m == "Log.entryAdded" and p["entry"]["level"] == "error":
                out.append(f"{url}: {p['entry'].get('text')} {p['entry'].get('url', '')}")
            elif m == "Network.loadingFailed" and not p.get("canceled"):
                out.append(f"{url}: failed to load ({p.get('errorText')})")
        return out

    def images(self) -> list[list]:
        return self.eval("Array.from(document.images).map(i => [i.getAttribute('src'), i.complete, i.naturalWidth])")

    def links(self) -> list[list]:
        return self.eval("Array.from(document.querySelectorAll('a[href]')).map(a => [a.getAttribute('href'), a.href])")

    def read(self, url: str) -> int:
        "Bytes the browser reads from `url` (-1 on an error)."
        return self.eval("new Promise(res => { const x = new XMLHttpRequest(); x.open('GET', %s); x.responseType = 'arraybuffer';"
                         " x.onload = () => res(x.response ? x.response.byteLength : 0); x.onerror = () => res(-1); x.send(); })"
                         % json.dumps(url))

    def close(self):
        try: self.ws.close()
        except Exception: pass  # the browser may be gone already
        self.proc.terminate()
        try: self.proc.wait(10)
        except subprocess.TimeoutExpired: self.proc.kill(); self.proc.wait(10)


def check_site(browser: Chromium, index: Path) -> dict:
    "Open `index` and every page it links to; `{problems, pages, files, images, external}`."
    problems, pages, files, images, external = [], [], [], [], []
    start = index.resolve().as_uri()
    todo, seen = [start], set()
    while todo:
        url = todo.pop(0)
        if url in seen: continue
        seen.add(url); pages.append(url)
        problems += browser.open(url)
        for src, complete, width in browser.images():
            images.append((url, src))
            if not complete or width <= 0: problems.append(f"{url}: image {src} did not load (naturalWidth {width})")
        for raw, resolved in browser.links():
            target = urlparse(resolved)
            if target.scheme in ("http", "https"): external.append((url, raw)); continue
            if target.scheme != "file": problems.append(f"{url}: link {raw} is not relative ({target.scheme})"); continue
            page_url = resolved.split("#")[0]
            if page_url == url.split("#")[0]:  # a link inside the page: its target must exist
                frag = target.fragment  # as the HTML spec finds a fragment's element: the raw id, else the percent-decoded one
                if frag and not browser.eval(f"((f) => !!(document.getElementById(f) || document.getElementById(decodeURIComponent(f))"
                                             f" || document.getElementsByName(f).length))({json.dumps(frag)})"):
                    problems.append(f"{url}: link {raw} points to no element")
                continue
            if page_url.endswith(".html"): todo.append(page_url); continue
            if page_url not in files:
                files.append(page_url)
                if browser.read(page_url) <= 0: problems.append(f"{url}: link {raw} -> {unquote(target.path)} cannot be read")
        problems += [p for p in browser.problems(url) if p not in problems]  # anything the reads above logged
    return dict(problems=problems, pages=pages, files=files, images=images, external=external)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    if CHROMIUM is None:
        if IN_CI: pytest.fail(f"CI=true and {NO_CHROMIUM}: a CI without Chromium is a failed CI, not a skipped browser test")
        pytest.skip(NO_CHROMIUM)
    b = Chromium(tmp_path_factory.mktemp("chromium-profile"))
    yield b
    b.close()


@needs_chromium
def test_the_checker_finds_broken_pages(browser, tmp_path):
    "The checker can fail: a missing image, a dangling file link and anchor, a console error and an exception."
    (tmp_path / "ok.csv").write_text("a,b\n1,2\n")
    (tmp_path / "index.html").write_text(
        '<!DOCTYPE html><html><head><meta charset="utf-8"><title>t</title></head><body>'
        '<img src="missing.png"><a href="ok.csv">fine</a><a href="nope.csv">gone</a><a href="#nowhere">x</a>'
        '<a href="page.html">page</a><script>console.error("boom"); setTimeout(() => { throw new Error("bang"); }, 0);</script>'
        "</body></html>")
    (tmp_path / "page.html").write_text('<!DOCTYPE html><html><body><a href="index.html">back</a></body></html>')
    res = check_site(browser, tmp_path / "index.html")
    text = "\n".join(res["problems"])
    assert "image missing.png did not load" in text and "nope.csv cannot be read" in text and "#nowhere points to no element" in text
    assert "boom" in text and "bang" in text
    assert "ok.csv" not in text and not [p for p in res["problems"] if p.startswith(res["pages"][1])]
    assert len(res["pages"]) == 2 and len(res["files"]) == 2


# ---------------------------------------------------------------- a report of a real run

@pytest.fixture(scope="module")
def real_report(tmp_path_factory, embedded_server):
    "A tiny real run (brink_kg_statistics without LLM, awakening_closed_book on the embedded server) and its report via `kgrag report`."
    d = tmp_path_factory.mktemp("report")
    real = get_config()
    cfg = get_config(root=real.root, data_dir=real.data_dir, cache_dir=real.cache_dir,  # the shared LLM response cache
                     runs_dir=d / "runs", figures_dir=d / "figures")
    t0 = time.time()
    m = reproduce(profile="tiny", only="brink_kg_statistics,awakening_closed_book", llm_url=embedded_server.url, cfg=cfg, progress=False)
    assert m["failed"] == [] and m["skipped"] == [], [e.get("error") for e in m["artifacts"]]
    t1 = time.time()
    env = {"KGRAG_HOME": str(cfg.root), "KGRAG_RUNS": str(cfg.runs_dir), "KGRAG_FIGURES": str(cfg.figures_dir)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try: assert main(["report", "--out", str(d / "site")]) == 0  # no --run: the last run, i.e. this one
    finally:
        for k, v in saved.items():
            if v is None: os.environ.pop(k, None)
            else: os.environ[k] = v
    print(f"\nreproduce tiny (2 artefacts): {t1 - t0:.1f} s; kgrag report: {time.time() - t1:.1f} s")
    return dict(manifest=m, index=d / "site" / "index.html", cfg=cfg)


@pytest.mark.llm
@needs_chromium
def test_real_report_opens_with_no_broken_link_image_or_console_error(browser, real_report):  # browser first: no Chromium fails fast
    t0 = time.time()
    res = check_site(browser, real_report["index"])
    print(f"\nbrowser check: {len(res['pages'])} pages, {len(res['files'])} files, {len(res['images'])} images in {time.time() - t0:.1f} s")
    assert not res["problems"], "\n".join(res["problems"])
    assert not [e for e in res["external"] if e[0].endswith("/index.html")], f"the index links outside the report: {res['external']}"
    site = real_report["index"].parent
    # both artefacts' notebooks were opened, and every figure the run wrote shows as a thumbnail on the index; the
    # closed-book baseline's questions have an item page (from its own per-question table: it runs no experiment)
    assert {Path(unquote(urlparse(p).path)).relative_to(site).as_posix() for p in res["pages"]} == {
        "index.html", "notebooks/brink_kg_statistics.html", "notebooks/awakening_closed_book.html", "items/awakening_closed_book/1-1.html"}
    thumbs = {src for page, src in res["images"] if page.endswith("/index.html")}
    assert thumbs == {"files/brink_kg_statistics/mean_degree.png", "files/awakening_closed_book/closed_book_hits.png"}
    read = {Path(unquote(urlparse(f).path)).relative_to(site).as_posix() for f in res["files"]}
    for name in ("brink_kg_statistics/kg_counts_vs_paper.csv", "brink_kg_statistics/mean_degree.pdf", "awakening_closed_book/closed_book_vs_paper.md"):
        assert f"files/{name}" in read, name


@pytest.mark.llm
def test_real_report_shows_each_artefact_with_its_provenance(real_report):
    m, page = real_report["manifest"], real_report["index"].read_text()
    assert f"run {m['run_id']}" in page and html.escape(m["git_sha"]) in page
    for e in m["artifacts"]:
        section = page[page.index(f'<section id="art-{e["artifact"]}">'):]
        section = section[:section.index("</section>")]
        assert "Ours vs the paper" in section, e["artifact"]
        for dev in e["deviations"]: assert html.escape(dev) in section
        for f, sha in e["datasets"].items(): assert f"<td>{html.escape(f)}</td><td>{sha}</td>" in section
        assert f"<dt>sample sizes</dt><dd>{html.escape(', '.join(f'{k}={v}' for k, v in e['sample_sizes'].items()))}</dd>" in section
        assert f"<dt>model</dt><dd>{html.escape(', '.join(e['models']) or 'none (no LLM used)')}</dd>" in section
    cb = next(e for e in m["artifacts"] if e["artifact"] == "awakening_closed_book")
    assert cb["models"] == [m["model"]]
    # the comparison table holds our row and the paper's (awakening Table 3 No RAG)
    table = page[page.index("Ours vs the paper: Closed-book"):]
    table = table[:table.index("</table>")]
    assert "<td>ours: " in table and "awakening Table 3" in table
    for p in real_report["index"].parent.rglob("*.html"):
        assert not re.search(r"<(?:script|link|img)[^>]+(?:src|href)=\"(?:https?:)?//", p.read_text()), f"{p} loads from the network"


@needs_chromium
def test_experiments_failed_artefacts_and_odd_names_render_and_resolve(browser, tmp_path):
    "A hand-made run: a computed experiment (its notebook under notebooks/experiments/), a reused one, a failed artefact"
    " with a partly executed notebook, and a file name with a space and a colon; every page and link still resolves."
    import nbformat
    cfg = get_config(runs_dir=tmp_path / "runs", figures_dir=tmp_path / "figures")
    run = cfg.runs_dir / "r-1"
    for rel, src in (("notebooks/experiments/exp_a.ipynb", "x = 1"), ("notebooks/art_bad.ipynb", "1 / 0")):
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# A notebook"), nbformat.v4.new_code_cell(src)])
        (run / rel).parent.mkdir(parents=True, exist_ok=True); nbformat.write(nb, run / rel)
    odd = cfg.figures_dir / "art_ok" / "odd: name.csv"; odd.parent.mkdir(parents=True); odd.write_text("source,x\nours,1\n")
    (run / "manifest.json").write_text(json.dumps({"run_id": "r-1", "git_sha": "0" * 40, "profile": "tiny", "started": "2026", "status": "finished", "experiments": [
        {"experiment": "exp_a", "status": "computed", "key": "k" * 64, "executed": "notebooks/experiments/exp_a.ipynb", "wall_s": 1.0},
        {"experiment": "exp_b", "status": "reused", "key": "j" * 64, "wall_s": 0.0}], "artifacts": [
        {"artifact": "art_bad", "status": "failed", "error": "cell 2: ZeroDivisionError: division by zero", "executed": "notebooks/art_bad.ipynb"},
        {"artifact": "art_ok", "status": "ok", "outputs": [str(odd)], "experiments": {"exp_a": "k" * 64}}]}))
    index = kgrag_nb.report.build_report(cfg=cfg)
    res = check_site(browser, index)
    assert not res["problems"], "\n".join(res["problems"])
    site = index.parent
    assert {Path(unquote(urlparse(p).path)).relative_to(site).as_posix() for p in res["pages"]} == {
        "index.html", "notebooks/art_bad.html", "notebooks/experiments/exp_a.html"}
    assert {Path(unquote(urlparse(f).path)).relative_to(site).as_posix() for f in res["files"]} == {"files/art_ok/odd: name.csv"}
    page = index.read_text()
    assert "ZeroDivisionError: division by zero" in page and "reused from the cache" in page and "exp_a (key kkkkkkkkkkkkkkkk)" in page


def test_report_out_never_deletes_a_folder_it_did_not_make(tmp_path):
    "Issue 25 item 2: `kgrag report --out .` in a project folder used to rmtree its `notebooks/` and `files/`."
    cfg = get_config(runs_dir=tmp_path / "runs", figures_dir=tmp_path / "figures")
    (cfg.runs_dir / "r-1").mkdir(parents=True)
    (cfg.runs_dir / "r-1" / "manifest.json").write_text(json.dumps({"run_id": "r-1", "status": "finished", "experiments": [], "artifacts": []}))
    project = tmp_path / "project"; (project / "notebooks").mkdir(parents=True)
    (project / "notebooks" / "mine.ipynb").write_text("{}"); (project / "files").mkdir(); (project / "files" / "data.csv").write_text("a\n")
    with pytest.raises(FileExistsError, match="was not made by `kgrag report`"):
        kgrag_nb.report.build_report("r-1", out=project, cfg=cfg)
    assert (project / "notebooks" / "mine.ipynb").read_text() == "{}" and (project / "files" / "data.csv").exists()
    site = tmp_path / "site"
    index = kgrag_nb.report.build_report("r-1", out=site, cfg=cfg)  # a new folder: made, marked, and rebuilt in place later
    (site / "files" / "stale.txt").parent.mkdir(exist_ok=True); (site / "files" / "stale.txt").write_text("old")
    assert kgrag_nb.report.build_report("r-1", out=site, cfg=cfg) == index and not (site / "files" / "stale.txt").exists()
    empty = tmp_path / "empty"; empty.mkdir()
    assert kgrag_nb.report.build_report("r-1", out=empty, cfg=cfg).exists()  # an empty folder is fine


# ---------------------------------------------------------------- issue 25: item 3 (default run), item 7 (provenance), item 12 (scripts)

def _manifest(run: Path, **m):
    run.mkdir(parents=True, exist_ok=True)
    (run / "manifest.json").write_text(json.dumps({"experiments": [], "artifacts": [], **m}))


def test_default_report_is_the_last_finished_run(tmp_path):
    "Issue 25 item 3: without --run the report is of the newest run whose status is `finished`, never of one that is"
    " still `running` (or was `interrupted`, or `failed`) although it started later; with none finished, the newest, with a warning."
    cfg = get_config(runs_dir=tmp_path / "runs", figures_dir=tmp_path / "figures")
    for rid, started, status in [("old-done", "2026-01-01T00", "finished"), ("done", "2026-01-02T00", "finished"),
                                 ("killed", "2026-01-03T00", "interrupted"), ("broke", "2026-01-04T00", "failed"),
                                 ("live", "2026-01-05T00", "running")]:
        _manifest(cfg.runs_dir / rid, run_id=rid, started=started, status=status)
    assert kgrag_nb.report.find_run(cfg=cfg).name == "done"
    assert kgrag_nb.report.find_run("live", cfg).name == "live"  # named explicitly: any run
    assert "run done" in kgrag_nb.report.build_report(cfg=cfg).read_text()
    only_unfinished = get_config(runs_dir=tmp_path / "runs2", figures_dir=tmp_path / "figures")
    _manifest(only_unfinished.runs_dir / "a", run_id="a", started="2026-01-01T00", status="interrupted")
    _manifest(only_unfinished.runs_dir / "b", run_id="b", started="2026-01-02T00", status="running")
    with pytest.warns(UserWarning, match=r"no finished run.*'b'.*status running.*--run"):
        assert kgrag_nb.report.find_run(cfg=only_unfinished).name == "b"
    with pytest.warns(UserWarning, match="no finished run"):
        page = kgrag_nb.report.build_report(cfg=only_unfinished).read_text()
    assert "did not finish" in page and "running" in page  # the page itself says so


def _shared_figures_run(tmp_path, prov: dict | None, entry_models=("stub-2",), manifest_model="stub-2"):
    "Run r-2 (model stub-2) whose artefact art_ok lists files in figures/art_ok/, whose provenance.json is `prov`."
    cfg = get_config(runs_dir=tmp_path / "runs", figures_dir=tmp_path / "figures")
    folder = cfg.figures_dir / "art_ok"; folder.mkdir(parents=True)
    (folder / "t_vs_paper.csv").write_text("source,Hits@1\nours: stub,0.1\npaper,0.6\n")
    if prov is not None: (folder / "provenance.json").write_text(json.dumps(prov))
    entry = {"artifact": "art_ok", "status": "ok", "outputs": [str(folder / "t_vs_paper.csv")], "params": {"n": 5}, "seed": 0}
    if entry_models is not None: entry["models"] = list(entry_models)
    _manifest(cfg.runs_dir / "r-2", run_id="r-2", started="2026", status="finished", profile="tiny", model=manifest_model,
              artifacts=[entry])
    page = kgrag_nb.report.build_report("r-2", cfg=cfg).read_text()
    section = page[page.index('<section id="art-art_ok">'):]
    return section[:section.index("</section>")]


@pytest.mark.parametrize("prov, entry_models, expected", [
    ({"run_id": "r-1", "models": ["stub"], "params": {"n": 5}, "seed": 0}, ("stub-2",), "written by run r-1 with model stub,"),
    ({"models": ["stub"], "params": {"n": 5}, "seed": 0}, ("stub-2",), "written by another run (its id is not recorded) with model stub,"),
    ({"run_id": "r-1", "models": ["stub-2"], "params": {"n": 5}, "seed": 0}, ("stub-2",), "written by run r-1 with model stub-2,"),
    ({"models": ["stub"], "params": {"n": 5}, "seed": 0}, None, "with model stub,"),  # no run record: the manifest's model
    ({"models": ["stub-2"], "params": {"n": 6}, "seed": 0}, ("stub-2",), "other parameters or seed"),
])
def test_report_warns_when_figures_come_from_another_run_or_model(tmp_path, prov, entry_models, expected):
    "Issue 25 item 7: two runs with different --model share figures/<artefact>/; the report of the second showed"
    " `ours: stub` under `model: stub-2` with no warning. Now the section says whose figures they are and how to rerun."
    section = _shared_figures_run(tmp_path, prov, entry_models)
    assert "<td>ours: stub</td>" in section  # still shown, but under the warning
    warn = re.search(r'<p class="error stale">(.*?)</p>', section, re.S)
    assert warn, section[:2000]
    text = html.unescape(warn.group(1))
    assert expected in text and "not by this run (r-2, model stub-2)" in text, text
    assert "kgrag reproduce --profile tiny --only art_ok --model stub-2" in text, text
    assert warn.start() < section.index("Ours vs the paper")  # before the numbers


@pytest.mark.parametrize("prov", [{"run_id": "r-2", "models": ["stub-2"], "params": {"n": 5}, "seed": 0},
                                  {"models": ["stub-2"], "params": {"n": 5}, "seed": 0}, None])
def test_report_does_not_warn_about_its_own_figures(tmp_path, prov):
    assert "stale" not in _shared_figures_run(tmp_path, prov)


def test_report_warns_on_unreadable_provenance(tmp_path):
    cfg_dir = tmp_path
    section = _shared_figures_run(cfg_dir, {"models": ["stub-2"], "params": {"n": 5}, "seed": 0})
    assert "stale" not in section
    (tmp_path / "figures" / "art_ok" / "provenance.json").write_text('{"models": [')  # cut short
    page = kgrag_nb.report.build_report("r-2", cfg=get_config(runs_dir=tmp_path / "runs", figures_dir=tmp_path / "figures")).read_text()
    assert "provenance.json cannot be read" in page


PWN_HTML = '<script>window.pwned=1</script><img src=x onerror="window.pwned=2">'


def _hostile_run(tmp_path) -> Path:
    "A run whose executed notebook displays a script (HTML and Markdown outputs) and has a Markdown cell with a raw script."
    import nbformat
    cfg = get_config(runs_dir=tmp_path / "runs", figures_dir=tmp_path / "figures")
    run = cfg.runs_dir / "r-x"; (run / "notebooks").mkdir(parents=True)
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# Hostile\n\n<script>window.pwned=3</script>\n\n<b onmouseover=\"window.pwned=4\">bold</b> "
                                      '<a href="javascript:window.pwned=5">link</a> and `x < y`'),
        nbformat.v4.new_code_cell("display(HTML(...))")])
    nb.cells[1].outputs = [
        nbformat.v4.new_output("display_data", {"text/html": PWN_HTML, "text/plain": "<IPython.core.display.HTML object>"}),
        nbformat.v4.new_output("display_data", {"text/markdown": "<script>window.pwned=6</script>\n\n**md**"}),
        nbformat.v4.new_output("display_data", {"application/javascript": "window.pwned=7", "text/plain": "js"}),
        nbformat.v4.new_output("display_data", {"text/html": "<table><thead><tr><th>col</th></tr></thead><tbody><tr><td>7</td></tr></tbody></table>"})]
    nbformat.write(nb, run / "notebooks" / "art_x.ipynb")
    _manifest(run, run_id="r-x", started="2026", status="finished", artifacts=[
        {"artifact": "art_x", "status": "ok", "executed": "notebooks/art_x.ipynb", "outputs": []}])
    return kgrag_nb.report.build_report("r-x", cfg=cfg)


def test_report_pages_carry_a_csp_and_notebook_scripts_are_removed(tmp_path):
    "Issue 25 item 12: notebook HTML and Markdown outputs were copied into the site unsanitised (<script>, onerror)."
    index = _hostile_run(tmp_path)
    pages = sorted(index.parent.rglob("*.html"))
    assert [p.relative_to(index.parent).as_posix() for p in pages] == ["index.html", "notebooks/art_x.html"]
    for p in pages:
        text = p.read_text()
        head = text[:text.index("</head>")]
        meta = re.search(r'<meta\b[^>]*\bhttp-equiv="Content-Security-Policy"[^>]*>', head)  # nbconvert reorders attributes
        csp = re.search(r'\bcontent="([^"]+)"', meta.group(0)).group(1) if meta else ""
        assert "script-src 'none'" in csp and "object-src 'none'" in csp and "default-src 'self'" in csp, p
        assert head.index("Content-Security-Policy") < min(i for i in (head.find("<style"), head.find("<script"), len(head)) if i >= 0)
        assert not re.search(r"<script", text, re.I), f"{p}: a script element"
        assert not re.search(r"\son\w+\s*=", text, re.I), f"{p}: an event handler attribute"
        assert "javascript:" not in text, p
    nb = pages[1].read_text()
    assert "bold" in nb and "<strong>md</strong>" in nb and "<th>col</th>" in nb and "<td>7</td>" in nb  # harmless markup stays
    assert re.search(r'<img [^>]*src="x"', nb) and "<code>x &lt; y</code>" in nb and "<a>link</a>" in nb


@needs_chromium
def test_notebook_scripts_do_not_run_in_the_browser(browser, tmp_path):
    index = _hostile_run(tmp_path)
    res = check_site(browser, index)
    missing_x = ("image x did not load", "/notebooks/x", "failed to load (net::ERR_FILE_NOT_FOUND)")  # the hostile <img src=x>
    assert [p for p in res["problems"] if not any(m in p for m in missing_x)] == [], res["problems"]  # no CSP violation either
    for page in res["pages"]:
        browser.open(page)
        assert browser.eval("typeof window.pwned") == "undefined", page


# ---------------------------------------------------------------- issue 24 item 2: templates escape everything a run wrote

SCRIPT = "<script>alert(1)</script>"


class _Tags(__import__("html.parser").parser.HTMLParser):
    "The start tags of a page and its text, as a browser's parser reads them."
    def __init__(self, text: str):
        super().__init__(convert_charrefs=True); self.tags, self.text = [], []
        self.feed(text); self.close()
    def handle_starttag(self, tag, attrs): self.tags.append(tag)
    def handle_data(self, data): self.text.append(data)


def test_a_script_in_any_string_of_a_run_renders_as_text(tmp_path):
    "A dataset name, an artefact title, a table caption, a table cell, a deviation and an error holding `<script>` show"
    " as text in both the index and the artefact's section: no script element, the string readable as written."
    (tmp_path / "studies.yaml").write_text(  # a real registry: the index takes the artefact's title from it
        f'artifacts:\n  art_s: {{paper: p.txt, title: "X Table 1: title {SCRIPT}", notebook: nbs/s.ipynb}}\n')
    cfg = get_config(root=tmp_path, runs_dir=tmp_path / "runs", figures_dir=tmp_path / "figures")
    folder = cfg.figures_dir / "art_s"; folder.mkdir(parents=True)
    (folder / "t_vs_paper.csv").write_text(f"source,Hits@1\n{SCRIPT},0.1\npaper,0.6\n")
    (folder / "t_vs_paper.md").write_text(f"**caption {SCRIPT}**\n\n| source |\n")
    _manifest(cfg.runs_dir / "r-s", run_id="r-s", started="2026", status="finished", profile="tiny", artifacts=[
        {"artifact": "art_s", "status": "ok", "outputs": [str(folder / "t_vs_paper.csv"), str(folder / "t_vs_paper.md")],
         "sample_sizes": {SCRIPT: 3}, "datasets": {f"data/{SCRIPT}.jsonl": "ab" * 32}, "deviations": [SCRIPT]},
        {"artifact": "art_f", "status": "failed", "error": SCRIPT}])
    page = kgrag_nb.report.build_report("r-s", cfg=cfg).read_text()
    parsed = _Tags(page)
    assert "script" not in parsed.tags and "<script" not in page.lower()
    text = "".join(parsed.text)
    for shown in (f"title {SCRIPT}", f"{SCRIPT}=3", f"caption {SCRIPT}", f"data/{SCRIPT}.jsonl", f"failed: {SCRIPT}"):
        assert shown in text, shown  # readable as text
    index, sections = page[:page.index("<section")], page[page.index("<section"):]
    esc = html.escape(SCRIPT)
    index_table = index[index.index("<h2>Artefacts</h2>"):]
    assert f"<td>X Table 1: title {esc}</td>" in index_table and f"<td>{esc}=3</td>" in index_table
    art_s = sections[:sections.index("</section>")]
    assert f'<p class="title">X Table 1: title {esc}</p>' in art_s and f"<dd>{esc}=3</dd>" in art_s
    assert f"<h3>Ours vs the paper: caption {esc}</h3>" in art_s and f"<td>{esc}</td><td>0.1</td>" in art_s
    assert f"<li>t_vs_paper: caption {esc} (" in art_s and f"<td>data/{esc}.jsonl</td>" in art_s and f"<li>{esc}</li>" in art_s
    assert f'<p class="error">failed: {esc}</p>' in sections[sections.index('<section id="art-art_f">'):]
    head = page[:page.index("</head>")]
    assert f'<meta http-equiv="Content-Security-Policy" content="{kgrag_nb.report.CSP}">' in head  # kept, unescaped


# ---------------------------------------------------------------- a tampered run folder (reliability round 3, item 5)

SECRET = "TOPSECRET-report-0123456789"


def _tampered(tmp_path, **entry):
    "Run r-t whose one artefact entry is `entry`; the report folder is runs/r-t/report (four levels below tmp_path)."
    cfg = get_config(runs_dir=tmp_path / "runs", figures_dir=tmp_path / "figures")
    _manifest(cfg.runs_dir / "r-t", run_id="r-t", started="2026", status="finished", artifacts=[{"status": "ok", **entry}])
    return cfg


def _outside(tmp_path) -> set[str]:
    "What exists in tmp_path besides the run folder, the figures folder and the secret (files a report must not make)."
    return {p.name for p in tmp_path.iterdir()} - {"runs", "figures", "secret.txt"}


def test_an_artefact_id_that_climbs_out_of_the_run_is_refused_before_anything_is_written(tmp_path):
    "Defect pinned: an artefact id `../../../../escaped` with `outputs` naming system files made `kgrag report` create"
    " tmp/escaped/ holding copies of /etc/passwd and /etc/hostname, and tmp/escaped.html beside it, with rc 0."
    import nbformat
    cfg = _tampered(tmp_path, artifact="../../../../escaped", outputs=["/etc/passwd", "/etc/hostname"],
                    executed="notebooks/ok.ipynb")
    (cfg.runs_dir / "r-t" / "notebooks").mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("x = 1")]), cfg.runs_dir / "r-t" / "notebooks" / "ok.ipynb")
    with pytest.raises(ValueError, match=r"artifacts\[0\]\.artifact = '\.\./\.\./\.\./\.\./escaped'"):
        kgrag_nb.report.build_report("r-t", cfg=cfg)
    assert _outside(tmp_path) == set() and not (cfg.runs_dir / "r-t" / "report").exists()
    env = {"KGRAG_RUNS": str(cfg.runs_dir), "KGRAG_FIGURES": str(cfg.figures_dir)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try: rc = main(["report", "--run", "r-t"])
    finally:
        for k, v in saved.items():
            if v is None: os.environ.pop(k, None)
            else: os.environ[k] = v
    assert rc == 1 and _outside(tmp_path) == set()


@pytest.mark.parametrize("outputs", [["/etc/passwd"], ["../secret.txt"], ["{tmp}/secret.txt"], ["{figures}/art/link.csv"]])
def test_outputs_outside_the_figures_and_run_folders_are_refused(tmp_path, outputs):
    "An `outputs` path (absolute, climbing, or a symbolic link in figures/) that resolves outside the run folder and the"
    " figures folder is refused, naming the field and the value; nothing is copied into the report."
    (tmp_path / "secret.txt").write_text(SECRET)
    (tmp_path / "figures" / "art").mkdir(parents=True)
    (tmp_path / "figures" / "art" / "link.csv").symlink_to(tmp_path / "secret.txt")
    outputs = [o.format(tmp=tmp_path, figures=tmp_path / "figures") for o in outputs]
    cfg = _tampered(tmp_path, artifact="art", outputs=outputs)
    with pytest.raises(ValueError, match=r"artifacts\[0\]\.outputs\[0\] = " + re.escape(repr(outputs[0]))) as e:
        kgrag_nb.report.build_report("r-t", cfg=cfg)
    assert SECRET not in str(e.value) and "outside" in str(e.value)
    assert not (cfg.runs_dir / "r-t" / "report").exists() and _outside(tmp_path) == set()


@pytest.mark.parametrize("executed", ["../../secret.txt", "{tmp}/secret.txt", "notebooks/not_a_notebook.ipynb"])
def test_an_executed_path_outside_the_run_or_not_a_notebook_never_shows_its_content(tmp_path, executed):
    "Defect pinned: `executed: ../../../../etc/passwd` was read and the file's first line printed in the error."
    (tmp_path / "secret.txt").write_text(SECRET)
    executed = executed.format(tmp=tmp_path)
    cfg = _tampered(tmp_path, artifact="art", executed=executed, outputs=[])
    (cfg.runs_dir / "r-t" / "notebooks").mkdir()
    (cfg.runs_dir / "r-t" / "notebooks" / "not_a_notebook.ipynb").write_text(SECRET)
    with pytest.raises(ValueError, match=r"artifacts\[0\]\.executed = " + re.escape(repr(executed))) as e:
        kgrag_nb.report.build_report("r-t", cfg=cfg)
    assert SECRET not in str(e.value), str(e.value)
    assert _outside(tmp_path) == set()


@pytest.mark.parametrize("bad", ["nl\n", "a/b", "..", "", " x", "x\n", "-x"])
def test_unsafe_ids_are_refused_in_every_manifest_field_and_run_option(tmp_path, bad):
    "Ids are matched whole (re.fullmatch): `$` of `^...$` with `re.match` let `nl\\n` through."
    cfg = _tampered(tmp_path, artifact=bad, outputs=[])
    with pytest.raises(ValueError, match=r"artifacts\[0\]\.artifact"): kgrag_nb.report.build_report("r-t", cfg=cfg)
    _manifest(cfg.runs_dir / "r-e", run_id="r-e", started="2026", status="finished", experiments=[{"experiment": bad, "status": "computed"}])
    with pytest.raises(ValueError, match=r"experiments\[0\]\.experiment"): kgrag_nb.report.build_report("r-e", cfg=cfg)
    with pytest.raises(ValueError, match="--run"): kgrag_nb.report.find_run(bad, cfg)
    assert _outside(tmp_path) == set()


def test_a_run_listed_as_running_whose_runner_is_gone_is_reported_abandoned(tmp_path):
    "Defect pinned: a SIGKILLed run's manifest said `running` forever. The report (and the runs listing) marks it"
    " `abandoned` when the runner's pid is gone or now belongs to another process (start time differs)."
    import socket, subprocess, sys
    from kgrag_nb.llm import _own_start_time
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead_pid = int(gone.stdout)
    cfg = get_config(runs_dir=tmp_path / "runs", figures_dir=tmp_path / "figures")
    host = socket.gethostname()
    for rid, pid, started in (("dead", dead_pid, None), ("reused", os.getpid(), "1"), ("live", os.getpid(), _own_start_time())):
        _manifest(cfg.runs_dir / rid, run_id=rid, started=f"2026-01-0{len(rid)}", status="running", host=host, pid=pid,
                  pid_started=started)
    _manifest(cfg.runs_dir / "elsewhere", run_id="elsewhere", started="2026", status="running", host=host + "-other", pid=dead_pid)
    _manifest(cfg.runs_dir / "old", run_id="old", started="2026", status="running")  # written before pids were recorded
    page = kgrag_nb.report.build_report("dead", cfg=cfg).read_text()
    assert "status: abandoned" in page, page[:3000]
    status = lambda rid: json.loads((cfg.runs_dir / rid / "manifest.json").read_text())["status"]
    assert status("dead") == "abandoned" and status("reused") == "running"  # only the run reported on was looked at so far
    kgrag_nb.report.list_runs(cfg)
    assert {r: status(r) for r in ("dead", "reused", "live", "elsewhere", "old")} == {
        "dead": "abandoned", "reused": "abandoned", "live": "running", "elsewhere": "running", "old": "running"}
    m = json.loads((cfg.runs_dir / "dead" / "manifest.json").read_text())
    assert str(dead_pid) in m["error"] and m["ended"]


# ---------------------------------------------------------------- per-item pages (issue 37 item 3)

from kgrag_nb.report import ItemSet, check_items, method_summary, write_item_pages

ITEMS_DATA = Path(__file__).parent / "data" / "report_items"  # real records of a tiny run: misk_runs and coe_runs results folders
MISK_KEY, COE_KEY = "8ca4c79fc5f9abd2975b8c4a89ecd351cb14e31047f9e79b10de7545d2907632", "be94b549bb85fd6897e7fcc32802e3cc0a3db24debcf8616e93f0f51833f43d3"
AWAKEN_KEY = "368ee16ee837185ed82bde0d52f23c43d6a71cfcb961409aa08f83cb3eccd3ac"
FORMAT_TAX_KEY = "34466c8e8b7fe4e7649cc62f2d832f616712f94a30a39c88c8a002a5f8b00194"
KBQA_KEY, KBC_KEY = "4991cf85e30a95eedfffda7b8920d8819b5958e72325979c3dd75f60260773da", "089fd04e4e7fbfb147f318c26a0711ffbd5f15fcf5d0215100b539a220afb84f"
# the tiny run before jcql_kbqa saved `questions` and jcql_kbc `topk` (its LLM answers timed live: Table 4's seconds)
KBQA_KEY_OLD, KBC_KEY_OLD = "9c54be3cc09d9dbf8d0418a3f96a458f55dccb34cf085484f9f718e2954c358e", "4c19aff18f0a2c0fdd3b4d0f29b605f01c7b9c6c102a752820c414a927caa775"
JCQL_ARTEFACTS = [(a, "jcql_kbqa", KBQA_KEY) for a in ("jcql_table2", "jcql_table3", "jcql_fig2", "jcql_fig4", "jcql_fig5")] \
    + [("jcql_table4", "jcql_kbqa", KBQA_KEY_OLD)] + [(a, "jcql_kbc", KBC_KEY) for a in ("jcql_table1", "jcql_table9", "jcql_fig3", "jcql_table8")]
AWAKEN_MORE = [(a, "awakening_task1", AWAKEN_KEY) for a in ("awakening_fig1", "awakening_fig5", "awakening_fig6", "awakening_fig7", "awakening_table7",
                                                        "awakening_table8_9", "awakening_table11")]
UNSEEN_KEY = "50f4c30f3ff6665a3a110a91b12f50e9b72b57ae29c750ebfa04b1a218d13d63"
BRINK_KEY = "57d95d05c6d1f7c29bd5c9c1a7f841e92302c61112185d60af52af58edf1a675"


def _item(**kw) -> dict:
    out = {"raw": "r", "parsed": "p", "status": "ok", "correct": {"EM": True}}
    return {"item_id": "q1", "question": "Q?", "gold": ["a"], "outputs": {"m": {**out, **kw}}, "trace": None}


@pytest.mark.parametrize("bad, match", [
    ({"item_id": ""}, r"items\[0\]\.item_id = ''"),
    ({"gold": "a"}, r"items\[0\]\.gold = 'a': gold answers are a list of strings"),
    ({"outputs": {"m": {"raw": 1}}}, r"items\[0\]\.outputs\['m'\]: raw = 1 is a int"),
    ({"outputs": {"m": {"status": "fixed"}}}, r"status = 'fixed': one of \('ok', 'repaired', 'failed'\)"),
    ({"outputs": {"m": {"correct": {"F1": 0.5}}}}, r"correct names \['F1'\], which are not the set's metrics \['EM'\]"),
    ({"outputs": {"m": {"correct": {"EM": "yes"}}}}, r"correct\['EM'\] = 'yes' is a str"),
    ({"trace": "trace.jsonl"}, r"items\[0\]\.trace: a list of trace records"),
])
def test_check_items_names_the_bad_field(bad, match):
    with pytest.raises(ValueError, match=match): check_items(ItemSet("t", ["EM"], [{**_item(), **bad}]))
    check_items(ItemSet("t", ["EM"], [_item(), {**_item(), "item_id": "q2", "question": None, "gold": None}]))  # None: not recorded
    with pytest.raises(ValueError, match="repeats an earlier item"): check_items(ItemSet("t", ["EM"], [_item(), _item()]))


def test_method_summary_hand_case():
    s = ItemSet("t", ["EM", "F1"], [
        {"item_id": "a", "outputs": {"m": {"status": "ok", "correct": {"EM": True, "F1": 0.5}}, "n": {"correct": {"EM": None}}}},
        {"item_id": "b", "outputs": {"m": {"status": "failed", "correct": {"EM": False, "F1": 1.0}}}}])
    assert method_summary(s) == [
        {"method": "m", "items": 2, "ok": 1, "repaired": 0, "failed": 1, "n/p": 0, "EM": "0.5 (n=2)", "F1": "0.75 (n=2)"},
        {"method": "n", "items": 1, "ok": 0, "repaired": 0, "failed": 0, "n/p": 1, "EM": "n/r", "F1": "n/r"}]


def _items_run(tmp_path, per_page: int = 100) -> tuple[Path, object]:
    "A run whose artefacts used the real tiny misk_runs, coe_runs, brink_methods, awakening_task1, awakening_task2, jcql_kbqa"
    " and jcql_kbc results (tests/data/report_items), plus aggregates with no items, one artefact with no item reader"
    " and one whose experiment results are gone; its report with `per_page` items a page."
    cfg = get_config(runs_dir=tmp_path / "runs", figures_dir=tmp_path / "figures", cache_dir=tmp_path / "cache")
    shutil.copytree(ITEMS_DATA / "experiments", cfg.cache_dir / "experiments")
    shutil.copytree(ITEMS_DATA / "artifacts", cfg.figures_dir)  # an artefact that runs no experiment keeps its items itself
    _manifest(cfg.runs_dir / "r-i", run_id="r-i", started="2026", status="finished", profile="tiny", artifacts=[
        {"artifact": "awakening_closed_book", "status": "ok", "experiments": {},
         "outputs": [str(cfg.figures_dir / "awakening_closed_book/closed_book_answers.csv")]},
        {"artifact": "brink_kg_statistics", "status": "ok", "outputs": [], "experiments": {}},
        *({"artifact": a, "status": "ok", "outputs": [], "experiments": {e: k}}
          for a, e, k in [("misk_table1", "misk_runs", MISK_KEY), ("misk_table3", "misk_runs", MISK_KEY), ("misk_table2", "misk_runs", MISK_KEY),
                        ("coe_table2", "coe_runs", COE_KEY), ("coe_table3", "coe_runs", COE_KEY), ("coe_table5", "coe_runs", COE_KEY),
                        ("coe_table1", "coe_runs", COE_KEY),
                        ("brink_table7", "brink_methods", BRINK_KEY), ("brink_fig4", "brink_methods", BRINK_KEY),
                        ("awakening_table2", "awakening_task1", AWAKEN_KEY), ("awakening_table4", "awakening_task1", AWAKEN_KEY),
                        ("awakening_table3", "awakening_task2", UNSEEN_KEY),
                        ("brink_table3", "brink_benchmarks", "b" * 64), ("misk_fig3", "misk_runs", "c" * 64),
                        ("new_study_fig1", "new_runs", "d" * 64), ("format_tax", "format_tax_runs", FORMAT_TAX_KEY),
                        ("brink_appj", "brink_methods", BRINK_KEY), *JCQL_ARTEFACTS,
                        *AWAKEN_MORE])])
    return kgrag_nb.report.build_report("r-i", cfg=cfg, items_per_page=per_page), cfg


def _released() -> dict:
    "id -> released CoE record where this checkout's data mirror has them ({} otherwise: the pages then say 'not recorded')."
    from kgrag_nb.studies.coe import evidence as coe
    try: return {r["id"]: r for ds in coe.DATASETS for r in coe.load_released(ds).to_dict("records")}
    except (OSError, KeyError, ValueError): return {}


def test_item_pages_of_real_misk_and_coe_records(tmp_path):
    index, cfg = _items_run(tmp_path)
    page = index.read_text()
    site = index.parent
    sec = lambda a: page[page.index(f'<section id="art-{a}">'):][:page[page.index(f'<section id="art-{a}">'):].index("</section>")]
    assert '<a href="items/misk_table1/1-1.html">Natural Questions (nq)</a>: 3 items, 10 methods, 1 page' in sec("misk_table1")
    assert '<a href="items/misk_table3/1-1.html">medical questions (Chinese) (med)</a>: 2 items, 10 methods' in sec("misk_table3")
    assert '<a href="items/coe_table2/1-1.html">questions, irrelevant condition</a>: 2 items' in sec("coe_table2")
    assert "No item pages: Table 2 counts the knowledge bases&#x27; text chunks" in sec("misk_table2")
    assert "No item pages: It counts each KG&#x27;s entities" in sec("brink_kg_statistics")
    # the closed-book baseline runs no experiment: its items come from its own per-question table (3 CWQ questions)
    assert '<a href="items/awakening_closed_book/1-1.html">cwq questions</a>: 3 items, 1 methods' in sec("awakening_closed_book")
    cb = (site / "items/awakening_closed_book/1-1.html").read_text()
    assert ("<dt>gold</dt><dd>Belmont University</dd>" in cb and
            '<td class="raw">In Paris</td><td>n/p</td><td class="n">no</td><td class="n">no</td><td class="note">answerable (Step 1): no</td>' in cb)
    # CoE Table 1: App. B discrimination of the released samples; the tiny model said yes to every feature of every
    # variant, so all are judged CoE: as expected for CoE, not for SenP / WordP
    assert '<a href="items/coe_table1/1-1.html">released samples (App. B discrimination)</a>: 2 items, 3 methods' in sec("coe_table1")
    c1 = (site / "items/coe_table1/1-1.html").read_text()
    assert ('<tr><td>CoE</td><td class="raw">intent &#x27;Location of school&#x27;: yes | keywords &#x27;Sunyani West District&#x27;: yes</td>'
            '<td class="raw">CoE</td><td>ok</td><td class="y">yes</td>') in c1
    assert c1.count('<td class="raw">CoE</td><td>ok</td><td class="n">no</td>') == 4  # SenP and WordP of both samples
    assert "no per-item reader for this artefact" in sec("new_study_fig1")
    assert "No item pages: Table 3 counts the benchmarks&#x27; triples and questions" in sec("brink_table3")
    assert "are not in" in sec("misk_fig3") and "rerun the artefact" in sec("misk_fig3")
    nq = (site / "items/misk_table1/1-1.html").read_text()
    assert "who performed the first c section in 1794" in nq and "<dd>Dr. Jesse Bennett</dd>" in nq
    # 'Jesse Bennett' vs gold 'Dr. Jesse Bennett': EM no, containment no (the gold is longer), F1 = 2*1*(2/3)/(1+2/3) = 0.8
    row = re.search(r"<tr><td>Wiki \(TopK=2\)</td><td class=\"raw\">Jesse Bennett</td><td class=\"raw\">= raw</td><td>n/p</td>(.*?)</tr>", nq)
    assert row, nq[:3000]
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1))
    assert cells[:3] == ['no', 'no', '0.8'] and row.group(1).startswith('<td class="n">no</td><td class="n">no</td><td>0.8</td>'), cells
    statuses = collections.Counter(r["parse_status"] for r in json.loads(
        (ITEMS_DATA / "experiments/misk_runs/8ca4c79fc5f9abd2/nq_predictions.json").read_text()))
    assert nq.count("<td>repaired</td>") == statuses["repaired"] == 6 and nq.count("<td>ok</td>") == statuses["ok"]
    assert nq.count("<td>n/p</td>") == statuses[None] and "trace</dt><dd>not recorded" in nq
    assert "parse repairs: control character in string" in nq
    med = (site / "items/misk_table3/1-1.html").read_text()
    assert "<th>ROUGE-L (jieba words)</th>" in med and "corpus-level: there is no per-question BLEU" in med
    coe2 = (site / "items/coe_table2/1-1.html").read_text()
    assert coe2.count('<details id="i') == 2 and "CoE · p=0.5 · run 0" in coe2 and "<th>ACC (judge)</th>" in coe2
    rel = _released()
    for iid in ("scopecoe_hotpotqa-558", "scopecoe_2wiki-562"):
        shown = html.escape(rel[iid]["question"]) if iid in rel else "not recorded"
        assert f"{iid}: " in coe2 and f"<dt>question</dt><dd>{shown}</dd>" in coe2.split(f"{iid}: ")[1], iid
    traces = re.findall(r'<a href="\.\./traces/([^"]+)">(\d+) records', coe2)
    assert len(traces) == 2
    for name, n in traces:
        recs = [json.loads(l) for l in (site / "items/traces" / name).read_text().splitlines()]
        assert len(recs) == int(n) > 0 and {r["question_id"].split("/")[0] for r in recs} == {name.rsplit("-", 2)[0]}
    coe3 = (site / "items/coe_table3/1-1.html").read_text()
    assert "<th>FR (following)</th>" in coe3 and "no judge call when contained" in coe3
    assert "(a) released snippets + CoE + BM25 · RAG+ScopeCoE · run 0" in (site / "items/coe_table5/1-1.html").read_text()
    assert '<a href="items/brink_table7/1-1.html">family test questions</a>: 3 items, 12 methods' in sec("brink_table7")
    assert "16 methods" in sec("brink_fig4")  # the kg_id labelling mode too
    t7 = (site / "items/brink_table7/1-1.html").read_text()
    # family-000029 (gold 2392, 2855, 698), llm_only on the complete KG answered ' 17320': parsed, no hit, F1 0 (strict and permissive)
    row = re.search(r'<tr><td>llm_only · complete</td><td class="raw"> 17320</td><td class="raw">17320</td><td>ok</td>(.*?)</tr>', t7)
    assert row and re.findall(r"<td[^>]*>(.*?)</td>", row.group(1))[:8] == ["no", "0", "0", "0", "no", "0", "0", "0"], t7[:2000]
    assert "<dd>2392 | 2855 | 698</dd>" in t7 and "<th>F1 (permissive)</th>" in t7
    # awakening: WebQTest-743's No-RAG samples hold the gold once (5th sample): Hits@1 no, Hits@10 yes; Table 4 counts the
    # question (No-RAG population), Table 2 does not (T7 passed probing on no question: the intersection is empty)
    for aid, counted in (("awakening_table4", "yes"), ("awakening_table2", "no")):
        aw = (site / f"items/{aid}/1-1.html").read_text()
        item = aw[aw.index("WebQTest-743"):]
        assert re.search(r'<tr><td>No RAG</td><td class="raw">not recorded</td><td class="raw">JFK \| [^<]*</td><td>n/p</td>'
                         r'<td class="n">no</td><td class="y">yes</td><td class="note">counted in this table: ' + counted
                         + '; samples correct: 0000100000</td></tr>', item), item[:3000]
    # App. J: RoG, trained paths, ToG and k-NN in both settings; family-000029's RoG answer on the complete KG is wrong and
    # RoG showed no path from the topic entity to a gold answer: a retrieval failure
    assert '<a href="items/brink_appj/1-1.html">family test questions</a>: 3 items, 8 methods' in sec("brink_appj")
    aj = (site / "items/brink_appj/1-1.html").read_text()
    assert "<th>Hits@Any</th><th>retrieval failure</th><th>details</th>" in aj
    assert re.search(r'<tr><td>rog · complete</td>[^\n]*?<td class="n">no</td><td class="y">yes</td><td class="note">[^<]*App. J label: retrieval</td>', aj)
    t3 = (site / "items/awakening_table3/1-1.html").read_text()  # unseen entities: the No-RAG call's raw samples start ' George Herbert'
    assert re.search(r'<tr><td>No RAG</td><td class="raw"> George Herbert \| [^<]*</td><td class="raw">George Herbert \| ', t3)
    assert re.search(r'<a href="\.\./traces/WebQTest-1686[^"]+">14 records', t3)


def _section(page: str, aid: str) -> str:
    s = page[page.index(f'<section id="art-{aid}">'):]
    return s[:s.index("</section>")]


def test_item_pages_of_real_jcql_records(tmp_path):
    "JCQL's KBQA questions (Tables 2-4) and KBC test triples (Tables 1, 9, Fig. 2) get item pages from the real tiny"
    " jcql_kbqa / jcql_kbc records; its aggregates (Figs. 3-5, Table 8) say in one line why they have none."
    index, cfg = _items_run(tmp_path)
    page, site = index.read_text(), index.parent
    for aid, link in [("jcql_table2", "CWQ test questions, 50% KB</a>: 1 items, 7 methods"),
                      ("jcql_table3", "CWQ test questions, 50% KB</a>: 1 items, 3 methods"),
                      ("jcql_table4", "CWQ test questions, 50% KB</a>: 1 items, 7 methods"),
                      ("jcql_table1", "KBC test triples, 50% KB</a>: 10 items, 10 methods"),
                      ("jcql_table9", "KBC test triples, 50% KB</a>: 10 items, 4 methods"),
                      ("jcql_fig2", "special test triples, cwq 50% KB</a>: 1 items, 3 methods")]:
        assert f'<a href="items/{aid}/1-1.html">{link}, 1 page' in _section(page, aid), aid
    for aid, why in [("jcql_fig3", "Fig. 3 is a KBC ranking curve"), ("jcql_fig4", "Fig. 4 times Algorithm 1"),
                     ("jcql_fig5", "Fig. 5 keeps MRR / Hits@k per replay size"), ("jcql_table8", "Table 8 counts GoG")]:
        assert f"No item pages: {why}" in _section(page, aid) and "items/" not in _section(page, aid), aid
    t2 = (site / "items/jcql_table2/1-1.html").read_text()
    assert "<dt>question</dt><dd>What movie featuring Taylor Swift was produced by Billy Ray Cyrus?</dd>" in t2
    assert "<dt>gold</dt><dd>Hannah Montana: The Movie</dd>" in t2
    # the agent (L = 2 in the tiny profile) searched twice and never wrote Finish: raw = its last step, nothing parsed, failed
    assert ('<tr><td>jcql</td><td class="raw"> I would like to watch this movie.\nAction 2: Search[Hannah Montana, Taylor Swift]</td>'
            '<td class="raw"><span class="nr">n/r</span></td><td>failed</td><td class="n">no</td>') in t2
    assert "failure: no Finish within L steps" in t2
    # CoT's answer line parsed to '"T Miley Cyrus"' (not the gold): ok, Hits@1 no
    assert re.search(r'<tr><td>jcql cot</td><td class="raw"> [^<]*So the answer is &quot;T Miley Cyrus&quot;.</td>'
                     r'<td class="raw">&quot;T Miley Cyrus&quot;</td><td>ok</td><td class="n">no</td>', t2)
    (name, n), = re.findall(r'<a href="\.\./traces/([^"]+)">(\d+) records', t2)
    recs = [json.loads(l) for l in (site / "items/traces" / name).read_text().splitlines()]
    assert int(n) == len(recs) == 19  # 21 calls in the trace file, 2 of them Algorithm 1's training question
    assert {r["question_id"] for r in recs} == {"WebQTest-538_3c662be721b9c2107f0dd05ba38cf729"}
    assert {r["method"] for r in recs} == {"jcql io", "jcql cot", "jcql sc", "jcql tog", "jcql", "jcql w/o generate", "jcql w/o complete"}
    t3 = (site / "items/jcql_table3/1-1.html").read_text()
    assert re.findall(r"<tr><td>(jcql[^<]*)</td><td class=\"raw\">", t3) == ["jcql", "jcql w/o generate", "jcql w/o complete"]
    t4 = (site / "items/jcql_table4/1-1.html").read_text()  # a run with no `questions`: the text of the KBC slice's seed question
    assert "<dt>question</dt><dd>What movie featuring Taylor Swift was produced by Billy Ray Cyrus?</dd>" in t4
    # SC: three CoT samples = 3 online calls, 4.214 s of cache misses (the run's `miss_time_s`)
    assert "<th>LLM call</th><th>Time (s)</th><th>Hits@1</th>" in t4 and re.search(
        r'<tr><td>jcql sc</td>.*?<td>ok</td><td>3</td><td>4.214</td><td class="n">no</td>', t4)
    k1 = (site / "items/jcql_table1/1-1.html").read_text()
    assert "<dt>question</dt><dd>(Taylor Swift, people person profession, ?)</dd><dt>gold</dt><dd>Songwriter-GB</dd>" in k1
    # rank 43 of the gold tail: RR 1/43 = 0.02326, no Hits@1/3/10; parsed: the SLM's filtered top-10 tails (`topk`)
    assert ('<tr><td>JCQL_T5-small · exact</td><td class="raw">not recorded</td><td class="raw">Utah | Guitar | Marriage | Male | '
            'Utah County | Country pop | Africa | Country | Pop rock | Country rock</td>'
            '<td>n/p</td><td>0.02326</td><td class="n">no</td><td class="n">no</td><td class="n">no</td>'
            '<td class="note">filtered rank: 43;') in k1
    # (World War II, combatants, ?) -> France at filtered rank 10: 10th of the top-10, Hits@10 yes, Hits@3 no
    item = k1[k1.index("World War II | military military conflict combatants."):]
    assert re.search(r'<tr><td>JCQL_T5-small · exact</td><td class="raw">not recorded</td><td class="raw">(?:[^|<]+ \| ){9}France</td>'
                     r'<td>n/p</td><td>0.1</td><td class="n">no</td><td class="n">no</td><td class="y">yes</td>', item)
    assert "Random ranking · exact</td><td class=\"raw\">not recorded</td><td class=\"raw\"><span class=\"nr\">n/r</span>" in k1  # no top-k
    assert "filtered rank: none: the sampled sequences never drew the gold tail (RR 0)" in k1
    # the per-method summary over the 10 triples equals the experiment's Table 1 row (kbc_results: MRR 0.026541, Hits@10 0.1)
    assert re.search(r"<tr><td>JCQL_T5-small · exact</td><td>10</td><td>0</td><td>0</td><td>0</td><td>10</td>"
                     r"<td>0.0265 \(n=10\)</td><td>0 \(n=10\)</td><td>0 \(n=10\)</td><td>0.1 \(n=10\)</td></tr>", k1)
    assert "Random ranking · exact" not in (site / "items/jcql_table9/1-1.html").read_text()
    f2 = (site / "items/jcql_fig2/1-1.html").read_text()  # oracle fine-tuning moved the gold tail from rank 37 to 33
    assert "<td>0.0303</td>" in f2 and "filtered rank: 33" in f2 and f2.count("filtered rank: 37") == 2


def test_jcql_items_show_jcql_with_each_other_llm(tmp_path):
    "Table 2's JCQL_<LLM> rows: JCQL run with another LLM (`llm_predictions`, its own trace file) is one more output of the"
    " question, named by its LLM, with that LLM's calls in the trace; Table 3 (the main LLM's ablations) leaves it out."
    from kgrag_nb.studies.jcql import kbqa as jcql
    xp = tmp_path / "jcql_kbqa" / KBQA_KEY[:16]
    shutil.copytree(ITEMS_DATA / "experiments/jcql_kbqa" / KBQA_KEY[:16], xp)
    main = next(r for r in json.loads((xp / "predictions.json").read_text()) if r["method"] == "jcql")
    other = {**main, "llm": "org/Other-7B", "answer": "Hannah Montana: The Movie", "ranked": ["Hannah Montana: The Movie"], "hits1": 1.0,
             "failure": None, "finished": True, "steps_repaired": 1, "n_steps": 1, "steps_ok": 1}
    (xp / "llm_predictions.json").write_text(json.dumps([other]))
    step = {"question_id": main["id"], "method": "jcql", "stage": "step 1", "completion": " Thought 1: x\nAction 1: Finish[Hannah Montana: The Movie]"}
    (xp / "traces" / jcql.trace_file("cwq", "50% KB", "org/Other-7B")).write_text(json.dumps(step) + "\n")
    res = {"jcql_kbqa": kgrag_nb.report.ExperimentResults(xp)}
    it = kgrag_nb.report.jcql_qa_items("jcql_table2", res, get_config())[0].items[0]
    o = it["outputs"]["jcql (org/Other-7B)"]
    assert (o["raw"], o["parsed"], o["status"], o["correct"]) == (step["completion"], "Hannah Montana: The Movie", "repaired", {"Hits@1": True})
    assert it["outputs"]["jcql"]["status"] == "failed" and len(it["outputs"]) == 8
    assert len(it["trace"]) == 20 and it["trace"][-1]["llm"] == "org/Other-7B" and "llm" not in it["trace"][0]
    t3 = kgrag_nb.report.jcql_qa_items("jcql_table3", res, get_config())[0].items[0]
    assert list(t3["outputs"]) == ["jcql", "jcql w/o generate", "jcql w/o complete"]


def test_item_pages_of_every_awakening_task1_artefact(tmp_path):
    "Figs. 1, 5-7 and Tables 7, 8/9, 11 of awakening Task 1 read the same answers as Tables 2 and 4, each with its own rows"
    " (types, query, temperature, model) and the questions each row counts."
    index, cfg = _items_run(tmp_path)
    page, site = index.read_text(), index.parent
    for aid, methods in [("awakening_fig1", 5), ("awakening_fig5", 5), ("awakening_fig6", 6), ("awakening_table7", 6), ("awakening_table8_9", 1),
                         ("awakening_table11", 12)]:
        assert (f'<a href="items/{aid}/1-1.html">Step-1-unanswerable CWQ questions</a>: 2 items, {methods} methods, 1 page'
                in _section(page, aid)), aid
    assert "No item pages: no item of this run enters the artefact&#x27;s rows" in _section(page, "awakening_fig7")  # no T7 passed probing
    t89 = (site / "items/awakening_table8_9/1-1.html").read_text()
    assert "<th>Hits@1</th><th>details</th>" in t89 and "Hits@10" not in t89  # Tables 8/9 report F, Hits@1 and hops only
    assert "knowledge: Inglourious Basterds, country, France; NLI probing: False, True, False (ok, ok, ok); hops to answer: 1" in t89
    t7 = (site / "items/awakening_table7/1-1.html").read_text()
    # min_true = 1: WebQTest-743's T6 knowledge passed QA probing (True x3) but not NLI (False x3): only the qa/original block
    assert ('<tr><td>A_q-R_x-Z-R_x-B (T6)</td><td class="raw">not recorded</td>' in t7 and
            "counted in: qa/original; samples correct: 0000000000; knowledge: John F. Kennedy, gender, Male; Ted Kennedy, gender, Male;"
            " NLI probing: False, False, False (ok, ok, ok); QA probing: True, True, True (ok, ok, ok)" in t7)
    t11 = (site / "items/awakening_table11/1-1.html").read_text()
    assert "<td>No RAG · A_q-R_q^1-B query</td>" in t11 and "<td>No RAG · A_q-R_q^1 query</td>" in t11
    f6 = (site / "items/awakening_fig6/1-1.html").read_text()
    assert "<td>gemma-3-270m-q4_k_m · No RAG</td>" in f6  # rows per model


def test_item_pages_of_the_format_tax(tmp_path):
    "The format tax's per-item records: one set per study, one output per decoding arm, with the study's own metric."
    index, cfg = _items_run(tmp_path)
    page, site = index.read_text(), index.parent
    links = re.findall(r'<a href="items/format_tax/(\d)-1.html">([^<]*)</a>: 1 items, 3 methods', _section(page, "format_tax"))
    assert links == [(str(i), f"{s}: the parsed step under each decoding")
                     for i, s in enumerate(("awakening", "awakening_task2", "brink", "jcql", "misk", "coe"), 1)]
    misk = (site / "items/format_tax/5-1.html").read_text()
    # NQ question 0: the free arm's verdict was cut at max_tokens (failed, no second retrieval); the constrained one repaired
    assert "<th>EM (strict, SQuAD-normalised) of the Misk Merged KB answer on NQ</th><th>parsed</th><th>second retrieval fired</th>" in misk
    assert re.search(r'<tr><td>free</td><td class="raw">- First round answer:[^<]*</td><td class="raw">George Washington</td>'
                     r'<td>failed</td><td class="n">no</td><td class="n">no</td><td class="n">no</td><td class="note">[^<]*'
                     r'parse_reason: truncated: no object \(output cut\)', misk)
    assert '<td class="raw">George Washington</td><td>repaired</td>' in misk and "<dd>Dr. Jesse Bennett</dd>" in misk
    coe_page = (site / "items/format_tax/6-1.html").read_text()  # CoE: a share of parsed pieces (5 of 7) under free decoding
    assert "<th>answer contained</th><th>ACC (judge)</th><th>parsed</th>" in coe_page and "<td>0.7143</td>" in coe_page


def test_item_pages_are_paged_and_rebuilt(tmp_path):
    index, cfg = _items_run(tmp_path, per_page=2)
    site = index.parent
    assert sorted(p.name for p in (site / "items/misk_table1").iterdir()) == ["1-1.html", "1-2.html"]
    p2 = (site / "items/misk_table1/1-2.html").read_text()
    assert "Items 3 to 3 of 3 (page 2 of 2)" in p2 and '<a href="1-1.html">1</a><b>2</b>' in p2 and '<details id="i3">' in p2
    assert '<a href="../../index.html#art-misk_table1">' in p2
    kgrag_nb.report.build_report("r-i", cfg=cfg)  # rebuilt at 100 a page: the old second page is gone
    assert sorted(p.name for p in (site / "items/misk_table1").iterdir()) == ["1-1.html"]
    with pytest.raises(ValueError, match="per_page = 0"): write_item_pages("a", [ItemSet("t", [], [])], tmp_path, per_page=0)


def test_item_pages_escape_every_text(tmp_path):
    s = ItemSet(f"t {SCRIPT}", [f"EM {SCRIPT}"], [{"item_id": f"id {SCRIPT}", "question": SCRIPT, "gold": [SCRIPT], "outputs": {
        SCRIPT: {"raw": SCRIPT, "parsed": SCRIPT + "x", "status": "ok", "correct": {f"EM {SCRIPT}": True}, "details": {SCRIPT: SCRIPT}}},
        "trace": [{"question_id": SCRIPT, "prompt": SCRIPT}]}], status_of=SCRIPT, notes=[SCRIPT])
    write_item_pages("a", [check_items(s)], tmp_path)
    text = (tmp_path / "items/a/1-1.html").read_text()
    assert "<script" not in text.lower() and text.count(html.escape(SCRIPT)) >= 10
    assert f'<meta http-equiv="Content-Security-Policy" content="{kgrag_nb.report.CSP}">' in text


@needs_chromium
def test_item_pages_pass_the_browser_check(browser, tmp_path):
    "Every page of the item browser of real records opens with no problem; every link (pages, traces, anchors) resolves."
    index, _ = _items_run(tmp_path, per_page=1)
    res = check_site(browser, index)
    assert not res["problems"], "\n".join(res["problems"])
    site = index.parent
    pages = {Path(unquote(urlparse(p).path)).relative_to(site).as_posix() for p in res["pages"]}
    assert {"items/misk_table1/1-1.html", "items/misk_table1/1-3.html", "items/coe_table5/1-3.html"} <= pages
    assert {"items/jcql_table2/1-1.html", "items/jcql_table4/1-1.html", "items/jcql_table1/1-10.html", "items/jcql_fig2/1-1.html",
            "items/awakening_fig1/1-2.html", "items/awakening_table7/1-2.html", "items/awakening_table11/1-2.html", "items/format_tax/6-1.html",
            "items/brink_appj/1-3.html", "items/coe_table1/1-2.html",
            "items/awakening_closed_book/1-3.html"} <= pages
    assert len([p for p in pages if p.startswith("items/")]) == len(list((site / "items").rglob("*.html")))
    traces = [f for f in res["files"] if "/items/traces/" in f]
    assert len(traces) == len(list((site / "items/traces").iterdir())) > 0


@needs_chromium
def test_a_page_of_500_items_stays_small(browser, tmp_path):
    "500 items of the real NQ records (the tiny run's 3 questions, each with its 10 methods, repeated under new ids) on"
    " one page (5,000 method rows, each with its raw output, parsed value and verdicts): under 4 MB, open in the browser"
    " within 5 s with every anchor resolved; at the default 100 a page, five pages under 1 MB each."
    index, cfg = _items_run(tmp_path)
    xp = kgrag_nb.report.ExperimentResults(cfg.cache_dir / "experiments/misk_runs" / MISK_KEY[:16])
    real = kgrag_nb.report.misk_items("misk_table1", {"misk_runs": xp}, cfg)[0]
    many = ItemSet(real.title, real.metrics, [dict(real.items[i % 3], item_id=f"{real.items[i % 3]['item_id']}-{i}") for i in range(500)],
                   real.status_of, real.notes)
    for per_page, pages in ((500, 1), (100, 5)):
        out = tmp_path / f"site{per_page}"
        links = write_item_pages("big", [check_items(many)], out, per_page=per_page)
        assert links[0]["pages"] == pages and len(list((out / "items/big").iterdir())) == pages
    size = (tmp_path / "site500/items/big/1-1.html").stat().st_size
    sizes100 = [p.stat().st_size for p in (tmp_path / "site100/items/big").iterdir()]
    print(f"\na page of 500 items: {size / 1024:.0f} KB; pages of 100: {[round(s / 1024) for s in sizes100]} KB")
    assert size < 4 * 2**20 and max(sizes100) < 2**20
    t0 = time.time()
    assert browser.open((tmp_path / "site500/items/big/1-1.html").resolve().as_uri()) == []
    opened = time.time() - t0
    assert browser.eval("document.querySelectorAll('details[id]').length") == 500
    assert browser.eval("Array.from(document.querySelectorAll('a[href^=\"#\"]')).every(a => document.getElementById(a.getAttribute('href').slice(1)))")
    print(f"opened in {opened:.2f} s")
    assert opened < 10  # a shared CI machine: the measured time is printed above


@pytest.mark.parametrize("aid, eid, key", [("jcql_table1", "jcql_kbc", KBC_KEY), ("jcql_table2", "jcql_kbqa", KBQA_KEY),
                                           ("awakening_table11", "awakening_task1", AWAKEN_KEY)])
def test_500_items_of_the_new_adapters_stay_small(tmp_path, aid, eid, key):
    "The new adapters' real items (KBC triples with ten model rows and their top-10, KBQA questions with seven methods'"
    " raw outputs, awakening's twelve rows) repeated to 500: one page under 4 MB, pages of 100 under 1 MB (sizes printed)."
    res = {eid: kgrag_nb.report.ExperimentResults(ITEMS_DATA / "experiments" / eid / key[:16])}
    s = kgrag_nb.report.ITEM_ADAPTERS[aid](aid, res, get_config())[0]
    many = ItemSet(s.title, s.metrics, [dict(s.items[i % len(s.items)], item_id=f"{s.items[i % len(s.items)]['item_id']}-{i}")
                                        for i in range(500)], s.status_of, s.notes)
    write_item_pages(aid, [check_items(many)], tmp_path / "one", per_page=500)
    write_item_pages(aid, [many], tmp_path / "paged", per_page=100)
    one = (tmp_path / f"one/items/{aid}/1-1.html").stat().st_size
    paged = [p.stat().st_size for p in (tmp_path / f"paged/items/{aid}").iterdir()]
    print(f"\n{aid}: 500 items on one page {one / 1024:.0f} KB; pages of 100 at most {max(paged) / 1024:.0f} KB")
    assert len(paged) == 5 and one < 4 * 2**20 and max(paged) < 2**20


def test_every_registered_artefact_has_item_pages_or_says_why():
    "No artefact is left with 'no per-item reader yet': each has an adapter (from its experiments or its own files) or a"
    " one-line reason in `NO_ITEM_PAGES` (an aggregate)."
    r = kgrag_nb.report
    assert [a for a in load_registry() if a not in r.ITEM_ADAPTERS and a not in r.NO_ITEM_PAGES and a not in r.FILE_ITEM_ADAPTERS] == []
    assert not set(r.NO_ITEM_PAGES) & (set(r.ITEM_ADAPTERS) | set(r.FILE_ITEM_ADAPTERS))
    assert all(len(why) < 250 and "\n" not in why for why in r.NO_ITEM_PAGES.values())


def test_a_study_can_write_its_own_items(tmp_path):
    "The contract a study can follow instead of an adapter: an experiment result `items` ({'sets': [...]}) with a trace"
    " file inside its results folder; a trace file outside it is not read, and a hand-edited experiment key is refused."
    cfg = get_config(runs_dir=tmp_path / "runs", figures_dir=tmp_path / "figures", cache_dir=tmp_path / "cache")
    xp = cfg.cache_dir / "experiments" / "my_exp" / ("a" * 16)
    xp.mkdir(parents=True)
    (xp / "_SUCCESS.json").write_text(json.dumps({"id": "my_exp", "key": "a" * 64}))
    (xp / "trace.jsonl").write_text(json.dumps({"question_id": "q1/variant", "prompt": "P", "completion": "C"}) + "\n")
    (tmp_path / "secret.jsonl").write_text(json.dumps({"question_id": "q1", "prompt": SECRET}) + "\n")
    out = {"raw": " Paris.", "parsed": "Paris", "status": "repaired", "correct": {"EM": True}, "details": {"repairs": "dropped '.'"}}
    def sets(trace_file): return {"sets": [{"title": "my questions", "metrics": ["EM"], "status_of": "the answer line",
                                           "notes": ["n1"], "trace_file": trace_file, "items": [
        {"item_id": "q1", "question": "Capital of France?", "gold": ["Paris"], "outputs": {"m1": out}},
        {"item_id": "q2", "question": None, "gold": None, "outputs": {"m1": {**out, "raw": None, "status": None, "correct": {}}}}]}]}
    (xp / "items.json").write_text(json.dumps(sets("trace.jsonl")))
    _manifest(cfg.runs_dir / "r-s", run_id="r-s", started="2026", status="finished", artifacts=[
        {"artifact": "my_art", "status": "ok", "outputs": [], "experiments": {"my_exp": "a" * 64}},
        {"artifact": "bad_key", "status": "ok", "outputs": [], "experiments": {"my_exp": "../../../x"}}])
    index = kgrag_nb.report.build_report("r-s", cfg=cfg)
    page = (index.parent / "items/my_art/1-1.html").read_text()
    assert "<dd>Capital of France?</dd>" in page and "<dd>Paris</dd>" in page and "<td>repaired</td>" in page
    assert '<td class="raw"> Paris.</td><td class="raw">Paris</td><td>repaired</td><td class="y">yes</td>' in page
    assert "<dt>question</dt><dd>not recorded</dd><dt>gold</dt><dd>not recorded</dd>" in page and "<td>n/p</td>" in page
    trace = re.findall(r'<a href="\.\./traces/([^"]+)">1 records', page)
    assert len(trace) == 1 and json.loads((index.parent / "items/traces" / trace[0]).read_text())["completion"] == "C"
    assert "is not an experiment id and key" in index.read_text()
    (xp / "items.json").write_text(json.dumps(sets("../../../../secret.jsonl")))
    index = kgrag_nb.report.build_report("r-s", cfg=cfg)
    assert SECRET not in "".join(p.read_text() for p in index.parent.rglob("*") if p.is_file())
    (xp / "items.json").write_text(json.dumps({"sets": [{"title": "t", "metrics": [], "items": [{"item_id": "q", "outputs": {"m": {"status": "fine"}}}]}]}))
    page = kgrag_nb.report.build_report("r-s", cfg=cfg).read_text()
    assert "could not be read as items (ValueError: my_exp/items.json sets[0][0].outputs[&#x27;m&#x27;].status = &#x27;fine&#x27;" in page
