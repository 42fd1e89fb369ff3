"""Capacity: how many bindings a model holds, from runs that train every model at each number of
writes W and evaluate each cell at its own W (so a fall is capacity, not generalisation to longer
inputs than trained on).

Three views of the same points: accuracy against W per model, with 95% bands over seeds, chance and
ceiling; accuracy against the bytes of state each model carries, at each W, one point per model
label (the grid sizes of one memory are separate labels), so that memories are compared at matched
state; and a table of the largest W at which each model stays at or above 90% and 50% accuracy.
Points whose training had not converged (the cells' `converged`, from the study's rule) are drawn
hollow and marked in the table: there a fall may be training's, not the state's. Points where nothing
was learned (within the power rule's margin of chance) are marked too, converged or not: a loss flat at
chance may be a plateau that learning has not yet left, which the convergence rule cannot tell from a
limit.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from .claims import load_power
from .data import RunData, model_order, per_seed, slug, task_label, task_order, variant_order
from .figures import save_figure
from .overlap import SPREAD_NOTE, spread
from .stats import interval_label, mean_ci
from .tables import fmt_ci, md_table

AXIS = "n_writes"
THRESHOLDS = (0.9, 0.5)
UNCONVERGED, AT_CHANCE = "*", "°"


@dataclass
class Group:
    """The trained-at points of one task, variant and combination of the task's other axes."""
    task: str
    variant: str
    panel: dict  # the other axes' values, e.g. {"noise": 0.05}
    rows: pd.DataFrame

    @property
    def title(self) -> str:
        where = " ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in self.panel.items())
        return task_label(self.task, self.variant) + (f" {where}" if where else "")


def capacity_groups(data: RunData) -> list[Group]:
    """Every task, variant and other-axes panel in which some model was trained at more than one W
    and evaluated where it was trained."""
    table = data.table
    if table.empty or "trained_at_level" not in table:
        return []
    out = []
    for task in task_order(data):
        axes = data.axes.get(task, ())
        if AXIS not in axes:
            continue
        t = table[(table["task"] == task) & table["trained_at_level"].astype(bool)]
        others = [a for a in axes if a != AXIS]
        for variant in variant_order(t) if not t.empty else []:
            tv = t[t["variant"] == variant]
            combos = tv[others].drop_duplicates().sort_values(others) if others else pd.DataFrame([{}])
            for values in combos.to_dict("records"):
                panel = {a: _plain(v) for a, v in values.items()}
                rows = tv
                for axis, value in panel.items():
                    rows = rows[rows[axis] == value]
                if not rows.empty and rows.groupby("label")[f"train_{AXIS}"].nunique().max() > 1:
                    out.append(Group(task, variant, panel, rows))
    return out


def _plain(value):
    """numpy and pandas scalars as Python's, for titles and data drawn."""
    return value.item() if hasattr(value, "item") else value


def _is_false(value) -> bool:
    """False, not None or NaN (a cell that does not say)."""
    return isinstance(value, (bool, np.bool_)) and not value


def points(group: Group) -> pd.DataFrame:
    """One row per model and W: mean accuracy over seeds with its 95% bootstrap interval, the seeds,
    chance and ceiling, the state bytes, how many seeds had not converged or do not say, and whether
    nothing was learned (the mean within the power rule's margin of chance)."""
    power = load_power()
    out = []
    for (model, w), g in group.rows.groupby(["label", AXIS]):
        mean, low, high = mean_ci(per_seed(g))
        cells = g.drop_duplicates("cell_id")
        state = pd.to_numeric(cells.get("state_bytes", pd.Series(dtype=float)), errors="coerce").dropna()
        converged = list(cells["converged"]) if "converged" in cells else [None] * len(cells)
        chance = float(g["chance"].mean())
        out.append({
            "label": model, AXIS: int(w), "accuracy": mean, "low": low, "high": high,
            "seeds": int(g["seed"].nunique()), "chance": chance,
            "ceiling": float(g["ceiling"].mean()),
            "state_bytes": float(state.median()) if not state.empty else math.nan,
            "not_converged": sum(_is_false(c) for c in converged),
            "convergence_unknown": sum(c is None or (isinstance(c, float) and math.isnan(c)) for c in converged),
            "nothing_learned": power.nothing_learned(mean, chance),
        })
    frame = pd.DataFrame(out)
    if frame.empty:
        return frame
    order = {m: i for i, m in enumerate(model_order(group.rows))}
    return frame.sort_values(["label", AXIS], key=lambda s: s.map(order) if s.name == "label" else s,
                             ignore_index=True)


def held(model_points: pd.DataFrame, threshold: float) -> dict:
    """The largest W at which a model's mean accuracy is at or above `threshold` at that W and at
    every smaller W it was trained at. `largest` is None when it is below already at the smallest W;
    `through_all` when it holds at every W; `first_below` the W where it first falls under,
    `unconverged_below` whether training had not converged there (the fall may then be training's) and
    `nothing_learned_below` whether nothing was learned there (a plateau, or the state's limit)."""
    p = model_points.sort_values(AXIS)
    largest, first_below = None, None
    for _, r in p.iterrows():
        if r["accuracy"] >= threshold - 1e-12:
            largest = int(r[AXIS])
            continue
        first_below = r
        break
    return {
        "threshold": threshold,
        "largest": largest,
        "through_all": first_below is None,
        "first_below": None if first_below is None else int(first_below[AXIS]),
        "unconverged_below": bool(first_below is not None and first_below["not_converged"] > 0),
        "nothing_learned_below": bool(first_below is not None and first_below["nothing_learned"]),
    }


def fmt_bytes(n: float) -> str:
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "-"
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def fmt_held(h: dict) -> str:
    if h["largest"] is None:
        text = "none"
    else:
        text = f"{h['largest']}" + ("+" if h["through_all"] else "")
    return text + (UNCONVERGED if h["unconverged_below"] else "") + (AT_CHANCE if h["nothing_learned_below"] else "")


def marks(point) -> str:
    """A point's marks: * a seed had not converged, ° nothing was learned."""
    return (UNCONVERGED if point["not_converged"] else "") + (AT_CHANCE if point["nothing_learned"] else "")


def capacity_table(group: Group) -> tuple[list[str], list[list[str]]]:
    """(header, body) of the group's table: per model its state, the largest W held at each
    threshold, and its accuracy at each W with its marks."""
    p = points(group)
    ws = sorted(p[AXIS].unique())
    header = ["model", "state"] + [f"W at >= {100 * t:g}%" for t in THRESHOLDS] + [f"W={w}" for w in ws]
    body = []
    for model in dict.fromkeys(p["label"]):
        mp = p[p["label"] == model]
        state = mp["state_bytes"].dropna()
        if state.empty:
            state_text = "-"
        elif state.min() == state.max():
            state_text = fmt_bytes(state.min())
        else:
            state_text = f"{fmt_bytes(state.min())}-{fmt_bytes(state.max())}"
        at = {int(r[AXIS]): r for _, r in mp.iterrows()}
        accuracy = [fmt_ci(at[w]["accuracy"], at[w]["low"], at[w]["high"]) + marks(at[w]) if w in at else "-"
                    for w in ws]
        body.append([model, state_text] + [fmt_held(held(mp, t)) for t in THRESHOLDS] + accuracy)
    return header, body


def capacity_rows(data: RunData) -> list[dict]:
    """Per group and model: the largest W held at each threshold (the table's numbers, as data)."""
    out = []
    for group in capacity_groups(data):
        p = points(group)
        for model in dict.fromkeys(p["label"]):
            mp = p[p["label"] == model]
            out.append({"task": group.task, "variant": group.variant, "panel": group.panel, "label": model,
                        "held": {t: held(mp, t) for t in THRESHOLDS},
                        "not_converged_at": [int(w) for w in mp[mp["not_converged"] > 0][AXIS]]})
    return out


def _seed_note(p: pd.DataFrame, interval: str = "band") -> str:
    seeds = sorted(set(p["seeds"]))
    if seeds == [1]:
        return f"1 seed per point: no interval {interval}"
    count = str(seeds[0]) if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
    return f"mean of {count} seeds per point, {interval_label(seeds)} {interval}"


def _hollow_legend(ax) -> None:
    ax.plot([], [], ls="none", marker="o", ms=5, mfc="white", mec="black", label="not converged (hollow)")


def accuracy_vs_writes(data: RunData, task: str, groups: list[Group]):
    """Accuracy against W, a panel per group, each model trained and evaluated at each W."""
    from .figure_parts import Style, finish_figure, new_figure, reference_lines, set_x_axis

    style = Style(data.table)
    fig, axes = new_figure(len(groups))
    drawn = {"title": f"{task}: accuracy vs {AXIS}, each model trained at each {AXIS} and evaluated there",
             "panels": []}
    all_points = []
    for ax, group in zip(axes, groups):
        p = points(group)
        all_points.append(p)
        panel = {"title": group.title, "series": {}}
        for model in dict.fromkeys(p["label"]):
            mp = p[p["label"] == model]
            color = style.of(model)
            xs = mp[AXIS].astype(float).tolist()
            ax.plot(xs, mp["accuracy"], color=color, marker=style.marker(model), ms=4.5, label=model)
            if (mp["high"] > mp["low"]).any():
                ax.fill_between(xs, mp["low"], mp["high"], color=color, alpha=0.18, lw=0)
            bad = mp[mp["not_converged"] > 0]
            if not bad.empty:
                ax.plot(bad[AXIS].astype(float), bad["accuracy"], ls="none", marker=style.marker(model), ms=5,
                        mfc="white", mec=color, zorder=3)
            panel["series"][model] = {"x": xs, "mean": mp["accuracy"].tolist(), "low": mp["low"].tolist(),
                                      "high": mp["high"].tolist(),
                                      "not_converged": [int(w) for w in bad[AXIS]]}
        ref = p.groupby(AXIS)[["chance", "ceiling"]].mean()
        xs = ref.index.astype(float).tolist()
        reference_lines(ax, xs, ref["chance"], ref["ceiling"])
        if (p["not_converged"] > 0).any():
            _hollow_legend(ax)
        set_x_axis(ax, xs, AXIS)
        ax.set_ylim(-0.02, 1.04)
        ax.set_ylabel("accuracy")
        ax.set_title(group.title, fontsize=9)
        ax.grid(alpha=0.3)
        panel["chance"], panel["ceiling"] = ref["chance"].tolist(), ref["ceiling"].tolist()
        drawn["panels"].append(panel)
    title = f"{drawn['title']}\n{_seed_note(pd.concat(all_points))}"
    return finish_figure(fig, axes, drawn, title)


def accuracy_vs_state(data: RunData, task: str, groups: list[Group]):
    """Accuracy against state bytes (log axis), a panel per group and W, a point per model label.
    None when no model of the task records its state bytes."""
    from matplotlib.transforms import offset_copy

    from .figure_parts import Style, finish_figure, new_figure, reference_lines, thin_x_tick_labels

    style = Style(data.table)
    panels = []
    for group in groups:
        p = points(group)
        for w in sorted(p[AXIS].unique()):
            pw = p[(p[AXIS] == w) & p["state_bytes"].notna()]
            if not pw.empty:
                panels.append((group, int(w), pw, sorted(set(p[(p[AXIS] == w) & p["state_bytes"].isna()]["label"]))))
    if not panels:
        return None
    fig, axes = new_figure(len(panels))
    drawn = {"title": f"{task}: accuracy vs bytes of state, at each {AXIS} (trained there)", "panels": []}
    for ax, (group, w, pw, stateless) in zip(axes, panels):
        panel = {"title": f"{group.title}, {AXIS}={w}", "points": {}, "no_state": stateless}
        lo, hi = pw["state_bytes"].min(), pw["state_bytes"].max()
        x_frac = np.log(pw["state_bytes"] / (lo / 2)) / np.log(4 * hi / lo)
        y_frac = (pw["accuracy"] + 0.02) / 1.06
        step_points = 9
        sideways = spread(list(zip(x_frac, y_frac)), step_points / (ax.bbox.width * 72 / fig.dpi))
        for (_, r), step in zip(pw.iterrows(), sideways):
            color = style.of(r["label"])
            hollow = r["not_converged"] > 0
            ax.errorbar([r["state_bytes"]], [r["accuracy"]],
                        yerr=[[r["accuracy"] - r["low"]], [r["high"] - r["accuracy"]]],
                        ls="none", marker=style.marker(r["label"]), ms=6, color=color, mfc="white" if hollow else color,
                        capsize=2, label=r["label"],
                        transform=offset_copy(ax.transData, fig=fig, x=step_points * step, units="points"))
            panel["points"][r["label"]] = {"state_bytes": r["state_bytes"], "accuracy": r["accuracy"],
                                           "low": r["low"], "high": r["high"], "not_converged": bool(hollow),
                                           **({"drawn_sideways": step} if step else {})}
        reference_lines(ax, None, pw["chance"], pw["ceiling"], horizontal=True)
        if (pw["not_converged"] > 0).any():
            _hollow_legend(ax)
        ax.set_xscale("log")
        ax.set_xlim(lo / 2, hi * 2)
        ax.set_ylim(-0.02, 1.04)
        ax.set_xlabel("state bytes")
        ax.set_ylabel("accuracy")
        ax.set_title(panel["title"], fontsize=9)
        ax.grid(alpha=0.3)
        drawn["panels"].append(panel)
    thin_x_tick_labels(axes)
    note = _seed_note(pd.concat([pw for *_, pw, _ in panels]), "interval")
    if any("drawn_sideways" in point for panel in drawn["panels"] for point in panel["points"].values()):
        note += f"; {SPREAD_NOTE}"
    return finish_figure(fig, axes, drawn, f"{drawn['title']}\n{note}")


def figure_stems(task: str) -> tuple[str, str]:
    return f"capacity_{slug(task)}", f"capacity_state_{slug(task)}"


def build_capacity_figures(data: RunData, figures_dir: Path) -> dict[str, dict]:
    """Write the capacity figures of every task that has capacity groups; stem -> the data drawn."""
    groups = capacity_groups(data)
    drawn = {}
    for task in dict.fromkeys(g.task for g in groups):
        these = [g for g in groups if g.task == task]
        writes, state = figure_stems(task)
        fig, d = accuracy_vs_writes(data, task, these)
        save_figure(fig, figures_dir, writes, tight=True)
        drawn[writes] = d
        made = accuracy_vs_state(data, task, these)
        if made is not None:
            save_figure(made[0], figures_dir, state, tight=True)
            drawn[state] = made[1]
    return drawn


def _figure(figures: dict, stem: str) -> str:
    return f"![{figures[stem]['title']}](figures/{stem}.png)\n\n[SVG](figures/{stem}.svg)"


def capacity_section(data: RunData, figures: dict) -> list[str]:
    """The report's Capacity section; nothing when no model was trained at more than one W."""
    groups = capacity_groups(data)
    if not groups:
        return []
    out = ["", "## Capacity", "",
           f"Each model trained at each number of writes ({AXIS}) and evaluated at the level it was trained at, "
           f"so a fall is what the model holds, not how it generalises to longer inputs. The table gives the "
           f"largest {AXIS} at which a model's mean accuracy stays at or above "
           f"{' and '.join(f'{100 * t:g}%' for t in THRESHOLDS)} at that {AXIS} and every smaller one it was "
           f"trained at: 'none' is below already at the smallest, '+' holds at every {AXIS} trained. A * marks "
           f"a point where training had not converged in some seed (the study's convergence rule), and, on a "
           f"largest {AXIS}, that the first point below the threshold had not converged: there the fall may be "
           f"training's, not the state's. A {AT_CHANCE} marks a point where nothing was learned (the mean "
           f"within {100 * load_power().learned_margin:g} points of chance), and, on a largest {AXIS}, that the "
           f"first point below was one: a loss flat at chance may be a plateau that more steps would leave, "
           f"which the convergence rule cannot tell from the state's limit. 'state' is the bytes of state the "
           f"backbone carries at that length ('-': the backbone reports none).", ""]
    unknown = sum(int(points(g)["convergence_unknown"].sum()) for g in groups)
    if unknown:
        out += [f"Convergence is not recorded (or the history was too short to tell) for {unknown} cell(s); "
                f"those points are not marked.", ""]
    for task in dict.fromkeys(g.task for g in groups):
        writes, state = figure_stems(task)
        if writes in figures:
            out += [_figure(figures, writes), ""]
        for group in (g for g in groups if g.task == task):
            header, body = capacity_table(group)
            out += [f"**{group.title}**", "", md_table(header, body), ""]
        if state in figures:
            stateless = sorted({m for p in figures[state]["panels"] for m in p["no_state"]})
            out += [f"Accuracy against the bytes of state, one point per model label at each {AXIS}, so that "
                    f"memories are compared at matched state"
                    + (f" ({', '.join(stateless)}: no state size, left out)" if stateless else "") + ".", "",
                    _figure(figures, state), ""]
        else:
            out += [f"No model of {task} records its state bytes: no accuracy-against-state figure.", ""]
    return out

