"""The training thresholds (thresholds.toml), read by the harness, the diagnostics and the report
through one cached loader that checks every table, key and value, so that a bad edit fails in one
line naming the key and what is allowed."""
from __future__ import annotations

import math
import tomllib
from functools import cache
from importlib import resources

# table -> key -> (lowest, highest, whether an integer, the highest's inclusion): what each may hold.
ALLOWED = {
    "early_stop": {"every": (1, math.inf, True), "learned_margin": (0.0, 1.0, False),
                   "patience": (1, math.inf, True), "min_improvement": (0.0, math.inf, False)},
    "selection": {"second_seed_margin": (0.0, 1.0, False)},
}


def _allowed(low, high, integer: bool) -> str:
    if integer:
        return "a positive integer" if low == 1 else f"an integer of at least {low}"
    return f"a finite number in [{low:g}, {high:g})" if math.isfinite(high) else f"a finite number of at least {low:g}"


def checked(table: dict) -> dict:
    """`table` (thresholds.toml as read) when every table, key and value is allowed; else ValueError
    in one line naming the first that is not and what is allowed."""
    for name in table:
        if name not in ALLOWED:
            raise ValueError(f"thresholds.toml has no table [{name}]; its tables: {', '.join(ALLOWED)}")
    for name, keys in ALLOWED.items():
        values = table.get(name)
        if not isinstance(values, dict) or sorted(values) != sorted(keys):
            unknown = sorted(set(values or {}) - set(keys)) if isinstance(values, dict) else []
            said = f"has no key {unknown[0]!r}" if unknown else "lacks a key"
            raise ValueError(f"thresholds.toml [{name}] {said}; it must set exactly {', '.join(keys)}")
        for key, (low, high, integer) in keys.items():
            value = values[key]
            ok = (not isinstance(value, bool) and isinstance(value, int if integer else (int, float))
                  and math.isfinite(value) and low <= value and (value < high or math.isinf(high)))
            if not ok:
                raise ValueError(f"thresholds.toml [{name}] {key} must be {_allowed(low, high, integer)}, "
                                 f"got {value!r}")
    return table


@cache
def thresholds() -> dict:
    """thresholds.toml, checked (checked()), read once."""
    return checked(tomllib.loads(resources.files(__package__).joinpath("thresholds.toml").read_text()))
