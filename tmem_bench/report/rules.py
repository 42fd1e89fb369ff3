"""The generic decision rules that turn a run's numbers into a verdict on each claim of claims.toml."""
from __future__ import annotations

import numpy as np
import pandas as pd

from ..levels import level_key
from ..registry import variant_forces_memory
from .budget import budget_note, lower_bound_note, lower_bounds, point
from .capacity_rule import capacity, censored
from .claims import Claim, ClaimSpec, claim_spec, load_claims, load_power
from .data import RunData, model_order, per_seed, task_order, variant_order
from .figure_rule import figure
from .no_harm import no_harm
from .stats import (BUDGET, INCONCLUSIVE, NOT_TESTABLE, REFUTED, SUPPORTED, combine, compare,
                    mean_ci)
from .tables import fmt_ci, fmt_pct, fmt_points
from .views import in_panel, panels, sweep_axis, trained_in_panel


TRAINED_EACH = "trained at each level"


def _claim_rows(data: RunData, spec: ClaimSpec, variant: str, x_axis: str, panel: dict, models: list[str]):
    """The rows a claim reads: the per-level training view when the memory model was trained at
    two or more levels of the sweep axis, else the generalisation view of its training level."""
    t = data.table[(data.table["task"] == spec.task) & (data.table["variant"] == variant)
                   & data.table["label"].isin(models)]
    trained = in_panel(t[t["trained_at_level"]], panel)
    if trained[trained["label"] == spec.memory][x_axis].nunique() >= 2:
        return trained, TRAINED_EACH
    rows_ = trained_in_panel(t, panel)
    levels = ", ".join(sorted(set(rows_[rows_["label"] == spec.memory]["train_level"])))
    return rows_, f"generalisation view: trained at {levels}, evaluated at every level"


def _missing_models(data: RunData, spec: ClaimSpec, models: list[str]) -> str | None:
    t = data.table[data.table["task"] == spec.task] if not data.table.empty else data.table
    if t.empty:
        return f"this run has no {spec.task} results"
    if spec.memory not in set(t["label"]):
        return f"this run has no '{spec.memory}' model on {spec.task}"
    baselines = [m for m in models if m in spec.baselines]
    if baselines and not set(baselines) & set(t["label"]):
        return f"this run has none of the attention baselines {', '.join(baselines)} on {spec.task}"
    return None


def _headline(claim: Claim, spec: ClaimSpec, data: RunData, per_variant: dict[str, str]) -> None:
    """The verdict comes from the variants in the paper's setting; memory-forcing variants are reported beside it."""
    paper = [v for v in per_variant if not variant_forces_memory(spec.task, v, data.task_options.get((spec.task, v), {}))]
    for variant, verdict in per_variant.items():
        if variant not in paper:
            claim.notes.append(f"under the variant {variant} (not in the paper) the same rule gives: {verdict}")
        elif variant != "standard":
            claim.notes.append(f"the paper's setting was run as the variant {variant}")
    if paper:
        claim.verdict = combine([per_variant[v] for v in paper])
        rows_ = [e for e in claim.evidence if e.get("variant") in paper]
        claim.reason = "; ".join(f"{e.get('level') or e.get('levels')}: {e['verdict']}"
                                 + (f" ({e['why']})" if e.get("why") else "") for e in rows_)
    else:
        claim.verdict = INCONCLUSIVE
        claim.reason = ("no cells in the paper's setting with both the memory model and a baseline"
                        if not per_variant else "this run has only memory-forcing variants, not the paper's setting")


def _per_panel(claim: Claim, spec: ClaimSpec, data: RunData, models: list[str], check) -> None:
    """Run `check(rows, view, x_axis, panel)` on the rows of `models` (_claim_rows) in every variant and
    panel of the claim's task, then give the headline verdict. A check returns None where the panel
    has too little to decide, else (evidence row, verdict, the points it read, those of them whose
    rising can only strengthen a supporting verdict). The verdict is withheld where a model read
    leaks (inconclusive) or a point read is the budget's (budget.py; a lower bound among the rising
    points of a supporting verdict is not)."""
    reason = _missing_models(data, spec, models)
    if reason:
        claim.reason = reason
        return
    x_axis = sweep_axis(data, spec.task)
    per_variant = {}
    for variant in variant_order(data.table[data.table["task"] == spec.task]):
        verdicts = []
        for panel in panels(data, spec.task, x_axis):
            checked = check(*_claim_rows(data, spec, variant, x_axis, panel, models), x_axis, panel)
            if checked is None:
                continue
            evidence, verdict, read, rising = checked
            rising = rising if verdict == SUPPORTED else []
            leak, budget = data.leak_note({p.label for p in read}), budget_note(read, rising)
            if leak:
                verdict, shown = INCONCLUSIVE, f"{INCONCLUSIVE} ({leak})"
            elif budget:
                verdict, shown = BUDGET, budget
            else:
                bounds = lower_bound_note(lower_bounds(read, rising))
                shown = f"{verdict} ({bounds})" if bounds else verdict
            verdicts.append(verdict)
            claim.evidence.append({"variant": variant, **evidence, "verdict": shown})
        if verdicts:
            per_variant[variant] = combine(verdicts)
    _headline(claim, spec, data, per_variant)


def memory_vs_baselines(claim: Claim, spec: ClaimSpec, data: RunData) -> None:
    """The memory model clearly beats the best attention baseline at the largest common level."""

    def check(rows_, view, x_axis, panel):
        memory = rows_[rows_["label"] == spec.memory]
        baselines = rows_[rows_["label"].isin(spec.baselines)]
        common = sorted(set(memory[x_axis]) & set(baselines[x_axis]))
        if not common:
            return None
        x = common[-1]
        mem_x, base_x = memory[memory[x_axis] == x], baselines[baselines[x_axis] == x]
        best = max(model_order(base_x), key=lambda m: base_x[base_x["label"] == m]["accuracy"].mean())
        best_x = base_x[base_x["label"] == best]
        cmp = compare(per_seed(mem_x), per_seed(best_x), spec.margin)
        off = mem_x.dropna(subset=["accuracy_memory_off"])
        ceiling = censored(rows_, x_axis, x)
        read = [point(mem_x), point(best_x)]
        evidence = {
            "level": ", ".join([f"{a}={v}" for a, v in panel.items()] + [f"{x_axis}={x}"]),
            "view": view, "seeds": int(mem_x["seed"].nunique()),
            spec.memory: fmt_ci(*mean_ci(per_seed(mem_x))),
            "best baseline": f"{best} {fmt_ci(*mean_ci(per_seed(best_x)))}",
            "lead (points)": fmt_points(cmp["diff"], cmp["low"], cmp["high"]),
            f"{spec.memory} memory off": fmt_pct(off["accuracy_memory_off"].mean()) if not off.empty else "-",
            "chance": fmt_pct(mem_x["chance"].mean()), "ceiling": fmt_pct(mem_x["ceiling"].mean()),
        }
        if ceiling:
            return {**evidence, "why": ceiling}, NOT_TESTABLE, [], []
        return evidence, cmp["verdict"], read, read[:1]

    _per_panel(claim, spec, data, [spec.memory, *spec.baselines, load_power().attention_reference], check)


def _drops(rows_: pd.DataFrame, model: str, x_axis: str, x_lo, x_hi) -> np.ndarray:
    """Per seed: accuracy at x_lo minus accuracy at x_hi."""
    m = rows_[rows_["label"] == model]
    lo = m[m[x_axis] == x_lo].groupby("seed")["accuracy"].mean()
    hi = m[m[x_axis] == x_hi].groupby("seed")["accuracy"].mean()
    both = lo.index.intersection(hi.index)
    return (lo[both] - hi[both]).to_numpy(dtype=float)


def smaller_drop(claim: Claim, spec: ClaimSpec, data: RunData) -> None:
    """The memory model's accuracy drops clearly less than the least-dropping baseline's along the sweep."""

    def check(rows_, view, x_axis, panel):
        xs = sorted(set(rows_[rows_["label"] == spec.memory][x_axis]))
        if len(xs) < 2:
            return None
        x_lo, x_hi = xs[0], xs[-1]
        mem = _drops(rows_, spec.memory, x_axis, x_lo, x_hi)
        base_drops = {m: d for m in model_order(rows_) if m in spec.baselines
                      and (d := _drops(rows_, m, x_axis, x_lo, x_hi)).size}
        if not mem.size or not base_drops:
            return None
        best = min(base_drops, key=lambda m: base_drops[m].mean())
        cmp = compare(base_drops[best], mem, spec.margin)
        read = [point(rows_[(rows_["label"] == m) & (rows_[x_axis] == x)]) for m in (spec.memory, best)
                for x in (x_lo, x_hi)]
        mem_hi = rows_[(rows_["label"] == spec.memory) & (rows_[x_axis] == x_hi)].dropna(
            subset=["accuracy_memory_off"])
        ceiling = censored(rows_, x_axis, x_hi)
        evidence = {
            "levels": ", ".join([f"{a}={v}" for a, v in panel.items()] + [f"{x_axis} {x_lo} -> {x_hi}"]),
            "view": view, "seeds": int(mem.size),
            f"{spec.memory} drop (points)": fmt_points(*mean_ci(mem)),
            "least-dropping baseline": f"{best} {fmt_points(*mean_ci(base_drops[best]))}",
            "advantage (points)": fmt_points(cmp["diff"], cmp["low"], cmp["high"]),
            f"{spec.memory} memory off at {x_axis}={x_hi}":
                f"{fmt_pct(mem_hi['accuracy_memory_off'].mean())} (on {fmt_pct(mem_hi['accuracy'].mean())})"
                if not mem_hi.empty else "-",
        }
        if ceiling:
            return {**evidence, "why": ceiling}, NOT_TESTABLE, [], []
        # A smaller memory drop: the memory higher at the longest level, the baseline at the shortest.
        return evidence, cmp["verdict"], read, [read[1], read[2]]

    _per_panel(claim, spec, data, [spec.memory, *spec.baselines, load_power().attention_reference], check)


def _learned(rows_: pd.DataFrame) -> bool:
    """More than the power rule's learned margin above chance (a blind model, at chance by
    construction, has learned nothing either)."""
    return not rows_.empty and not load_power().nothing_learned(float(per_seed(rows_).mean()),
                                                                float(rows_["chance"].mean()))


def saturation(claim: Claim, spec: ClaimSpec, data: RunData) -> None:
    """The memory model's accuracy falls from the fewest to the most levels of the sweep clearly more
    than that of a growing-state reference trained and read the same way: only that part of a drop
    can be credited to a state of fixed size. Read from models trained at each level; a drop from
    one training level is extrapolation, which mixes length generalisation with capacity."""

    def check(rows_, view, x_axis, panel):
        xs = sorted(set(rows_[rows_["label"] == spec.memory][x_axis]))
        if len(xs) < 2:
            return None
        x_lo, x_hi = xs[0], xs[-1]
        mem = rows_[rows_["label"] == spec.memory]
        lo, hi = mem[mem[x_axis] == x_lo], mem[mem[x_axis] == x_hi]
        drop = _drops(rows_, spec.memory, x_axis, x_lo, x_hi)
        evidence = {
            "level": level_key(panel), "view": view,
            f"fewest {x_axis}": f"{x_lo}: {fmt_ci(*mean_ci(per_seed(lo)))}",
            f"most {x_axis}": f"{x_hi}: {fmt_ci(*mean_ci(per_seed(hi)))}",
            f"{spec.memory} drop (points)": fmt_points(*mean_ci(drop)),
        }
        if view != TRAINED_EACH:
            return {**evidence, "why": "an extrapolation drop: trained at one level, so it mixes length "
                                       "generalisation with capacity"}, NOT_TESTABLE, [], []
        refs = {m: d for m in model_order(rows_) if m in spec.references
                and _learned(rows_[(rows_["label"] == m) & (rows_[x_axis] == x_lo)])
                and (d := _drops(rows_, m, x_axis, x_lo, x_hi)).size}
        read = [point(lo), point(hi)]
        if not refs:
            present = [rows_[(rows_["label"] == m) & (rows_[x_axis] == x_lo)] for m in spec.references]
            present = [point(r) for r in present if not r.empty]
            if present and all(p.blind for p in present):
                return {**evidence, "why": f"attention is blind by construction here (no path from the writes to "
                                           f"the query for {', '.join(p.label for p in present)}), so no growing "
                                           f"state can be compared"}, NOT_TESTABLE, [], []
            return {**evidence, "why": f"no growing-state reference ({', '.join(spec.references)}) learned the task "
                                       f"at {x_axis}={x_lo}"}, INCONCLUSIVE, read, []
        ref = max(refs, key=lambda m: refs[m].mean())  # the reference that drops most
        cmp = compare(drop, refs[ref], spec.margin)
        ref_rows = rows_[rows_["label"] == ref]
        read += [point(ref_rows[ref_rows[x_axis] == x_lo]), point(ref_rows[ref_rows[x_axis] == x_hi])]
        evidence.update({
            "growing-state reference drop (points)": f"{ref} {fmt_points(*mean_ci(refs[ref]))}",
            "drop beyond it (points)": fmt_points(cmp["diff"], cmp["low"], cmp["high"]),
            f"state probe at {x_hi}": read[1].probe_note() or "not run there",
            # The reference read is named in the verdict's reason, so no summary can name another.
            "why": f"{spec.memory} drops {fmt_points(*mean_ci(drop))} points from {x_axis}={x_lo} to {x_hi}, {ref} "
                   f"(the growing-state reference that drops most) {fmt_points(*mean_ci(refs[ref]))}",
        })
        # A larger memory drop: the memory higher at the fewest levels, the reference at the most.
        return evidence, cmp["verdict"], read, [read[0], read[3]]

    _per_panel(claim, spec, data, [spec.memory, *spec.references], check)


def throughput(claim: Claim, spec: ClaimSpec, data: RunData) -> None:
    """The memory model trains much slower than the reference model (median over tasks)."""
    if data.table.empty:
        claim.reason = "no results"
        return
    cells = data.table.drop_duplicates("cell_id")
    ratios, per_task = [], []
    # The task the paper's figure is about first: a median over tasks can hide it.
    for task in sorted(task_order(data), key=lambda t: t != spec.task):
        c = cells[cells["task"] == task]
        ref, mem = c[c["label"] == spec.reference], c[c["label"] == spec.memory]
        if ref.empty or mem.empty:
            continue
        devices = set(ref["device"]) | set(mem["device"])
        if len(devices) > 1:
            claim.notes.append(f"{task} left out: its cells ran on different devices ({', '.join(sorted(devices))})")
            continue
        ratio = float(ref["loop_steps_per_s"].mean() / mem["loop_steps_per_s"].mean())
        ratios.append(ratio)
        per_task.append(f"{task} {ratio:.1f}x")
        claim.evidence.append({
            "task": task, f"{spec.reference} steps/s": f"{ref['loop_steps_per_s'].mean():.2f}",
            f"{spec.memory} steps/s": f"{mem['loop_steps_per_s'].mean():.2f}", "slowdown": f"{ratio:.1f}x",
            "device": ", ".join(sorted(map(str, devices))),
        })
    if not ratios:
        claim.reason = f"this run has no task with both {spec.reference} and {spec.memory}"
        return
    median = float(np.median(ratios))
    claim.verdict = (SUPPORTED if median >= spec.supported_ratio
                     else REFUTED if median < spec.refuted_ratio else INCONCLUSIVE)
    claim.reason = f"median slowdown {median:.1f}x over {len(ratios)} task(s): {', '.join(per_task)}"


RULES = {
    "capacity": capacity,
    "memory_vs_baselines": memory_vs_baselines,
    "smaller_drop": smaller_drop,
    "saturation": saturation,
    "no_harm": no_harm,
    "throughput": throughput,
    "figure": figure,
}


def check_claim(data: RunData, spec: ClaimSpec | str) -> Claim:
    spec = claim_spec(spec) if isinstance(spec, str) else spec
    if spec.rule not in RULES:
        raise ValueError(f"claim {spec.id!r} names the rule {spec.rule!r}; known rules: {', '.join(RULES)}")
    claim = Claim(spec.id, spec.name, spec.statement, spec.paper, spec.explained())
    RULES[spec.rule](claim, spec, data)
    return claim


def check_claims(data: RunData) -> list[Claim]:
    return [check_claim(data, spec) for spec in load_claims()]
