"""Which rows a curve is drawn from: the sweep axis, its panels, the training and generalisation views."""
from __future__ import annotations

import numpy as np
import pandas as pd

from .data import RunData, model_order, per_seed, series_label, variant_order
from .stats import mean_ci


def train_level_rank(data: RunData, task: str) -> dict[str, tuple]:
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


def panels(data: RunData, task: str, x_axis: str) -> list[dict]:
    """One panel per combination of the task's other axes (e.g. one per query-noise level)."""
    rows_ = data.table[data.table["task"] == task]
    others = [a for a in data.axes[task] if a != x_axis]
    if not others:
        return [{}]
    combos = rows_[others].drop_duplicates().sort_values(others)
    return [dict(zip(others, values)) for values in combos.itertuples(index=False)]


def in_panel(rows_: pd.DataFrame, panel: dict) -> pd.DataFrame:
    mask = np.ones(len(rows_), dtype=bool)
    for axis, value in panel.items():
        mask &= (rows_[axis] == value).fillna(False).to_numpy(dtype=bool)
    return rows_[mask]


def trained_in_panel(rows_: pd.DataFrame, panel: dict) -> pd.DataFrame:
    """Rows of the panel; where models were also trained at the panel's other-axis values, only those."""
    rows_ = in_panel(rows_, panel)
    matching = in_panel(rows_, {f"train_{a}": v for a, v in panel.items()})
    return matching if not matching.empty else rows_


def training_view(data: RunData, task: str, panel: dict) -> pd.DataFrame:
    """Rows evaluated at the level their model was trained at."""
    rows_ = data.table[(data.table["task"] == task) & data.table["trained_at_level"]]
    return in_panel(rows_, panel)


def generalisation_view(data: RunData, task: str, x_axis: str, trained_x, panel: dict) -> pd.DataFrame:
    """Models trained at x = trained_x, evaluated at every level of the panel. Where models
    were also trained at the panel's other-axis values, only those are kept."""
    rows_ = data.table[(data.table["task"] == task) & (data.table[f"train_{x_axis}"] == trained_x)]
    return trained_in_panel(rows_, panel)


def curve_data(rows_: pd.DataFrame, x_axis: str, label_by_train_level: bool = False) -> dict:
    """{"series": {label: {x, mean, low, high, n_seeds}}, "chance": {x, y}, "ceiling": {x, y}}; a label
    names the model, and its variant too where the rows hold several."""
    out = {"series": {}, "chance": {}, "ceiling": {}}
    if rows_.empty:
        return out
    names = rows_["label"] if rows_["variant"].nunique() == 1 else rows_["series"]
    labels = names + (" @ " + rows_["train_level"] if label_by_train_level else "")
    rows_ = rows_.assign(_label=labels)
    order = {s: i for i, s in enumerate(_series_order(rows_))}
    for label, group in sorted(rows_.groupby("_label"), key=lambda kv: (order[kv[1]["series"].iloc[0]], kv[0])):
        xs = sorted(group[x_axis].unique())
        stats = [mean_ci(per_seed(group[group[x_axis] == x])) for x in xs]
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
    models, variants = model_order(rows_), variant_order(rows_)
    present = set(rows_["series"])
    return [s for v in variants for m in models if (s := series_label(m, v)) in present]
