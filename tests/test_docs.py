"""`make docs` (tools/docs_site.py): the documentation site of the library notebooks, opened in headless Chromium.

The site is built once per module into a temporary folder (about a minute on 2 cores: nbdev's processors over the
library notebooks, no notebook cell executed), then Chromium (the DevTools driver of tests/test_report.py) opens
`index.html` from `file://` and every page it links to: every page loads, every link resolves (to a page, a file, or an
element of the target page), every image has a natural width, and no console error, exception or failed load happens.
The browser test skips, saying why, when no Chromium is installed outside CI (under `CI=true` it fails, as in
tests/test_report.py), or when the site cannot be built here (nbdev, nbconvert or the notebooks' module imports missing).
"""
from __future__ import annotations
import html, importlib.util, json, re, sys
from pathlib import Path
from urllib.parse import unquote, urlparse

import pytest

from test_report import CHROMIUM, IN_CI, NO_CHROMIUM, Chromium, browser, check_site  # noqa: F401 (browser: the fixture)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))


def _docs_site():
    "tools/docs_site.py, or the reason it cannot build a site here."
    try: import docs_site
    except ImportError as e: return None, f"the docs site cannot be built here: {e!r} (make setup installs nbdev and nbconvert)"
    return docs_site, ""


docs_site, CANNOT_BUILD = _docs_site()
needs_builder = pytest.mark.skipif(docs_site is None, reason=CANNOT_BUILD)


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    "The site built once, as `make docs` builds it, into a temporary folder (README.md and nbs/*.yml left untouched)."
    if docs_site is None: pytest.skip(CANNOT_BUILD)
    tmp = tmp_path_factory.mktemp("docs")
    res = docs_site.build(ROOT, out=tmp / "_docs", proc=tmp / "_proc", readme=False, write_config=False, quarto=False)
    print(f"docs site: {res['pages']} pages, {res['bytes'] / 1e6:.2f} MB, {res['seconds']} s ({res['renderer']})")
    return res | {"root": tmp / "_docs", "proc": tmp / "_proc"}


# ---------------------------------------------------------------- what the site holds

@needs_builder
def test_site_has_every_library_notebook_study_readme_and_the_layer_page(site):
    out = site["root"]
    want = {docs_site.out_name(docs_site.site_rel(p, ROOT / "nbs")) for p in docs_site.library_notebooks(ROOT / "nbs")}
    want |= {f"studies/{p.parent.name}/README.html" for p in (ROOT / "nbs" / "studies").glob("*/README.md")}
    want |= {"layers.html", "index.html"}
    have = {p.relative_to(out).as_posix() for p in out.rglob("*.html")}
    assert want <= have, f"pages missing from the site: {sorted(want - have)}"
    assert have == want, f"pages that are no library notebook, study README or the layer page: {sorted(have - want)}"
    assert "kg.html" in have and len([p for p in have if not p.endswith("README.html")]) >= 30  # the study wing's pages count
    sources = {p: re.search(r"Rendered from <code>([^<]+)</code>", p.read_text()).group(1) for p in out.rglob("*.html")}
    papermill = re.compile(r"^nbs/studies/[^/]+/(experiments|artefacts)/")
    assert not [s for s in sources.values() if papermill.match(s)], "study notebooks (papermill) are not part of the docs"
    assert not [p for p in site["proc"].rglob("*.ipynb") if p.parent.name in ("experiments", "artefacts")], \
        "study notebooks (papermill) are never processed"
    assert "studies/brink/rules.html" in have, "a study's library notebooks are pages"
    kg = (out / "kg.html").read_text()
    kg_text = html.unescape(re.sub(r"<[^>]+>", "", kg))  # the page's text (code is highlighted into spans)
    assert 'id="kg.from_triples"' in kg and "def from_triples(" in kg_text, "show_doc of an exported method, rendered from the module"
    assert "test_eq" in kg and "#| export" not in kg and "#| hide" not in kg, "demo cells shown, directives and exports not"
    layers = (out / "layers.html").read_text()
    assert "<table>" in layers and "<code>hooks</code>" in layers
    assert site["unresolved"] == [], f"links in notebooks or Markdown pages that point nowhere: {site['unresolved']}"


@needs_builder
def test_no_notebook_cell_runs_while_the_docs_are_built(tmp_path):
    "nbdev's own `exec_show_docs` runs export and import cells (a cell mixing an import with code runs whole); the docs build runs none."
    import nbformat
    from execnb.nbio import read_nb
    from nbdev.processors import FilterDefaults
    sentinel = tmp_path / "ran.txt"
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("# A library notebook\n\n> what it is"),
        nbformat.v4.new_code_cell("#| default_exp kg"),
        nbformat.v4.new_code_cell("#| export\nclass KG: pass"),
        nbformat.v4.new_code_cell(f"from pathlib import Path\nPath({str(sentinel)!r}).write_text('ran')")])
    src = tmp_path / "03_kg.ipynb"
    nbformat.write(nb, src)
    done = docs_site.process(src, tmp_path / "proc" / src.name)
    assert not sentinel.exists(), "the docs build executed a notebook cell"
    shown = [c for c in done.cells if c.cell_type == "code" and "show_doc(KG)" in c.source]
    assert len(shown) == 1 and "### KG" in "".join(shown[0].outputs[0]["data"]["text/markdown"])  # from kgrag_nb.kg.KG
    nbdev_default = read_nb(src); nbdev_default.path_ = str(src)
    FilterDefaults()(nbdev_default)
    assert sentinel.read_text() == "ran", "nbdev's default processors run that cell (why the docs build replaces exec_show_docs)"


@needs_builder
def test_readme_is_the_index_notebook_rendered(tmp_path):
    "README.md is what `make docs` writes from nbs/index.ipynb (nbdev's processors, then GitHub Markdown), byte for byte."
    nb = docs_site.process(ROOT / "nbs" / "index.ipynb", tmp_path / "index.ipynb")
    want = docs_site.readme_gfm(nb)
    assert want.startswith("# kgrag_nb\n\n\n" + docs_site.WARNING + "\n\n> ")
    assert (ROOT / "README.md").read_text() == want, "README.md is not nbs/index.ipynb rendered: edit the notebook, then `make docs`"


@needs_builder
def test_quarto_configs_are_current():
    "nbs/sidebar.yml (the navigation, Quarto's and the static site's) and nbs/nbdev.yml are what `make docs` writes."
    assert (ROOT / "nbs" / "sidebar.yml").read_text() == docs_site.sidebar_text(ROOT), "run `make docs` and commit nbs/sidebar.yml"
    from nbdev.config import get_config
    from nbdev.quarto import _nbdev_yml
    cfg = get_config()
    vals = {k: cfg[k] for k in ["title", "description", "branch", "git_url", "doc_host", "doc_baseurl"]} | {"doc_path": cfg.doc_path.name}
    assert (ROOT / "nbs" / "nbdev.yml").read_text() == _nbdev_yml.format(**vals), "run `make docs` and commit nbs/nbdev.yml"
    assert cfg.custom_sidebar, "settings.ini custom_sidebar = True: nbdev_sidebar would drop the study READMEs and the layer page"


@pytest.mark.parametrize("text, slug", [("KG", "kg"), ("KG.from_triples", "kg.from_triples"), ("Two commands", "two-commands"),
                                         ("The llama.cpp build, and <code>kgrag doctor</code>", "the-llama.cpp-build-and-kgrag-doctor"),
                                         ("1. Setup", "setup")])
@needs_builder
def test_heading_ids_are_pandocs(text, slug):
    "Heading ids follow pandoc's rule, which nbdev's doc links (`kg.html#kg.from_triples`) assume."
    assert docs_site._slug(text) == slug


# ---------------------------------------------------------------- the browser

def _ids(page: Path) -> set[str]:
    return set(re.findall(r'\bid="([^"]+)"', page.read_text()))


@pytest.mark.skipif(CHROMIUM is None and not IN_CI, reason=NO_CHROMIUM)
@needs_builder
def test_docs_site_opens_with_no_broken_page_link_image_or_console_error(browser, site):
    res = check_site(browser, site["root"] / "index.html")
    pages = {unquote(urlparse(u).path) for u in res["pages"]}
    on_disk = {str(p.resolve()) for p in site["root"].rglob("*.html")}
    assert res["problems"] == [], "\n".join(res["problems"][:40])
    assert pages == on_disk, f"pages no link reaches: {sorted(on_disk - pages)}"
    dangling = []
    for page in site["root"].rglob("*.html"):  # a link into another page names an element that exists there
        for href in re.findall(r'\bhref="([^"#:]+\.html)#([^"]+)"', page.read_text()):
            target = (page.parent / href[0]).resolve()
            if unquote(href[1]) not in _ids(target): dangling.append(f"{page.name}: {href[0]}#{href[1]}")
    assert not dangling, f"{len(dangling)} links to an element that is not on the target page: {dangling[:20]}"
    print(f"chromium: {len(res['pages'])} pages, {len(res['files'])} files, {len(res['images'])} images, "
          f"{len(res['external'])} external links (not followed: no network), 0 problems")


PNG = ("iVBORw0KGgoAAAANSUhEUgAAAAIAAAACCAIAAAD91JpzAAAAFklEQVR4nGP8z8DAwMDAxMDAwMDAAAANHQEDasKb6QAAAABJRU5ErkJggg==")


@pytest.mark.skipif(CHROMIUM is None and not IN_CI, reason=NO_CHROMIUM)
@needs_builder
def test_figures_and_images_of_pages_resolve_in_the_browser(browser, tmp_path):
    "The library notebooks are saved without figures, so a small site shows that figure outputs and Markdown images load."
    import base64, nbformat
    (tmp_path / "nbs").mkdir(); (tmp_path / "docs").mkdir()
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Home\n\n> the index")]), tmp_path / "nbs" / "index.ipynb")
    fig = nbformat.v4.new_code_cell("plot()", outputs=[nbformat.v4.new_output("display_data", {"image/png": PNG, "text/plain": "<Figure>"})])
    nbformat.write(nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# Figures\n\nSee [the layers](../docs/layers.md)."), fig]),
                   tmp_path / "nbs" / "01_figs.ipynb")
    (tmp_path / "docs" / "pic.png").write_bytes(base64.b64decode(PNG))
    (tmp_path / "docs" / "layers.md").write_text("# Layers\n\n![a picture](pic.png) and [figures](../nbs/01_figs.ipynb)\n")
    files, md = [tmp_path / "nbs" / "index.ipynb", tmp_path / "nbs" / "01_figs.ipynb"], {"layers.md": tmp_path / "docs" / "layers.md"}
    nbs = {f.name: docs_site.process(f, tmp_path / "_proc" / f.name) for f in files}
    site = docs_site.render_static(tmp_path, tmp_path / "_proc", tmp_path / "_docs", files, md, nbs, docs_site.sidebar(files, md))
    assert site.unresolved == []
    res = check_site(browser, tmp_path / "_docs" / "index.html")
    assert res["problems"] == [], res["problems"]
    assert sorted(Path(unquote(urlparse(u).path)).name for u in res["pages"]) == ["figs.html", "index.html", "layers.html"]
    assert sorted(Path(src).name for _, src in res["images"]) == ["figure-1.png", "pic.png"]

