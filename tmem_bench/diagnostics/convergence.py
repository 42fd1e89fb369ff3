"""Had training converged? A rule on a cell's logged loss, with thresholds kept as data
(claims.toml's [convergence] table), so that "still learning at the end" is told apart from
"learned nothing" or "too weak". The same rule, with its own thresholds ([early_stop]), stops a
cell whose profile sets `early_stop` once its validation loss has flattened."""
from __future__ import annotations

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
    first check where the convergence rule with these thresholds holds on that history and the
    accuracy is more than `learned_margin` above chance (a loss flat at chance may be a plateau
    that more steps would leave)."""
    every: int
    learned_margin: float
    last_fraction: float
    max_late_fraction: float
    min_late_drop: float

    @property
    def convergence(self) -> ConvergenceRule:
        return ConvergenceRule(self.last_fraction, self.max_late_fraction, self.min_late_drop)


def _thresholds() -> dict:
    return tomllib.loads(resources.files("tmem_bench.report").joinpath("claims.toml").read_text())


def load_rule() -> ConvergenceRule:
    return ConvergenceRule(**_thresholds()["convergence"])


def load_early_stop() -> EarlyStopRule:
    """The [early_stop] thresholds, refused where they are looser than [convergence]'s: a cell
    that stopped early must also meet the rule the report applies to every cell."""
    table = _thresholds()
    rule, report = EarlyStopRule(**table["early_stop"]), ConvergenceRule(**table["convergence"])
    if not (isinstance(rule.every, int) and rule.every >= 1 and rule.last_fraction == report.last_fraction
            and rule.max_late_fraction <= report.max_late_fraction and rule.min_late_drop <= report.min_late_drop):
        raise ValueError(f"claims.toml [early_stop] {asdict(rule)} must have a positive integer `every`, the "
                         f"same last_fraction as [convergence] and thresholds no larger than its {asdict(report)}")
    return rule


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
    from step 0 on): something was learned and the loss has flattened."""
    last = checks[-1]
    learned = last["accuracy"] > chance + rule.learned_margin
    return learned and convergence(checks, last["step"], rule.convergence)["converged"] is True
