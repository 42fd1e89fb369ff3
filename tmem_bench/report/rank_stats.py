"""Rank statistics between two rankings of the same models, vectorised over rows so that every
permutation or resample is one call: Kendall's tau-b and Spearman's rho, their permutation test,
their percentile interval from resampling the models, and Holm's correction (report/validity.py)."""
from __future__ import annotations

import itertools
import math

import numpy as np
from scipy.stats import rankdata

from .stats import BOOT_SEED, BOOTSTRAP_FROM, CI_LEVEL, N_BOOT

N_PERM = 10_000  # the hypothesis's permutations; every ordering instead where n! is no more (n <= 7)
ALPHA = 0.05


# The statistics, one row of X against the same row of Y, so that permutations and resamples are one call.

def _pairs(n: int):
    return np.triu_indices(n, k=1)


def tau_rows(x, y) -> np.ndarray:
    """Kendall's tau-b of each row of `x` with the same row of `y`: (concordant - discordant pairs)
    over the geometric mean of the pairs untied in x and in y; nan where either has no untied pair.
    scipy.stats.kendalltau gives the same (tested), one pair of sequences a call."""
    x, y = np.atleast_2d(np.asarray(x, dtype=float)), np.atleast_2d(np.asarray(y, dtype=float))
    i, j = _pairs(x.shape[1])
    sx, sy = np.sign(x[:, i] - x[:, j]), np.sign(y[:, i] - y[:, j])
    denominator = np.sqrt(np.count_nonzero(sx, axis=1) * np.count_nonzero(sy, axis=1).astype(float))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, (sx * sy).sum(axis=1) / denominator, np.nan)


def rho_rows(x, y) -> np.ndarray:
    """Spearman's rho of each row pair: the correlation of their ranks (ties at their mean rank);
    nan where either row is constant."""
    rx = rankdata(np.atleast_2d(x), axis=1)
    ry = rankdata(np.atleast_2d(y), axis=1)
    rx, ry = rx - rx.mean(axis=1, keepdims=True), ry - ry.mean(axis=1, keepdims=True)
    denominator = np.sqrt((rx * rx).sum(axis=1) * (ry * ry).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denominator > 0, (rx * ry).sum(axis=1) / denominator, np.nan)


STATISTIC_ROWS = {"tau": tau_rows, "rho": rho_rows}


def kendall_tau(x, y) -> float:
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"kendall_tau needs two 1-D sequences of one length, got {x.shape} and {y.shape}")
    return float(tau_rows(x, y)[0])


def _orderings(n: int, n_perm: int, seed: int) -> tuple[np.ndarray, bool]:
    """Every ordering of n models where n! <= n_perm (exact), else n_perm random ones (seeded), as
    scipy.stats.permutation_test chooses."""
    if math.factorial(n) <= n_perm:
        return np.array(list(itertools.permutations(range(n)))), True
    return np.argsort(np.random.default_rng(seed).random((n_perm, n)), axis=1), False


def permutation_p(x, y, statistic: str = "tau", alternative: str = "two-sided",
                  n_perm: int = N_PERM, seed: int = BOOT_SEED) -> float:
    """The permutation test's p-value of `statistic` ("tau" or "rho") between x and y, y's model
    labels permuted: exact over every ordering where n! <= n_perm, else Monte Carlo counting the
    observed ordering as one of n_perm + 1. Two-sided is twice the smaller one-sided p (at most 1),
    and values within rounding of the observed one count as reaching it, both as scipy's
    permutation_test does. nan where the statistic is."""
    rows = STATISTIC_ROWS[statistic]
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    observed = rows(x, y)[0]
    if math.isnan(observed):
        return math.nan
    orderings, exact = _orderings(len(x), n_perm, seed)
    null = rows(np.broadcast_to(x, orderings.shape), y[orderings])
    gamma = abs(observed) * 100 * np.finfo(float).eps
    extra = 0 if exact else 1
    greater = (np.count_nonzero(null >= observed - gamma) + extra) / (len(null) + extra)
    less = (np.count_nonzero(null <= observed + gamma) + extra) / (len(null) + extra)
    return float({"greater": greater, "less": less, "two-sided": min(1.0, 2 * min(greater, less))}[alternative])


def model_interval(x, y, statistic: str = "tau", n_boot: int = N_BOOT, seed: int = BOOT_SEED,
                   level: float = CI_LEVEL) -> tuple[float, float, int]:
    """(low, high, undefined): the percentile bootstrap interval of `statistic` from drawing the
    models (the pairs x[k], y[k]) with replacement. A resample in which either side ties every model
    has no statistic: it is left out and counted. No interval (nan) below BOOTSTRAP_FROM models, where
    docs/protocol.md refuses a percentile bootstrap: a handful of values resample to a few rankings."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(x) < BOOTSTRAP_FROM:
        return math.nan, math.nan, 0
    draws = np.random.default_rng(seed).integers(0, len(x), (n_boot, len(x)))
    values = STATISTIC_ROWS[statistic](x[draws], y[draws])
    defined = values[~np.isnan(values)]
    if not len(defined):
        return math.nan, math.nan, n_boot
    low, high = np.percentile(defined, [50 * (1 - level), 50 * (1 + level)])
    return float(low), float(high), int(n_boot - len(defined))


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values over the defined ones (nan stays nan): the k-th smallest
    times (m - k + 1), never below an earlier one, at most 1."""
    p = np.asarray(pvalues, dtype=float)
    out = np.full(p.shape, np.nan)
    defined = np.flatnonzero(~np.isnan(p))
    order = defined[np.argsort(p[defined], kind="stable")]
    m = len(order)
    out[order] = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    return out


def critical_tau(n: int, alpha: float = ALPHA) -> float:
    """The smallest |tau| that a two-sided exact permutation test at level `alpha` tells from no
    relation, for n untied models (every ordering of n enumerated; n <= 9)."""
    if not 2 <= n <= 9:
        raise ValueError(f"critical_tau enumerates n! orderings, for 2 <= n <= 9; got {n}")
    orderings, _ = _orderings(n, math.factorial(n), 0)
    taus = np.abs(np.round(tau_rows(np.broadcast_to(np.arange(n), orderings.shape), orderings), 12))
    for t in sorted(set(taus)):
        if np.mean(taus >= t) <= alpha:
            return float(t)
    return math.nan
