"""Paired statistics of the claims ledger (`kgrag_nb.stats`): hand-computed cases, checks against statsmodels, and
properties (hypothesis): swapping the arms flips the effect, duplicating the items narrows the interval, and a verdict
never outruns its test."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from kgrag_nb.stats import mde, n_needed, paired_binary, paired_continuous, verdict, verdict_reason


def test_exact_mcnemar_matches_statsmodels():
    from statsmodels.stats.contingency_tables import mcnemar
    a = [1] * 7 + [0] * 2 + [1] * 5 + [0] * 6
    b = [0] * 7 + [1] * 2 + [1] * 5 + [0] * 6
    r = paired_binary(a, b)
    table = [[5, 7], [2, 6]]  # rows: A yes/no; columns: B yes/no
    assert r.p == pytest.approx(mcnemar(table, exact=True).pvalue)
    assert (r.n, r.n_discordant, r.effect) == (20, 9, pytest.approx(5 / 20))


def test_the_format_tax_case_is_not_a_verdict():
    "0/3 against 3/3, which the old format tax called 'CIs disjoint': exact p = 0.25, and n = 3 can carry no verdict."
    r = paired_binary([0, 0, 0], [1, 1, 1])
    assert r.p == pytest.approx(0.25) and verdict(r, "<") == "not resolved"
    assert "no outcome at this n can reach" in verdict_reason(r, "<")


def test_t_interval_matches_statsmodels_and_wilcoxon_matches_scipy():
    from scipy.stats import wilcoxon
    from statsmodels.stats.weightstats import DescrStatsW
    a = np.array([0.2, 0.5, 0.9, 0.4, 0.7, 0.1, 0.8])
    b = np.array([0.1, 0.5, 0.3, 0.5, 0.2, 0.0, 0.4])
    r = paired_continuous(a, b)
    lo, hi = DescrStatsW(a - b).tconfint_mean()
    assert (r.ci_low, r.ci_high) == (pytest.approx(lo), pytest.approx(hi))
    assert r.p == pytest.approx(wilcoxon(a - b).pvalue)


def test_power_against_cohen_tables():
    assert n_needed(0.5, 1.0) == 34 and n_needed(0.2, 1.0) == 199  # Cohen (1988), paired t, two-sided 0.05, power 0.8
    assert mde(1.0, 34) == pytest.approx(0.49, abs=0.01) and math.isnan(mde(1.0, 5))  # below min_n nothing is detectable
    mdes = [mde(1.0, n) for n in range(6, 400)]  # statsmodels' solve_power gave a negative root as an array at n = 73
    assert all(a > b > 0 for a, b in zip(mdes, mdes[1:]))
    assert n_needed(0.1, 0.5) == n_needed(-0.1, 0.5)  # the direction does not change the n


binary = st.lists(st.tuples(st.integers(0, 1), st.integers(0, 1)), min_size=1, max_size=60)
scores = st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), min_size=2, max_size=40)


@settings(max_examples=150, deadline=None)
@given(binary)
def test_swapping_binary_arms_flips_the_sign(pairs):
    a, b = zip(*pairs)
    r, s = paired_binary(a, b), paired_binary(b, a)
    assert s.effect == pytest.approx(-r.effect) and s.p == pytest.approx(r.p)
    if not math.isnan(r.ci_low):
        assert (s.ci_low, s.ci_high) == (pytest.approx(-r.ci_high), pytest.approx(-r.ci_low))
    assert verdict(r, ">") == verdict(s, "<")


@settings(max_examples=150, deadline=None)
@given(scores)
def test_swapping_continuous_arms_flips_the_sign(pairs):
    a, b = zip(*pairs)
    r, s = paired_continuous(a, b), paired_continuous(b, a)
    assert s.effect == pytest.approx(-r.effect, abs=1e-12) and s.p == pytest.approx(r.p)
    assert math.isnan(s.ci_low) == math.isnan(r.ci_high)  # no interval either way (equal differences at a small n)
    if not math.isnan(r.ci_low):
        assert (s.ci_low, s.ci_high) == (pytest.approx(-r.ci_high, abs=1e-12), pytest.approx(-r.ci_low, abs=1e-12))


@settings(max_examples=150, deadline=None)
@given(binary)
def test_duplicating_binary_items_narrows_the_interval(pairs):
    a, b = zip(*pairs)
    r, d = paired_binary(a, b), paired_binary(a * 2, b * 2)
    assert d.effect == pytest.approx(r.effect) and d.p <= r.p + 1e-12
    if r.n_discordant:
        assert d.ci_high - d.ci_low < r.ci_high - r.ci_low


@settings(max_examples=150, deadline=None)
@given(scores)
def test_duplicating_continuous_items_narrows_the_interval(pairs):
    a, b = zip(*pairs)
    r, d = paired_continuous(a, b), paired_continuous(a * 2, b * 2)
    assert d.effect == pytest.approx(r.effect, abs=1e-12)
    if r.sd_diff > 1e-9 and not math.isnan(r.ci_low):
        assert d.ci_high - d.ci_low < r.ci_high - r.ci_low


@settings(max_examples=200, deadline=None)
@given(binary, st.sampled_from([">", "<"]))
def test_a_verdict_never_outruns_its_test(pairs, direction):
    a, b = zip(*pairs)
    r = paired_binary(a, b)
    v = verdict(r, direction)
    if v != "not resolved":
        assert r.p < r.alpha and r.min_p < r.alpha and r.n >= 6
        sign = 1 if direction == ">" else -1
        assert (sign * r.ci_low > 0) == (v == "replicated") and (sign * r.ci_high < 0) == (v == "contradicted")


def test_bad_input_names_the_fix():
    with pytest.raises(ValueError, match="arm A has 2 items and arm B 1"): paired_binary([1, 0], [1])
    with pytest.raises(ValueError, match="must be 0/1"): paired_binary([2], [1])
    with pytest.raises(ValueError, match="missing"): paired_continuous([0.1, float("nan")], [0.2, 0.3])
    with pytest.raises(ValueError, match="use '>'"): verdict(paired_binary([1], [0]), "greater")
