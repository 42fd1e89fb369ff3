"""Had training converged? A rule on a cell's logged train loss, with thresholds kept as data
(claims.toml's [convergence] table), so that "still learning at the end" is told apart from
"learned nothing" or "too weak"."""
from __future__ import annotations

import tomllib
from dataclasses import asdict, dataclass
from importlib import resources


@dataclass(frozen=True)
class ConvergenceRule:
    last_fraction: float
    max_late_fraction: float
    min_late_drop: float


def load_rule() -> ConvergenceRule:
    table = tomllib.loads(resources.files("tmem_bench.report").joinpath("claims.toml").read_text())
    return ConvergenceRule(**table["convergence"])


def convergence(history: list[dict], steps: int, rule: ConvergenceRule | None = None) -> dict:
    """{"converged": True/False, or None when the history is too short to tell, "late_drop": the
    loss's fall over the last window, "total_drop": its fall from the first logged value, "rule"}."""
    rule = rule or load_rule()
    points = [(h["step"], h["loss"]) for h in history if h.get("loss") is not None]
    out = {"converged": None, "late_drop": None, "total_drop": None, "rule": asdict(rule)}
    cut = steps * (1 - rule.last_fraction)
    late = [loss for step, loss in points if step > cut]
    before = [loss for step, loss in points if cut - steps * rule.last_fraction < step <= cut]
    if len(points) < 3 or not late or not before:
        return out
    end = sum(late) / len(late)
    late_drop = sum(before) / len(before) - end
    total_drop = points[0][1] - end
    return {**out, "late_drop": late_drop, "total_drop": total_drop,
            "converged": late_drop <= max(rule.max_late_fraction * total_drop, rule.min_late_drop)}
