"""The one no-harm rule, as PAPER.md states the claim: every model reaches the ceiling (100%)
and a learned gate stays near its initial value. The claim and the no-harm verdicts under the
gate values both apply it."""
from __future__ import annotations

import pandas as pd

from .budget import budget_note, point
from .claims import Claim, ClaimSpec
from .data import RunData, model_order, per_seed, task_label, variant_order
from .stats import BUDGET, EPS, INCONCLUSIVE, REFUTED, SUPPORTED, combine, mean_ci
from .tables import fmt_ci, fmt_pct


def no_harm_verdict(accuracies, ceiling: float, gate: float | None, gate_init: float | None,
                    accuracy_tolerance: float, gate_tolerance: float) -> dict:
    """Reaches: the 95% interval of accuracy over seeds lies at or above ceiling - accuracy_tolerance
    (entirely below: does not; else inconclusive). Stays: the mean final gate is within gate_tolerance
    of its initial value (ungated models have no gate part). Both inclusive."""
    mean, low, high = mean_ci(accuracies)
    target = ceiling - accuracy_tolerance
    reaches = SUPPORTED if low >= target - EPS else REFUTED if high < target - EPS else INCONCLUSIVE
    where = {SUPPORTED: "at or above", REFUTED: "below", INCONCLUSIVE: "straddling"}[reaches]
    reasons = [f"accuracy {fmt_ci(mean, low, high)} vs ceiling {fmt_pct(ceiling)}: "
               f"{where} ceiling - {100 * accuracy_tolerance:g} points"]
    out = {"accuracy": mean, "low": low, "high": high, "ceiling": ceiling, "reaches": reaches,
           "gate": gate, "gate_init": gate_init, "gate_delta": None, "stays": None}
    if gate is not None:
        out["gate_delta"] = gate - gate_init
        within = abs(out["gate_delta"]) <= gate_tolerance + EPS
        out["stays"] = SUPPORTED if within else REFUTED
        reasons.append(f"mean gate {gate:.3f} vs initial {gate_init:.3f}: {out['gate_delta']:+.3f} "
                       f"({'within' if within else 'outside'} {gate_tolerance:g})")
    out["verdict"] = combine([v for v in (reaches, out["stays"]) if v is not None])
    out["reason"] = "; ".join(reasons)
    return out


def _model_verdict(data: RunData, rows_: pd.DataFrame, spec: ClaimSpec) -> dict:
    """The rule on one model's rows of one variant; a leaking model gets no verdict, nor one whose
    point is the budget's (budget.py); `shown` is the verdict as the report gives it."""
    cells = rows_.drop_duplicates("cell_id")
    gate = gate_init = None
    if cells["gate_init_mean"].notna().any():
        gate, gate_init = float(cells["gate_final_mean"].mean()), float(cells["gate_init_mean"].mean())
    verdict = no_harm_verdict(per_seed(rows_), float(rows_["ceiling"].mean()), gate, gate_init,
                              spec.accuracy_tolerance, spec.gate_tolerance)
    leak, budget = data.leak_note([rows_["label"].iloc[0]]), budget_note([point(rows_)])
    shown = None
    if leak:
        verdict["verdict"], verdict["reason"] = INCONCLUSIVE, f"{leak}; {verdict['reason']}"
        shown = f"{INCONCLUSIVE} ({leak})"
    elif budget:
        verdict["verdict"], verdict["reason"] = BUDGET, f"{budget}; {verdict['reason']}"
        shown = budget
    return {"seeds": int(rows_["seed"].nunique()), "leak": leak, **verdict, "shown": shown or verdict["verdict"]}


def _task_rows(data: RunData, spec: ClaimSpec) -> pd.DataFrame:
    return data.table[data.table["task"] == spec.task] if not data.table.empty else data.table


def no_harm_verdicts(data: RunData, spec: ClaimSpec) -> list[dict]:
    """One verdict per gated model and variant of the no-harm task."""
    t = _task_rows(data, spec)
    out = []
    if t.empty:
        return out
    for variant in variant_order(t):
        v = t[t["variant"] == variant]
        for model in model_order(v):
            g = v[(v["label"] == model) & v["gate_init_mean"].notna()]
            if not g.empty:
                out.append({"variant": variant, "label": model, **_model_verdict(data, g, spec)})
    return out


def no_harm(claim: Claim, spec: ClaimSpec, data: RunData) -> None:
    """The claim: every model of the paper's setting (the standard variant when it was run)."""
    t = _task_rows(data, spec)
    if t.empty:
        claim.reason = f"this run has no {spec.task} results"
        return
    t = t[t["variant"] == "standard"] if "standard" in set(t["variant"]) else t
    verdicts = []
    for model in model_order(t):
        g = t[t["label"] == model]
        v = _model_verdict(data, g, spec)
        verdicts.append(v["verdict"])
        off = g.dropna(subset=["accuracy_memory_off"])
        claim.evidence.append({
            "label": model, "seeds": v["seeds"], "accuracy": fmt_ci(v["accuracy"], v["low"], v["high"]),
            "ceiling": fmt_pct(v["ceiling"]), "reaches": v["reaches"],
            "gate initial -> final": "-" if v["gate"] is None else
            f"{v['gate_init']:.3f} -> {v['gate']:.3f} ({v['gate_delta']:+.3f})",
            "memory off": fmt_pct(off["accuracy_memory_off"].mean()) if not off.empty else "-",
            "verdict": v["shown"],
        })
    if not t["gate_init_mean"].notna().any():
        claim.verdict = INCONCLUSIVE
        claim.reason = "no gated model in this run, so the gate part cannot be checked"
    else:
        claim.verdict = combine(verdicts)
        claim.reason = "; ".join(f"{e['label']}: {e['verdict']}" for e in claim.evidence)
    claim.notes += _gate_context(data, spec)


def _gate_context(data: RunData, spec: ClaimSpec) -> list[str]:
    """A gate that also stays at its initial value where memory is needed says little about no harm."""
    notes = []
    cells = data.table.drop_duplicates("cell_id") if not data.table.empty else data.table
    gated = cells[cells["gate_init_mean"].notna()] if not cells.empty else cells
    for (task, variant, model), g in gated.groupby(["task", "variant", "label"]):
        if task == spec.task:
            continue
        moved = float((g["gate_final_mean"] - g["gate_init_mean"]).mean())
        within = abs(moved) <= spec.gate_tolerance + EPS
        notes.append(f"{model} on {task_label(task, variant)}: mean gate moved {moved:+.3f} from its initial value "
                     f"({'also within' if within else 'beyond'} {spec.gate_tolerance:g})")
    return notes
