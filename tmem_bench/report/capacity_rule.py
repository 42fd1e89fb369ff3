"""The capacity claim's rule: trained at each W, the memory keeps the paper's accuracy at every W, and
adds something there that attention alone and the model with its memory off do not have; and the
ceiling check every comparison with the attention reference shares."""
from __future__ import annotations

import pandas as pd

from ..levels import level_key
from .budget import Point, budget_note, point
from .capacity import (AT_CHANCE, AXIS, THRESHOLDS, UNCONVERGED, capacity_groups, fmt_bytes, fmt_held, held, marks,
                       points)
from .claims import Claim, ClaimSpec, load_power
from .data import RunData, model_order, per_seed, task_label
from .stats import BUDGET, EPS, INCONCLUSIVE, NOT_TESTABLE, REFUTED, SUPPORTED, combine, diff_ci, mean_ci
from .tables import fmt_ci, fmt_pct, fmt_points


def censored(rows_: pd.DataFrame, x_axis: str, x) -> str | None:
    """Why a comparison with the attention reference at level x cannot show a memory's advantage
    (the reference already gets at least the power rule's halfway from chance to ceiling), or None."""
    spec = load_power()
    ref = rows_[(rows_["label"] == spec.attention_reference) & (rows_[x_axis] == x)]
    if ref.empty:
        return None
    accuracy, chance, ceiling = float(per_seed(ref).mean()), float(ref["chance"].mean()), float(ref["ceiling"].mean())
    if accuracy < spec.halfway_mark(chance, ceiling) - EPS:
        return None
    return (f"attention alone does it at {x_axis}={x}: {spec.attention_reference} {fmt_pct(accuracy)}, at least "
            f"{100 * spec.halfway:g}% of the way from chance {fmt_pct(chance)} to ceiling {fmt_pct(ceiling)}, so an "
            f"advantage of a memory cannot show")


def _keeps(p: pd.DataFrame, read: list[Point], keeps: float) -> tuple[str, int | None]:
    """(verdict, the first W where a point that learned and converged lies entirely below `keeps`).
    Such a point refutes whatever the others are; else a point of the budget's leaves it
    inconclusive (budget), except a lower bound already at or above `keeps`; else supported when
    every interval lies at or above `keeps`."""
    clean = ~pd.Series([r.limited for r in read], index=p.index)
    below = p[clean & (p["high"] < keeps)]
    if not below.empty:
        return REFUTED, int(below[AXIS].min())
    passed = pd.Series([r.lower_bound for r in read], index=p.index) & (p["low"] >= keeps - 1e-12)
    if not (clean | passed).all():
        return BUDGET, None
    return (SUPPORTED if (p["low"] >= keeps - 1e-12).all() else INCONCLUSIVE), None


def _fixed_state(p: pd.DataFrame) -> set[str]:
    """Labels whose state bytes are recorded and the same at every W."""
    out = set()
    for label, mp in p.groupby("label"):
        state = mp["state_bytes"].dropna()
        if len(state) == len(mp) and state.nunique() == 1:
            out.add(label)
    return out


def _matched(group, p: pd.DataFrame, memories: list[str], spec: ClaimSpec) -> list[str]:
    """At each W, each memory label against every fixed-state model of matched state."""
    rows_, out = group.rows, []
    others = [m for m in model_order(rows_) if m in _fixed_state(p) and m not in memories]
    for w in sorted(p[AXIS].unique()):
        at = p[p[AXIS] == w].set_index("label")
        for memory in (m for m in memories if m in at.index):
            for other in (o for o in others if o in at.index):
                a, b = at.loc[memory, "state_bytes"], at.loc[other, "state_bytes"]
                if not (a > 0 and b > 0) or max(a, b) / min(a, b) > spec.state_ratio:
                    continue
                diff, low, high = diff_ci(
                    per_seed(rows_[(rows_["label"] == memory) & (rows_[AXIS] == w)]),
                    per_seed(rows_[(rows_["label"] == other) & (rows_[AXIS] == w)]))
                reading = ("ahead" if low > spec.margin else "behind" if high < -spec.margin
                           else "level or unresolved")
                out.append(f"{AXIS}={w}: {memory} ({fmt_bytes(a)}) {fmt_pct(at.loc[memory, 'accuracy'])} against "
                           f"{other} ({fmt_bytes(b)}) {fmt_pct(at.loc[other, 'accuracy'])}: "
                           f"{fmt_points(diff, low, high)} points, {reading}")
    return out


def _memory_off_does_it(rows_: pd.DataFrame, label: str, w) -> str | None:
    """Why, at W=w, the memory model with its memory switched off already does the task (at least the
    power rule's halfway from chance to ceiling), so what the model holds there is not its memory's;
    or None (below it, or no memory-off accuracy recorded)."""
    m = rows_[(rows_["label"] == label) & (rows_[AXIS] == w)].dropna(subset=["accuracy_memory_off"])
    if m.empty:
        return None
    spec = load_power()
    off, chance, ceiling = (float(per_seed(m, "accuracy_memory_off").mean()), float(m["chance"].mean()),
                            float(m["ceiling"].mean()))
    if off < spec.halfway_mark(chance, ceiling) - EPS:
        return None
    return (f"with its memory off {label} still does it at {AXIS}={w}: {fmt_pct(off)} against "
            f"{fmt_pct(float(per_seed(m).mean()))} on, at least {100 * spec.halfway:g}% of the way from chance "
            f"{fmt_pct(chance)} to ceiling {fmt_pct(ceiling)}, so what it holds is not its memory's")


def _attention_and_off(rows_: pd.DataFrame, label: str, w) -> str:
    """The attention reference's accuracy and the memory model's with its memory off, at W=w."""
    ref = rows_[(rows_["label"] == load_power().attention_reference) & (rows_[AXIS] == w)]
    m = rows_[(rows_["label"] == label) & (rows_[AXIS] == w)].dropna(subset=["accuracy_memory_off"])
    return (f"{AXIS}={w}: {load_power().attention_reference} "
            + (fmt_ci(*mean_ci(per_seed(ref))) if not ref.empty else "not run")
            + ", memory off " + (fmt_pct(float(per_seed(m, "accuracy_memory_off").mean())) if not m.empty else "-"))


def capacity(claim: Claim, spec: ClaimSpec, data: RunData) -> None:
    """Trained at each W: the memory keeps the paper's accuracy at every W; where each of its sizes
    saturates; and how it compares with the other fixed-state memories at matched state. Where, at the
    largest W, attention alone (the ceiling rule, `censored`) or the model with its memory off already
    does the task, the memory's holding cannot be told from attention's: not testable, unless the
    memory falls below the paper's accuracy (refuted whatever holds it)."""
    groups = [g for g in capacity_groups(data) if g.task == spec.task]
    verdicts, reasons = [], []
    for group in groups:
        model_of = dict(zip(group.rows["label"], group.rows["model"]))
        p = points(group)
        memories = [m for m in model_order(group.rows) if model_of.get(m) == spec.memory]
        per_label = {}
        for label in memories:
            mp = p[p["label"] == label]
            rows_ = group.rows[group.rows["label"] == label]
            read = [point(rows_[rows_[AXIS] == w], where=f"at {AXIS}={w}") for w in mp[AXIS]]
            verdict, refuted_at = _keeps(mp, read, spec.keeps)
            largest = int(mp[AXIS].max())
            not_its_memory = (censored(group.rows, AXIS, largest)
                              or _memory_off_does_it(group.rows, label, largest))
            if not_its_memory and verdict != REFUTED:
                verdict = NOT_TESTABLE
            probed = {int(w): p for w, p in zip(mp[AXIS], read) if p.probe is not None}
            per_label[label] = verdict
            below = mp[mp["high"] < spec.keeps].sort_values(AXIS)
            first = None if below.empty else below.iloc[0]
            state = mp["state_bytes"].dropna()
            claim.evidence.append({
                "variant": group.variant, "level": level_key(group.panel), "model": label,
                "state": "-" if state.empty else "-".join(dict.fromkeys([fmt_bytes(state.min()),
                                                                          fmt_bytes(state.max())])),
                "accuracy at each W": ", ".join(f"{int(r[AXIS])}: {fmt_ci(r['accuracy'], r['low'], r['high'])}"
                                                + marks(r) for _, r in mp.iterrows()),
                f"first W below {100 * spec.keeps:g}%": "none" if first is None else str(int(first[AXIS])),
                **{f"W at >= {100 * t:g}%": fmt_held(held(mp, t)) for t in THRESHOLDS},
                "state probe at each W": ", ".join(f"{w}: {fmt_pct(p.probe)} ({p.probed_seeds()})"
                                                   for w, p in probed.items())
                                         or ("cannot tell (calibration below its goal)"
                                             if any(p.probe_cannot_tell for p in read) else "not run"),
                "attention and memory off at the largest W": _attention_and_off(group.rows, label, largest),
                "verdict": verdict,
            })
            keeps = f"{100 * spec.keeps:g}%"
            if verdict == REFUTED:
                at = probed.get(refuted_at)
                reasons.append((f"{label}: {verdict} (below {keeps} from {AXIS}={refuted_at}"
                                if refuted_at == int(first[AXIS]) else
                                f"{label}: {verdict} (below {keeps} at {AXIS}={refuted_at}, the first point below "
                                f"that learned and converged") + (f"; there {at.probe_note()})" if at else ")"))
            elif verdict == NOT_TESTABLE:
                reasons.append(f"{label}: {verdict} ({not_its_memory})")
            elif verdict == BUDGET:  # lower bounds already at or above `keeps` are not the budget's
                reasons.append(budget_note(read, [r for r, low in zip(read, mp["low"]) if low >= spec.keeps - 1e-12]))
            elif verdict == SUPPORTED:
                reasons.append(f"{label}: {verdict} (at or above {keeps} at every {AXIS} trained)")
            else:
                straddles = ", ".join(str(int(w)) for w in mp[mp["low"] < spec.keeps - 1e-12][AXIS])
                reasons.append(f"{label}: {verdict} (the interval straddles {keeps} at {AXIS}={straddles})")
        if not per_label:
            continue
        headline = per_label.get(spec.memory)
        verdicts.append(headline if headline is not None else combine(list(per_label.values())))
        where = task_label(group.task, group.variant) + (f" {level_key(group.panel)}" if group.panel else "")
        claim.notes += [f"{where}, at matched state: {line}" for line in _matched(group, p, memories, spec)]
    if not verdicts:
        claim.reason = (f"this run trains no {spec.memory} model of {spec.task} at more than one {AXIS} "
                        f"(the capacity profile does)")
        return
    claim.verdict = combine(verdicts)
    claim.reason = "; ".join(reasons)
    if any(UNCONVERGED in e["accuracy at each W"] for e in claim.evidence):
        claim.notes.append(f"{UNCONVERGED} a seed of that point had not converged (the convergence rule)")
    if any(AT_CHANCE in e["accuracy at each W"] for e in claim.evidence):
        claim.notes.append(f"{AT_CHANCE} nothing was learned at that point (within the power rule's learned margin "
                           f"of chance)")
