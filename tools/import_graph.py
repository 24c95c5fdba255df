#!/usr/bin/env python3
"""Draw the import graph of the `kgrag_nb` package: which module imports which, by layer (issue 24, "Done means").

The modules are read with `ast` from `kgrag_nb/*.py`, or from a git revision with `--rev` (`git show REV:kgrag_nb/x.py`),
so the package is never imported and an old state can be drawn from the history. An edge `a -> b` means that module
`a` imports module `b` of the package; imports at a module's top are solid lines, imports inside a function (a late
import, which `tests/test_layers.py` allows only for heavy or optional third-party libraries) are dashed.

The layers come from `LAYERS` in `tests/test_layers.py` (of the same revision when it has one, else of the working
tree), read with `ast.literal_eval`, not imported: a list of layers, lowest first, whose study layer is a dict
study -> its modules in import order. The same rule as that test counts an edge as upward: a module may import only a
lower layer, or an earlier module of its own study. Modules are coloured as general layers below the studies, the
studies (one colour each), or general layers above them (report, bench, CLI, ...); a module with no layer is grey.
A general module that imports a study module (`general -> study`) is counted too: issue 24 item 1 wants none.

Usage (matplotlib and networkx, both in the project's environment; no graphviz needed):

    .venv/bin/python tools/import_graph.py --out docs/import_graph_after.svg
    .venv/bin/python tools/import_graph.py --rev 71246c7 --out docs/import_graph_before.svg

It prints the adjacency list (`a -> b, c | in functions: d`) and the counts (modules, edges, upward edges,
general -> study edges, cycles), and exits with status 1 when an edge is upward.
"""
from __future__ import annotations

import argparse, ast, subprocess, sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PKG = "kgrag_nb"
NOT_MODULES = {"__init__", "_modidx"}  # as tests/test_layers.py: the package root and nbdev's index


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(ROOT), *args], check=True, capture_output=True, text=True).stdout


def read_sources(rev: str | None = None) -> dict[str, str]:
    "module name -> its source, from the working tree or from git revision `rev`."
    if rev is None:
        return {p.stem: p.read_text(encoding="utf-8") for p in sorted((ROOT / PKG).glob("*.py")) if p.stem not in NOT_MODULES}
    names = [Path(n) for n in _git("ls-tree", "--name-only", rev, f"{PKG}/").split()]
    return {n.stem: _git("show", f"{rev}:{n.as_posix()}") for n in names
            if n.suffix == ".py" and n.parent.name == PKG and n.stem not in NOT_MODULES}


def read_layers(rev: str | None = None) -> tuple[list, str]:
    "`(LAYERS, where it was read)` from tests/test_layers.py of `rev` (falling back to the working tree)."
    src, where = None, "tests/test_layers.py"
    if rev is not None:
        try: src, where = _git("show", f"{rev}:tests/test_layers.py"), f"{rev}:tests/test_layers.py"
        except subprocess.CalledProcessError: src = None
    if src is None: src = (ROOT / "tests" / "test_layers.py").read_text(encoding="utf-8")
    for node in ast.parse(src).body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "LAYERS" for t in targets):
                return ast.literal_eval(node.value), where
    raise SystemExit(f"{where}: no `LAYERS = [...]` literal; the layer order cannot be read")


def rank(layers: list) -> dict[str, tuple[int, str | None, int]]:
    "module -> (layer index, study or None, position inside the study), as tests/test_layers.py ranks them."
    out = {}
    for i, layer in enumerate(layers):
        if isinstance(layer, dict):
            for study, mods in layer.items():
                for j, m in enumerate(mods): out[m] = (i, study, j)
        else:
            for m in layer: out[m] = (i, None, 0)
    return out


def imports(src: str, modules: set[str], name: str = "<src>") -> list[tuple[str, bool]]:
    "(imported module of the package, inside a function?) for every import of `src` that names one of `modules`."
    def targets(node) -> list[str]:
        if isinstance(node, ast.Import):
            return [a.name.split(".")[1] for a in node.names if a.name.startswith(PKG + ".")]
        base = (f"{PKG}.{node.module}" if node.module else PKG) if node.level else (node.module or "")
        if base == PKG: return [a.name for a in node.names if a.name in modules]  # `from kgrag_nb import x` / `from . import x`
        return [base.split(".")[1]] if base.startswith(PKG + ".") else []
    out = []
    def visit(node, hidden: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                out.extend((t, hidden) for t in targets(child) if t in modules)
            visit(child, hidden or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
    visit(ast.parse(src, filename=name), False)
    return out


def graph(sources: dict[str, str]) -> dict[tuple[str, str], bool]:
    "(importer, imported) -> True when only imported inside functions (False: at least once at the module's top)."
    edges: dict[tuple[str, str], bool] = {}
    for m, src in sources.items():
        for dep, hidden in imports(src, set(sources), f"{m}.py"):
            if dep != m: edges[(m, dep)] = edges.get((m, dep), True) and hidden
    return edges


def upward(edges, ranks) -> list[tuple[str, str]]:
    "Edges that break tests/test_layers.py's rule (a module with no layer counts as breaking it)."
    bad = []
    for a, b in edges:
        if a not in ranks or b not in ranks: bad.append((a, b)); continue
        (li, si, pi), (lj, sj, pj) = ranks[a], ranks[b]
        if not (lj < li or (lj == li and si is not None and si == sj and pj < pi)): bad.append((a, b))
    return sorted(bad)


def kind(m: str, ranks, study_layer: int | None) -> str:
    "'study', 'base' (a general layer below the studies), 'top' (a general layer above them) or 'none' (no layer)."
    if m not in ranks: return "none"
    i, study, _ = ranks[m]
    return "study" if study else "base" if study_layer is None or i < study_layer else "top"


def cycles(edges) -> list[list[str]]:
    "The strongly connected components with more than one module (import cycles), by Tarjan's algorithm."
    succ: dict[str, list[str]] = {}
    for a, b in edges: succ.setdefault(a, []).append(b)
    index, low, stack, on, out = {}, {}, [], set(), []
    def strong(v):
        index[v] = low[v] = len(index); stack.append(v); on.add(v)
        for w in succ.get(v, []):
            if w not in index: strong(w); low[v] = min(low[v], low[w])
            elif w in on: low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop(); on.discard(w); comp.append(w)
                if w == v: break
            if len(comp) > 1: out.append(sorted(comp))
    sys.setrecursionlimit(max(1000, 10 * len(edges)))
    for v in sorted({x for e in edges for x in e}):
        if v not in index: strong(v)
    return out


def positions(modules, layers, ranks) -> dict[str, tuple[float, float]]:
    "x, y of each module: one row per general layer, lowest at the bottom, single modules zigzagging over three columns"
    " (so that an edge does not run behind the modules it skips); the studies side by side, each a column."
    pos, y, zig = {}, 0.0, 0
    for layer in layers:
        if isinstance(layer, dict):
            studies = [(s, [m for m in mods if m in modules]) for s, mods in layer.items()]
            studies = [(s, ms) for s, ms in studies if ms]
            height = max((len(ms) for _, ms in studies), default=1)
            for k, (s, ms) in enumerate(studies):
                for j, m in enumerate(ms): pos[m] = (2.2 * (k - (len(studies) - 1) / 2) + 1.1 * (len(studies) % 2), y + j)  # between the columns
            y += height
        else:
            ms = [m for m in layer if m in modules]
            if len(ms) == 1: pos[ms[0]] = ((-2.2, 0.0, 2.2)[zig % 3], y); zig += 1
            else:
                for k, m in enumerate(ms): pos[m] = (2.4 * (k - (len(ms) - 1) / 2), y)
            y += 1 if ms else 0
    loose = sorted(m for m in modules if m not in pos)
    for k, m in enumerate(loose): pos[m] = (8.0, k)  # no layer: a column on the right
    return pos


def draw(out: Path, modules, edges, layers, ranks, bad, title: str):
    import matplotlib
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.hashsalt"] = "kgrag_nb"  # the same graph gives the same file
    import matplotlib.pyplot as plt
    import networkx as nx
    study_layer = next((i for i, l in enumerate(layers) if isinstance(l, dict)), None)
    studies = list(layers[study_layer]) if study_layer is not None else []
    palette = plt.get_cmap("Pastel2")
    colour = {"base": "#a6cee3", "top": "#cab2d6", "none": "#dddddd"}
    def fill(m):
        k = kind(m, ranks, study_layer)
        return palette(studies.index(ranks[m][1]) % 8) if k == "study" else colour[k]
    g = nx.DiGraph(); g.add_nodes_from(sorted(modules)); g.add_edges_from(sorted(edges))
    pos = positions(modules, layers, ranks)
    height = max(y for _, y in pos.values()) + 1
    fig, ax = plt.subplots(figsize=(15, 0.62 * height + 1.5))
    general_to_study = {(a, b) for a, b in edges if kind(a, ranks, study_layer) != "study" and kind(b, ranks, study_layer) == "study"}
    for hidden, style in ((False, "solid"), (True, "dashed")):
        for special, col, width in ((False, "#555555", 0.7), (True, None, 1.8)):
            es = [e for e in g.edges if edges[e] == hidden and ((e in bad or e in general_to_study) == special)]
            if not es: continue
            cols = [("#d7301f" if e in bad else "#ff7f00") for e in es] if special else col
            nx.draw_networkx_edges(g, pos, edgelist=es, ax=ax, style=style, edge_color=cols, width=width, alpha=0.75,
                                   arrows=True, arrowsize=9, node_size=1300, connectionstyle="arc3,rad=0.12")
    nx.draw_networkx_nodes(g, pos, ax=ax, node_color=[fill(m) for m in g.nodes], node_size=1300, edgecolors="#333333",
                           linewidths=0.6)
    nx.draw_networkx_labels(g, pos, ax=ax, font_size=7.5)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch
    legend = [Patch(color=colour["base"], label="general layer below the studies"),
              *[Patch(color=palette(k % 8), label=f"study: {s}") for k, s in enumerate(studies)],
              Patch(color=colour["top"], label="general layer above the studies"),
              Line2D([], [], color="#555555", label="import at the module's top"),
              Line2D([], [], color="#555555", linestyle="dashed", label="import inside a function"),
              Line2D([], [], color="#ff7f00", linewidth=1.8, label="general module imports a study"),
              Line2D([], [], color="#d7301f", linewidth=1.8, label="upward import (breaks tests/test_layers.py)")]
    if any(kind(m, ranks, study_layer) == "none" for m in modules): legend.append(Patch(color=colour["none"], label="no layer"))
    ax.legend(handles=legend, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    ax.set_title(title, fontsize=10); ax.axis("off")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, metadata={"Date": None} if out.suffix == ".svg" else None)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, default=None, help="image to write (.svg or .png); none: print only")
    p.add_argument("--rev", default=None, help="git revision to read kgrag_nb/*.py from (default: the working tree)")
    args = p.parse_args(argv)
    sources = read_sources(args.rev)
    layers, where = read_layers(args.rev)
    ranks = rank(layers)
    edges = graph(sources)
    bad = upward(edges, ranks)
    study_layer = next((i for i, l in enumerate(layers) if isinstance(l, dict)), None)
    g2s = sorted((a, b) for a, b in edges if kind(a, ranks, study_layer) != "study" and kind(b, ranks, study_layer) == "study")
    state = args.rev or "working tree"
    print(f"# import graph of {PKG} ({state}; layers from {where})")
    for m in sorted(sources):
        top = sorted(b for (a, b), hidden in edges.items() if a == m and not hidden)
        late = sorted(b for (a, b), hidden in edges.items() if a == m and hidden)
        print(f"{m} -> {', '.join(top) or '-'}" + (f" | in functions: {', '.join(late)}" if late else ""))
    n_late = sum(edges.values())
    cyc = cycles(edges)
    print(f"\nmodules: {len(sources)}; edges: {len(edges)} ({len(edges) - n_late} at the top, {n_late} only inside functions); "
          f"upward edges: {len(bad)}; general -> study edges: {len(g2s)}; cycles: {len(cyc)}; "
          f"modules with no layer: {sorted(m for m in sources if m not in ranks) or 0}")
    for a, b in bad: print(f"upward: {a} -> {b}")
    for a, b in g2s: print(f"general -> study: {a} -> {b}")
    for c in cyc: print(f"cycle: {' <-> '.join(c)}")
    if args.out:
        draw(args.out, set(sources), edges, layers, ranks, set(bad),
             f"{PKG} imports ({state}): {len(sources)} modules, {len(edges)} edges, {len(bad)} upward, "
             f"{len(g2s)} general -> study")
        print(f"wrote {args.out}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
