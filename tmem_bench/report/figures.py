"""Figures of a report, drawn with matplotlib's object-oriented API on the Agg canvas (no global
backend is changed); each returns the data it drew."""
from __future__ import annotations

import math
import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from .data import (
    KNOWN_MODELS, TASK_ORDER, RunData, level_key, model_order, natural_key, ordered, series_label, slug, task_order,
    variant_order,
)
from .tables import level_sort_key, reliance_frame, summary_frame
from .views import curve_data, generalisation_view, panels, sweep_axis, train_level_rank, training_view

_LINESTYLES = ("-", "--", "-.", ":")


class Style:
    """Stable colours per model and line styles per variant across every figure of a report."""

    def __init__(self, table: pd.DataFrame):
        from matplotlib import colormaps

        models = model_order(table) if not table.empty else []
        palette = colormaps["tab10"].colors
        # The suite's own models keep one colour in every report; others take the colours after them.
        others = [m for m in models if m not in KNOWN_MODELS]
        index = {m: i for i, m in enumerate(list(KNOWN_MODELS) + others)}
        self.colors = {m: palette[index[m] % len(palette)] for m in models}
        variants = variant_order(table) if not table.empty else []
        self.styles = {v: _LINESTYLES[i % len(_LINESTYLES)] for i, v in enumerate(variants)}
        self.series = {}
        if not table.empty:
            for s, m, v in table[["series", "model", "variant"]].drop_duplicates().itertuples(index=False):
                self.series[s] = (self.colors[m], self.styles[v])

    def of(self, label: str):
        return self.series.get(label.split(" @ ")[0], ("black", "-"))


_LEGEND_W, _MARGIN_L, _MARGIN_B, _TITLE_H = 2.8, 0.8, 0.75, 0.8  # inches


def _new_figure(n_panels: int, ncols: int | None = None, panel_size=(4.2, 3.2)):
    """A grid of panels with room on the right for one shared legend. The layout is fixed
    (not constrained) because the constrained solver dominated the cost of a report."""
    from matplotlib.figure import Figure

    ncols = ncols or min(n_panels, 3)
    nrows = math.ceil(n_panels / ncols)
    width = panel_size[0] * ncols + _LEGEND_W
    height = panel_size[1] * nrows + _TITLE_H
    fig = Figure(figsize=(width, height))
    fig.subplots_adjust(left=_MARGIN_L / width, right=1 - _LEGEND_W / width, bottom=_MARGIN_B / height,
                        top=1 - _TITLE_H / height, wspace=0.32, hspace=0.6)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[n_panels:]:
        ax.set_visible(False)
    return fig, axes[:n_panels]


def _finish(fig, axes, drawn: dict, title: str | None = None, title_pad: float = 0.15):
    """One legend for every panel, on the right, and the figure's title; returns (figure, data drawn)."""
    seen = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    if seen:
        right, top = fig.subplotpars.right, fig.subplotpars.top
        fig.legend(list(seen.values()), list(seen), loc="upper left", bbox_to_anchor=(right + 0.01, top),
                   fontsize=8, frameon=False)
    fig.suptitle(title or drawn["title"], fontsize=11, y=1 - title_pad / fig.get_figheight())
    return fig, drawn


def _set_x(ax, xs: list[float], x_axis: str):
    xs = sorted(set(xs))
    if xs and xs[0] > 0 and xs[-1] / xs[0] >= 8:
        ax.set_xscale("log")
    ax.set_xticks(xs, [f"{x:g}" for x in xs])
    ax.minorticks_off()
    ax.set_xlabel(x_axis)


def accuracy_figure(figure_panels: list[dict], x_axis: str, title: str, style: Style, trained_x=None):
    """figure_panels: [{"title", "curves": curve_data(...)}]. Returns (figure, data drawn)."""
    fig, axes = _new_figure(len(figure_panels))
    drawn = {"title": title, "x_axis": x_axis, "trained_x": trained_x, "panels": []}
    for ax, panel in zip(axes, figure_panels):
        curves = panel["curves"]
        for label, s in curves["series"].items():
            color, ls = style.of(label)
            ax.plot(s["x"], s["mean"], marker="o", ms=4, color=color, ls=ls, label=label)
            if any(h > lo for lo, h in zip(s["low"], s["high"])):
                ax.fill_between(s["x"], s["low"], s["high"], color=color, alpha=0.18, lw=0)
        if curves["chance"]:
            ax.plot(curves["chance"]["x"], curves["chance"]["y"], color="0.45", ls="--", lw=1, label="chance")
            ax.plot(curves["ceiling"]["x"], curves["ceiling"]["y"], color="black", ls=":", lw=1.2, label="ceiling")
            _set_x(ax, curves["chance"]["x"], x_axis)
        if trained_x is not None:
            ax.axvline(float(trained_x), color="0.75", lw=3, alpha=0.5, zorder=0, label="trained at")
        ax.set_ylim(-0.02, 1.04)
        ax.set_ylabel("accuracy")
        ax.set_title(panel["title"], fontsize=10)
        ax.grid(alpha=0.3)
        drawn["panels"].append({"title": panel["title"], **curves})
    seeds = sorted({n for p in figure_panels for s in p["curves"]["series"].values() for n in s["n_seeds"]})
    if seeds == [1]:
        title += "\n1 seed per point: no interval band"
    elif seeds:
        count = str(seeds[0]) if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
        title += f"\nmean of {count} seeds per point, 95% bootstrap band"
    return _finish(fig, axes, drawn, title, title_pad=0.1)


def gate_figure(data: RunData, task: str):
    """sigmoid(gamma) per layer against step for every gated cell of a task; step 0 is the initial value."""
    gates = data.gates[data.gates["task"] == task]
    rank = train_level_rank(data, task)
    groups = sorted(gates.groupby(["variant", "model", "train_level"]), key=lambda kv: (
        variant_order(gates).index(kv[0][0]), model_order(gates).index(kv[0][1]), rank[kv[0][2]]))
    fig, axes = _new_figure(len(groups))
    drawn = {"title": f"{task}: gate values", "panels": []}
    for ax, ((variant, model, train_level), g) in zip(axes, groups):
        layers = sorted(g["layer"].unique(), key=natural_key)
        where = "" if train_level == "-" else f" @ {train_level}"
        panel = {"title": series_label(model, variant) + where, "lines": {}, "initial": {}}
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
    return _finish(fig, axes, drawn)


_LAYER_COLORS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02")


def training_figure(data: RunData, task: str, style: Style):
    """Loss and train accuracy against step: a pair of panels per (variant, training level)."""
    hist = data.history[data.history["task"] == task]
    rank = train_level_rank(data, task)
    groups = sorted(hist.groupby(["variant", "train_level"]),
                    key=lambda kv: (variant_order(hist).index(kv[0][0]), rank[kv[0][1]]))
    ncols = 2 * min(len(groups), 3)
    fig, axes = _new_figure(2 * len(groups), ncols=ncols, panel_size=(3.4, 2.6))
    drawn = {"title": f"{task}: training curves", "panels": []}
    for k, ((variant, train_level), g) in enumerate(groups):
        for m, metric in enumerate(("loss", "train_acc")):
            ax = axes[2 * k + m]
            prefix = "" if variant == "standard" else f"[{variant}] "
            panel = {"title": f"{prefix}trained at {train_level}", "metric": metric, "lines": {}}
            for model in model_order(g):
                for j, (seed, sg) in enumerate(sorted(g[g["model"] == model].groupby("seed"))):
                    sg = sg.sort_values("step")
                    label = series_label(model, variant)
                    color, ls = style.of(label)
                    ax.plot(sg["step"], sg[metric], color=color, ls=ls, lw=1.2, alpha=1.0 if j == 0 else 0.5,
                            marker="." if len(sg) < 3 else None, label=label)
                    panel["lines"][f"{label} seed {seed}"] = {"step": sg["step"].tolist(), metric: sg[metric].tolist()}
            if metric == "train_acc":
                ax.set_ylim(-0.02, 1.04)
            ax.set_xlabel("step")
            ax.set_ylabel("train accuracy" if metric == "train_acc" else "loss")
            ax.set_title(panel["title"], fontsize=8)
            ax.grid(alpha=0.3)
            drawn["panels"].append(panel)
    return _finish(fig, axes, drawn)


def reliance_figure(reliance: pd.DataFrame, style: Style):
    """Accuracy drop when the memory path is switched off, per task (panel), level and gated model."""
    tasks = ordered(reliance["task"], TASK_ORDER)
    fig, axes = _new_figure(len(tasks), panel_size=(4.6, 3.0))
    drawn = {"title": "memory reliance: accuracy - accuracy with memory off", "panels": []}
    for ax, task in zip(axes, tasks):
        r = reliance[reliance["task"] == task]
        levels = sorted(dict.fromkeys(r["level"]), key=level_sort_key)
        # The summary selection leaves one training level per series and evaluation level.
        series = list(dict.fromkeys(zip(r["series"], r["variant"])))
        width = 0.8 / max(len(series), 1)
        panel = {"title": task, "levels": levels, "bars": {}}
        for i, (name, variant) in enumerate(series):
            s = r[r["series"] == name].set_index("level").reindex(levels)
            xs = np.arange(len(levels)) + (i - (len(series) - 1) / 2) * width
            err = np.vstack([s["drop"] - s["drop low"], s["drop high"] - s["drop"]])
            ax.bar(xs, s["drop"], width=width, color=style.of(name)[0], yerr=err, capsize=2, label=name,
                   hatch=None if variant == "standard" else "//", edgecolor="white")
            panel["bars"][name] = s["drop"].tolist()
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(np.arange(len(levels)), levels, rotation=30, ha="right", fontsize=7)
        ax.set_ylabel("accuracy drop")
        ax.set_title(task, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        drawn["panels"].append(panel)
    return _finish(fig, axes, drawn)


def save_figure(fig, figures_dir: Path, stem: str) -> list[Path]:
    """PNG and SVG, each written to a temporary file and renamed into place."""
    import matplotlib

    figures_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    with matplotlib.rc_context({"svg.hashsalt": "tmem-bench"}):
        for ext, metadata in (("png", None), ("svg", {"Date": None})):
            path = figures_dir / f"{stem}.{ext}"
            fd, tmp = tempfile.mkstemp(dir=figures_dir, prefix=f".{path.name}.", suffix=f".{ext}")
            os.close(fd)
            try:
                fig.savefig(tmp, format=ext, dpi=110, metadata=metadata)
                os.replace(tmp, path)
            except BaseException:
                os.unlink(tmp)
                raise
            paths.append(path)
    return paths


def _accuracy_figures(data: RunData, task: str, style: Style):
    """(stem, (figure, data drawn)): the per-level training view, then one generalisation view per
    training value of the sweep axis."""
    x_axis = sweep_axis(data, task)
    if x_axis is None:
        return
    task_panels = panels(data, task, x_axis)
    titles = [level_key(p) if p else "" for p in task_panels]  # one-axis tasks: the figure title says it all
    trained = [{"title": title, "curves": curve_data(training_view(data, task, p), x_axis)}
               for title, p in zip(titles, task_panels)]
    if _has_a_line(trained):
        yield f"accuracy_{slug(task)}_trained", accuracy_figure(
            trained, x_axis, f"{task}: accuracy vs {x_axis}, each model trained at each level", style)
    t = data.table[data.table["task"] == task]
    for trained_x in sorted(t[f"train_{x_axis}"].unique()):
        gen = []
        for title, p in zip(titles, task_panels):
            rows_ = generalisation_view(data, task, x_axis, trained_x, p)
            by_level = rows_["train_level"].nunique() > 1
            gen.append({"title": title, "curves": curve_data(rows_, x_axis, label_by_train_level=by_level)})
        if _has_a_line(gen):  # else evaluated only where trained: the training view already shows it
            yield f"accuracy_{slug(task)}_from_{slug(x_axis)}{trained_x}", accuracy_figure(
                gen, x_axis, f"{task}: trained at {x_axis}={trained_x}, evaluated at every level", style,
                trained_x=trained_x)


def _has_a_line(figure_panels: list[dict]) -> bool:
    return any(len(s["x"]) >= 2 for p in figure_panels for s in p["curves"]["series"].values())


def _figures(data: RunData):
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
    for stem, (fig, d) in _figures(data):
        save_figure(fig, figures_dir, stem)
        drawn[stem] = d
    return drawn
