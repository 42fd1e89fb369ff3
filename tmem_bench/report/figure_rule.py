"""A figure the paper states (attention at 7-14% at W=50, the memory at 75-91%), checked as a claim of
its own at the level it names. A stated range is a floor (its low end) and a ceiling (its high end).

A point that learned and converged is read by its 95% interval: entirely outside the range ->
not reproduced; entirely inside -> reproduced; else inconclusive. A point still learning is a lower
bound, so it is read by the direction more steps can move it: already above a ceiling it can only
move further away (not reproduced, lower bound); already past a floor with no ceiling it can only
stay past it (reproduced, lower bound); below a ceiling or a floor it may still cross, so it is
inconclusive (budget), as is a point that learned nothing."""
from __future__ import annotations

import pandas as pd

from ..registry import variant_forces_memory
from .budget import point
from .claims import Claim, ClaimSpec
from .data import RunData, per_seed
from .stats import BUDGET, EPS, INCONCLUSIVE, REFUTED, SUPPORTED, combine, mean_ci
from .tables import fmt_ci, fmt_pct
from .views import panels, sweep_axis

REPRODUCED, NOT_REPRODUCED = "reproduced", "not reproduced"
LOWER_BOUND = "lower bound"


def read_figure(p, low: float, high: float, spec: ClaimSpec) -> tuple[str, bool]:
    """(verdict, whether it rests on a lower bound) of one point whose interval is [low, high].
    Verdicts in the words of combine(): supported = reproduced, not supported = not reproduced."""
    above = spec.high is not None and low > spec.high + EPS
    below = spec.low is not None and high < spec.low - EPS
    inside = (spec.low is None or low >= spec.low - EPS) and (spec.high is None or high <= spec.high + EPS)
    if p.nothing_learned or p.read_not_learned:
        return BUDGET, False
    if p.lower_bound:
        if above:
            return REFUTED, True
        if spec.high is None and inside:
            return SUPPORTED, True
        return BUDGET, False
    return (REFUTED if above or below else SUPPORTED if inside else INCONCLUSIVE), False


def _words(verdict: str) -> str:
    return {SUPPORTED: REPRODUCED, REFUTED: NOT_REPRODUCED}.get(verdict, verdict)


def _rows_at(t: pd.DataFrame, model: str, level: dict) -> tuple[pd.DataFrame, str]:
    """The model's rows at the level named, those trained there where there are any; and how they
    were trained, as the verdict says it."""
    m = t[t["label"] == model]
    for axis, value in level.items():
        m = m[m[axis] == value]
    trained = m[m["trained_at_level"].astype(bool)]
    if not trained.empty:
        return trained, "trained and read there"
    return m, f"trained at {', '.join(sorted(set(m['train_level'])))}, read there" if not m.empty else ""


def figure(claim: Claim, spec: ClaimSpec, data: RunData) -> None:
    """Each model the figure names, at the level it names, in every variant and panel of the task's
    other axes. The headline is the paper's setting's; memory-forcing variants are given beside it."""
    t = data.table[data.table["task"] == spec.task] if not data.table.empty else data.table
    if t.empty:
        claim.reason = f"this run has no {spec.task} results"
        return
    x_axis = sweep_axis(data, spec.task)
    per_variant, reasons, bounds = {}, [], []
    for variant in dict.fromkeys(t["variant"]):
        tv = t[t["variant"] == variant]
        verdicts = []
        for panel in panels(data, spec.task, x_axis):
            level = {**panel, **spec.at}
            for model in spec.models:
                rows_, how = _rows_at(tv, model, level)
                if rows_.empty:
                    continue
                mean, low, high = mean_ci(per_seed(rows_))
                p = point(rows_)
                verdict, lower_bound = read_figure(p, low, high, spec)
                where = ", ".join(f"{a}={v}" for a, v in level.items())
                shown = _words(verdict)
                if lower_bound:
                    shown += f" ({LOWER_BOUND}: {p.describe()})"
                elif verdict == BUDGET:
                    shown += f": {p.describe()}"
                claim.evidence.append({"variant": variant, "level": where, "model": model, "how": how,
                                       "seeds": int(rows_["seed"].nunique()), "accuracy": fmt_ci(mean, low, high),
                                       "paper": spec.figure(), "chance": fmt_pct(rows_["chance"].mean()),
                                       "verdict": shown})
                verdicts.append(verdict)
                if not variant_forces_memory(spec.task, variant, data.task_options.get((spec.task, variant), {})):
                    reasons.append(f"{model} {fmt_ci(mean, low, high)} at {where} ({how}) against the paper's "
                                   f"{spec.figure()}: {shown}")
                    bounds.append((verdict, lower_bound))
        if verdicts:
            per_variant[variant] = combine(verdicts)
    paper = {v: verdict for v, verdict in per_variant.items()
             if not variant_forces_memory(spec.task, v, data.task_options.get((spec.task, v), {}))}
    for variant, verdict in per_variant.items():
        if variant not in paper:
            claim.notes.append(f"under the variant {variant} (not in the paper) the same rule gives: {_words(verdict)}")
    if not per_variant:
        claim.reason = f"this run has none of {', '.join(spec.models)} at {spec.at}"
        return
    if not paper:
        claim.verdict, claim.reason = INCONCLUSIVE, "this run has only memory-forcing variants, not the paper's setting"
        return
    verdict = combine(list(paper.values()))
    refuting = [lb for v, lb in bounds if v == REFUTED]
    claim.verdict = _words(verdict) + (f" ({LOWER_BOUND})" if verdict == REFUTED and all(refuting) else "")
    claim.reason = "; ".join(reasons)

