"""Intervals over seeds and the verdict words every decision rule shares.

With few seeds a percentile bootstrap cannot see the spread it is asked for (three values resample
to at most ten distinct means, and identical ones to a point), so below BOOTSTRAP_FROM seeds an
interval is Student's t interval of the mean (Welch's for a difference), and from there on the
percentile bootstrap; one value (per side) is a point, where no interval means anything.
"""
from __future__ import annotations

import numpy as np
from scipy import stats

CI_LEVEL = 0.95
N_BOOT = 10_000
BOOT_SEED = 0  # the bootstrap is seeded so a report is reproducible byte for byte
EPS = 1e-9  # thresholds are inclusive; this keeps 0.99 - 1.0 from failing "within 0.01"
BOOTSTRAP_FROM = 5  # seeds: fewer get t intervals

SUPPORTED, REFUTED, INCONCLUSIVE = "supported", "not supported", "inconclusive"
# A comparison with an attention reference that already does the task (at the ceiling, or past
# the power rule's halfway mark) is censored: the memory cannot show an advantage there.
NOT_TESTABLE = "not testable in this setting"
# A verdict that rests on a point the training budget left undecided (budget.py): more steps, not
# more seeds, could settle it.
BUDGET = "inconclusive (budget)"


def interval_kind(n: int) -> str:
    """How an interval over `n` seeds is made, as "How to read" says it."""
    return "a point" if n <= 1 else "Student's t" if n < BOOTSTRAP_FROM else "percentile bootstrap"


def interval_label(seed_counts) -> str:
    """The kind of 95% interval drawn over points with these seed counts (each more than one)."""
    kinds = sorted({interval_kind(int(n)) for n in seed_counts if n > 1})
    return "95% " + (" or ".join(kinds) if kinds else "interval")


def _t_halfwidth(scale: float, df: float, level: float) -> float:
    return float(stats.t.ppf(0.5 + level / 2, df) * scale) if scale > 0 else 0.0


def mean_ci(values, level: float = CI_LEVEL):
    """(mean, low, high): the interval of the mean over `values` (one per seed): Student's t below
    BOOTSTRAP_FROM values, else the percentile bootstrap. One value is a point."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("mean_ci needs at least one value")
    if 1 < x.size < BOOTSTRAP_FROM:
        mean = float(x.mean())
        half = _t_halfwidth(float(x.std(ddof=1)) / np.sqrt(x.size), x.size - 1, level)
        return mean, mean - half, mean + half
    return bootstrap_ci(x, level)


def diff_ci(a, b, level: float = CI_LEVEL):
    """(mean(a) - mean(b), low, high): Welch's t interval where either side has fewer than
    BOOTSTRAP_FROM values, else the percentile bootstrap resampling the two groups independently. A
    point where neither side has a spread to estimate (one value each)."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size == 0 or b.size == 0:
        raise ValueError("diff_ci needs values in both groups")
    if max(a.size, b.size) > 1 and min(a.size, b.size) < BOOTSTRAP_FROM:
        diff = float(a.mean() - b.mean())
        half = _welch_halfwidth(a, b, level)
        return diff, diff - half, diff + half
    return bootstrap_diff_ci(a, b, level)


def bootstrap_ci(values, level: float = CI_LEVEL, n_boot: int = N_BOOT, seed: int = BOOT_SEED):
    """(mean, low, high): percentile bootstrap interval of the mean over `values`, whatever their
    number (mean_ci chooses it from BOOTSTRAP_FROM values on). One value collapses to a point."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    mean = float(x.mean())
    if x.size == 1:
        return mean, mean, mean
    means = _resampled_means(x, n_boot, np.random.default_rng(seed))
    low, high = np.percentile(means, [50 * (1 - level), 50 * (1 + level)])
    return mean, float(low), float(high)


def bootstrap_diff_ci(a, b, level: float = CI_LEVEL, n_boot: int = N_BOOT, seed: int = BOOT_SEED):
    """(mean(a) - mean(b), low, high), resampling the two groups independently."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size == 0 or b.size == 0:
        raise ValueError("bootstrap_diff_ci needs values in both groups")
    diff = float(a.mean() - b.mean())
    if a.size == 1 and b.size == 1:
        return diff, diff, diff
    rng = np.random.default_rng(seed)
    diffs = _resampled_means(a, n_boot, rng) - _resampled_means(b, n_boot, rng)
    low, high = np.percentile(diffs, [50 * (1 - level), 50 * (1 + level)])
    return diff, float(low), float(high)


def _welch_halfwidth(a: np.ndarray, b: np.ndarray, level: float) -> float:
    """Welch's half-width; a side of one value contributes no variance of its own (it is known only
    to be one draw), so the degrees of freedom come from the other side."""
    va = a.var(ddof=1) / a.size if a.size > 1 else 0.0
    vb = b.var(ddof=1) / b.size if b.size > 1 else 0.0
    terms = [(v, n) for v, n in ((va, a.size), (vb, b.size)) if n > 1]
    denominator = sum(v * v / (n - 1) for v, n in terms)
    df = (va + vb) ** 2 / denominator if denominator > 0 else max(n for _, n in terms) - 1
    return _t_halfwidth(float(np.sqrt(va + vb)), df, level)


def _resampled_means(x: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    if x.size == 1:
        return np.full(n_boot, x[0])
    return x[rng.integers(0, x.size, (n_boot, x.size))].mean(axis=1)


def compare(a, b, margin: float) -> dict:
    """Does A beat B by more than `margin`? From the 95% interval of mean(A) - mean(B):
    supported when the whole interval lies above the margin, not supported when it lies below,
    inconclusive when it straddles it. With one seed per side the interval is a point."""
    diff, low, high = diff_ci(a, b)
    if low > margin:
        verdict = SUPPORTED
    elif high < margin:
        verdict = REFUTED
    else:
        verdict = INCONCLUSIVE
    return {"diff": diff, "low": low, "high": high, "verdict": verdict}


def combine(verdicts: list[str]) -> str:
    """Parts not testable in this setting are left out, and all of them is not testable; then all
    supported -> supported; any not supported -> not supported; else inconclusive (budget) when
    some part is, since more steps could settle that part; else inconclusive."""
    if verdicts and all(v == NOT_TESTABLE for v in verdicts):
        return NOT_TESTABLE
    verdicts = [v for v in verdicts if v != NOT_TESTABLE]
    if verdicts and all(v == SUPPORTED for v in verdicts):
        return SUPPORTED
    if any(v == REFUTED for v in verdicts):
        return REFUTED
    return BUDGET if BUDGET in verdicts else INCONCLUSIVE
