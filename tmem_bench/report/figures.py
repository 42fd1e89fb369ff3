"""Figures of a report, drawn with matplotlib's object-oriented API on the Agg canvas (no global
backend is changed); each returns the data it drew."""
from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np
import pandas as pd

from ..files import write_atomic
from ..levels import level_key
from .data import TASK_ORDER, RunData, model_order, natural_key, ordered, slug, task_order, variant_order
from .figure_parts import Style, finish_figure, new_figure, one_variant, reference_lines, set_x_axis, spaced
from .overlap import COINCIDENT_NOTE, coincident_style, coinciding
from .stats import interval_label
from .tables import level_sort_key, reliance_frame, summary_frame
from .views import curve_data, generalisation_view, panels, sweep_axis, train_level_rank, training_view

_LINESTYLES = ("-", "--", "-.", ":")
# The capacity section (capacity.py) draws accuracy against this axis with every model trained at each
# value, with its convergence marks: the per-level training view would be the same points again.
CAPACITY_AXIS = "n_writes"


def accuracy_figure(figure_panels: list[dict], x_axis: str, title: str, style: Style, trained_x=None):
    """figure_panels: [{"title", "curves": curve_data(...)}]. Returns (figure, data drawn)."""
    fig, axes = new_figure(len(figure_panels))
    drawn = {"title": title, "x_axis": x_axis, "trained_x": trained_x, "panels": []}
    for ax, panel in zip(axes, figure_panels):
        curves = panel["curves"]
        # Series of one model trained at several levels ("base @ level") differ by line style.
        trained_at = list(dict.fromkeys(label.partition(" @ ")[2] for label in curves["series"]))
        levels = curves["chance"]["x"] if curves["chance"] else []
        chance = [("chance", curves["chance"]["x"], curves["chance"]["y"])] if curves["chance"] else []
        earlier, coincident = [], {}
        for label, s in curves["series"].items():
            color = style.of(label)
            ls = _LINESTYLES[trained_at.index(label.partition(" @ ")[2]) % len(_LINESTYLES)]
            # NaN where a level of the panel was not evaluated: the line breaks there instead of crossing it.
            mean = dict(zip(s["x"], s["mean"]))
            xs = [x for x in levels if s["x"][0] <= x <= s["x"][-1]]
            ys = [mean.get(x, math.nan) for x in xs]
            under = coinciding(xs, ys, earlier, 1.0)
            on_chance = bool(coinciding(xs, ys, chance, 1.0))
            if under or on_chance:
                coincident[label] = under + ["chance"] * on_chance
            ax.plot(xs, ys, **{"marker": style.marker(label), "ms": 4.5, "color": color, "ls": ls, "label": label,
                               **coincident_style(len(under), on_chance)})
            earlier.append((label, xs, ys))
            if any(h > lo for lo, h in zip(s["low"], s["high"])):
                ax.fill_between(s["x"], s["low"], s["high"], color=color, alpha=0.18, lw=0)
        if curves["chance"]:
            reference_lines(ax, curves["chance"]["x"], curves["chance"]["y"], curves["ceiling"]["y"])
            set_x_axis(ax, curves["chance"]["x"], x_axis, trained_x)
        ax.set_ylim(-0.02, 1.04)
        ax.set_ylabel("accuracy")
        ax.set_title(panel["title"], fontsize=10)
        ax.grid(alpha=0.3)
        drawn["panels"].append({**panel, **curves, "coincident": coincident})
        del drawn["panels"][-1]["curves"]
    seeds = sorted({n for p in figure_panels for s in p["curves"]["series"].values() for n in s["n_seeds"]})
    if any(any(under != ["chance"] for under in p["coincident"].values()) for p in drawn["panels"]):
        title += f" ({COINCIDENT_NOTE})"
    if seeds == [1]:
        title += "\n1 seed per point: no interval band"
    elif seeds:
        count = str(seeds[0]) if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
        title += f"\nmean of {count} seeds per point, {interval_label(seeds)} band"
    return finish_figure(fig, axes, drawn, title)


def gate_figure(data: RunData, task: str):
    """sigmoid(gamma) per layer against step for every gated cell of a task; step 0 is the initial value."""
    gates = data.gates[data.gates["task"] == task]
    rank = train_level_rank(data, task)
    groups = sorted(gates.groupby(["variant", "label", "train_level"]), key=lambda kv: (
        variant_order(gates).index(kv[0][0]), model_order(gates).index(kv[0][1]), rank[kv[0][2]]))
    fig, axes = new_figure(len(groups))
    suffix = one_variant(gates["variant"])
    drawn = {"title": f"{task}{suffix}: gate values", "panels": []}
    for ax, ((variant, model, train_level), g) in zip(axes, groups):
        layers = sorted(g["layer"].unique(), key=natural_key)
        where = "" if train_level == "-" else f" @ {train_level}"
        title = model + where + ("" if suffix or variant == "standard" else f"\n{spaced(variant)}")
        panel = {"title": title, "variant": variant, "lines": {}, "initial": {}}
        for i, layer in enumerate(layers):
            color = _LAYER_COLORS[i % len(_LAYER_COLORS)]
            for j, (seed, lg) in enumerate(sorted(g[g["layer"] == layer].groupby("seed"))):
                lg = lg.sort_values("step")
                ax.plot(lg["step"], lg["gate"], color=color, lw=1.3, alpha=1.0 if j == 0 else 0.6,
                        label=f"{layer}")
                panel["lines"][f"{layer} seed {seed}"] = {"step": lg["step"].tolist(), "gate": lg["gate"].tolist()}
            init = float(g[(g["layer"] == layer) & (g["step"] == 0)]["gate"].mean())
            panel["initial"][layer] = init
            ax.plot([0], [init], marker="D", color=color, ms=6, ls="none")
        for init in sorted(set(panel["initial"].values())):
            ax.axhline(init, color="0.4", ls=":", lw=1, label="initial value")
        ax.set_ylim(0, 1)
        ax.set_xlabel("step")
        ax.set_ylabel("sigmoid(gamma)")
        ax.set_title(panel["title"], fontsize=9)
        ax.grid(alpha=0.3)
        drawn["panels"].append(panel)
    return finish_figure(fig, axes, drawn)


_LAYER_COLORS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02")


# Models a training panel holds: with three seeds each, the external run's seven models were 21 lines
# in one panel, too many to tell apart.
PANEL_MODELS = 4
# A line lies on another where, at LIES_ON_STEPS of the steps both have, they are within LIES_ON of
# the panel's range; a model every line of which lies on one of another model's is hidden by it when
# both are drawn in one panel (base under lstm and tensor, all at chance, in study_converge's occlusion
# curves). The loose fraction lets a noisy line at chance count as lying on another.
LIES_ON = 0.02
LIES_ON_STEPS = 0.8


def _hidden_by(a: dict, b: dict, spans: dict) -> bool:
    """Whether, in some metric, every seed's line of model a lies on one of model b's; a, b: metric -> [{step: y}]."""
    def lies_on(mine: dict, other: dict, span: float) -> bool:
        shared = [abs(y - other[x]) for x, y in mine.items() if x in other]
        return bool(shared) and sum(d <= LIES_ON * span for d in shared) >= LIES_ON_STEPS * len(shared)

    return any(a[metric] and all(any(lies_on(mine, other, span) for other in b[metric]) for mine in a[metric])
               for metric, span in spans.items())


def _model_groups(g: pd.DataFrame) -> list[list[str]]:
    """The models of a row of training panels split into panels of at most PANEL_MODELS, each model in
    the first with room where it hides no model and none hides it."""
    spans = {m: float(np.ptp(g[m].dropna())) or 1.0 for m in ("loss", "train_acc") if g[m].notna().any()}
    lines = {model: {m: [{x: y for x, y in zip(sg["step"], sg[m]) if not math.isnan(y)}
                         for _, sg in g[g["label"] == model].groupby("seed")] for m in spans}
             for model in model_order(g)}
    groups: list[list[str]] = []
    for model in lines:
        room = next((grp for grp in groups if len(grp) < PANEL_MODELS
                     and not any(_hidden_by(lines[model], lines[other], spans)
                                 or _hidden_by(lines[other], lines[model], spans) for other in grp)), None)
        if room is None:
            groups.append(room := [])
        room.append(model)
    return groups


def training_figure(data: RunData, task: str, style: Style):
    """Loss and train accuracy against step: a row per (variant, training level, group of models), loss
    on the left. Every seed is drawn in its model's colour (a fainter copy would read as another model)."""
    hist = data.history[data.history["task"] == task]
    rank = train_level_rank(data, task)
    rows = []
    for key, g in sorted(hist.groupby(["variant", "train_level"]),
                         key=lambda kv: (variant_order(hist).index(kv[0][0]), rank[kv[0][1]])):
        groups = _model_groups(g)
        rows += [(key, i, len(groups), models, g) for i, models in enumerate(groups)]
    fig, axes = new_figure(2 * len(rows), ncols=2, panel_size=(3.6, 2.3))
    suffix = one_variant(hist["variant"])
    drawn = {"title": f"{task}{suffix}: training curves", "panels": []}
    for k, ((variant, train_level), i, n, models, g) in enumerate(rows):
        for m, metric in enumerate(("loss", "train_acc")):
            ax = axes[2 * k + m]
            prefix = "" if suffix or variant == "standard" else f"{spaced(variant)}\n"
            part = f" ({i + 1} of {n})" if n > 1 else ""
            panel = {"title": f"{prefix}trained at {spaced(train_level)}{part}", "variant": variant,
                     "metric": metric, "models": models, "lines": {}}
            for model in models:
                marker = style.marker(model)
                for seed, sg in sorted(g[g["label"] == model].groupby("seed")):
                    sg = sg.sort_values("step")
                    steps, ys = sg["step"].tolist(), sg[metric].tolist()
                    # A circle is every label's default; any other marker tells a similar colour apart.
                    ax.plot(steps, ys, color=style.of(model), lw=1.0, label=model,
                            marker=marker if len(sg) < 3 or marker != "o" else None, ms=4,
                            markevery=max(1, len(sg) // 5))
                    panel["lines"][f"{model} seed {seed}"] = {"step": steps, metric: ys}
            if metric == "train_acc":
                ax.set_ylim(-0.02, 1.04)
            ax.set_xlabel("step")
            ax.set_ylabel("train accuracy" if metric == "train_acc" else "loss")
            ax.set_title(panel["title"], fontsize=10)
            ax.grid(alpha=0.3)
            drawn["panels"].append(panel)
    return finish_figure(fig, axes, drawn)


def _level_ticks(levels: list[str]) -> tuple[list[str], str, str]:
    """(tick labels, x label, what every level shares) for level keys 'a=1,b=2': the ticks name only
    the axes that vary, by value where one does."""
    if levels == ["-"]:
        return [], "no levels: one evaluation set", ""
    pairs = [dict(item.split("=", 1) for item in level.split(",")) for level in levels]
    axes = list(pairs[0])
    varying = [a for a in axes if len({p.get(a) for p in pairs}) > 1] or axes
    fixed = ", ".join(f"{a}={pairs[0][a]}" for a in axes if a not in varying)
    if len(varying) == 1:
        return [p.get(varying[0], "-") for p in pairs], varying[0], fixed
    return [",".join(f"{a}={p.get(a)}" for a in varying) for p in pairs], "level", fixed


def reliance_figure(reliance: pd.DataFrame, style: Style):
    """Accuracy drop when the memory path is switched off, per task and variant (panel), level and gated
    model, every panel on one scale: a drop of zero reads as zero beside one that is not."""
    groups = [(t, v) for t in ordered(reliance["task"], TASK_ORDER)
              for v in variant_order(reliance[reliance["task"] == t])]
    fig, axes = new_figure(len(groups), panel_size=(3.6, 2.2))
    drawn = {"title": "memory reliance: accuracy - accuracy with memory off", "panels": []}
    low = min(0.0, float(reliance["drop low"].min()))
    high = max(0.1, float(reliance["drop high"].max()))
    pad = 0.06 * (high - low)
    for ax, (task, variant) in zip(axes, groups):
        r = reliance[(reliance["task"] == task) & (reliance["variant"] == variant)]
        levels = sorted(dict.fromkeys(r["level"]), key=level_sort_key)
        ticks, x_label, fixed = _level_ticks(levels)
        # The summary selection leaves one training level per model and evaluation level.
        models = model_order(r)
        width = 0.8 / len(models)
        title = "\n".join([task] + ([spaced(variant)] if variant != "standard" else []) + ([fixed] if fixed else []))
        panel = {"title": title, "variant": variant, "levels": levels, "bars": {}}
        for i, model in enumerate(models):
            s = r[r["label"] == model].set_index("level").reindex(levels)
            xs = np.arange(len(levels)) + (i - (len(models) - 1) / 2) * width
            err = np.vstack([s["drop"] - s["drop low"], s["drop high"] - s["drop"]])
            color = style.of(model)
            ax.bar(xs, s["drop"], width=width, color=color, yerr=err, capsize=2, label=model, edgecolor="white")
            # A drop of zero is a result too: a bar of no height still shows as a line in its colour.
            ax.hlines(s["drop"], xs - width / 2, xs + width / 2, color=color, lw=2.5, zorder=3)
            panel["bars"][model] = s["drop"].tolist()
        ax.axhline(0, color="black", lw=0.8)
        if (r["drop"] == 0).all():
            ax.text(0.5, 0.5, "no drop" if levels == ["-"] else "no drop at any level", transform=ax.transAxes,
                    ha="center", fontsize=9, color="0.3")
        ax.set_xticks(np.arange(len(ticks)), ticks, fontsize=8)
        ax.set_xlabel(x_label)
        ax.set_ylim(low - pad, high + pad)
        ax.set_ylabel("accuracy drop")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        drawn["panels"].append(panel)
    return finish_figure(fig, axes, drawn)


def save_figure(fig, figures_dir: Path, stem: str, tight: bool = False) -> list[Path]:
    """PNG and SVG, each through the atomic writer (whole files, the mode the umask gives); `tight`
    crops them to what is drawn (for figures whose layout does not measure its own text)."""
    import matplotlib

    paths = []
    with matplotlib.rc_context({"svg.hashsalt": "tmem-bench"}):
        for ext, metadata in (("png", None), ("svg", {"Date": None})):
            image = io.BytesIO()
            fig.savefig(image, format=ext, dpi=110, metadata=metadata, bbox_inches="tight" if tight else None)
            paths.append(figures_dir / f"{stem}.{ext}")
            write_atomic(paths[-1], image.getvalue())
    return paths


def _accuracy_figures(data: RunData, task: str, style: Style):
    """(stem, (figure, data drawn)): the per-level training view, then one generalisation view per
    training value of the sweep axis. A panel per variant and combination of the other axes."""
    x_axis = sweep_axis(data, task)
    if x_axis is None:
        return
    t = data.table[data.table["task"] == task]
    variants = variant_order(t)
    suffix = one_variant(variants)
    grid = [(v, p) for v in variants for p in panels(data, task, x_axis)]

    def titled(variant: str, panel: dict) -> dict:
        lines = ([spaced(variant)] if len(variants) > 1 else []) + ([level_key(panel)] if panel else [])
        return {"title": "\n".join(lines), "variant": variant}

    trained = []
    for v, p in grid:
        rows_ = training_view(data, task, p)
        trained.append({**titled(v, p), "curves": curve_data(rows_[rows_["variant"] == v], x_axis)})
    trained = [p for p in trained if p["curves"]["series"]]  # a panel without a point is not drawn
    if _has_a_line(trained) and x_axis != CAPACITY_AXIS:
        yield f"accuracy_{slug(task)}_trained", accuracy_figure(
            trained, x_axis, f"{task}{suffix}: accuracy vs {x_axis}, each model trained at each level", style)
    for trained_x in sorted(t[f"train_{x_axis}"].unique()):
        gen = []
        for v, p in grid:
            rows_ = generalisation_view(data, task, x_axis, trained_x, p)
            rows_ = rows_[rows_["variant"] == v]
            by_level = rows_["train_level"].nunique() > 1
            gen.append({**titled(v, p), "curves": curve_data(rows_, x_axis, label_by_train_level=by_level)})
        gen = [p for p in gen if p["curves"]["series"]]
        if _has_a_line(gen):  # else evaluated only where trained: the training view already shows it
            yield f"accuracy_{slug(task)}_from_{slug(x_axis)}{trained_x}", accuracy_figure(
                gen, x_axis, f"{task}{suffix}: trained at {x_axis}={trained_x}, evaluated at every level", style,
                trained_x=trained_x)


def _has_a_line(figure_panels: list[dict]) -> bool:
    return any(len(s["x"]) >= 2 for p in figure_panels for s in p["curves"]["series"].values())


def draw_figures(data: RunData):
    """(stem, (figure, data drawn)) for every figure of a report, in the report's order."""
    style = Style(data.table)
    for task in task_order(data):
        yield from _accuracy_figures(data, task, style)
    for task in task_order(data):
        if not data.gates.empty and task in set(data.gates["task"]):
            yield f"gates_{slug(task)}", gate_figure(data, task)
    for task in task_order(data):
        if not data.history.empty and task in set(data.history["task"]):
            yield f"training_{slug(task)}", training_figure(data, task, style)
    reliance = reliance_frame(summary_frame(data))
    if not reliance.empty:
        yield "memory_reliance", reliance_figure(reliance, style)


def build_figures(data: RunData, figures_dir: Path) -> dict[str, dict]:
    """Write every figure into `figures_dir`; return stem -> the data drawn."""
    figures_dir.mkdir(parents=True, exist_ok=True)
    drawn = {}
    for stem, (fig, d) in draw_figures(data):
        save_figure(fig, figures_dir, stem)
        drawn[stem] = d
    return drawn
