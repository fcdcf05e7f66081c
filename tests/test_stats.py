"""The intervals and paired tests of the tables, against their definitions and published values."""

import math

import numpy as np
import pytest

from evals.stats import bootstrap_mean, mcnemar, paired_difference, resolves, wilson, with_interval


@pytest.mark.parametrize("k, n, low, high", [(5, 10, 0.2366, 0.7634), (0, 10, 0.0, 0.2775),  # Newcombe (1998)
                                             (15, 30, 0.3315, 0.6685), (30, 30, 0.8865, 1.0)])
def test_wilson_matches_published_intervals(k, n, low, high):
    assert wilson(k, n) == pytest.approx((low, high), abs=1e-4)


@pytest.mark.parametrize("k, n", [(1, 30), (7, 20), (13, 30), (99, 100)])
def test_wilson_endpoints_solve_the_score_equation(k, n):
    """Each endpoint p is where the observed rate lies z standard errors (at p) away: |k/n - p| = z sqrt(p(1-p)/n)."""
    z = 1.959963984540054
    for p in wilson(k, n):
        assert abs(k / n - p) == pytest.approx(z * math.sqrt(p * (1 - p) / n), abs=1e-9)


def test_wilson_of_nothing_is_no_interval():
    assert all(math.isnan(v) for v in wilson(0, 0)) and with_interval(math.nan, *wilson(0, 0)) == ""


@pytest.mark.parametrize("b, c, p", [(0, 6, 2 * 0.5 ** 6), (1, 5, 2 * 7 / 64), (4, 4, 1.0), (0, 0, 1.0),
                                     (2, 10, 2 * (1 + 12 + 66) / 4096)])
def test_mcnemar_is_the_exact_binomial_test_of_the_discordant_pairs(b, c, p):
    assert mcnemar(b, c) == pytest.approx(p) and mcnemar(c, b) == pytest.approx(p)


def test_the_paired_bootstrap_resamples_groups_and_brackets_the_mean():
    groups = np.repeat(np.arange(10), 3)
    first = np.zeros(30)
    assert paired_difference(first, first + 1, groups) == (1.0, 1.0, 1.0)       # a constant shift is certain
    second = np.where(groups < 5, 1.0, 0.0)                                      # half the groups flip together
    mean, low, high = paired_difference(first, second, groups)
    assert mean == 0.5 and low < 0.5 < high and 0 <= low and high <= 1
    assert (low, high) == paired_difference(first, second, groups)[1:]           # seeded: the same every time


@pytest.mark.parametrize("groups", [2, 3, 4, 5])
def test_below_four_groups_the_bootstrap_interval_is_only_their_range(groups):
    """One question per group, group g scoring g: under 4 groups the interval's ends are the extreme groups'
    scores, so it says nothing the groups' own range does not (`resolves`); from 4 on it lies inside."""
    mean, low, high = bootstrap_mean(np.arange(groups, dtype=float), np.arange(groups))
    assert ((low, high) == (0, groups - 1)) != resolves(groups) and resolves(groups) == (groups >= 4)


def test_a_rate_is_shown_with_its_interval_in_percent():
    assert with_interval(0.5, *wilson(15, 30)) == "50.0 [33.2, 66.8]"
