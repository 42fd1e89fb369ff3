"""Reports of a run, regenerated from its stored cell results alone.

`write_report(run_dir)` reads runs/<run>/cells/*.json (and manifest.json for the
planned cell ids) and writes report.md plus figures/ (PNG and SVG):

- accuracy against each task's sweep axis, one line per model and variant, mean
  over seeds with a 95% bootstrap band, chance and ceiling as reference lines; both
  the per-level training view (evaluated where trained) and the generalisation
  view (one trained model evaluated at every level);
- gate values per layer against step for gated models, a final-gate table across
  tasks and the no-harm verdict;
- memory reliance (accuracy minus accuracy with the memory path switched off);
- training curves; summary tables (markdown and rich);
- the paper's toy claims checked with explicit decision rules.

Every number comes from the cell files; unreadable or missing cells are named in
the report and everything else still renders. Figures use matplotlib's
object-oriented API with the Agg canvas, so no global backend is changed.
"""
from __future__ import annotations

import json
import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from .errors import UsageError
from .results import load_cells, rows

CI_LEVEL = 0.95
N_BOOT = 10_000
BOOT_SEED = 0  # the bootstrap is seeded so a report is reproducible byte for byte

# The no-harm verdict: a gated model passes when its accuracy is within 1 point of
# `base` and its mean gate within 0.05 of its initial value.
NO_HARM_TASK = "no_harm"
NO_HARM_ACC_TOL = 0.01
NO_HARM_GATE_TOL = 0.05
# Claims: "A clearly beats B" needs the 95% interval of A - B entirely above this margin.
CLAIM_MARGIN = 0.05
# "Much slower": the median over tasks of base steps/s divided by tensor steps/s.
SLOWER_SUPPORTED = 2.0
SLOWER_REFUTED = 1.25
MEMORY_MODEL = "tensor"
TOY_BASELINES = ("base", "base_wide", "slots")  # the paper's toy-suite attention baselines
_EPS = 1e-9  # thresholds are inclusive; this keeps 0.99 - 1.0 from failing "within 0.01"

SUPPORTED, REFUTED, INCONCLUSIVE = "supported", "not supported", "inconclusive"
TASK_ORDER = ("coordinate_binding", "occlusion", "map_building", "no_harm")
KNOWN_MODELS = ("base", "base_wide", "slots", "local", "linear", "xl", "registers", "lstm", "tensor", "tensor_local")


# Statistics

def bootstrap_ci(values, level: float = CI_LEVEL, n_boot: int = N_BOOT, seed: int = BOOT_SEED):
    """(mean, low, high): percentile bootstrap interval of the mean over `values` (one per seed).

    With a single value there is nothing to resample and the interval collapses to it.
    """
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        raise ValueError("bootstrap_ci needs at least one value")
    mean = float(x.mean())
    if x.size == 1:
        return mean, mean, mean
    means = _resampled_means(x, n_boot, np.random.default_rng(seed))
    low, high = np.percentile(means, [50 * (1 - level), 50 * (1 + level)])
    return mean, float(low), float(high)


def bootstrap_diff_ci(a, b, level: float = CI_LEVEL, n_boot: int = N_BOOT, seed: int = BOOT_SEED):
    """(mean(a) - mean(b), low, high), resampling the two groups independently."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.size == 0 or b.size == 0:
        raise ValueError("bootstrap_diff_ci needs values in both groups")
    diff = float(a.mean() - b.mean())
    if a.size == 1 and b.size == 1:
        return diff, diff, diff
    rng = np.random.default_rng(seed)
    diffs = _resampled_means(a, n_boot, rng) - _resampled_means(b, n_boot, rng)
    low, high = np.percentile(diffs, [50 * (1 - level), 50 * (1 + level)])
    return diff, float(low), float(high)


def _resampled_means(x: np.ndarray, n_boot: int, rng: np.random.Generator) -> np.ndarray:
    if x.size == 1:
        return np.full(n_boot, x[0])
    return x[rng.integers(0, x.size, (n_boot, x.size))].mean(axis=1)


# Loading a run

@dataclass
class RunData:
    run_dir: Path
    manifest: dict | None
    table: pd.DataFrame  # one row per cell and evaluation level (results.rows, plus series)
    history: pd.DataFrame  # one row per cell and logged step
    gates: pd.DataFrame  # one row per gated cell, layer and step; step 0 is the initial value
    axes: dict[str, tuple]  # task -> its level axes, in stored order
    problems: list[str] = field(default_factory=list)
    n_cells: int = 0

    @property
    def leaking(self) -> dict[str, list[str]]:
        """Model label -> where its causality probe said 'leaking' (marks the model everywhere)."""
        out: dict[str, list[str]] = {}
        if self.table.empty:
            return out
        bad = self.table[self.table["causality"] == "leaking"]
        for (model, task, variant), _ in bad.groupby(["model", "task", "variant"], sort=True):
            out.setdefault(model, []).append(_task_label(task, variant))
        return out


def load_run(run_dir) -> RunData:
    """Every readable cell of a run; problems name each unreadable, incomplete or missing cell."""
    run_dir = Path(run_dir)
    if not run_dir.exists():
        raise UsageError(f"run directory {str(run_dir)!r} does not exist")
    if not run_dir.is_dir():
        raise UsageError(f"run directory {str(run_dir)!r} is not a directory")
    cells_dir, manifest_path = run_dir / "cells", run_dir / "manifest.json"
    if not cells_dir.is_dir() and not manifest_path.is_file():
        raise UsageError(f"{str(run_dir)!r} is not a run directory: it has neither manifest.json nor cells/")

    problems, manifest = [], None
    if manifest_path.is_file():
        try:
            manifest = json.loads(manifest_path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            problems.append(f"manifest.json is unreadable ({e}); planned cells cannot be checked")

    results, errors = load_cells(run_dir, checks=(_history_rows, _gate_rows))
    problems.extend(errors)
    stored_ids = {path.stem for path in cells_dir.glob("*.json")}

    planned = manifest.get("cells", []) if isinstance(manifest, dict) else []
    missing = [cid for cid in planned if cid not in stored_ids]
    if missing:
        described = _planned_descriptions(manifest)
        for cid in missing:
            what = f" ({described[cid]})" if cid in described else ""
            path = cells_dir / f"{cid}.json"
            problems.append(f"cell {cid}{what} is planned in manifest.json but {path} is missing")
    return run_data(results, run_dir, manifest, problems)


def run_data(results: list[dict], run_dir=".", manifest: dict | None = None,
             problems: list[str] | None = None) -> RunData:
    """The report's tables built from cell results (already read and checked)."""
    table_rows, history_rows, gate_rows, axes, axis_is_int = [], [], [], {}, {}
    for result in results:
        loop_rate = _loop_steps_per_s(result)
        table_rows += [{**row, "loop_steps_per_s": loop_rate} for row in rows(result)]
        history_rows += _history_rows(result)
        gate_rows += _gate_rows(result)
        cell = result["cell"]
        axes.setdefault(cell["task"], tuple(cell["train_level"]))
        for level in [cell["train_level"]] + [e["level"] for e in result["eval"]]:
            for axis, value in level.items():
                is_int = isinstance(value, int) and not isinstance(value, bool)
                axis_is_int[axis] = axis_is_int.get(axis, True) and is_int

    table = pd.DataFrame(table_rows)
    if not table.empty:
        table["series"] = [_series_label(m, v) for m, v in zip(table["model"], table["variant"])]
        for col in ("accuracy_memory_off", "gate_init_mean", "gate_final_mean", "n_params", "wall_time_s",
                    "steps_per_s", "loop_steps_per_s"):
            table[col] = pd.to_numeric(table[col], errors="coerce")
        for axis, is_int in axis_is_int.items():
            if is_int:  # rows of other tasks lack the axis, which would turn 50 into 50.0
                table[axis] = table[axis].astype("Int64")
                table[f"train_{axis}"] = table[f"train_{axis}"].astype("Int64")
    return RunData(Path(run_dir), manifest, table, pd.DataFrame(history_rows), pd.DataFrame(gate_rows), axes,
                   list(problems or []), len(results))


def _loop_steps_per_s(result: dict) -> float:
    """Training-loop speed from the logged windows; the cell's own steps_per_s also counts model
    building and the causality probe, which dominate short runs."""
    seconds, last = 0.0, 0
    for h in result.get("history") or []:
        if h.get("steps_per_s"):
            seconds += (h["step"] - last) / h["steps_per_s"]
        last = h["step"]
    return last / seconds if seconds > 0 else result.get("steps_per_s", math.nan)


def _cell_keys(result: dict) -> dict:
    cell = result["cell"]
    return {
        "cell_id": result["cell_id"], "task": cell["task"], "variant": cell["variant"], "model": cell["label"],
        "seed": cell["seed"], "train_level": _level_key(cell["train_level"]),
    }


def _history_rows(result: dict) -> list[dict]:
    keys = _cell_keys(result)
    return [{**keys, "step": h["step"], "loss": h["loss"], "train_acc": h["train_acc"]}
            for h in result.get("history") or []]


def _gate_rows(result: dict) -> list[dict]:
    init = result.get("gate_init")
    if not init:
        return []
    keys = _cell_keys(result)
    out = [{**keys, "layer": layer, "step": 0, "gate": value} for layer, value in init.items()]
    for h in result.get("history") or []:
        for layer, value in (h.get("gates") or {}).items():
            out.append({**keys, "layer": layer, "step": h["step"], "gate": value})
    return out


def _planned_descriptions(manifest: dict) -> dict[str, str]:
    """Cell id -> description, by replanning the manifest's settings (best effort: names only)."""
    from .plan import Overrides, make_plan

    try:
        settings = manifest["settings"]
        cells = make_plan(settings["task"], settings["profile"], Overrides(**settings["overrides"]))
    except Exception:  # an old or edited manifest only loses the descriptions, never the report
        return {}
    return {c.id: c.describe() for c in cells}


def _level_key(level: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in level.items()) or "-"


def _series_label(model: str, variant: str) -> str:
    return model if variant == "standard" else f"{model} [{variant}]"


def _task_label(task: str, variant: str) -> str:
    return task if variant == "standard" else f"{task} [{variant}]"


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_")


def _natural(name: str) -> list:
    """Sort key that puts layer2 before layer10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(name))]


def _ordered(values, first=()) -> list:
    values = list(dict.fromkeys(values))
    return sorted(values, key=lambda v: (first.index(v) if v in first else len(first), str(v)))


def _tasks(data: RunData) -> list[str]:
    return _ordered(data.table["task"], TASK_ORDER) if not data.table.empty else []


def _models(table: pd.DataFrame) -> list[str]:
    return _ordered(table["model"], ("base",) + TOY_BASELINES)


def _variants(table: pd.DataFrame) -> list[str]:
    return _ordered(table["variant"], ("standard",))


def _per_seed(rows_: pd.DataFrame, column: str = "accuracy") -> np.ndarray:
    """One value per seed (several rows of one seed, e.g. cells trained at different levels, are averaged)."""
    return rows_.groupby("seed")[column].mean().to_numpy(dtype=float)


# Views: which rows a curve is drawn from

def _train_level_rank(data: RunData, task: str) -> dict[str, tuple]:
    """Training-level key -> its axis values, so levels sort by number (5 before 20)."""
    t = data.table[data.table["task"] == task]
    cols = [f"train_{a}" for a in data.axes.get(task, ())]
    return {key: tuple(g[cols].iloc[0]) for key, g in t.groupby("train_level")}


def sweep_axis(data: RunData, task: str) -> str | None:
    """The x axis of a task's curves: its first axis with more than one evaluated value."""
    axes = data.axes.get(task, ())
    if not axes:
        return None
    rows_ = data.table[data.table["task"] == task]
    return next((a for a in axes if rows_[a].nunique() > 1), axes[0])


def _panels(data: RunData, task: str, x_axis: str) -> list[dict]:
    """One panel per combination of the task's other axes (e.g. one per query-noise level)."""
    rows_ = data.table[data.table["task"] == task]
    others = [a for a in data.axes[task] if a != x_axis]
    if not others:
        return [{}]
    combos = rows_[others].drop_duplicates().sort_values(others)
    return [dict(zip(others, values)) for values in combos.itertuples(index=False)]


def _in_panel(rows_: pd.DataFrame, panel: dict) -> pd.DataFrame:
    mask = np.ones(len(rows_), dtype=bool)
    for axis, value in panel.items():
        mask &= (rows_[axis] == value).fillna(False).to_numpy(dtype=bool)
    return rows_[mask]


def training_view(data: RunData, task: str, panel: dict) -> pd.DataFrame:
    """Rows evaluated at the level their model was trained at."""
    rows_ = data.table[(data.table["task"] == task) & data.table["trained_at_level"]]
    return _in_panel(rows_, panel)


def generalisation_view(data: RunData, task: str, x_axis: str, trained_x, panel: dict) -> pd.DataFrame:
    """Models trained at x = trained_x, evaluated at every level of the panel. Where models
    were also trained at the panel's other-axis values, only those are kept."""
    rows_ = data.table[(data.table["task"] == task) & (data.table[f"train_{x_axis}"] == trained_x)]
    rows_ = _in_panel(rows_, panel)
    matching = _in_panel(rows_, {f"train_{a}": v for a, v in panel.items()})
    return matching if not matching.empty else rows_


def curve_data(rows_: pd.DataFrame, x_axis: str, label_by_train_level: bool = False) -> dict:
    """{"series": {label: {x, mean, low, high, n_seeds}}, "chance": {x, y}, "ceiling": {x, y}}."""
    out = {"series": {}, "chance": {}, "ceiling": {}}
    if rows_.empty:
        return out
    labels = rows_["series"] + (" @ " + rows_["train_level"] if label_by_train_level else "")
    rows_ = rows_.assign(_label=labels)
    order = {s: i for i, s in enumerate(_series_order(rows_))}
    for label, group in sorted(rows_.groupby("_label"), key=lambda kv: (order[kv[1]["series"].iloc[0]], kv[0])):
        xs = sorted(group[x_axis].unique())
        stats = [bootstrap_ci(_per_seed(group[group[x_axis] == x])) for x in xs]
        out["series"][label] = {
            "x": [float(x) for x in xs],
            "mean": [s[0] for s in stats], "low": [s[1] for s in stats], "high": [s[2] for s in stats],
            "n_seeds": [int(group[group[x_axis] == x]["seed"].nunique()) for x in xs],
        }
    xs = sorted(rows_[x_axis].unique())
    for ref in ("chance", "ceiling"):
        out[ref] = {"x": [float(x) for x in xs],
                    "y": [float(rows_[rows_[x_axis] == x][ref].mean()) for x in xs]}
    return out


def _series_order(rows_: pd.DataFrame) -> list[str]:
    models, variants = _models(rows_), _variants(rows_)
    present = set(rows_["series"])
    return [s for v in variants for m in models if (s := _series_label(m, v)) in present]


# Figures

_LINESTYLES = ("-", "--", "-.", ":")


class _Style:
    """Stable colours per model and line styles per variant across every figure of a report."""

    def __init__(self, table: pd.DataFrame):
        from matplotlib import colormaps

        models = _models(table) if not table.empty else []
        palette = colormaps["tab10"].colors
        # The suite's own models keep one colour in every report; others take the colours after them.
        others = [m for m in models if m not in KNOWN_MODELS]
        index = {m: i for i, m in enumerate(list(KNOWN_MODELS) + others)}
        self.colors = {m: palette[index[m] % len(palette)] for m in models}
        variants = _variants(table) if not table.empty else []
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


def _legend(fig, axes):
    seen = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, handle)
    if seen:
        right, top = fig.subplotpars.right, fig.subplotpars.top
        fig.legend(list(seen.values()), list(seen), loc="upper left", bbox_to_anchor=(right + 0.01, top),
                   fontsize=8, frameon=False)


def _set_x(ax, xs: list[float], x_axis: str):
    xs = sorted(set(xs))
    if xs and xs[0] > 0 and xs[-1] / xs[0] >= 8:
        ax.set_xscale("log")
    ax.set_xticks(xs, [f"{x:g}" for x in xs])
    ax.minorticks_off()
    ax.set_xlabel(x_axis)


def accuracy_figure(panels: list[dict], x_axis: str, title: str, style: _Style, trained_x=None):
    """panels: [{"title", "curves": curve_data(...)}]. Returns (figure, data drawn)."""
    fig, axes = _new_figure(len(panels))
    drawn = {"title": title, "x_axis": x_axis, "trained_x": trained_x, "panels": []}
    for ax, panel in zip(axes, panels):
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
    _legend(fig, axes)
    seeds = sorted({n for p in panels for s in p["curves"]["series"].values() for n in s["n_seeds"]})
    if seeds == [1]:
        title += "\n1 seed per point: no interval band"
    elif seeds:
        count = str(seeds[0]) if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
        title += f"\nmean of {count} seeds per point, 95% bootstrap band"
    fig.suptitle(title, fontsize=11, y=1 - 0.1 / fig.get_figheight())
    return fig, drawn


def gate_figure(data: RunData, task: str):
    """sigmoid(gamma) per layer against step for every gated cell of a task; step 0 is the initial value."""
    gates = data.gates[data.gates["task"] == task]
    rank = _train_level_rank(data, task)
    groups = sorted(gates.groupby(["variant", "model", "train_level"]), key=lambda kv: (
        _variants(gates).index(kv[0][0]), _models(gates).index(kv[0][1]), rank[kv[0][2]]))
    fig, axes = _new_figure(len(groups))
    drawn = {"title": f"{task}: gate values", "panels": []}
    for ax, ((variant, model, train_level), g) in zip(axes, groups):
        layers = sorted(g["layer"].unique(), key=_natural)
        where = "" if train_level == "-" else f" @ {train_level}"
        panel = {"title": _series_label(model, variant) + where, "lines": {}, "initial": {}}
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
    _legend(fig, axes)
    fig.suptitle(drawn["title"], fontsize=11, y=1 - 0.15 / fig.get_figheight())
    return fig, drawn


_LAYER_COLORS = ("#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02")


def training_figure(data: RunData, task: str, style: _Style):
    """Loss and train accuracy against step: a pair of panels per (variant, training level)."""
    hist = data.history[data.history["task"] == task]
    rank = _train_level_rank(data, task)
    groups = sorted(hist.groupby(["variant", "train_level"]),
                    key=lambda kv: (_variants(hist).index(kv[0][0]), rank[kv[0][1]]))
    ncols = 2 * min(len(groups), 3)
    fig, axes = _new_figure(2 * len(groups), ncols=ncols, panel_size=(3.4, 2.6))
    drawn = {"title": f"{task}: training curves", "panels": []}
    for k, ((variant, train_level), g) in enumerate(groups):
        for m, metric in enumerate(("loss", "train_acc")):
            ax = axes[2 * k + m]
            prefix = "" if variant == "standard" else f"[{variant}] "
            panel = {"title": f"{prefix}trained at {train_level}", "metric": metric, "lines": {}}
            for model in _models(g):
                for j, (seed, sg) in enumerate(sorted(g[g["model"] == model].groupby("seed"))):
                    sg = sg.sort_values("step")
                    label = _series_label(model, variant)
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
    _legend(fig, axes)
    fig.suptitle(drawn["title"], fontsize=11, y=1 - 0.15 / fig.get_figheight())
    return fig, drawn


def reliance_figure(reliance: pd.DataFrame, style: _Style):
    """Accuracy drop when the memory path is switched off, per task (panel), level and gated model."""
    tasks = _ordered(reliance["task"], TASK_ORDER)
    fig, axes = _new_figure(len(tasks), panel_size=(4.6, 3.0))
    drawn = {"title": "memory reliance: accuracy - accuracy with memory off", "panels": []}
    for ax, task in zip(axes, tasks):
        r = reliance[reliance["task"] == task]
        levels = sorted(dict.fromkeys(r["level"]), key=_level_sort_key)
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
    _legend(fig, axes)
    fig.suptitle(drawn["title"], fontsize=11, y=1 - 0.15 / fig.get_figheight())
    return fig, drawn


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


# Tables

def _fmt_pct(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def _fmt_ci(mean, low, high) -> str:
    if low == high:
        return _fmt_pct(mean)
    return f"{_fmt_pct(mean)} [{100 * low:.1f}, {100 * high:.1f}]"


def _fmt_points(mean, low, high) -> str:
    def points(x):
        return f"{round(100 * x, 1) + 0.0:+.1f}"  # + 0.0 turns -0.0 into 0.0

    return points(mean) if low == high else f"{points(mean)} [{points(low)}, {points(high)}]"


def _summary_selection(table: pd.DataFrame) -> pd.DataFrame:
    """Per (task, variant, model): the trained-at rows when models were trained at several
    levels (the full grid stays in results.csv and the figures), else every evaluated level."""
    parts = []
    for _, g in table.groupby(["task", "variant", "model"], sort=False):
        parts.append(g[g["trained_at_level"]] if g["train_level"].nunique() > 1 else g)
    return pd.concat(parts) if parts else table


def summary_frame(data: RunData) -> pd.DataFrame:
    """Per task, variant, model, training level and evaluation level: mean accuracy with its
    95% interval over seeds, memory-off accuracy, chance, ceiling, cost and probe verdict."""
    table = data.table
    if table.empty:
        return pd.DataFrame()
    leaking = data.leaking
    out = []
    for task in _tasks(data):
        t = _summary_selection(table[table["task"] == task])
        axes = data.axes.get(task, ())
        for (variant, model, train_level, level), g in t.groupby(["variant", "model", "train_level", "level"]):
            mean, low, high = bootstrap_ci(_per_seed(g))
            off = g.dropna(subset=["accuracy_memory_off"])
            reliance = bootstrap_ci(_per_seed(off.assign(d=off["accuracy"] - off["accuracy_memory_off"]), "d")) \
                if not off.empty else (math.nan,) * 3
            probes = sorted(set(g["causality"].dropna()))
            out.append({
                "task": task, "variant": variant, "model": model, "series": _series_label(model, variant),
                "trained at": train_level, "level": level, "seeds": int(g["seed"].nunique()),
                "accuracy": mean, "low": low, "high": high,
                "memory off": float(off["accuracy_memory_off"].mean()) if not off.empty else math.nan,
                "drop": reliance[0], "drop low": reliance[1], "drop high": reliance[2],
                "chance": float(g["chance"].mean()), "ceiling": float(g["ceiling"].mean()),
                "params": int(g["n_params"].iloc[0]) if g["n_params"].notna().any() else None,
                "wall s": float(g.drop_duplicates("cell_id")["wall_time_s"].mean()),
                "steps/s": float(g.drop_duplicates("cell_id")["loop_steps_per_s"].mean()),
                "probe": "leaking" if model in leaking else ",".join(probes) or "-",
                "_sort": (_variants(table).index(variant), _models(table).index(model),
                          tuple(g[f"train_{a}"].iloc[0] for a in axes), tuple(g[a].iloc[0] for a in axes)),
            })
    out.sort(key=lambda r: (_tasks(data).index(r["task"]), r["_sort"]))
    return pd.DataFrame(out).drop(columns="_sort")


def _md_table(header: list[str], body: list[list]) -> str:
    def cell(v):
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in body]
    return "\n".join(lines)


_SUMMARY_COLUMNS = ("variant", "model", "trained at", "level", "seeds", "accuracy [95% CI]", "memory off", "chance",
                    "ceiling", "params", "wall s", "steps/s", "probe")


def _summary_cells(r) -> list[str]:
    return [
        r["variant"], r["model"], r["trained at"], r["level"], str(r["seeds"]),
        _fmt_ci(r["accuracy"], r["low"], r["high"]), _fmt_pct(r["memory off"]), _fmt_pct(r["chance"]),
        _fmt_pct(r["ceiling"]), "-" if pd.isna(r["params"]) else f"{int(r['params']):,}",
        f"{r['wall s']:.0f}", f"{r['steps/s']:.3g}", r["probe"],
    ]


def summary_markdown(summary: pd.DataFrame) -> str:
    parts = []
    for task, g in summary.groupby("task", sort=False):
        body = [_summary_cells(r) for _, r in g.iterrows()]
        parts.append(f"**{task}**\n\n" + _md_table(list(_SUMMARY_COLUMNS), body))
    return "\n\n".join(parts)


def _level_values(key: str) -> list[str]:
    """'n_writes=20,noise=0.05' -> ['20', '0.05'] (the axis names go into the column headers)."""
    return [] if key == "-" else [part.partition("=")[2] for part in key.split(",")]


def _level_sort_key(key: str) -> tuple:
    values = []
    for v in _level_values(key):
        try:
            values.append((0, float(v), ""))
        except ValueError:
            values.append((1, 0.0, v))
    return tuple(values)


def summary_rich(data: RunData):
    """The console summary: one compact rich table per task and variant."""
    from rich import box
    from rich.console import Group
    from rich.markup import escape
    from rich.table import Table

    summary = summary_frame(data)
    if summary.empty:
        return Table(title="tmem-bench: no cell results")
    tables = []
    for (task, variant), g in summary.groupby(["task", "variant"], sort=False):
        axes = list(data.axes.get(task, ()))
        show_trained = any(r["trained at"] != r["level"] for _, r in g.iterrows())
        gated = g["memory off"].notna().any()
        title = escape(f"{_task_label(task, variant)}: accuracy, mean over seeds [95% CI]")  # [..] is rich markup
        table = Table(title=title, box=box.SIMPLE_HEAD,
                      title_justify="left", pad_edge=False)
        # Narrow consoles fold the minor columns; the model and its accuracy keep their width.
        table.add_column("model", min_width=min(max(map(len, g["model"])), 16))
        if show_trained:
            table.add_column("trained", overflow="fold")
        for axis in axes:
            table.add_column(axis, justify="right", overflow="fold")
        accuracy_width = max(len(_fmt_ci(r["accuracy"], r["low"], r["high"])) for _, r in g.iterrows())
        for name in ("seeds", "accuracy", *(["mem off"] if gated else []), "chance", "ceiling", "params", "wall s",
                     "steps/s", "probe"):
            table.add_column(name, justify="left" if name == "probe" else "right", overflow="fold",
                             min_width=accuracy_width if name == "accuracy" else None)
        for _, r in g.iterrows():
            cells = [r["model"]]
            if show_trained:
                cells.append(",".join(_level_values(r["trained at"])) or "-")
            cells += _level_values(r["level"])
            cells += [str(r["seeds"]), _fmt_ci(r["accuracy"], r["low"], r["high"])]
            if gated:
                cells.append(_fmt_pct(r["memory off"]))
            cells += [_fmt_pct(r["chance"]), _fmt_pct(r["ceiling"]),
                      "-" if pd.isna(r["params"]) else f"{r['params'] / 1000:.0f}k", f"{r['wall s']:.0f}",
                      f"{r['steps/s']:.3g}", r["probe"]]
            table.add_row(*map(escape, cells))
        tables.append(table)
    return Group(*tables)


def summary_table(results: list[dict]):
    """Console summary for a list of cell results (as returned by the runner)."""
    return summary_rich(run_data(results))


def reliance_frame(summary: pd.DataFrame) -> pd.DataFrame:
    return summary[summary["memory off"].notna()].reset_index(drop=True) if not summary.empty else summary


def final_gate_table(data: RunData) -> tuple[list[str], list[list[str]]]:
    """Rows: gated model and layer; columns: initial value, then each task (and variant)."""
    final = data.gates
    if final.empty:
        return [], []
    last = final.sort_values("step").groupby(["cell_id", "layer"]).tail(1)
    init = final[final["step"] == 0]
    columns = []
    for task in _ordered(final["task"], TASK_ORDER):
        for variant in _variants(final[final["task"] == task]):
            columns.append((task, variant))
    header = ["model", "layer", "initial"] + [_task_label(t, v) for t, v in columns]
    body = []
    for model in _models(final):
        for layer in sorted(final[final["model"] == model]["layer"].unique(), key=_natural):
            sel = (last["model"] == model) & (last["layer"] == layer)
            row = [model, layer, f"{init[(init['model'] == model) & (init['layer'] == layer)]['gate'].mean():.3f}"]
            for task, variant in columns:
                v = last[sel & (last["task"] == task) & (last["variant"] == variant)]["gate"]
                if v.empty:
                    row.append("-")
                elif len(v) == 1:
                    row.append(f"{v.iloc[0]:.3f}")
                elif v.min() == v.max():
                    row.append(f"{v.mean():.3f} ({len(v)} cells)")
                else:
                    row.append(f"{v.mean():.3f} ({v.min():.3f}-{v.max():.3f}, {len(v)} cells)")
            body.append(row)
    return header, body


# The no-harm verdict

def no_harm_verdict(accuracy: float, base_accuracy: float | None, gate: float, gate_init: float) -> dict:
    """Pass when accuracy is within NO_HARM_ACC_TOL of base and the mean gate within
    NO_HARM_GATE_TOL of its initial value (both inclusive)."""
    gate_delta = gate - gate_init
    gate_ok = abs(gate_delta) <= NO_HARM_GATE_TOL + _EPS
    if base_accuracy is None:
        return {"verdict": INCONCLUSIVE, "accuracy": accuracy, "base": None, "accuracy_delta": None,
                "gate": gate, "gate_init": gate_init, "gate_delta": gate_delta,
                "reason": "no base cells on this task to compare with"}
    acc_delta = accuracy - base_accuracy
    acc_ok = abs(acc_delta) <= NO_HARM_ACC_TOL + _EPS
    reasons = [
        f"accuracy {_fmt_pct(accuracy)} vs base {_fmt_pct(base_accuracy)}: {100 * acc_delta:+.2f} points "
        f"({'within' if acc_ok else 'outside'} {100 * NO_HARM_ACC_TOL:g})",
        f"mean gate {gate:.3f} vs initial {gate_init:.3f}: {gate_delta:+.3f} "
        f"({'within' if gate_ok else 'outside'} {NO_HARM_GATE_TOL:g})",
    ]
    return {"verdict": "pass" if acc_ok and gate_ok else "fail", "accuracy": accuracy, "base": base_accuracy,
            "accuracy_delta": acc_delta, "gate": gate, "gate_init": gate_init, "gate_delta": gate_delta,
            "reason": "; ".join(reasons)}


def no_harm_verdicts(data: RunData) -> list[dict]:
    """One verdict per gated model and variant of the no-harm task."""
    t = data.table[data.table["task"] == NO_HARM_TASK] if not data.table.empty else data.table
    out = []
    if t.empty:
        return out
    for variant in _variants(t):
        v = t[t["variant"] == variant]
        base = v[v["model"] == "base"]
        base_acc = float(base["accuracy"].mean()) if not base.empty else None
        for model in _models(v):
            g = v[(v["model"] == model) & v["gate_init_mean"].notna()]
            if g.empty:
                continue
            cells = g.drop_duplicates("cell_id")
            verdict = no_harm_verdict(float(g["accuracy"].mean()), base_acc, float(cells["gate_final_mean"].mean()),
                                      float(cells["gate_init_mean"].mean()))
            out.append({"variant": variant, "model": model, "seeds": int(g["seed"].nunique()), **verdict})
    return out


# The paper's claims

@dataclass
class Claim:
    name: str
    statement: str  # the claim as PAPER.md states it
    paper: str  # the paper's numbers
    rule: str  # the decision rule applied here
    verdict: str = INCONCLUSIVE
    reason: str = ""
    evidence: list[dict] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def compare(a, b, margin: float = CLAIM_MARGIN) -> dict:
    """Does A beat B by more than `margin`? From the 95% bootstrap interval of mean(A) - mean(B):
    supported when the whole interval lies above the margin, not supported when it lies below,
    inconclusive when it straddles it. With one seed per side the interval is a point."""
    diff, low, high = bootstrap_diff_ci(a, b)
    if low > margin:
        verdict = SUPPORTED
    elif high < margin:
        verdict = REFUTED
    else:
        verdict = INCONCLUSIVE
    return {"diff": diff, "low": low, "high": high, "verdict": verdict}


def combine(verdicts: list[str]) -> str:
    """All supported -> supported; any not supported -> not supported; else inconclusive."""
    if verdicts and all(v == SUPPORTED for v in verdicts):
        return SUPPORTED
    if any(v == REFUTED for v in verdicts):
        return REFUTED
    return INCONCLUSIVE


def _claim_rows(data: RunData, task: str, variant: str, x_axis: str, panel: dict, models: list[str]):
    """The rows a claim reads: the per-level training view when the memory model was trained at
    two or more levels of the sweep axis, else the generalisation view of its training level."""
    t = data.table[(data.table["task"] == task) & (data.table["variant"] == variant)
                   & data.table["model"].isin(models)]
    trained = _in_panel(t[t["trained_at_level"]], panel)
    memory = trained[trained["model"] == MEMORY_MODEL]
    if memory[x_axis].nunique() >= 2:
        return trained, "trained at each level"
    rows_ = _in_panel(t, panel)
    matching = _in_panel(rows_, {f"train_{a}": v for a, v in panel.items()})
    rows_ = matching if not matching.empty else rows_
    levels = ", ".join(sorted(set(rows_[rows_["model"] == MEMORY_MODEL]["train_level"])))
    return rows_, f"generalisation view: trained at {levels}, evaluated at every level"


def _missing_models(data: RunData, task: str) -> str | None:
    t = data.table[data.table["task"] == task] if not data.table.empty else data.table
    if t.empty:
        return f"this run has no {task} results"
    if MEMORY_MODEL not in set(t["model"]):
        return f"this run has no '{MEMORY_MODEL}' model on {task}"
    if not set(TOY_BASELINES) & set(t["model"]):
        return f"this run has none of the attention baselines {', '.join(TOY_BASELINES)} on {task}"
    return None


def _leak_note(data: RunData, models) -> str | None:
    leaks = {m: w for m, w in data.leaking.items() if m in models}
    if not leaks:
        return None
    return "the causality probe found a leak in " + "; ".join(f"{m} ({', '.join(w)})" for m, w in leaks.items())


def _nothing_learned(*groups: pd.DataFrame) -> str | None:
    """A reason to withhold a verdict when no compared model is CLAIM_MARGIN above chance:
    models that learned nothing cannot show that one of them holds up better."""
    best = max(float(g["accuracy"].mean()) for g in groups)
    chance = float(pd.concat(groups)["chance"].mean())
    if best > chance + CLAIM_MARGIN:
        return None
    return f"nothing learned: best accuracy {_fmt_pct(best)} is within {100 * CLAIM_MARGIN:g} points of chance"


_LEARNED_RULE = (f" No verdict (inconclusive) where no compared model is more than {100 * CLAIM_MARGIN:g} points "
                 f"above chance (nothing was learned).")


def _memory_vs_baselines(claim: Claim, data: RunData, task: str) -> None:
    """Fill a claim 'the memory model clearly beats the attention baselines at the largest level'."""
    reason = _missing_models(data, task)
    if reason:
        claim.verdict, claim.reason = INCONCLUSIVE, reason
        return
    x_axis = sweep_axis(data, task)
    models = [MEMORY_MODEL, *TOY_BASELINES]
    per_variant = {}
    for variant in _variants(data.table[data.table["task"] == task]):
        verdicts = []
        for panel in _panels(data, task, x_axis):
            rows_, view = _claim_rows(data, task, variant, x_axis, panel, models)
            memory = rows_[rows_["model"] == MEMORY_MODEL]
            baselines = rows_[rows_["model"].isin(TOY_BASELINES)]
            common = sorted(set(memory[x_axis]) & set(baselines[x_axis]))
            if not common:
                continue
            x = common[-1]
            mem_x, base_x = memory[memory[x_axis] == x], baselines[baselines[x_axis] == x]
            best = max(_models(base_x), key=lambda m: base_x[base_x["model"] == m]["accuracy"].mean())
            best_x = base_x[base_x["model"] == best]
            cmp = compare(_per_seed(mem_x), _per_seed(best_x))
            withheld = _leak_note(data, [MEMORY_MODEL, best]) or _nothing_learned(mem_x, best_x)
            verdict = INCONCLUSIVE if withheld else cmp["verdict"]
            verdicts.append(verdict)
            off = mem_x.dropna(subset=["accuracy_memory_off"])
            claim.evidence.append({
                "variant": variant, "level": ", ".join([f"{a}={v}" for a, v in panel.items()] + [f"{x_axis}={x}"]),
                "view": view, "seeds": int(mem_x["seed"].nunique()),
                MEMORY_MODEL: _fmt_ci(*bootstrap_ci(_per_seed(mem_x))),
                "best baseline": f"{best} {_fmt_ci(*bootstrap_ci(_per_seed(best_x)))}",
                "lead (points)": _fmt_points(cmp["diff"], cmp["low"], cmp["high"]),
                f"{MEMORY_MODEL} memory off": _fmt_pct(off["accuracy_memory_off"].mean()) if not off.empty else "-",
                "chance": _fmt_pct(mem_x["chance"].mean()), "ceiling": _fmt_pct(mem_x["ceiling"].mean()),
                "verdict": verdict + (f" ({withheld})" if withheld else ""),
            })
        if verdicts:
            per_variant[variant] = combine(verdicts)
    _headline(claim, per_variant)


def _paper_setting(variant: str) -> bool:
    """Whether a variant keeps the paper's information flow (it may still differ in size, e.g. fewer frames)."""
    return "block_queries=True" not in variant.split(",")


def _headline(claim: Claim, per_variant: dict[str, str]) -> None:
    """The verdict comes from the variants in the paper's setting; memory-forcing variants are reported beside it."""
    paper = [v for v in per_variant if _paper_setting(v)]
    for variant, verdict in per_variant.items():
        if variant not in paper:
            claim.notes.append(f"under the variant {variant} (not in the paper) the same rule gives: {verdict}")
        elif variant != "standard":
            claim.notes.append(f"the paper's setting was run as the variant {variant}")
    if paper:
        claim.verdict = combine([per_variant[v] for v in paper])
        rows_ = [e for e in claim.evidence if e.get("variant") in paper]
        claim.reason = "; ".join(f"{e.get('level') or e.get('levels')}: {e['verdict']}" for e in rows_)
    else:
        claim.verdict = INCONCLUSIVE
        claim.reason = ("no cells in the paper's setting with both the memory model and a baseline"
                        if not per_variant else "this run has only memory-forcing variants, not the paper's setting")


def claim_coordinate_binding(data: RunData) -> Claim:
    claim = Claim(
        "coordinate binding: memory holds as writes grow",
        "Tensor Memory keeps 75-91% accuracy as the number of writes grows; attention baselines fall to 7-14% "
        "(chance 1/32, about 3%).",
        "tensor 75-91%, attention baselines 7-14%, chance 3.1%",
        f"at the largest number of writes (per query-noise level), the 95% interval of tensor minus the best of "
        f"{', '.join(TOY_BASELINES)} lies above {100 * CLAIM_MARGIN:g} points -> supported; below -> not supported; "
        f"straddling -> inconclusive. All noise levels supported -> supported; any not supported -> not supported."
        + _LEARNED_RULE,
    )
    _memory_vs_baselines(claim, data, "coordinate_binding")
    return claim


def claim_map_building(data: RunData) -> Claim:
    claim = Claim(
        "map building: memory wins at long horizons",
        "Tensor Memory clearly beats the baselines at long horizons.",
        "a clear win (no numbers given in PAPER.md)",
        f"at the largest horizon, the 95% interval of tensor minus the best of {', '.join(TOY_BASELINES)} lies "
        f"above {100 * CLAIM_MARGIN:g} points -> supported; below -> not supported; straddling -> inconclusive."
        + _LEARNED_RULE,
    )
    _memory_vs_baselines(claim, data, "map_building")
    return claim


def _drops(rows_: pd.DataFrame, model: str, x_axis: str, x_lo, x_hi) -> np.ndarray:
    """Per seed: accuracy at x_lo minus accuracy at x_hi."""
    m = rows_[rows_["model"] == model]
    lo = m[m[x_axis] == x_lo].groupby("seed")["accuracy"].mean()
    hi = m[m[x_axis] == x_hi].groupby("seed")["accuracy"].mean()
    both = lo.index.intersection(hi.index)
    return (lo[both] - hi[both]).to_numpy(dtype=float)


def claim_occlusion(data: RunData) -> Claim:
    claim = Claim(
        "occlusion: belief about the hidden ball",
        "The persistent state keeps a belief about the hidden ball, so accuracy should hold up better as L grows.",
        "a qualitative claim (no numbers given in PAPER.md)",
        f"drop = accuracy at the shortest occlusion minus accuracy at the longest, per seed. The 95% interval of "
        f"(smallest baseline drop among {', '.join(TOY_BASELINES)}) minus (tensor drop) lies above "
        f"{100 * CLAIM_MARGIN:g} points -> supported; below -> not supported; straddling -> inconclusive."
        + _LEARNED_RULE,
    )
    task = "occlusion"
    reason = _missing_models(data, task)
    if reason:
        claim.reason = reason
        return claim
    x_axis = sweep_axis(data, task)
    per_variant = {}
    for variant in _variants(data.table[data.table["task"] == task]):
        rows_, view = _claim_rows(data, task, variant, x_axis, {}, [MEMORY_MODEL, *TOY_BASELINES])
        xs = sorted(set(rows_[rows_["model"] == MEMORY_MODEL][x_axis]))
        if len(xs) < 2:
            continue
        x_lo, x_hi = xs[0], xs[-1]
        mem = _drops(rows_, MEMORY_MODEL, x_axis, x_lo, x_hi)
        base_drops = {m: d for m in _models(rows_) if m in TOY_BASELINES
                      and (d := _drops(rows_, m, x_axis, x_lo, x_hi)).size}
        if not mem.size or not base_drops:
            continue
        best = min(base_drops, key=lambda m: base_drops[m].mean())
        cmp = compare(base_drops[best], mem)
        at_lo = rows_[rows_[x_axis] == x_lo]
        withheld = _leak_note(data, [MEMORY_MODEL, best]) or _nothing_learned(
            at_lo[at_lo["model"] == MEMORY_MODEL], at_lo[at_lo["model"] == best])
        verdict = INCONCLUSIVE if withheld else cmp["verdict"]
        per_variant[variant] = verdict
        mem_hi = rows_[(rows_["model"] == MEMORY_MODEL) & (rows_[x_axis] == x_hi)].dropna(
            subset=["accuracy_memory_off"])
        claim.evidence.append({
            "variant": variant, "levels": f"{x_axis} {x_lo} -> {x_hi}", "view": view, "seeds": int(mem.size),
            f"{MEMORY_MODEL} drop (points)": _fmt_points(*bootstrap_ci(mem)),
            "least-dropping baseline": f"{best} {_fmt_points(*bootstrap_ci(base_drops[best]))}",
            "advantage (points)": _fmt_points(cmp["diff"], cmp["low"], cmp["high"]),
            f"{MEMORY_MODEL} memory off at {x_axis}={x_hi}":
                f"{_fmt_pct(mem_hi['accuracy_memory_off'].mean())} (on {_fmt_pct(mem_hi['accuracy'].mean())})"
                if not mem_hi.empty else "-",
            "verdict": verdict + (f" ({withheld})" if withheld else ""),
        })
    _headline(claim, per_variant)
    return claim


def claim_no_harm(data: RunData) -> Claim:
    claim = Claim(
        "no-harm control",
        "Every model reaches 100%; the learned gate sigmoid(gamma) stays near its initial value.",
        "100% for every model; gate near its initial value",
        f"every model: the 95% interval of its accuracy lies at or above ceiling - {100 * NO_HARM_ACC_TOL:g} points "
        f"-> reaches; entirely below -> does not; else inconclusive. Every gated model: mean final gate within "
        f"{NO_HARM_GATE_TOL:g} of its initial value -> stays, else not. All parts supported -> supported; any not "
        f"supported -> not supported.",
    )
    t = data.table[data.table["task"] == NO_HARM_TASK] if not data.table.empty else data.table
    if t.empty:
        claim.reason = f"this run has no {NO_HARM_TASK} results"
        return claim
    t = t[t["variant"] == "standard"] if "standard" in set(t["variant"]) else t
    verdicts = []
    for model in _models(t):
        g = t[t["model"] == model]
        mean, low, high = bootstrap_ci(_per_seed(g))
        target = float(g["ceiling"].mean()) - NO_HARM_ACC_TOL
        reach = SUPPORTED if low >= target - _EPS else REFUTED if high < target - _EPS else INCONCLUSIVE
        cells = g.drop_duplicates("cell_id")
        gated = cells["gate_init_mean"].notna().any()
        gate_text, gate_verdict = "-", None
        if gated:
            init, final = float(cells["gate_init_mean"].mean()), float(cells["gate_final_mean"].mean())
            gate_verdict = SUPPORTED if abs(final - init) <= NO_HARM_GATE_TOL + _EPS else REFUTED
            gate_text = f"{init:.3f} -> {final:.3f} ({final - init:+.3f})"
        leak = _leak_note(data, [model])
        parts = [reach] + ([gate_verdict] if gate_verdict else [])
        verdict = INCONCLUSIVE if leak else combine(parts)
        verdicts.append(verdict)
        off = g.dropna(subset=["accuracy_memory_off"])
        claim.evidence.append({
            "model": model, "seeds": int(g["seed"].nunique()), "accuracy": _fmt_ci(mean, low, high),
            "ceiling": _fmt_pct(g["ceiling"].mean()), "reaches": reach, "gate initial -> final": gate_text,
            "memory off": _fmt_pct(off["accuracy_memory_off"].mean()) if not off.empty else "-",
            "verdict": verdict + (f" ({leak})" if leak else ""),
        })
    if not t["gate_init_mean"].notna().any():
        claim.verdict = INCONCLUSIVE
        claim.reason = "no gated model in this run, so the gate part cannot be checked"
    else:
        claim.verdict = combine(verdicts)
        claim.reason = "; ".join(f"{e['model']}: {e['verdict']}" for e in claim.evidence)
    claim.notes += _gate_context(data)
    return claim


def _gate_context(data: RunData) -> list[str]:
    """A gate that also stays at its initial value where memory is needed says little about no harm."""
    notes = []
    cells = data.table.drop_duplicates("cell_id") if not data.table.empty else data.table
    gated = cells[cells["gate_init_mean"].notna()] if not cells.empty else cells
    for (task, variant, model), g in gated.groupby(["task", "variant", "model"]):
        if task == NO_HARM_TASK:
            continue
        moved = float((g["gate_final_mean"] - g["gate_init_mean"]).mean())
        within = abs(moved) <= NO_HARM_GATE_TOL + _EPS
        notes.append(f"{model} on {_task_label(task, variant)}: mean gate moved {moved:+.3f} from its initial value "
                     f"({'also within' if within else 'beyond'} {NO_HARM_GATE_TOL:g})")
    return notes


def claim_saturation(data: RunData) -> Claim:
    claim = Claim(
        "caveat: a fixed-size state saturates",
        "A fixed-size state can saturate when a task needs many distinct details.",
        "a qualitative caveat (no numbers given in PAPER.md)",
        f"coordinate binding, per query-noise level: the 95% interval of tensor accuracy at the fewest writes minus "
        f"at the most writes lies above {100 * CLAIM_MARGIN:g} points -> supported (it saturates within this sweep); "
        f"below -> not supported; straddling -> inconclusive." + _LEARNED_RULE,
    )
    task = "coordinate_binding"
    t = data.table[data.table["task"] == task] if not data.table.empty else data.table
    if t.empty or MEMORY_MODEL not in set(t["model"]):
        claim.reason = f"this run has no '{MEMORY_MODEL}' results on {task}"
        return claim
    x_axis = sweep_axis(data, task)
    per_variant = {}
    for variant in _variants(t):
        verdicts = []
        for panel in _panels(data, task, x_axis):
            rows_, view = _claim_rows(data, task, variant, x_axis, panel, [MEMORY_MODEL])
            xs = sorted(set(rows_[x_axis]))
            if len(xs) < 2:
                continue
            lo, hi = rows_[rows_[x_axis] == xs[0]], rows_[rows_[x_axis] == xs[-1]]
            cmp = compare(_per_seed(lo), _per_seed(hi))
            why = _nothing_learned(lo)
            verdict = INCONCLUSIVE if why else cmp["verdict"]
            verdicts.append(verdict)
            claim.evidence.append({
                "variant": variant, "level": _level_key(panel), "view": view,
                f"fewest {x_axis}": f"{xs[0]}: {_fmt_ci(*bootstrap_ci(_per_seed(lo)))}",
                f"most {x_axis}": f"{xs[-1]}: {_fmt_ci(*bootstrap_ci(_per_seed(hi)))}",
                "drop (points)": _fmt_points(cmp["diff"], cmp["low"], cmp["high"]),
                "verdict": verdict + (f" ({why})" if why else ""),
            })
        if verdicts:
            per_variant[variant] = combine(verdicts)
    _headline(claim, per_variant)
    return claim


def claim_throughput(data: RunData) -> Claim:
    claim = Claim(
        "caveat: dense voxel updates limit throughput",
        "Dense voxel updates limit throughput: training is much slower in wall-clock time.",
        "much slower (PAPER.md measured the reference about 70x slower than base on CPU)",
        f"per task, ratio = mean base training-loop steps/s / mean tensor steps/s over its cells; the median "
        f"ratio over tasks >= {SLOWER_SUPPORTED:g} -> supported, < {SLOWER_REFUTED:g} -> not supported, else inconclusive. Timings "
        f"from a shared machine are noisy; a task whose cells ran on different devices is left out.",
    )
    if data.table.empty:
        claim.reason = "no results"
        return claim
    cells = data.table.drop_duplicates("cell_id")
    ratios = []
    for task in _tasks(data):
        c = cells[cells["task"] == task]
        base, mem = c[c["model"] == "base"], c[c["model"] == MEMORY_MODEL]
        if base.empty or mem.empty:
            continue
        devices = set(base["device"]) | set(mem["device"])
        if len(devices) > 1:
            claim.notes.append(f"{task} left out: its cells ran on different devices ({', '.join(sorted(devices))})")
            continue
        ratio = float(base["loop_steps_per_s"].mean() / mem["loop_steps_per_s"].mean())
        ratios.append(ratio)
        claim.evidence.append({
            "task": task, "base steps/s": f"{base['loop_steps_per_s'].mean():.2f}",
            f"{MEMORY_MODEL} steps/s": f"{mem['loop_steps_per_s'].mean():.2f}", "slowdown": f"{ratio:.1f}x",
            "device": ", ".join(sorted(map(str, devices))),
        })
    if not ratios:
        claim.reason = f"this run has no task with both base and {MEMORY_MODEL}"
        return claim
    median = float(np.median(ratios))
    claim.verdict = SUPPORTED if median >= SLOWER_SUPPORTED else REFUTED if median < SLOWER_REFUTED else INCONCLUSIVE
    claim.reason = f"median slowdown {median:.1f}x over {len(ratios)} task(s)"
    return claim


def check_claims(data: RunData) -> list[Claim]:
    return [claim_coordinate_binding(data), claim_no_harm(data), claim_map_building(data), claim_occlusion(data),
            claim_saturation(data), claim_throughput(data)]


# The report

@dataclass
class Report:
    path: Path
    figures: dict[str, dict]  # stem -> the data drawn in that figure
    claims: list[Claim]
    no_harm: list[dict]
    summary: pd.DataFrame
    problems: list[str]
    data: RunData


def build_figures(data: RunData, figures_dir: Path) -> dict[str, dict]:
    """Write every figure; return stem -> the data drawn."""
    style, drawn = _Style(data.table), {}

    def emit(stem, fig_and_data):
        fig, d = fig_and_data
        save_figure(fig, figures_dir, stem)
        drawn[stem] = d

    for task in _tasks(data):
        x_axis = sweep_axis(data, task)
        if x_axis is None:
            continue
        panels = _panels(data, task, x_axis)
        titles = [_level_key(p) if p else "" for p in panels]  # one-axis tasks: the figure title says it all
        trained = [{"title": title, "curves": curve_data(training_view(data, task, p), x_axis)}
                   for title, p in zip(titles, panels)]
        if any(len(s["x"]) >= 2 for p in trained for s in p["curves"]["series"].values()):
            emit(f"accuracy_{_slug(task)}_trained", accuracy_figure(
                trained, x_axis, f"{task}: accuracy vs {x_axis}, each model trained at each level", style))
        t = data.table[data.table["task"] == task]
        for trained_x in sorted(t[f"train_{x_axis}"].unique()):
            gen = []
            for title, p in zip(titles, panels):
                rows_ = generalisation_view(data, task, x_axis, trained_x, p)
                by_level = rows_["train_level"].nunique() > 1
                gen.append({"title": title, "curves": curve_data(rows_, x_axis, label_by_train_level=by_level)})
            if not any(len(s["x"]) >= 2 for p in gen for s in p["curves"]["series"].values()):
                continue  # evaluated only where trained: the training view already shows it
            emit(f"accuracy_{_slug(task)}_from_{_slug(x_axis)}{trained_x}", accuracy_figure(
                gen, x_axis, f"{task}: trained at {x_axis}={trained_x}, evaluated at every level", style,
                trained_x=trained_x))
    for task in _tasks(data):
        if not data.gates.empty and task in set(data.gates["task"]):
            emit(f"gates_{_slug(task)}", gate_figure(data, task))
    for task in _tasks(data):
        if not data.history.empty and task in set(data.history["task"]):
            emit(f"training_{_slug(task)}", training_figure(data, task, style))
    reliance = reliance_frame(summary_frame(data))
    if not reliance.empty:
        emit("memory_reliance", reliance_figure(reliance, style))
    for path in figures_dir.glob("*") if figures_dir.is_dir() else []:
        # Figures of an earlier report that this one no longer draws would contradict report.md.
        if path.suffix in (".png", ".svg") and path.stem not in drawn and path.name.startswith(_FIGURE_PREFIXES):
            path.unlink()
    return drawn


_FIGURE_PREFIXES = ("accuracy_", "gates_", "training_", "memory_reliance")


def write_report(run_dir) -> Report:
    """Regenerate report.md and figures/ of a run from its stored cell results."""
    data = load_run(run_dir)
    run_dir = data.run_dir
    figures_dir = run_dir / "figures"
    figures = build_figures(data, figures_dir)
    summary = summary_frame(data)
    claims = check_claims(data)
    no_harm = no_harm_verdicts(data)
    text = render_markdown(data, figures, summary, claims, no_harm)
    path = run_dir / "report.md"
    from .results import write_atomic

    write_atomic(path, text)
    return Report(path, figures, claims, no_harm, summary, data.problems, data)


def _figure_md(stem: str, caption: str) -> str:
    return f"![{caption}](figures/{stem}.png)\n\n[SVG](figures/{stem}.svg)"


def render_markdown(data: RunData, figures: dict, summary: pd.DataFrame, claims: list[Claim],
                    no_harm: list[dict]) -> str:
    m = data.manifest or {}
    out = [f"# tmem-bench report: {data.run_dir.name}", ""]
    facts = [
        ("run directory", str(data.run_dir)),
        ("command", " ".join(m["command"]) if isinstance(m.get("command"), list) else "-"),
        ("started", m.get("started", "-")), ("device", m.get("device", "-")),
        ("tmem-bench / torch", f"{m.get('tmem_bench_version', '-')} / {m.get('torch_version', '-')}"),
        ("cells", f"{data.n_cells} readable" + (f" of {len(m['cells'])} planned" if m.get("cells") else "")),
    ]
    if not data.table.empty:
        cells = data.table.drop_duplicates("cell_id")
        facts.append(("tasks", ", ".join(_task_label(t, v) for t in _tasks(data)
                                         for v in _variants(cells[cells["task"] == t]))))
        facts.append(("models", ", ".join(_models(cells))))
        facts.append(("seeds", ", ".join(map(str, sorted(cells["seed"].unique())))))
        facts.append(("training steps", ", ".join(map(str, sorted(cells["steps"].unique())))))
    out += [f"- {k}: {v}" for k, v in facts]

    if data.problems:
        out += ["", "## Problems", "", "Left out of every table and figure below:", ""]
        out += [f"- {p}" for p in data.problems]

    if data.table.empty:
        out += ["", "No readable cell results: nothing to report yet."]
        return "\n".join(out) + "\n"

    max_seeds = int(data.table.groupby(["task", "variant", "model", "train_level", "level"])["seed"].nunique().max())
    out += ["", "## How to read this report", "",
            f"Accuracy is measured on each level's fixed evaluation set. Means are over seeds; intervals are 95% "
            f"percentile-bootstrap intervals of the mean over seeds ({N_BOOT:,} resamples, seeded, so the report is "
            f"reproducible). Chance (best constant predictor) and ceiling (best accuracy the information in the "
            f"evaluation set allows) are drawn as dashed and dotted lines.",
            ""]
    if max_seeds == 1:
        out.append("**This run has one seed per cell, so every interval collapses to its mean: the bands and "
                   "intervals show no seed-to-seed uncertainty, and claim verdicts rest on the margin alone.**")
    else:
        out.append(f"Cell groups have up to {max_seeds} seeds; a group with one seed has a zero-width interval.")
    leaking = data.leaking
    if leaking:
        out += ["", "**Causality probe: " + "; ".join(
            f"'{m}' leaks the future (detected in {', '.join(w)}); every row of it is marked 'leaking', and its "
            f"accuracies on tasks that score every position are not to be trusted" for m, w in leaking.items()) + ".**"]

    out += ["", "## The paper's claims", "",
            "Each toy claim of PAPER.md, this run's numbers beside the paper's, and a verdict computed by the rule "
            "given with it. A missing task or model makes a claim inconclusive. Where the memory-forcing variant "
            "was run, its verdict is given beside the paper's setting.", ""]
    out.append(_md_table(["claim", "verdict", "why"], [[c.name, f"**{c.verdict}**", c.reason] for c in claims]))
    for c in claims:
        out += ["", f"### {c.name}: {c.verdict}", "", f"- Paper: {c.statement} ({c.paper})",
                f"- Rule: {c.rule}", f"- This run: {c.reason or '-'}"]
        out += [f"- {n}" for n in c.notes]
        if c.evidence:
            header = list(dict.fromkeys(k for e in c.evidence for k in e))
            out += ["", _md_table(header, [[e.get(k, "-") for k in header] for e in c.evidence])]

    out += ["", "## Summary", "",
            "Per task, variant, model, training level and evaluation level. Where a model was trained at several "
            "levels only the trained-at rows are listed (results.csv holds the full grid). 'memory off': accuracy "
            "with the gated memory path switched off. Wall time is per cell (build, probe, training, evaluation); "
            "steps/s is the training loop's.", "",
            summary_markdown(summary)]

    out += ["", "## Accuracy against the sweep axis", ""]
    for task in _tasks(data):
        x_axis = sweep_axis(data, task)
        out += [f"### {task}", ""]
        if x_axis is None:
            out += ["No sweep axis: see the summary table.", ""]
            continue
        stems = [s for s in figures if s.startswith(f"accuracy_{_slug(task)}_")]
        if f"accuracy_{_slug(task)}_trained" not in figures:
            rank = _train_level_rank(data, task)
            trained = sorted(set(data.table[data.table["task"] == task]["train_level"]), key=rank.get)
            out += [f"Each model (and variant) was trained at a single level ({'; '.join(trained)}), so the "
                    f"per-level training view would be one point per line; the generalisation view follows.", ""]
        for stem in stems:
            out += [_figure_md(stem, figures[stem]["title"]), ""]

    reliance = reliance_frame(summary)
    out += ["## Memory reliance", "",
            "Accuracy minus accuracy with the memory path switched off (gate forced to zero), for gated models. A "
            "memory that matters costs accuracy when removed; on the no-harm task the drop is what removing an "
            "unneeded path costs by itself.", ""]
    if reliance.empty:
        out.append("No gated model in this run.")
    else:
        out.append(_md_table(
            ["task", "variant", "model", "trained at", "level", "seeds", "accuracy", "memory off", "drop (points)"],
            [[r["task"], r["variant"], r["model"], r["trained at"], r["level"], r["seeds"],
              _fmt_ci(r["accuracy"], r["low"], r["high"]), _fmt_pct(r["memory off"]),
              _fmt_points(r["drop"], r["drop low"], r["drop high"])] for _, r in reliance.iterrows()]))
        out += ["", _figure_md("memory_reliance", figures["memory_reliance"]["title"])]

    out += ["", "## Gate values", ""]
    header, body = final_gate_table(data)
    if not body:
        out.append("No gated model in this run.")
    else:
        out += ["Final sigmoid(gamma) per layer, mean over seeds (and training levels, with the range when there "
                "are several cells), for every task side by side: a gate that also stays at its initial value "
                "where the task needs memory says little about no harm.", "", _md_table(header, body), ""]
        for task in _tasks(data):
            if f"gates_{_slug(task)}" in figures:
                out += [_figure_md(f"gates_{_slug(task)}", figures[f"gates_{_slug(task)}"]["title"]), ""]
    out += ["", "### No-harm verdict", "",
            f"Rule: accuracy within {100 * NO_HARM_ACC_TOL:g} point of `base` and mean gate within "
            f"{NO_HARM_GATE_TOL:g} of its initial value -> pass, else fail (inclusive; means over seeds).", ""]
    if no_harm:
        out.append(_md_table(["variant", "model", "seeds", "verdict", "numbers"],
                             [[v["variant"], v["model"], v["seeds"], f"**{v['verdict']}**", v["reason"]]
                              for v in no_harm]))
    else:
        out.append(f"No gated model on {NO_HARM_TASK} in this run." if NO_HARM_TASK in set(data.table["task"])
                   else f"This run has no {NO_HARM_TASK} results.")

    out += ["", "## Training curves", ""]
    for task in _tasks(data):
        if f"training_{_slug(task)}" in figures:
            out += [_figure_md(f"training_{_slug(task)}", figures[f"training_{_slug(task)}"]["title"]), ""]
    return "\n".join(out).rstrip() + "\n"
