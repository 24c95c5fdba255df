"""One check of a study's `format_tax_arm` record (issue 21's contract), shared by the studies' `llm` tests."""
from kgrag_nb.metrics import FORMAT_TAX_KEYS, _check_tax_record


def one_constrained_record(arm, client, study: str) -> dict:
    "Run `arm(client, 'constrained', 1)` and check its one record: the contract's keys, a str item, parsed and metric in [0, 1]."
    out = arm(client, "constrained", 1)
    assert len(out) == 1, out
    r = _check_tax_record(out[0], study)
    assert set(FORMAT_TAX_KEYS) <= set(r) and isinstance(r["item"], str)
    assert isinstance(r["parsed"], float) and 0 <= r["parsed"] <= 1 and r["metric"] in (0.0, 1.0)
    return r
