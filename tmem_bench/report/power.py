"""Diagnostic power: does a task variant, at a level its models were trained at, tell a memory
from no memory? Only where the attention-only reference is blind, another model solves the task
and (when gated) fails again with its memory off can a win there be credited to a memory.
The thresholds are claims.toml's [power] table."""
from __future__ import annotations

import pandas as pd

from .budget import budget_note, point
from .claims import PowerSpec, ReachSpec, load_power, load_reach
from .data import RunData, model_order, per_seed, task_order, variant_order
from .selection_table import lr_note
from .stats import BUDGET, EPS, INCONCLUSIVE, diff_ci, mean_ci
from .tables import fmt_pct, level_sort_key

DISCRIMINATES, DOES_NOT, CONTROL = "discriminates", "does not discriminate", "control (not a discriminator)"


def _points(x: float) -> str:
    return f"{100 * x:g} points"


def _of_the_way(fraction: float) -> str:
    return "halfway" if fraction == 0.5 else f"{100 * fraction:g}% of the way"


def power_rule(spec: PowerSpec) -> str:
    """The rule as the report prints it, with the thresholds it applies."""
    ref = spec.attention_reference
    return (f"A variant tells a memory from no memory at a level when, on models trained and evaluated at that "
            f"level: the attention reference {ref} stays within {_points(spec.chance_margin)} of chance; the best "
            f"other model is more than {_points(spec.learned_margin)} above chance and gets at least "
            f"{_of_the_way(spec.halfway)} from chance to ceiling; and, if that model is gated, its accuracy with the "
            f"memory switched off falls back within {_points(spec.memory_off_margin)} of chance. Checked in this "
            f"order: nothing learned, attention alone does it ({ref} itself at least "
            f"{_of_the_way(spec.halfway)}), attention is not blind, too weak, does not rely on its memory. With no "
            f"{ref} there is no verdict. A task without level axes is a control, not a discriminator. The verdict is "
            f"{BUDGET} where the best other model learned nothing or had a seed whose training had not "
            f"converged, or where a seed of {ref} had not converged ({ref} is read for being blind, so only its "
            f"convergence counts): a point of the training budget neither supports nor refutes. A best model "
            f"that already passes and is still learning is a lower bound, and its variant discriminates; so is a "
            f"{ref} already above chance and still learning, which can only rise further from blind.")


def power_verdict(reference: float | None, best: float | None, best_model: str | None, memory_off: float | None,
                  chance: float, ceiling: float, spec: PowerSpec) -> tuple[str, str]:
    """(verdict, why) for one variant and level from mean accuracies; memory_off is None for an ungated model.
    Thresholds are inclusive up to stats.EPS, as in the claims' rules."""
    ref, pct = spec.attention_reference, fmt_pct
    if reference is None:
        return INCONCLUSIVE, f"no attention reference ({ref}) in this run at this variant and level"
    if best is None:
        return INCONCLUSIVE, f"no model besides the attention reference ({ref})"
    halfway = spec.halfway_mark(chance, ceiling)
    gated = memory_off is not None
    if spec.nothing_learned(best, chance):
        return DOES_NOT, f"nothing learned: best {pct(best)} ({best_model}), chance {pct(chance)}"
    if reference >= halfway - EPS:
        why = f"attention alone does it: {ref} {pct(reference)} of ceiling {pct(ceiling)}"
        if gated and memory_off >= halfway - EPS:
            why += f"; {best_model} with its memory off keeps {pct(memory_off)}"
        return DOES_NOT, why
    if reference > chance + spec.chance_margin + EPS:
        return DOES_NOT, (f"attention is not blind: {ref} {pct(reference)} is more than "
                          f"{_points(spec.chance_margin)} above chance {pct(chance)}")
    if best < halfway - EPS:
        return DOES_NOT, (f"too weak: best {pct(best)} ({best_model}) is less than {_of_the_way(spec.halfway)} "
                          f"from chance {pct(chance)} to ceiling {pct(ceiling)}")
    if gated and memory_off > chance + spec.memory_off_margin + EPS:
        return DOES_NOT, f"{best_model} does not rely on its memory: {pct(memory_off)} with it off"
    why = f"{ref} at chance ({pct(reference)}), {best_model} {pct(best)} of ceiling {pct(ceiling)}"
    return DISCRIMINATES, why + (f"; with its memory off {pct(memory_off)}" if gated
                                 else "; not gated, no memory-off check")


def _mean(rows_: pd.DataFrame, column: str = "accuracy") -> float | None:
    """Mean over seeds (a seed's several rows averaged first); None where the column has no value."""
    rows_ = rows_.dropna(subset=[column])
    return float(per_seed(rows_, column).mean()) if not rows_.empty else None


def _still_learning(g: pd.DataFrame, model: str) -> str | None:
    """'k of n seeds' when the convergence rule says some of the model's cells were still learning."""
    seeds = g[g["label"] == model].groupby("seed")["converged"].first()
    late = int((seeds == False).sum())  # noqa: E712 - None (unknown) is neither
    return f"{late} of {len(seeds)} seeds" if late else None


def reach_case(init: float | None, trained: float | None, spec: ReachSpec) -> str | None:
    """Which of the three cases a model's information reach is in, with its ratio."""
    if init is None or trained is None or pd.isna(init) or pd.isna(trained):
        return None
    if max(init, trained) <= spec.no_path:
        return "no path from the evidence to the answer"
    if max(init, trained) < spec.vanishing:
        return f"a path whose gradient vanishes (reach {init:.1e} at init, {trained:.1e} trained)"
    if trained < spec.vanishing:
        return f"a path whose gradient vanished in training (reach {init:.2g} at init, {trained:.1e} trained)"
    return f"a path that carries gradient (reach {init:.2g} at init, {trained:.2g} trained) but was not learned"


def _reach_cases(g: pd.DataFrame, models: list[str], why: str, reach: ReachSpec) -> str:
    """'nothing learned' names each model's information reach case."""
    if not why.startswith("nothing learned"):
        return why
    cases = []
    for m in models:
        rows_ = g[g["label"] == m]
        case = reach_case(rows_["reach_init"].mean(), rows_["reach_trained"].mean(), reach)
        if case:
            cases.append(f"{m}: {case}")
    return why + (" (" + "; ".join(cases) + ")" if cases else "")


def _power_row(g: pd.DataFrame, task: str, variant: str, level: str, spec: PowerSpec,
               reach: ReachSpec | None = None) -> dict:
    # A model whose causality probe found a leak reads the future, so it cannot be credited.
    honest = g[g["causality"] != "leaking"]
    means = {model: _mean(honest[honest["label"] == model]) for model in model_order(honest)}
    reference = means.pop(spec.attention_reference, None)
    best_model = max(means, key=means.get) if means else None  # a tie goes to the first in model order
    best = means.get(best_model)
    memory_off = _mean(g[g["label"] == best_model], "accuracy_memory_off") if best_model else None
    chance, ceiling = float(g["chance"].mean()), float(g["ceiling"].mean())
    if level == "-":
        verdict, why = CONTROL, "no level axes: a control task, where memory is not needed"
    else:
        verdict, why = power_verdict(reference, best, best_model, memory_off, chance, ceiling, spec)
        why = _reach_cases(honest, list(means), why, reach or load_reach())
        if reference is not None and best_model is not None:
            read = [point(honest[honest["label"] == best_model], spec),
                    point(honest[honest["label"] == spec.attention_reference], spec, judge_learning=False)]
            # A best model already past the bar and still learning is a lower bound: it only rises. So is a
            # reference already above chance: rising only takes it further, so the verdict it decides stands.
            by_reference = verdict == DOES_NOT and why.startswith(("attention alone does it", "attention is not blind"))
            read = read[1:] if by_reference else read
            if budget := budget_note(read, read[:1] if verdict == DISCRIMINATES or by_reference else []):
                verdict, why = BUDGET, f"{budget.removeprefix(BUDGET + ': ')}; {why}"
    best_rows = g[g["label"] == best_model]
    runner_up = max((m for m in means if m != best_model), key=means.get, default=None)
    lead = None
    if runner_up is not None:
        diff, low, high = diff_ci(per_seed(honest[honest["label"] == best_model]),
                                            per_seed(honest[honest["label"] == runner_up]))
        lead = {"over": runner_up, "diff": diff, "low": low, "high": high}
    return {"task": task, "variant": variant, "level": level, "seeds": int(g["seed"].nunique()), "lead": lead,
            "reference": reference, "best_model": best_model, "best": best, "memory_off": memory_off,
            "chance": chance, "ceiling": ceiling, "verdict": verdict, "reason": why,
            "best_still_learning": _still_learning(g, best_model) if best_model else None,
            "best_reach_init": _mean(best_rows, "reach_init") if best_model else None,
            "best_reach_trained": _mean(best_rows, "reach_trained") if best_model else None}


def power_rows(data: RunData, spec: PowerSpec | None = None) -> list[dict]:
    """One row per task, variant and evaluation level, from in-distribution rows only (evaluated at
    the level the cell was trained at): out of distribution a blind reference could be mere failure
    to generalise, not the absence of a memory."""
    spec = spec or load_power()
    return [_power_row(g, task, variant, level, spec) for task, variant, level, g in _in_distribution(data)]


def _in_distribution(data: RunData):
    """(task, variant, level, rows) for every level models were trained and evaluated at."""
    if data.table.empty:
        return
    t = data.table[data.table["trained_at_level"].astype(bool)]
    for task in task_order(data):
        for variant in variant_order(t[t["task"] == task]):
            v = t[(t["task"] == task) & (t["variant"] == variant)]
            for level in sorted(set(v["level"]), key=level_sort_key):
                yield task, variant, level, v[v["level"] == level]


def power_summary(rows: list[dict]) -> dict[str, list[str]]:
    """Task -> the variants that discriminate at one or more of their levels (every task is a key)."""
    out: dict[str, list[str]] = {}
    for r in rows:
        variants = out.setdefault(r["task"], [])
        if r["verdict"] == DISCRIMINATES and r["variant"] not in variants:
            variants.append(r["variant"])
    return out


def power_lines(rows: list[dict]) -> dict[str, str]:
    """Task -> the report's line on it: the variants that discriminate, those whose verdict the
    budget left open (never counted as not discriminating), and the rest."""
    out = {}
    for task, good in power_summary(rows).items():
        mine = [r for r in rows if r["task"] == task]
        if all(r["verdict"] == CONTROL for r in mine):
            out[task] = CONTROL
            continue
        variants = list(dict.fromkeys(r["variant"] for r in mine))
        budget = [v for v in variants if v not in good and any(r["verdict"] == BUDGET for r in mine
                                                               if r["variant"] == v)]
        rest = [v for v in variants if v not in good and v not in budget]
        parts = [f"discriminates in {', '.join(good)}" if good else "",
                 f"{BUDGET} in {', '.join(budget)}" if budget else ""]
        if rest:
            parts.append(f"not in {', '.join(rest)}" if good or budget else "no variant of this run discriminates")
        out[task] = "; ".join(p for p in parts if p)
    return out


def _model_case(mean: float, chance: float, ceiling: float, reach_init, reach_trained, late: str | None,
                spec: PowerSpec, reach: ReachSpec) -> str:
    """Per model, the power rule's reading of its own accuracy: nothing learned (with its reach
    case), too weak, or learned; a model still falling at the end is said to be still learning."""
    late_note = f"; still learning at the end ({late} not converged)" if late else ""
    if spec.nothing_learned(mean, chance):
        case = reach_case(reach_init, reach_trained, reach)
        return "nothing learned" + (f": {case}" if case else "") + late_note
    if mean < spec.halfway_mark(chance, ceiling) - EPS:
        return "too weak" + late_note
    return "learned" + late_note


def model_rows(data: RunData, spec: PowerSpec | None = None, reach: ReachSpec | None = None) -> list[dict]:
    """Every model at the level it was trained at, per task and variant: its lr (and the selection's
    note on it: at the grid's edge, or every lr tied), accuracy with its 95% interval over seeds,
    memory-off accuracy, information reach at init and trained, how many seeds converged, and its case."""
    spec, reach = spec or load_power(), reach or load_reach()
    notes = {(s["task"], s["variant"], s["label"], s["train_level"]): lr_note(s)
             for s in data.selection if s.get("chosen_lr") is not None}
    out = []
    for task, variant, level, g in _in_distribution(data):
        chance, ceiling = float(g["chance"].mean()), float(g["ceiling"].mean())
        for label in model_order(g):
            m = g[g["label"] == label]
            mean, low, high = mean_ci(per_seed(m))
            seeds = m.groupby("seed")["converged"].first()
            lrs = sorted(set(m["lr"].dropna()))
            reach_init, reach_trained = _mean(m, "reach_init"), _mean(m, "reach_trained")
            out.append({
                "task": task, "variant": variant, "level": level, "label": label,
                "lr": lrs[0] if len(lrs) == 1 else None,
                "lr_note": notes.get((task, variant, label, m["train_level"].iloc[0]), ""),
                "seeds": len(seeds), "accuracy": mean, "low": low, "high": high,
                "memory_off": _mean(m, "accuracy_memory_off"), "reach_init": reach_init,
                "reach_trained": reach_trained,
                "converged": int((seeds == True).sum()),  # noqa: E712 - None (unknown) is neither
                "convergence_known": int(seeds.isin([True, False]).sum()),
                "chance": chance, "ceiling": ceiling,
                "case": _model_case(mean, chance, ceiling, reach_init, reach_trained, _still_learning(g, label),
                                    spec, reach)})
    return out
