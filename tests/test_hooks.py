"""The registries of `kgrag_nb.hooks` as the installed studies fill them (the CLI and `format_tax_runs` read them)."""
import inspect

from kgrag_nb.datasets import get_spec
from kgrag_nb.hooks import FORMAT_TAX_ARMS, load_study_modules, study_modules

# the six studies' format-tax arms (issue 21 item 4); the experiment `format_tax_runs` runs what is registered
EXPECTED_ARMS = {"awakening", "awakening_task2", "brink", "jcql", "misk", "coe"}


def test_every_study_registers_its_format_tax_arm():
    load_study_modules()
    assert EXPECTED_ARMS <= set(FORMAT_TAX_ARMS), sorted(EXPECTED_ARMS - set(FORMAT_TAX_ARMS))
    for study, (fn, info, datasets) in FORMAT_TAX_ARMS.items():
        assert info["study"] == study
        assert list(inspect.signature(fn).parameters)[:4] == ["client", "decoding", "n", "seed"], (study, fn)
        assert datasets, f"{study}: the arm declares no dataset"
        for d in datasets: get_spec(d)  # raises on a dataset the registry does not know


def test_the_arms_modules_are_installed_study_modules():
    load_study_modules()
    installed = set(study_modules().values())
    for study, (fn, _, _) in FORMAT_TAX_ARMS.items():
        assert fn.__module__ in installed, f"{study}: {fn.__module__} is not an entry point of kgrag_nb.studies (settings.ini study_modules)"
