"""Had training converged? A rule on a cell's logged loss, with thresholds kept as data
(claims.toml's [convergence] table), so that "still learning at the end" is told apart from
"learned nothing" or "too weak". A cell whose profile sets `early_stop` stops once its validation
loss has not improved on its best by a stated minimum for a stated number of checks ([early_stop])."""
from __future__ import annotations

import math
import tomllib
from dataclasses import asdict, dataclass, fields
from importlib import resources


@dataclass(frozen=True)
class ConvergenceRule:
    last_fraction: float
    max_late_fraction: float
    min_late_drop: float


@dataclass(frozen=True)
class EarlyStopRule:
    """Every `every` steps the validation loss and accuracy are measured; training stops at the
    first check where none of the last `patience` checks improved on the best loss before them by
    more than `min_improvement` nats, and the accuracy is more than `learned_margin` above chance (a
    loss flat at chance may be a plateau that more steps would leave). Patience on an absolute
    improvement, not a fraction of the loss's whole fall, so that a loss still falling steadily (10%
    a check near its end) is never called flat."""
    every: int
    learned_margin: float
    patience: int
    min_improvement: float


def _thresholds() -> dict:
    return tomllib.loads(resources.files("tmem_bench.report").joinpath("claims.toml").read_text())


def load_rule() -> ConvergenceRule:
    return ConvergenceRule(**_thresholds()["convergence"])


def load_early_stop() -> EarlyStopRule:
    """The [early_stop] thresholds, each checked: a positive integer `every` and `patience`, a finite
    `min_improvement` of at least 0 and a `learned_margin` in [0, 1)."""
    table = _thresholds().get("early_stop")
    names = [f.name for f in fields(EarlyStopRule)]
    if not isinstance(table, dict) or sorted(table) != sorted(names):
        raise ValueError(f"claims.toml [early_stop] must set exactly {', '.join(names)}; it sets "
                         f"{', '.join(sorted(table)) if isinstance(table, dict) else repr(table)}")
    for name in ("every", "patience"):
        value = table[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"claims.toml [early_stop] {name} must be a positive integer, got {value!r}")
    for name, top in (("min_improvement", math.inf), ("learned_margin", 1.0)):
        value = table[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
                or not 0 <= value < top:
            raise ValueError(f"claims.toml [early_stop] {name} must be a finite number in [0, {top:g}), got {value!r}")
    return EarlyStopRule(**table)


def early_stop_rule(settings: dict) -> EarlyStopRule:
    """The rule a cell's settings (its train["early_stop"]) carry."""
    return EarlyStopRule(**{f.name: settings[f.name] for f in fields(EarlyStopRule)})


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


def should_stop(checks: list[dict], chance: float, rule: EarlyStopRule) -> bool:
    """Whether training stops after the last of `checks` (validation {"step", "loss", "accuracy"},
    from step 0 on): something was learned and the last `patience` checks did not improve on the
    best loss before them by more than `min_improvement`."""
    if len(checks) <= rule.patience:
        return False
    learned = checks[-1]["accuracy"] > chance + rule.learned_margin
    best_before = min(c["loss"] for c in checks[:-rule.patience])
    best_since = min(c["loss"] for c in checks[-rule.patience:])
    return learned and best_since > best_before - rule.min_improvement
