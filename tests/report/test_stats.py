"""Intervals over seeds (Student's t below five seeds, the bootstrap from five) and the comparison rule
every claim's verdict uses."""
import numpy as np
import pytest

from tests.report.helpers import MARGIN
from tmem_bench.report import INCONCLUSIVE, REFUTED, SUPPORTED, bootstrap_ci, bootstrap_diff_ci, compare, diff_ci, mean_ci
from tmem_bench.report.stats import interval_kind


T_975 = {1: 12.706204736, 2: 4.302652730, 3: 3.182446305, 4: 2.776445105}  # Student's t quantiles, from tables


def test_below_five_seeds_an_interval_is_students_t():
    """Three seeds: the t interval with 2 degrees of freedom, never the collapsed bootstrap one."""
    mean, low, high = mean_ci([0.2, 0.4, 0.6])
    half = T_975[2] * 0.2 / np.sqrt(3)
    assert (mean, low, high) == pytest.approx((0.4, 0.4 - half, 0.4 + half))
    for n in (2, 3, 4):
        x = np.linspace(0.1, 0.3, n)
        _, low, high = mean_ci(x)
        assert (high - low) / 2 == pytest.approx(T_975[n - 1] * x.std(ddof=1) / np.sqrt(n))
    assert mean_ci([0.7]) == (0.7, 0.7, 0.7)  # one seed: a point, no interval means anything
    assert mean_ci([0.4] * 3) == pytest.approx((0.4, 0.4, 0.4))  # no spread: none to show
    assert [interval_kind(n) for n in (1, 2, 4, 5, 9)] == ["a point", "Student's t", "Student's t",
                                                          "percentile bootstrap", "percentile bootstrap"]


def test_t_intervals_of_three_seeds_cover_the_mean_95_percent_of_the_time():
    rng = np.random.default_rng(0)
    samples = rng.normal(0.5, 0.1, (4000, 3))
    covered = [low <= 0.5 <= high for _, low, high in map(mean_ci, samples)]
    assert 0.94 <= np.mean(covered) <= 0.96  # the percentile bootstrap of 3 values covers about 80%


def test_welch_interval_of_a_difference_below_five_seeds():
    a, b = np.array([0.8, 0.9, 1.0]), np.array([0.1, 0.1, 0.4])
    va, vb = a.var(ddof=1) / 3, b.var(ddof=1) / 3
    df = (va + vb) ** 2 / (va ** 2 / 2 + vb ** 2 / 2)
    diff, low, high = diff_ci(a, b)
    assert diff == pytest.approx(0.7)
    from scipy import stats
    assert (high - low) / 2 == pytest.approx(stats.t.ppf(0.975, df) * np.sqrt(va + vb))
    # One value on one side: its variance is unknown, so the other side's degrees of freedom count.
    assert diff_ci([0.0, 1.0], [0.25]) == pytest.approx((0.25, 0.25 - T_975[1] * 0.5, 0.25 + T_975[1] * 0.5))
    assert diff_ci([0.9], [0.1]) == pytest.approx((0.8, 0.8, 0.8))


def test_from_five_seeds_an_interval_is_the_percentile_bootstrap():
    assert mean_ci([0.4] * 5) == pytest.approx((0.4, 0.4, 0.4))
    # [0, 0, 0, 0, 1]: resampled means are k/5 with k ~ Binomial(5, 1/5); P(k = 0) = 0.328 > 0.025, so
    # the lower end is 0, and P(k >= 3) = 0.058 > 0.025 >= P(k >= 4) = 0.0067, so the upper end is 3/5.
    assert mean_ci([0.0, 0.0, 0.0, 0.0, 1.0]) == pytest.approx((0.2, 0.0, 0.6))
    sample = np.random.default_rng(1).normal(0.5, 0.1, 400)
    mean, low, high = mean_ci(sample)
    half = 1.96 * sample.std(ddof=1) / np.sqrt(sample.size)  # normal theory for a large sample
    assert (high - low) / 2 == pytest.approx(half, rel=0.1)
    assert low < mean < high and mean_ci(sample) == (mean, low, high) == bootstrap_ci(sample)  # seeded


def test_the_percentile_bootstrap_on_known_samples():
    """What the board's aggregates use at every seed count."""
    # Resampling [0, 1] gives means 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4: the 2.5% and
    # 97.5% percentiles are exactly 0 and 1.
    assert bootstrap_ci([0.0, 1.0]) == (0.5, 0.0, 1.0)
    assert bootstrap_ci([0.7]) == (0.7, 0.7, 0.7)
    assert bootstrap_diff_ci([0.0, 1.0], [0.25]) == (0.25, -0.25, 0.75)
    assert bootstrap_diff_ci([0.9], [0.1]) == pytest.approx((0.8, 0.8, 0.8))


def test_compare_and_combine_rules():
    assert compare([0.80, 0.82, 0.81], [0.10, 0.12, 0.11], MARGIN)["verdict"] == SUPPORTED
    assert compare([0.50, 0.52, 0.51], [0.50, 0.49, 0.52], MARGIN)["verdict"] == REFUTED
    assert compare([0.2, 0.9, 0.5], [0.45, 0.5, 0.55], MARGIN)["verdict"] == INCONCLUSIVE  # straddles the margin
    assert compare([0.6], [0.5], MARGIN)["verdict"] == SUPPORTED
    assert compare([0.52], [0.5], MARGIN)["verdict"] == REFUTED
