"""The study wing: every study is one folder (`nbs/studies/<id>/`) and one package (`kgrag_nb/studies/<id>/`).

A study folder has its `study.yaml` (the runner finds it by glob), its `README.md`, a numbered library notebook per
module and, in its package, a `Study` record `STUDY` whose paper-number file exists; a study.yaml names only notebooks
inside its own folder. `wing_problems` reads a checkout's files only (no import), so the same check runs on a broken
copy of the checkout; `test_every_study_package_exports_its_study` then imports each package and asks its `Study`.
`nbs/studies/cross/` (the format tax and the claims ledger, of every paper) has a study.yaml and README but no package.
The record (`STUDY`, from the study's `00_study.ipynb`) holds the paper, the deviation and decoding lines and the
format-tax arms as data: no module of a study defines them as loose names (`loose_study_names`), and the package imports
none of its modules. `Study.deviation_lines`, `FormatTaxArm` and `register_study` are checked on hand-made records.
"""
from __future__ import annotations
import ast, csv, importlib, shutil
from pathlib import Path

import pytest
import yaml

from kgrag_nb.config import get_config
from kgrag_nb.reproduce import FormatTaxArm, NOTEBOOK_DECODING_LINES, STUDIES, Study, StudyRun, _read_registry, register_study

ROOT = Path(__file__).resolve().parents[1]
CROSS = "cross"  # the folder of notebooks that belong to every paper, not one: no package, no Study


def study_ids(root: Path) -> list[str]:
    "Every study folder of the wing (`nbs/studies/<id>/`) and every study package (`kgrag_nb/studies/<id>/`), but `cross`."
    folders = {p.name for p in (root / "nbs/studies").iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    packages = {p.name for p in (root / "kgrag_nb/studies").iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}
    return sorted((folders | packages) - {CROSS})


def _study_call(init: Path) -> ast.Call | None:
    "The `Study(...)` call assigned to `STUDY` in a study package's `__init__.py`, read without importing it."
    if not init.is_file(): return None
    for node in ast.parse(init.read_text()).body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "STUDY" for t in node.targets)
                and isinstance(node.value, ast.Call) and getattr(node.value.func, "id", None) == "Study"):
            return node.value
    return None


def wing_problems(root: Path) -> list[str]:
    "What the study wing of the checkout `root` lacks, one line each (empty when every study is complete)."
    out = []
    for sid in study_ids(root):
        folder, pkg = root / "nbs/studies" / sid, root / "kgrag_nb/studies" / sid
        for f in ("study.yaml", "README.md"):
            if not (folder / f).is_file(): out.append(f"nbs/studies/{sid}/{f} is missing")
        call = _study_call(pkg / "__init__.py")
        if call is None: out.append(f"kgrag_nb/studies/{sid}/__init__.py defines no `STUDY = Study(...)` (export it from nbs/studies/{sid}/NN_study.ipynb)")
        else:
            kw = {k.arg: k.value for k in call.keywords}
            if not (isinstance(kw.get("id"), ast.Constant) and kw["id"].value == sid):
                out.append(f"kgrag_nb/studies/{sid}/__init__.py: STUDY's id is not {sid!r} (the folder's name)")
            mods = ast.literal_eval(kw["modules"]) if "modules" in kw else ()
            for m in mods:
                if not list(folder.glob(f"[0-9]*_{m}.ipynb")): out.append(f"nbs/studies/{sid}/ has no notebook NN_{m}.ipynb for module {m}")
        papers = {e.get("paper") for f in [folder / "study.yaml"] if f.is_file()
                  for sec in ("experiments", "artifacts") for e in ((yaml.safe_load(f.read_text()) or {}).get(sec) or {}).values()}
        numbers = root / "kgrag_nb/papers" / f"{sid}.csv"  # named by the study's id, like its folder and package
        if not numbers.is_file(): out.append(f"kgrag_nb/papers/{sid}.csv (the paper numbers of {sid}) is missing")
        else:
            with numbers.open(newline="", encoding="utf-8") as fh: named = {row["paper"] for row in csv.DictReader(fh)}
            for paper in sorted(p for p in papers if p and p != "all" and p not in named):
                out.append(f"kgrag_nb/papers/{sid}.csv holds no numbers of {paper}, the paper its study.yaml names")
    for sid in study_ids(root) + [CROSS]:
        f = root / "nbs/studies" / sid / "study.yaml"
        if not f.is_file(): continue
        raw = yaml.safe_load(f.read_text()) or {}
        for sec in ("experiments", "artifacts"):
            for eid, e in (raw.get(sec) or {}).items():
                nb = (root / str(e.get("notebook", ""))).resolve()
                if not nb.is_relative_to(f.parent.resolve()):
                    out.append(f"nbs/studies/{sid}/study.yaml: {eid} names {e.get('notebook')}, outside its folder")
    if not (root / "nbs/studies" / CROSS / "README.md").is_file(): out.append(f"nbs/studies/{CROSS}/README.md is missing")
    return out


def test_the_study_wing_is_complete():
    assert study_ids(ROOT) == ["awakening", "brink", "coe", "jcql", "misk"]
    assert wing_problems(ROOT) == []


@pytest.fixture(scope="module")
def copy_of_wing(tmp_path_factory):
    "The files `wing_problems` reads, copied: a checkout to break."
    dst = tmp_path_factory.mktemp("wing")
    for d in ("nbs/studies", "kgrag_nb/studies", "kgrag_nb/papers"):
        shutil.copytree(ROOT / d, dst / d, ignore=shutil.ignore_patterns("*.ipynb", "__pycache__"))
    for nb in (ROOT / "nbs/studies").glob("*/[0-9]*.ipynb"): (dst / nb.relative_to(ROOT)).write_text("{}")
    return dst


def _broken(src: Path, tmp_path: Path) -> Path:
    root = tmp_path / "root"; shutil.copytree(src, root); return root


@pytest.mark.parametrize("breakage, expected", [
    (lambda r: (r / "nbs/studies/misk/study.yaml").unlink(), "nbs/studies/misk/study.yaml is missing"),
    (lambda r: (r / "nbs/studies/coe/README.md").unlink(), "nbs/studies/coe/README.md is missing"),
    (lambda r: (r / "kgrag_nb/papers/jcql.csv").unlink(), "kgrag_nb/papers/jcql.csv (the paper numbers of jcql) is missing"),
    (lambda r: (r / "kgrag_nb/papers/coe.csv").write_text((r / "kgrag_nb/papers/coe.csv").read_text().replace("chain_of_evidence.txt", "other.txt")),
     "kgrag_nb/papers/coe.csv holds no numbers of chain_of_evidence.txt, the paper its study.yaml names"),
    (lambda r: (r / "kgrag_nb/studies/brink/__init__.py").write_text(""), "kgrag_nb/studies/brink/__init__.py defines no `STUDY = Study(...)`"),
    (lambda r: (r / "nbs/studies/awakening/02_task1.ipynb").unlink(), "nbs/studies/awakening/ has no notebook NN_task1.ipynb for module task1"),
    (lambda r: (r / "nbs/studies/newpaper").mkdir(), "nbs/studies/newpaper/study.yaml is missing"),
    (lambda r: (r / "nbs/studies/misk/study.yaml").write_text((r / "nbs/studies/misk/study.yaml").read_text().replace(
        "nbs/studies/misk/artefacts/misk_table1.ipynb", "nbs/studies/coe/artefacts/misk_table1.ipynb")),
     "nbs/studies/misk/study.yaml: misk_table1 names nbs/studies/coe/artefacts/misk_table1.ipynb, outside its folder"),
])
def test_a_broken_study_folder_is_named(copy_of_wing, tmp_path, breakage, expected):
    "Each missing piece (study.yaml, README, paper file, Study, a module's notebook) and a notebook outside its folder fails the check."
    root = _broken(copy_of_wing, tmp_path)
    assert wing_problems(root) == []  # the copy is whole
    breakage(root)
    problems = wing_problems(root)
    assert any(p.startswith(expected) for p in problems), problems


def test_every_study_package_exports_its_study():
    "`kgrag_nb.studies.<id>.STUDY` is a `Study` of that id, and `Study.problems` finds the folder complete."
    for sid in study_ids(ROOT):
        s = importlib.import_module(f"kgrag_nb.studies.{sid}").STUDY
        assert isinstance(s, Study) and s.id == sid and s.problems(ROOT) == [], (sid, s.problems(ROOT))
        assert s.package == f"kgrag_nb.studies.{sid}" and s.format_tax and s.all_deviations


def test_the_runner_refuses_a_notebook_outside_its_study_folder(tmp_path):
    "The registry itself (not only this test) refuses a study.yaml entry whose notebook lies in another folder."
    root = tmp_path / "proj"
    (root / "nbs/studies/a/artefacts").mkdir(parents=True); (root / "nbs/studies/b").mkdir(parents=True)
    (root / "nbs/studies/a/artefacts/x.ipynb").write_text("{}")
    (root / "studies.yaml").write_text("defaults:\n  tiny: {decoding: constrained}\n")
    entry = "artifacts:\n  x: {paper: p, title: t, notebook: nbs/studies/a/artefacts/x.ipynb, profiles: {tiny: {}}}\n"
    cfg = get_config(root=root)
    (root / "nbs/studies/a/study.yaml").write_text(entry)
    exps, arts = _read_registry(cfg=cfg)
    assert list(arts) == ["x"] and arts["x"].notebook == "nbs/studies/a/artefacts/x.ipynb"
    (root / "nbs/studies/a/study.yaml").unlink(); (root / "nbs/studies/b/study.yaml").write_text(entry)
    with pytest.raises(ValueError, match=r"study.yaml: artifact 'x': notebook 'nbs/studies/a/artefacts/x.ipynb' is outside its study folder nbs/studies/b"):
        _read_registry(cfg=cfg)
    (root / "nbs/studies/a/study.yaml").write_text(entry)  # the same id in two folders, each notebook in its own
    (root / "nbs/studies/b/x.ipynb").write_text("{}")
    (root / "nbs/studies/b/study.yaml").write_text(entry.replace("nbs/studies/a/artefacts/x.ipynb", "nbs/studies/b/x.ipynb"))
    with pytest.raises(ValueError, match="registered in .* too; ids are unique across study folders"):
        _read_registry(cfg=cfg)


LOOSE_NAMES = {"PAPER", "DEVIATIONS", "DECODING_DEVIATION", "DECODING_DEVIATIONS", "DECODING_LINES", "FORMAT_TAX"}


def loose_study_names(root: Path) -> list[str]:
    "`kgrag_nb/studies/<id>/<file>.py: NAME` for every module-level assignment of a name the `Study` record holds instead."
    out = []
    for f in sorted((root / "kgrag_nb/studies").glob("*/*.py")):
        for node in ast.parse(f.read_text()).body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, (ast.AnnAssign, ast.AugAssign)) else []
            names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            out += [f"{f.relative_to(root).as_posix()}: {n}" for n in sorted(names & LOOSE_NAMES)]
    return out


def test_no_study_module_defines_the_loose_names():
    "The paper, deviations, decoding lines and format-tax arm of a study live in its `STUDY` record only (its `NN_study`"
    " notebook), never in module-level names of its modules (`PAPER`, `DEVIATIONS`, `DECODING_DEVIATION`, `FORMAT_TAX`)."
    assert loose_study_names(ROOT) == []


def test_the_loose_name_scan_finds_one(tmp_path):
    "The scan itself, on a hand-made study package: an assignment (plain, annotated or tuple) is found, a use is not."
    pkg = tmp_path / "kgrag_nb/studies/demo"; pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("STUDY = Study(id='demo', paper='p.txt', modules=('m',))\n")
    (pkg / "m.py").write_text("from . import STUDY\nPAPER, X = STUDY.paper, 1\nFORMAT_TAX: dict = {}\nlines = STUDY.deviations\n")
    assert loose_study_names(tmp_path) == ["kgrag_nb/studies/demo/m.py: PAPER", "kgrag_nb/studies/demo/m.py: FORMAT_TAX"]


def test_a_study_package_imports_none_of_its_modules():
    "The record is data exported first (`00_study.ipynb`): its `__init__` imports nothing from its own package, so a"
    " module that imports `STUDY` makes no cycle, and importing the package loads none of its modules."
    for sid in study_ids(ROOT):
        tree = ast.parse((ROOT / "kgrag_nb/studies" / sid / "__init__.py").read_text())
        own = [ast.unparse(n) for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 1
               or isinstance(n, (ast.Import, ast.ImportFrom)) and f"studies.{sid}" in ast.unparse(n)]
        assert not own, (sid, own)
        assert list((ROOT / "nbs/studies" / sid).glob("00_study.ipynb")), f"nbs/studies/{sid}/00_study.ipynb: the record comes first"



def _arm(**kw) -> FormatTaxArm:
    return FormatTaxArm(**{**dict(key="toy", step="the answer list (App. E)", metric="Hits@1", paper="0.5 Hits@1 (Table 3)",
                                  settings="at most {max_triples} triples, {keep:.0%} KB", params=dict(max_triples=500, keep=0.5),
                                  datasets=["family"]), **kw})


def test_format_tax_arm_fills_its_settings_from_its_params():
    a = _arm()
    assert a.settings_line == "at most 500 triples, 50% KB" and a.datasets == ("family",)
    assert a.as_dict() == {"study": "toy", "step": "the answer list (App. E)", "metric": "Hits@1",
                           "paper": "0.5 Hits@1 (Table 3)", "settings": "at most 500 triples, 50% KB"}


@pytest.mark.parametrize("bad, message", [
    (dict(params={}), r"settings='at most \{max_triples\} triples, \{keep:.0%\} KB' cannot be filled from params=\{\}.*add the field to params"),
    (dict(metric=" "), r"FormatTaxArm\('toy'\): metric=' '; give one non-empty sentence"),
    (dict(key="no key!"), r"FormatTaxArm\(key='no key!'\): give a plain key"),
    (dict(params=[("max_triples", 500)]), r"params=\[\('max_triples', 500\)\]; give a dict"),
    (dict(datasets="family"), r"datasets='family'; give a list of mirror dataset names"),
])
def test_format_tax_arm_names_a_bad_input_and_the_fix(bad, message):
    with pytest.raises(ValueError, match=message): _arm(**bad)


def _toy_study() -> Study:
    return Study("toy", "toy_paper.txt", ("core", "methods"), deviations={"core": ["Data: a sample."], "methods": ["Prompts are ours."]},
                 decoding_deviations={"methods": {"constrained": "Decoding: constrained; the paper decodes freely."}},
                 decoding_notebooks={"methods": "toy_runs"}, format_tax=(_arm(),))


def test_deviation_lines_hand_computed():
    s = _toy_study()
    assert s.deviation_lines("methods") == ["Prompts are ours."]
    assert s.deviation_lines("methods", "constrained", ["Probing kept 3 of 5."]) == [
        "Prompts are ours.", "Probing kept 3 of 5.", "Decoding: constrained; the paper decodes freely."]
    assert s.deviation_lines("core", "free", ("x",)) == ["Data: a sample.", "x"]
    assert s.deviations == {"core": ("Data: a sample.",), "methods": ("Prompts are ours.",)}  # stored as tuples
    assert s.decoding_notebooks == {"methods": ("toy_runs",)} and s.arm("toy").key == "toy"
    with pytest.raises(ValueError, match=r"decoding='json': use 'free'"): s.deviation_lines("methods", "json")
    with pytest.raises(ValueError, match=r"deviation lines for \['constrained'\] only"): s.deviation_lines("methods", "decoupled")
    with pytest.raises(ValueError, match=r"module='tables'; use one of \['core', 'methods'\]"): s.deviation_lines("tables")
    with pytest.raises(ValueError, match=r"no format-tax arm 'other'; its arms are \['toy'\]"): s.arm("other")


@pytest.mark.parametrize("bad, message", [
    (dict(deviations={"core": "one line"}), r"deviations\['core'\] must be a list of sentences"),
    (dict(decoding_deviations={"other": {"constrained": "x"}}), r"decoding_deviations name \['other'\], which are not among its modules"),
    (dict(decoding_deviations={"core": {"greedy": "x"}}), r"decoding='greedy'"),
    (dict(decoding_deviations={"core": {"constrained": ""}}), r"must map decoding modes to sentences"),
    (dict(decoding_notebooks={"core": "toy_runs"}), r"decoding_notebooks name \['core'\], which have no decoding_deviations"),
    (dict(format_tax=({"study": "toy"},)), r"must be FormatTaxArm records"),
])
def test_a_bad_study_record_is_named(bad, message):
    with pytest.raises(ValueError, match=message): Study("toy", "p.txt", ("core",), **bad)


def test_a_registered_study_gives_a_run_its_decoding_line(tmp_path):
    s = register_study(_toy_study())
    try:
        run = StudyRun("toy_runs", params={"decoding": "constrained"}, cfg=get_config(figures_dir=tmp_path))
        assert run.decoding_lines() == ["Decoding: constrained; the paper decodes freely."]
        assert run.deviations(s.deviation_lines("core")) == ["Data: a sample.", "Decoding: constrained; the paper decodes freely."]
        assert STUDIES["toy"] is s
    finally:
        STUDIES.pop("toy", None); NOTEBOOK_DECODING_LINES.pop("toy_runs", None)
