"""The report's environment section draws its intervals by the same few-seeds rule as every other table."""
from types import SimpleNamespace

import pandas as pd
import pytest

from tmem_bench.report.external import _fmt_return, external_rows
from tmem_bench.report.stats import mean_ci


def _table(returns: dict[str, list[float]]) -> pd.DataFrame:
    rows = [{"task": "popgym_x", "train_level": "difficulty=1", "trained_at_level": True, "label": label,
             "accuracy": 0.5 + r / 2, "normalised_return": r, "chance": 0.25}
            for label, values in returns.items() for r in values]
    return pd.DataFrame(rows)


def test_three_seeds_get_the_t_interval_and_rows_rank_by_return():
    returns = {"a": [0.1, 0.5, 0.3], "b": [0.6, 0.7, 0.8]}
    rows = external_rows(SimpleNamespace(table=_table(returns)))
    assert [r["label"] for r in rows] == ["b", "a"]
    a = rows[1]
    assert a["return"] == pytest.approx(mean_ci(returns["a"]))
    assert a["return"][2] - a["return"][1] == pytest.approx(2 * 4.302653 * 0.2 / 3 ** 0.5, rel=1e-5)  # t(2) 97.5%


def test_a_return_interval_is_clipped_to_popgyms_range():
    assert _fmt_return(0.1, -1.7, 1.3) == "+0.100 [-1.000, +1.000]"
    assert _fmt_return(0.1, 0.1, 0.1) == "+0.100"
