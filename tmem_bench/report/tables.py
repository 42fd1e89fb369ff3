"""Number formats and the tables of a report: the summary (markdown and rich), memory reliance, final gates."""
from __future__ import annotations

import math

import pandas as pd

from .data import (TASK_ORDER, RunData, model_order, natural_key, ordered, per_seed, series_label, task_label,
                   task_order, variant_order)
from .stats import mean_ci


def fmt_pct(x) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def fmt_ci(mean, low, high) -> str:
    """An accuracy with its interval, clipped to [0, 100]: a t interval of few seeds may reach past
    them, where a mean of accuracies cannot lie."""
    if low == high:
        return fmt_pct(mean)
    return f"{fmt_pct(mean)} [{100 * max(low, 0.0):.1f}, {100 * min(high, 1.0):.1f}]"


def fmt_points(mean, low, high) -> str:
    def points(x):
        return f"{round(100 * x, 1) + 0.0:+.1f}"  # + 0.0 turns -0.0 into 0.0

    return points(mean) if low == high else f"{points(mean)} [{points(low)}, {points(high)}]"


def md_table(header: list[str], body: list[list]) -> str:
    """A GitHub Markdown table, cells unpadded and "|" escaped. Not pandas' to_markdown (tabulate): it pads
    each column to its widest cell, so every committed report would change, and leaves "|" unescaped."""
    def cell(v):
        return str(v).replace("|", "\\|")

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in body]
    return "\n".join(lines)


def _summary_selection(table: pd.DataFrame) -> pd.DataFrame:
    """Per (task, variant, model): the trained-at rows when models were trained at several
    levels (the full grid stays in results.csv and the figures), else every evaluated level."""
    parts = []
    for _, g in table.groupby(["task", "variant", "label"], sort=False):
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
    for task in task_order(data):
        t = _summary_selection(table[table["task"] == task])
        axes = data.axes.get(task, ())
        for (variant, model, train_level, level), g in t.groupby(["variant", "label", "train_level", "level"]):
            mean, low, high = mean_ci(per_seed(g))
            off = g.dropna(subset=["accuracy_memory_off"])
            reliance = mean_ci(per_seed(off.assign(d=off["accuracy"] - off["accuracy_memory_off"]), "d")) \
                if not off.empty else (math.nan,) * 3
            probes = sorted(set(g["causality"].dropna()))
            diverged = g.drop_duplicates("cell_id").dropna(subset=["diverged_at_step"])
            out.append({
                "task": task, "variant": variant, "label": model, "series": series_label(model, variant),
                "trained at": train_level, "level": level, "seeds": int(g["seed"].nunique()),
                "accuracy": mean, "low": low, "high": high,
                "memory off": float(off["accuracy_memory_off"].mean()) if not off.empty else math.nan,
                "drop": reliance[0], "drop low": reliance[1], "drop high": reliance[2],
                "chance": float(g["chance"].mean()), "ceiling": float(g["ceiling"].mean()),
                "params": int(g["n_params"].iloc[0]) if g["n_params"].notna().any() else None,
                "wall s": float(g.drop_duplicates("cell_id")["wall_time_s"].mean()),
                "steps/s": float(g.drop_duplicates("cell_id")["loop_steps_per_s"].mean()),
                "probe": "leaking" if model in leaking else ",".join(probes) or "-",
                "status": (f"diverged at step {','.join(str(int(x)) for x in sorted(diverged['diverged_at_step']))}"
                           if not diverged.empty else ""),
                "_sort": (variant_order(table).index(variant), model_order(table).index(model),
                          tuple(g[f"train_{a}"].iloc[0] for a in axes), tuple(g[a].iloc[0] for a in axes)),
            })
    out.sort(key=lambda r: (task_order(data).index(r["task"]), r["_sort"]))
    return pd.DataFrame(out).drop(columns="_sort")


_SUMMARY_COLUMNS = ("variant", "model", "trained at", "level", "seeds", "accuracy [95% CI]", "memory off", "chance",
                    "ceiling", "params", "wall s", "steps/s", "probe")


def _summary_cells(r) -> list[str]:
    return [
        r["variant"], r["label"], r["trained at"], r["level"], str(r["seeds"]),
        fmt_ci(r["accuracy"], r["low"], r["high"]), fmt_pct(r["memory off"]), fmt_pct(r["chance"]),
        fmt_pct(r["ceiling"]), "-" if pd.isna(r["params"]) else f"{int(r['params']):,}",
        f"{r['wall s']:.0f}", f"{r['steps/s']:.3g}", r["probe"],
    ]


def summary_markdown(summary: pd.DataFrame) -> str:
    parts = []
    for task, g in summary.groupby("task", sort=False):
        # A status column only where training diverged, so it cannot be overlooked there.
        status = g["status"].astype(bool).any()
        body = [_summary_cells(r) + ([r["status"] or "-"] if status else []) for _, r in g.iterrows()]
        parts.append(f"**{task}**\n\n" + md_table(list(_SUMMARY_COLUMNS) + (["status"] if status else []), body))
    return "\n\n".join(parts)


def _level_values(key: str) -> list[str]:
    """'n_writes=20,noise=0.05' -> ['20', '0.05'] (the axis names go into the column headers)."""
    return [] if key == "-" else [part.partition("=")[2] for part in key.split(",")]


def level_sort_key(key: str) -> tuple:
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
        title = escape(f"{task_label(task, variant)}: accuracy, mean over seeds [95% CI]")  # [..] is rich markup
        table = Table(title=title, box=box.SIMPLE_HEAD,
                      title_justify="left", pad_edge=False)
        # Narrow consoles fold the minor columns; the model and its accuracy keep their width.
        table.add_column("model", min_width=min(max(map(len, g["label"])), 16))
        if show_trained:
            table.add_column("trained", overflow="fold")
        for axis in axes:
            table.add_column(axis, justify="right", overflow="fold")
        accuracy_width = max(len(fmt_ci(r["accuracy"], r["low"], r["high"])) for _, r in g.iterrows())
        diverged = g["status"].astype(bool).any()
        for name in ("seeds", "accuracy", *(["mem off"] if gated else []), "chance", "ceiling", "params", "wall s",
                     "steps/s", "probe", *(["status"] if diverged else [])):
            table.add_column(name, justify="left" if name in ("probe", "status") else "right", overflow="fold",
                             min_width=accuracy_width if name == "accuracy" else None)
        for _, r in g.iterrows():
            cells = [r["label"]]
            if show_trained:
                cells.append(",".join(_level_values(r["trained at"])) or "-")
            cells += _level_values(r["level"])
            cells += [str(r["seeds"]), fmt_ci(r["accuracy"], r["low"], r["high"])]
            if gated:
                cells.append(fmt_pct(r["memory off"]))
            cells += [fmt_pct(r["chance"]), fmt_pct(r["ceiling"]),
                      "-" if pd.isna(r["params"]) else f"{r['params'] / 1000:.0f}k", f"{r['wall s']:.0f}",
                      f"{r['steps/s']:.3g}", r["probe"]] + ([r["status"] or "-"] if diverged else [])
            table.add_row(*map(escape, cells))
        tables.append(table)
    return Group(*tables)


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
    for task in ordered(final["task"], TASK_ORDER):
        for variant in variant_order(final[final["task"] == task]):
            columns.append((task, variant))
    header = ["model", "layer", "initial"] + [task_label(t, v) for t, v in columns]
    body = []
    for model in model_order(final):
        for layer in sorted(final[final["label"] == model]["layer"].unique(), key=natural_key):
            sel = (last["label"] == model) & (last["layer"] == layer)
            row = [model, layer, f"{init[(init['label'] == model) & (init['layer'] == layer)]['gate'].mean():.3f}"]
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
