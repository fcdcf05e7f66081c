"""The intervals and paired tests of the tables, against their definitions and published values."""

import itertools
import math

import numpy as np
import pytest

from evals.stats import (CONFIDENCE, bootstrap_mean, design_effect, fewest_groups, grouped_wilson, mcnemar,
                          paired_difference, resolves, wilson, with_interval)


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


def test_the_design_effect_counts_groups_as_far_as_their_observations_agree_within():
    """One observation a group: a binomial's variance (with G/(G-1)). Groups that agree within (all hit or all miss):
    each group counts once, m observations as one. Every observation alike, or one group: not measurable."""
    one_each = np.array([1, 0, 0, 1, 1, 0, 0, 0, 1, 0])
    assert design_effect(one_each, np.arange(10)) == pytest.approx(10 / 9)
    agreeing, groups = np.repeat(one_each, 20), np.repeat(np.arange(10), 20)
    assert design_effect(agreeing, groups) == pytest.approx(20 * 10 / 9)
    assert grouped_wilson(agreeing, groups) == pytest.approx(wilson(4 * 0.9, 9))      # 200 counted as 9
    assert design_effect(np.ones(200), groups) is None and design_effect(one_each, np.zeros(10)) is None
    mixed = np.tile([1, 0, 1, 0, 0], 40)                             # every group of 20 holds 8 hits: less spread
    assert grouped_wilson(mixed, groups) == pytest.approx(wilson(80, 200))   # than a binomial's, counted as one


def test_at_0_and_100_percent_the_interval_is_no_wider_than_just_inside():
    """Where the design effect cannot be measured (every probe alike) it is 1 (Korn and Graubard): 100 of 100 lies
    above 99 of 100 at both ends, and 0 of 100 below 1 of 100, the one miss or hit in one group of ten."""
    groups = np.repeat(np.arange(10), 10)
    bounds = [grouped_wilson(np.r_[np.ones(k), np.zeros(100 - k)], groups) for k in (0, 1, 99, 100)]
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(bounds, bounds[1:])), bounds
    assert bounds[-1] == pytest.approx(wilson(100, 100)) and all(map(math.isnan, grouped_wilson([], [])))


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


@pytest.mark.parametrize("confidence, fewest", [(CONFIDENCE, 6), (0.90, 5), (0.99, 8)])
def test_the_fewest_groups_come_from_the_confidence_level(confidence, fewest):
    """The smallest k with 2 * 2 ** -k < 1 - confidence: 6 at 95 % (5 is 6.25 %), where 4 was allowed before."""
    assert fewest_groups(confidence) == fewest
    assert [resolves(k, confidence) for k in (fewest - 2, fewest - 1, fewest, fewest + 1)] == [False, False, True,
                                                                                            True]


@pytest.mark.parametrize("groups", [2, 3, 4, 5, 6, 7])
def test_under_a_symmetric_null_the_interval_excludes_0_whenever_every_group_moves_one_way(groups):
    """Each group's difference +1 or -1 at even odds, one question per group: every one of the 2 ** k sign
    patterns as likely. Where all groups share a sign every resample does, so the interval excludes 0: a false
    difference at least 2 * 2 ** -k of the time (exactly that up to 6 groups here), which `resolves` allows only
    below 1 - CONFIDENCE (a floor: 7 groups exclude 0 on more patterns than the two)."""
    false = []
    for signs in itertools.product((-1.0, 1.0), repeat=groups):
        mean, low, high = bootstrap_mean(np.array(signs), np.arange(groups))
        false.append(not low <= 0 <= high)
    rate, same_sign = sum(false) / 2 ** groups, 2 * 2.0 ** -groups
    assert false[0] and false[-1] and (rate == same_sign if groups <= 6 else rate > same_sign)
    assert resolves(groups) == (same_sign < 1 - CONFIDENCE) == (groups >= 6)


def test_a_rate_is_shown_with_its_interval_in_percent():
    assert with_interval(0.5, *wilson(15, 30)) == "50.0 [33.2, 66.8]"
