"""The report's section for tasks with an environment (POPGym's, tasks/popgym.py): per task and
trained level, each model's oracle-action accuracy and the normalised return it earned acting in
the environment (harness/closed_loop.py), ranked by return."""
from __future__ import annotations

import math

import pandas as pd

from .data import RunData
from .stats import interval_label, mean_ci
from .tables import fmt_ci, md_table


def _fmt_return(mean: float, low: float, high: float) -> str:
    """A normalised return with its interval, clipped to POPGym's [-1, 1], as fmt_ci clips accuracy."""
    if low == high:
        return f"{mean:+.3f}"
    return f"{mean:+.3f} [{max(low, -1.0):+.3f}, {min(high, 1.0):+.3f}]"


def external_rows(data: RunData) -> list[dict]:
    """One row per (task, trained level, model) with closed-loop returns: seeds, accuracy and
    normalised return (mean and 95% interval over seeds, stats.mean_ci), best return first per task."""
    table = data.table
    if table.empty or "normalised_return" not in table:
        return []
    rows = table[table["trained_at_level"].astype(bool) & table["normalised_return"].notna()]
    out = []
    for (task, level), group in rows.groupby(["task", "train_level"], sort=True):
        ranked = []
        for label, cells in group.groupby("label"):
            ranked.append({"task": task, "level": level, "label": label, "seeds": len(cells),
                           "accuracy": mean_ci(cells["accuracy"]),
                           "return": mean_ci(cells["normalised_return"].astype(float)),
                           "chance": float(cells["chance"].iloc[0])})
        out += sorted(ranked, key=lambda r: (-r["return"][0], r["label"]))
    return out


def external_section(data: RunData) -> list[str]:
    rows = external_rows(data)
    if not rows:
        return []
    out = ["", "## Acting in the environment", "",
           "Tasks with an environment (POPGym's): each model imitated the oracle's actions; oracle-action accuracy "
           "is on the fixed evaluation episodes, and the normalised return is the mean episode return the model "
           "earned acting greedily in the environment itself on fixed seeds (POPGym scales it to [-1, 1]; the "
           "oracle earns 1). Mean over seeds with its "
           + interval_label(r["seeds"] for r in rows) + " interval, at the level each model was trained at, best "
           "return first.", ""]
    body = [[r["task"], r["level"], r["label"], r["seeds"], fmt_ci(*r["accuracy"]), f"{100 * r['chance']:.1f}%",
             _fmt_return(*r["return"])] for r in rows]
    out.append(md_table(["task", "trained at", "model", "seeds", "oracle-action accuracy", "chance",
                         "normalised return"], body))
    means = pd.DataFrame([{"label": r["label"], "return": r["return"][0]} for r in rows])
    overall = means.groupby("label")["return"].agg(["mean", "count"]).sort_values("mean", ascending=False)
    if len({(r["task"], r["level"]) for r in rows}) > 1:
        out += ["", "Mean normalised return over the environments and levels each model was trained at: "
                + ", ".join(f"{label} {row['mean']:+.3f} ({int(row['count'])})" for label, row in overall.iterrows()
                            if not math.isnan(row["mean"])) + "."]
    return out + [""]
