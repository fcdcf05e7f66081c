"""How sure a table's numbers are: intervals for a rate and paired tests between methods asked the same questions.

Accuracy is a rate over n questions: its 95 % interval is Wilson's score interval, which stays inside [0, 1] and
keeps its coverage at small n and at rates near 0 or 1, where the normal approximation does not. Two methods
answered on the same questions are compared on the questions where they disagree (b: only the first right, c: only
the second): McNemar's exact test, the two-sided binomial test of b against b + c at one half, since the questions
both get right or both get wrong say nothing of which is better. A score that is not a rate (F1, ROUGE, BERTScore)
gets a bootstrap over groups: a group's questions share its memory, so they are resampled together; a rate over
several questions a group (a probe's targets) gets Wilson's interval over the effective number of questions.
"""

from __future__ import annotations

import functools
import math
from itertools import count

import numpy as np

CONFIDENCE = 0.95


@functools.lru_cache(maxsize=None)
def two_sided_z(confidence: float) -> float:
    """The normal quantile of a two-sided `confidence` (once per confidence: a report asks for thousands of
    intervals, and scipy's quantile costs a quarter of a millisecond a call)."""
    from scipy.stats import norm        # here, not at the top: every command imports this module, few test

    return float(norm.ppf(0.5 + confidence / 2))


def wilson(successes: float, n: float, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson's score interval (low, high) of a rate of `successes` in `n` (an effective n may be fractional);
    (nan, nan) for n = 0."""
    if n == 0:
        return math.nan, math.nan
    z = two_sided_z(confidence)
    rate = successes / n
    centre = (rate + z * z / (2 * n)) / (1 + z * z / n)
    half = z / (1 + z * z / n) * math.sqrt(rate * (1 - rate) / n + z * z / (4 * n * n))
    return max(0.0, centre - half), min(1.0, centre + half)


def group_totals(values: np.ndarray, groups: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per group (in sorted order of `groups`), the sum of its `values` and how many it has."""
    _, index = np.unique(np.asarray(groups), return_inverse=True)
    return np.bincount(index, np.asarray(values, dtype=float)), np.bincount(index)


def design_effect(hits: np.ndarray, groups: np.ndarray) -> float | None:
    """How much less a rate over observations that come in groups (a probe group's targets share its memory) knows
    than one over as many independent ones: its variance between groups (the ratio estimator's, with G/(G-1))
    against a binomial's of n. None where it cannot be measured: one group, or every observation alike."""
    hits = np.asarray(hits, dtype=float)
    sums, sizes = group_totals(hits, groups)
    n, count = len(hits), len(sums)
    rate = float(hits.mean()) if n else math.nan
    if count < 2 or not 0 < rate < 1:
        return None
    between = count / (count - 1) * float(np.sum((sums - rate * sizes) ** 2)) / n ** 2
    return between / (rate * (1 - rate) / n)


def grouped_wilson(hits: np.ndarray, groups: np.ndarray, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """Wilson's interval of a rate over grouped observations over their effective number, n over the rate's own
    design effect (design_effect), at least 1; where it cannot be measured (a rate of 0 or 1, one group) it is 1,
    as Korn and Graubard (1998) take it, so that an interval at 0 % or 100 % is no wider than one just inside."""
    hits = np.asarray(hits, dtype=float)
    if not len(hits):
        return math.nan, math.nan
    effective = len(hits) / max(1.0, design_effect(hits, groups) or 1.0)
    return wilson(float(hits.mean()) * effective, effective, confidence)


def mcnemar(only_first: int, only_second: int) -> float:
    """McNemar's exact two-sided p-value from the discordant pairs (1 where there are none)."""
    discordant = only_first + only_second
    if discordant == 0:
        return 1.0
    from scipy.stats import binomtest

    return float(binomtest(only_first, discordant, 0.5).pvalue)


def bootstrap_mean(values: np.ndarray, groups: np.ndarray, resamples: int = 2000, seed: int = 0,
                   confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """(mean, low, high): the mean of per-question `values` and its percentile bootstrap interval, resampling
    whole groups (a group's questions share its memory)."""
    values = np.asarray(values, dtype=float)
    sums, counts = group_totals(values, groups)
    draws = np.random.default_rng(seed).integers(0, len(sums), size=(resamples, len(sums)))
    means = sums[draws].sum(axis=1) / counts[draws].sum(axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(means, [tail, 100 - tail])
    return float(values.mean()), float(low), float(high)


def paired_difference(first: np.ndarray, second: np.ndarray, groups: np.ndarray, **bootstrap) -> tuple[float, float,
                                                                                                        float]:
    """(mean of second - first, low, high): the paired difference of per-question scores and its bootstrap
    interval over groups."""
    return bootstrap_mean(np.asarray(second, dtype=float) - np.asarray(first, dtype=float), groups, **bootstrap)


def fewest_groups(confidence: float = CONFIDENCE) -> int:
    """The fewest groups over which a bootstrap interval excluding 0 may be read as a difference at `confidence`:
    the smallest k with 2 * 2 ** -k < 1 - confidence (6 at 95 %). When every group's difference has the same
    sign, every resample's mean has it too, so the percentile interval excludes 0 however small the differences;
    under a symmetric null (each group as likely to move either way) that happens with probability 2 * 2 ** -k
    (12.5 % at 4 groups), a false difference at least that often, which only k groups or more keep below the
    level the interval claims. A floor, not a guarantee: above it the interval's coverage still rests on the
    groups' spread."""
    return next(k for k in count(1) if 2 * 2.0 ** -k < 1 - confidence)


def resolves(groups: int, confidence: float = CONFIDENCE) -> bool:
    """Whether a bootstrap interval over `groups` groups may state a difference at `confidence` (fewest_groups)."""
    return groups >= fewest_groups(confidence)


def with_interval(rate: float, low: float, high: float) -> str:
    """A rate and its interval as a table shows them, in %: `50.0 [32.1, 67.9]`."""
    if math.isnan(rate):
        return ""
    return f"{100 * rate:.1f} [{100 * low:.1f}, {100 * high:.1f}]"
