"""README.md is `nbs/index.ipynb` rendered (issue 8, item 7): real Markdown cells, no prose hidden in `# #` comments,
every Markdown cell present in README.md, and the test command it names is the one CI runs.

`nbdev_readme` regenerates README.md from the notebook (it needs Quarto); whitespace is compared loosely because
Quarto may rewrap lines.
"""
import json, re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CELLS = json.loads((ROOT / "nbs" / "index.ipynb").read_text())["cells"]
README = (ROOT / "README.md").read_text()


def _norm(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def test_index_notebook_prose_is_markdown():
    md = [c for c in CELLS if c["cell_type"] == "markdown"]
    assert len(md) >= 3, "nbs/index.ipynb: the README's sections belong in Markdown cells"
    commented = [c["id"] for c in CELLS if re.search(r"^# #", "".join(c["source"]), re.M)]
    assert not commented, f"nbs/index.ipynb cells {commented} hold Markdown written as `# #` comments; make them Markdown cells"
    assert "".join(md[0]["source"]).startswith("# kgrag_nb\n"), "the first cell is the title (`# kgrag_nb`) and `> summary`"


def test_readme_renders_every_markdown_cell_in_order():
    readme, pos = _norm(README), 0
    assert README.startswith("# kgrag_nb\n")
    for c in CELLS:
        if c["cell_type"] != "markdown": continue
        body = "".join(c["source"])
        if body.startswith("# kgrag_nb"): body = body.split("\n", 1)[1]  # the title line is README's first line
        i = readme.find(_norm(body), pos)
        assert i >= 0, f"README.md lacks (or reorders) the cell {c['id']} of nbs/index.ipynb: {body[:80]!r}...; regenerate it (nbdev_readme)"
        pos = i + len(_norm(body))


def test_readme_test_command_is_what_ci_runs():
    assert re.search(r"^make test\s+#", README, re.M), "README.md must name `make test`"
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == "make test", ".ci/run must end with the README's test command"
    assert re.search(r"^test:", (ROOT / "Makefile").read_text(), re.M)
