"""Had training converged, and when does early stopping stop? One rule for both, with thresholds kept
as data (thresholds.toml's [early_stop]): a loss has stopped learning once none of its last `patience`
checks improved on the best loss before them by more than `min_improvement` nats. Early stopping stops
there once something was learned; "converged" is the same plateau, so a cell is called converged
exactly where early stopping would stop it (a loss flat at chance is converged too: that it learned
nothing is the power rule's to say)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from ..thresholds import thresholds


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


def load_early_stop() -> EarlyStopRule:
    """thresholds.toml's [early_stop], each value checked by its loader."""
    return EarlyStopRule(**thresholds()["early_stop"])


def early_stop_rule(settings: dict) -> EarlyStopRule:
    """The rule a cell's settings (its train["early_stop"]) carry."""
    return EarlyStopRule(**{f.name: settings[f.name] for f in fields(EarlyStopRule)})


def plateaued(losses: list[float], rule: EarlyStopRule) -> bool | None:
    """Whether none of the last `patience` losses improved on the best before them by more than
    `min_improvement`; None while there are no more than `patience` of them."""
    if len(losses) <= rule.patience:
        return None
    return min(losses[-rule.patience:]) > min(losses[:-rule.patience]) - rule.min_improvement


def should_stop(checks: list[dict], chance: float, rule: EarlyStopRule) -> bool:
    """Whether training stops after the last of `checks` (validation {"step", "loss", "accuracy"},
    from step 0 on): something was learned and the loss has plateaued."""
    learned = bool(checks) and checks[-1]["accuracy"] > chance + rule.learned_margin
    return learned and plateaued([c["loss"] for c in checks], rule) is True


def convergence(history: list[dict], checks: list[dict] | None, rule: EarlyStopRule | None = None) -> dict:
    """{"converged": the plateau rule on the validation checks where the cell made them, else on the
    train loss logged every `every` steps (and at the last step logged); None when too few to tell,
    "on": which loss, "rule"}."""
    rule = rule or load_early_stop()
    if checks:
        losses, on = [c["loss"] for c in checks], "validation_loss"
    else:
        logged = [h for h in history if h.get("loss") is not None]
        losses = [h["loss"] for i, h in enumerate(logged) if h["step"] % rule.every == 0 or i == len(logged) - 1]
        on = "train_loss"
    return {"converged": plateaued(losses, rule), "on": on, "rule": asdict(rule)}


def stopped_too_early(result: dict, rule: EarlyStopRule | None = None) -> bool:
    """Whether early stopping stopped a cell ("converged") at a step where `rule` (the current one)
    had not yet stopped at any of its stored validation checks: a cell stopped by a rule since retired,
    which the current rule would have trained on."""
    checks = result.get("validation_checks") or []
    if result.get("stopped") != "converged" or not checks:
        return False
    train_level = result["cell"]["train_level"]
    chance = next((e["chance"] for e in result["eval"] if e["level"] == train_level), result["eval"][0]["chance"])
    rule = rule or load_early_stop()
    return not any(should_stop(checks[:i + 1], chance, rule) for i in range(len(checks)))


def judge_cell(result: dict) -> dict:
    """A stored cell read under the current rule, whatever rule it was trained under: {"converged"
    (None for a diverged cell, which cannot tell), "stopped_too_early"}."""
    rule = load_early_stop()
    converged = None
    if result.get("status") != "diverged":
        converged = convergence(result.get("history") or [], result.get("validation_checks"), rule)["converged"]
    return {"converged": converged, "stopped_too_early": stopped_too_early(result, rule)}
