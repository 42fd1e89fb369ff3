"""Bootstrap intervals over seeds and the verdict words every decision rule shares."""
from __future__ import annotations

import numpy as np

CI_LEVEL = 0.95
N_BOOT = 10_000
BOOT_SEED = 0  # the bootstrap is seeded so a report is reproducible byte for byte
EPS = 1e-9  # thresholds are inclusive; this keeps 0.99 - 1.0 from failing "within 0.01"

SUPPORTED, REFUTED, INCONCLUSIVE = "supported", "not supported", "inconclusive"
# A verdict that rests on a point the training budget left undecided (budget.py): more steps, not
# more seeds, could settle it.
BUDGET = "inconclusive (budget)"


def bootstrap_ci(values, level: float = CI_LEVEL, n_boot: int = N_BOOT, seed: int = BOOT_SEED):
    """(mean, low, high): percentile bootstrap interval of the mean over `values` (one per seed).

    With a single value there is nothing to resample and the interval collapses to it.
    """
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


def _resampled_means(x: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    if x.size == 1:
        return np.full(n_boot, x[0])
    return x[rng.integers(0, x.size, (n_boot, x.size))].mean(axis=1)


def compare(a, b, margin: float) -> dict:
    """Does A beat B by more than `margin`? From the 95% bootstrap interval of mean(A) - mean(B):
    supported when the whole interval lies above the margin, not supported when it lies below,
    inconclusive when it straddles it. With one seed per side the interval is a point."""
    diff, low, high = bootstrap_diff_ci(a, b)
    if low > margin:
        verdict = SUPPORTED
    elif high < margin:
        verdict = REFUTED
    else:
        verdict = INCONCLUSIVE
    return {"diff": diff, "low": low, "high": high, "verdict": verdict}


def combine(verdicts: list[str]) -> str:
    """All supported -> supported; any not supported -> not supported; else inconclusive (budget)
    when some part is, since more steps could settle that part; else inconclusive."""
    if verdicts and all(v == SUPPORTED for v in verdicts):
        return SUPPORTED
    if any(v == REFUTED for v in verdicts):
        return REFUTED
    return BUDGET if BUDGET in verdicts else INCONCLUSIVE
