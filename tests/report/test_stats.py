"""Bootstrap intervals over seeds and the comparison rule every claim's verdict uses."""
import numpy as np
import pytest

from tests.report.helpers import MARGIN
from tmem_bench.report import INCONCLUSIVE, REFUTED, SUPPORTED, bootstrap_ci, bootstrap_diff_ci, compare


def test_bootstrap_interval_on_known_samples():
    # Resampling [0, 1] gives means 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4: the 2.5% and
    # 97.5% percentiles are exactly 0 and 1.
    assert bootstrap_ci([0.0, 1.0]) == (0.5, 0.0, 1.0)
    # [0, 0, 1]: P(mean <= 2/3) = 26/27 > 0.975 is false (0.963), so the upper end is 1.
    mean, low, high = bootstrap_ci([0.0, 0.0, 1.0])
    assert mean == pytest.approx(1 / 3) and low == 0.0 and high == 1.0
    assert bootstrap_ci([0.7]) == (0.7, 0.7, 0.7)  # one seed: the band collapses
    assert bootstrap_ci([0.4] * 5) == pytest.approx((0.4, 0.4, 0.4))
    sample = np.random.default_rng(1).normal(0.5, 0.1, 400)
    mean, low, high = bootstrap_ci(sample)
    half = 1.96 * sample.std(ddof=1) / np.sqrt(sample.size)  # normal theory for a large sample
    assert (high - low) / 2 == pytest.approx(half, rel=0.1)
    assert low < mean < high and bootstrap_ci(sample) == (mean, low, high)  # seeded: reproducible
    assert bootstrap_diff_ci([0.0, 1.0], [0.25]) == (0.25, -0.25, 0.75)
    assert bootstrap_diff_ci([0.9], [0.1]) == pytest.approx((0.8, 0.8, 0.8))


def test_compare_and_combine_rules():
    assert compare([0.80, 0.82, 0.81], [0.10, 0.12, 0.11], MARGIN)["verdict"] == SUPPORTED
    assert compare([0.50, 0.52, 0.51], [0.50, 0.49, 0.52], MARGIN)["verdict"] == REFUTED
    assert compare([0.2, 0.9, 0.5], [0.45, 0.5, 0.55], MARGIN)["verdict"] == INCONCLUSIVE  # straddles the margin
    assert compare([0.6], [0.5], MARGIN)["verdict"] == SUPPORTED
    assert compare([0.52], [0.5], MARGIN)["verdict"] == REFUTED
