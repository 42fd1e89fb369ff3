"""External validity: does the toy suite's ranking of memories predict their ranking elsewhere?

For each toy diagnostic score and each external score: Kendall's tau-b and Spearman's rho between
the two rankings of the models both runs trained (each model's mean over its seeds), each with a 95%
percentile interval from resampling the MODELS and a permutation test (`tmem-bench validity TOY_RUN...
EXTERNAL_RUN`). The models, not the seeds, are resampled: the question is whether the relation holds
for memories beyond these, and a seed's noise already sits inside each model's mean.

The pair a hypothesis stated before the external run's first cell names (`read_hypothesis`, issue 59)
is tested as stated, first, once every cell of its two sides is in; every other pair is exploratory,
its p-values Holm-corrected over all of them. A hypothesis stated later, or naming a pair these runs
lack, makes every pair exploratory.

A score is one number per model and seed:
- toy: accuracy at the level a model was trained at, in every variant of a task that has a
  memory-forcing variant (the memory-forcing ones, and the standard one where attention may see the
  evidence), one score per task, variant and training level;
- external: at each environment and difficulty a model was trained at, oracle-action accuracy and
  the normalised return it earned acting in the environment; and the mean normalised return over the
  levels, all of them and those kept (`kept_levels`, the hypothesis's), per seed.
Rows come from the runs' own reports' loading (`report.data.load_run`), so only the cells at the
learning rate each search chose count.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import UsageError
from ..registry import TASKS, variant_forces_memory
from .budget import converged_flag
from .data import RunData, load_run, natural_key
from .hypothesis import DIRECTIONS, HYPOTHESIS, Hypothesis, exploratory_reasons, read_hypothesis, shown
from .rank_stats import ALPHA, N_PERM, STATISTIC_ROWS, critical_tau, holm, model_interval, permutation_p
from .stats import BOOT_SEED, BOOTSTRAP_FROM, CI_LEVEL, N_BOOT

# A level is kept for the mean return when no model's mean return is within this of the oracle's +1
# (the hypothesis's rule: a level every model has solved ranks nothing).
CEILING_MARGIN = 0.01
# POPGym's returns lie in [-1, 1]; closed-loop means carry float error past it (1.0000000000000007).
RETURN_SLACK = 1e-9
MEAN_ALL, MEAN_KEPT = "mean return over environments", "mean return over kept levels"
FORCING = " (memory forcing)"  # names an external score of the memory-forcing variants


@dataclass(frozen=True)
class Score:
    """One measure of every model: `values[label]` has one number per seed; `key` what a hypothesis
    names it by: (task, variant, train_level) for a toy score, its name for an external one; `over`
    the levels a mean return averages ("task @ level"), so that a reader sees which the rule kept."""
    name: str
    kind: str  # "toy" or "external"
    values: dict[str, tuple[float, ...]]
    key: tuple = ()
    over: tuple[str, ...] = ()

    def means(self, labels) -> np.ndarray:
        return np.array([np.mean(self.values[label]) for label in labels])


def pair_stats(a: Score, b: Score, alternative: str = "two-sided", n_boot: int = N_BOOT,
               n_perm: int = N_PERM, seed: int = BOOT_SEED) -> dict:
    """tau and rho between two scores' rankings of the models they share, each with its
    model-resampling interval and permutation p-value."""
    labels = sorted(set(a.values) & set(b.values))
    out = {"toy": a.name, "external": b.name, "models": labels, "n_models": len(labels)}
    x, y = (a.means(labels), b.means(labels)) if len(labels) >= 2 else (np.zeros(0), np.zeros(0))
    for name, rows in STATISTIC_ROWS.items():
        value = float(rows(x, y)[0]) if len(labels) >= 2 else math.nan
        low, high, undefined = model_interval(x, y, name, n_boot, seed) if not math.isnan(value) else (math.nan,) * 2 + (0,)
        p = permutation_p(x, y, name, alternative, n_perm, seed) if not math.isnan(value) else math.nan
        out |= {name: value, f"{name}_low": low, f"{name}_high": high, f"{name}_p": p}
        out.setdefault("undefined_resamples", undefined)
    return out


# The scores, from the runs' tables.

def _has_forcing_variant(task: str) -> bool:
    try:
        return bool(TASKS.get(task).memory_forcing)
    except UsageError:  # a task not installed here: read as standard, as variant_forces_memory does
        return False


def _check_numbers(rows: pd.DataFrame, column: str, data: RunData, bounds: tuple[float, float]) -> None:
    """A UsageError naming the first cell whose `column` is not a finite number within `bounds`: a
    nan, an infinity or a string would rank silently (or not at all) and change every tau."""
    low, high = bounds
    for _, r in rows.iterrows():
        v = r[column]
        number = isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
        if number and math.isfinite(v) and low - RETURN_SLACK <= v <= high + RETURN_SLACK:
            continue
        why = ("is not a number" if not number else "is not finite" if not math.isfinite(v)
               else f"is outside [{low:g}, {high:g}]")
        raise UsageError(f"run {data.run_dir}: cell {r['cell_id']} ({r['task']} {r['label']} @ {r['train_level']} "
                         f"seed {r['seed']}) has {column} {v!r}, which {why}; validity ranks only finite scores "
                         "in range, so mend or rerun that cell")


def _by_seed(rows: pd.DataFrame, column: str) -> dict[str, tuple[float, ...]]:
    return {label: tuple(float(v) for v in g.sort_values("seed")[column]) for label, g in rows.groupby("label")}


def _trained(data: RunData) -> pd.DataFrame:
    table = data.table
    if table.empty:
        why = f" ({len(data.problems)} problem(s), the first: {data.problems[0]})" if data.problems else ""
        raise UsageError(f"run {data.run_dir} has no finished cell a score can count yet{why}")
    return table[table["trained_at_level"].astype(bool) & (table["status"] == "finished")]


def toy_scores(data: RunData) -> list[Score]:
    """Accuracy at the trained level in each variant of a task with a memory-forcing variant, per
    task, variant and training level; the standard variant is named so."""
    scores = []
    run = Path(data.run_dir).name
    rows = _trained(data)
    rows = rows[[_has_forcing_variant(t) for t in rows["task"]]]
    _check_numbers(rows, "accuracy", data, (0.0, 1.0))
    groups = rows.groupby(["task", "variant", "train_level"])
    for (task, variant, train_level), group in sorted(groups, key=lambda g: (g[0][0], g[0][1], natural_key(g[0][2]))):
        forcing = variant_forces_memory(task, variant, data.task_options.get((task, variant), {}))
        name = f"{run}: {task}{'' if forcing else ' (' + variant + ')'} @ {train_level}"
        scores.append(Score(name, "toy", _by_seed(group, "accuracy"), (task, variant, train_level)))
    return scores


def kept_levels(rows: pd.DataFrame) -> list[tuple[str, str]]:
    """The (task, train_level)s the mean return averages, by the hypothesis's rule, fixed before the
    scores were read: no model's mean return within CEILING_MARGIN of the oracle's +1, and some
    model's mean accuracy above chance (the best constant answer's; its return is not recorded)."""
    kept = []
    for (task, level), group in rows.groupby(["task", "train_level"], sort=True):
        by_model = group.groupby("label")
        if (by_model["normalised_return"].mean().max() < 1 - CEILING_MARGIN
                and (by_model["accuracy"].mean() > group["chance"].astype(float).max()).any()):
            kept.append((task, level))
    return kept


def external_scores(data: RunData) -> list[Score]:
    """Accuracy and normalised return at each environment and trained difficulty, and the mean
    normalised return over all of them and over the kept levels (per seed, over those a model has
    at that seed)."""
    rows = _trained(data)
    if "normalised_return" not in rows or rows["normalised_return"].isna().all():
        raise UsageError(f"run {data.run_dir} has no closed-loop returns; give a run of the external profile "
                         "(tmem-bench run all --profile external) as EXTERNAL_RUN")
    _check_numbers(rows, "accuracy", data, (0.0, 1.0))
    _check_numbers(rows, "normalised_return", data, (-1.0, 1.0))
    rows = rows.astype({"accuracy": float, "normalised_return": float})
    # Each memory condition apart: a memory-forcing variant's scores, and its means, are named so.
    rows["condition"] = [FORCING if variant_forces_memory(t, v, data.task_options.get((t, v), {})) else ""
                         for t, v in zip(rows["task"], rows["variant"])]
    scores = []
    for (task, condition, train_level), group in rows.groupby(["task", "condition", "train_level"], sort=True):
        where = f"{task.removeprefix('popgym_')}{condition} @ {train_level}"
        scores.append(Score(f"{where} accuracy", "external", _by_seed(group, "accuracy"), (f"{where} accuracy",)))
        scores.append(Score(f"{where} return", "external", _by_seed(group, "normalised_return"), (f"{where} return",)))
    for condition, played in rows.groupby("condition", sort=True):
        kept = set(kept_levels(played))
        kept_rows = played[[(t, lv) in kept for t, lv in zip(played["task"], played["train_level"])]]
        for name, levels in ((MEAN_ALL + condition, played), (MEAN_KEPT + condition, kept_rows)):
            if len(levels):
                mean = levels.groupby(["label", "seed"])["normalised_return"].mean().reset_index()
                where = sorted(set(zip(levels["task"].str.removeprefix("popgym_"), levels["train_level"])),
                               key=lambda w: (w[0], natural_key(w[1])))
                over = tuple(f"{task} @ {level}" for task, level in where)
                scores.append(Score(name, "external", _by_seed(mean, "normalised_return"), (name,), over))
    return scores


# The table and what is said about it.

@dataclass
class Validity:
    table: pd.DataFrame  # one row per (toy score, external score); the confirmatory pair first, if any
    hypothesis: Hypothesis | None
    reasons: list[str]  # why no pair is confirmatory (empty: one is)
    left_out: list[str]  # every cell no score counts, and why
    alpha: float
    budget: list[str]  # per run, how many of the cells its scores count had converged
    means: dict[str, tuple[str, ...]] = field(default_factory=dict)  # each mean return's levels (Score.over)


def _budget(data: RunData, toy: bool) -> str:
    """How many of the cells a run's scores count met the convergence rule, in all and per task,
    variant and level: a score from cells still learning at their cap ranks what the memories reached
    in that many steps, which may not be the order they would converge to."""
    cells = _trained(data).drop_duplicates("cell_id")
    if toy:
        cells = cells[[_has_forcing_variant(t) for t in cells["task"]]]
    flags = [converged_flag(v) for v in cells["converged"]] if "converged" in cells else [None] * len(cells)
    cells = cells.assign(flag=flags)
    unknown = sum(f is None for f in flags)
    parts = [f"{task}{'' if variant == 'standard' else ' [' + variant + ']'} @ {level} "
             f"{sum(f is True for f in g['flag'])}/{len(g)}"
             for (task, variant, level), g in cells.groupby(["task", "variant", "train_level"], sort=True)]
    return (f"{Path(data.run_dir).name}: {sum(f is True for f in flags)} of {len(cells)} cells counted had converged "
            f"(the convergence rule), {sum(f is False for f in flags)} were still learning at their cap"
            + (f", {unknown} do not say" if unknown else "") + f" ({'; '.join(parts)})")


def _not_whole(data: RunData, on_side) -> str:
    """What a run still lacks of the stated pair's side ('' where nothing): a confirmatory test read
    off part of its cells could be read again, and differ, once the rest lands. `on_side` tells
    whether a (task, variant, training level) is on it; one a manifest does not name always is."""
    unfinished = sum(w is None or on_side(*w) for w in data.unfinished)
    unchosen = sum(w is None or on_side(*w) for w in data.unchosen)
    parts = [f"{unfinished} cell(s) without a result"] if unfinished else []
    parts += [f"{unchosen} learning-rate search(es) with no lr chosen"] if unchosen else []
    return " and ".join(parts)


def _external_side(data: RunData, forcing: bool):
    """Whether a cell of the external run is on the side of a score of that memory condition: every
    level of it, since the mean over kept levels depends on them all. A variant whose options no
    finished cell records yet is on both sides."""
    def on_side(task, variant, level):
        options = data.task_options.get((task, variant))
        unknown = options is None and variant != "standard"
        return unknown or variant_forces_memory(task, variant, options or {}) == forcing
    return on_side


def _left_out(data: RunData, shared: set[str], toy: bool) -> list[str]:
    run = Path(data.run_dir).name
    lines = [f"{run}: {p}" for p in data.problems]
    table = data.table
    if table.empty:
        return lines
    cells = table.drop_duplicates("cell_id")

    def named(rows, why):
        if len(rows):
            lines.append(f"{run}: {len(rows)} cell(s) {why}: {', '.join(sorted(rows['cell_id']))}")

    for status, rows in cells[cells["status"] != "finished"].groupby("status"):
        named(rows, f"{status}, not finished")
    counted = cells[cells["status"] == "finished"]
    if toy:
        no_diagnosis = counted[[not _has_forcing_variant(t) for t in counted["task"]]]
        for task, rows in no_diagnosis.groupby("task"):
            named(rows, f"of {task}, a task with no memory-forcing variant (no memory diagnosis)")
        counted = counted[[_has_forcing_variant(t) for t in counted["task"]]]
    for label, rows in counted[~counted["label"].isin(shared)].groupby("label"):
        named(rows, f"of {label}, a model the {'external run' if toy else 'toy runs'} did not train")
    return lines


def validity_table(toy_runs: list[RunData], external: RunData, hypothesis: Hypothesis | None = None,
                   n_boot: int = N_BOOT) -> Validity:
    """Every (toy score, external score) pair's statistics; the hypothesis's pair tested as stated
    where it was stated before the external run's first cell, every other pair exploratory."""
    externals = external_scores(external)
    external_models = set(_trained(external)["label"])
    toy_models = set()
    for data in toy_runs:
        models = set(_trained(data)["label"])
        if not models & external_models:
            raise UsageError(f"runs {data.run_dir} and {external.run_dir} share no model ({', '.join(sorted(models))} "
                             f"against {', '.join(sorted(external_models))}); validity ranks the models both trained")
        toy_models |= models
    toys = [s for data in toy_runs for s in toy_scores(data)]
    if not toys:
        raise UsageError("the toy runs have no memory diagnosis (a task with a memory-forcing variant); give runs "
                         "such as docs/runs/study_converge and docs/runs/capacity_converge as TOY_RUN")
    stated = None
    if hypothesis is not None:
        stated = next(((t, e) for t in toys if t.key == hypothesis.toy
                       for e in externals if e.key == (hypothesis.external,)), None)
    reasons = exploratory_reasons(hypothesis, external, stated is not None)
    if hypothesis is not None:
        sides = [(d, lambda *where: where == hypothesis.toy) for d in toy_runs]
        sides.append((external, _external_side(external, FORCING in hypothesis.external)))
        reasons += [f"run {d.run_dir} has {why} on the stated pair's side, which is tested only once all its "
                    "cells are in" for d, on_side in sides if (why := _not_whole(d, on_side))]
    rows = []
    if not reasons:
        rows.append(pair_stats(*stated, DIRECTIONS[hypothesis.direction], n_boot) | {"role": "confirmatory"})
    rows += [pair_stats(t, e, n_boot=n_boot) | {"role": "exploratory"} for t in toys for e in externals
             if reasons or (t, e) != stated]
    table = pd.DataFrame(rows)
    table["models"] = [" ".join(m) for m in table["models"]]
    exploratory = table["role"] == "exploratory"
    for name in STATISTIC_ROWS:
        table[f"{name}_p_holm"] = np.nan
        table.loc[exploratory, f"{name}_p_holm"] = holm(table.loc[exploratory, f"{name}_p"])
    columns = ["role", "toy", "external", "n_models", "tau", "tau_low", "tau_high", "tau_p", "tau_p_holm",
               "rho", "rho_low", "rho_high", "rho_p", "rho_p_holm", "undefined_resamples", "models"]
    left_out = [line for data in toy_runs for line in _left_out(data, external_models, toy=True)]
    left_out += _left_out(external, toy_models, toy=False)
    budget = [_budget(data, toy=True) for data in toy_runs] + [_budget(external, toy=False)]
    means = {e.name: e.over for e in externals if e.over}
    return Validity(table[columns], hypothesis, reasons, left_out, hypothesis.alpha if hypothesis else ALPHA, budget,
                    means)


def _num(v: float, fmt: str = "+.2f") -> str:
    return "-" if math.isnan(v) else format(v, fmt)


def stat_text(row, name: str = "tau") -> str:
    """'+0.43 [+0.05, +0.71]', without an interval where there is none, '-' where the statistic is undefined."""
    if math.isnan(row[name]):
        return "-"
    low, high = row[f"{name}_low"], row[f"{name}_high"]
    return f"{row[name]:+.2f}" + ("" if math.isnan(low) else f" [{low:+.2f}, {high:+.2f}]")


def blank_externals(table: pd.DataFrame) -> list[str]:
    """The external scores with no tau against any toy score: every model scores alike there."""
    return [e for e, g in table.groupby("external", sort=False) if g["tau"].isna().all()]


def summary(v: Validity) -> list[str]:
    """What `tmem-bench validity` prints: the stated pair, the strongest relation, how many pairs a
    Holm-corrected test tells from none, what '-' and a blank column mean, the levels each kept mean
    averages and those its rule leaves out, how many of the counted cells had converged, and the
    left-out cells."""
    t = v.table
    n = int(t["n_models"].max()) if len(t) else 0
    exploratory = t[t["role"] == "exploratory"]
    lines = []
    h = v.hypothesis
    if not v.reasons:
        row = t.iloc[0]
        stat = h.statistic
        verdict = "supported" if row[f"{stat}_p"] <= h.alpha else "not supported"
        lines.append(f"confirmatory (stated {h.stated_text} at {h.revision}): {row['toy']} vs {row['external']}: "
                     f"{stat} {stat_text(row, stat)}, one-sided p = {row[f'{stat}_p']:.3g} ({h.direction}, alpha "
                     f"{h.alpha:g}), {row['n_models']} models: {verdict}")
    else:
        what = f"the hypothesis in {shown(h.path)}" if h else "no hypothesis"
        lines.append(f"no confirmatory pair: {what}: {'; '.join(v.reasons)}. Every pair is exploratory.")
    defined = exploratory.dropna(subset=["tau"])
    if len(defined):
        best = defined.assign(size=defined["tau"].abs()).sort_values(["size", "tau_p"], ascending=[False, True]).iloc[0]
        lines.append(f"strongest relation (exploratory): {best['toy']} vs {best['external']}: tau {stat_text(best)}, "
                     f"rho {stat_text(best, 'rho')}, p = {best['tau_p']:.3g}, Holm p = {best['tau_p_holm']:.3g}")
    significant = int((defined["tau_p_holm"] <= v.alpha).sum())
    critical = ""
    if 2 <= n <= 9:
        c = critical_tau(n, v.alpha)
        critical = (f"; with {n} models even one test needs |tau| >= {c:.2f}" if not math.isnan(c)
                    else f"; with {n} models no tau can reach it")
    lines.append(f"{significant} of {len(defined)} exploratory pairs reach p <= {v.alpha:g} after Holm's correction "
                 f"(permutation test of tau, {n} models{critical})")
    blank = blank_externals(t)
    lines.append("'-': no tau, as one score ranks every model alike"
                 + (f"; blank heatmap columns: {', '.join(blank)} (every model scores the same there)" if blank else "")
                 + "; a percentile interval can miss its point where resampled models tie")
    played = {name.removeprefix(MEAN_ALL): over for name, over in v.means.items() if name.startswith(MEAN_ALL)}
    for name, over in v.means.items():
        if name.startswith(MEAN_KEPT):
            dropped = [lv for lv in played.get(name.removeprefix(MEAN_KEPT), ()) if lv not in over]
            lines.append(f"{name} averages {', '.join(over)}" + (f"; its rule leaves out {', '.join(dropped)}"
                                                                   if dropped else ""))
    lines += [f"converged: {line}" for line in v.budget]
    lines += [f"left out: {line}" for line in v.left_out]
    return lines


def validity_markdown(v: Validity, toy_dirs: list[str], external_dir: str, n_boot: int) -> str:
    """The summary, then the table (made with `n_boot` resamples): a row per toy score, a column per external score."""
    table = v.table
    externals = list(dict.fromkeys(table["external"]))
    lines = [
        "# External validity: Kendall's tau between toy and external rankings", "",
        f"Toy runs: {', '.join(toy_dirs)}. External run: {external_dir}. Each entry is Kendall's tau-b between "
        f"the models' rankings by the two scores (mean over seeds), its {CI_LEVEL:.0%} percentile interval from "
        f"resampling the models ({n_boot} resamples, seeded; none below {BOOTSTRAP_FROM} models) and, after 'p', "
        f"its two-sided permutation test's p-value (every ordering of the models where n! <= {N_PERM}, "
        f"else {N_PERM} seeded ones) with Holm's correction over the exploratory pairs. "
        "+1: the toy score orders the models as the external one does; 0: no relation; -1: the reverse. "
        "Spearman's rho, its interval and p-values are in validity.csv.", "",
        *[f"- {line}" for line in summary(v)], "",
        "| toy score | " + " | ".join(externals) + " |",
        "|---|" + "---|" * len(externals),
    ]
    for toy, group in table.groupby("toy", sort=False):
        cells = {}
        for _, r in group.iterrows():
            p = r["tau_p_holm"] if r["role"] == "exploratory" else r["tau_p"]
            cells[r["external"]] = stat_text(r) + ("" if math.isnan(p) else f" p {p:.2f}") \
                + (" (confirmatory, one-sided)" if r["role"] == "confirmatory" else "")
        lines.append(f"| {toy} | " + " | ".join(cells.get(e, "") for e in externals) + " |")
    models = sorted({m for ms in table["models"] for m in ms.split()})
    lines += ["", f"Models ranked (those both runs trained): {', '.join(models)}. The {MEAN_KEPT} averages the "
              f"levels where no model's mean return is within {CEILING_MARGIN} of +1 and some model's mean accuracy "
              "is above chance.", ""]
    return "\n".join(lines)


def validity_figure(table: pd.DataFrame):
    """A heatmap of tau, toy scores by external scores, each cell annotated."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    toys = list(dict.fromkeys(table["toy"]))
    externals = list(dict.fromkeys(table["external"]))
    grid = np.full((len(toys), len(externals)), np.nan)
    for _, r in table.iterrows():
        grid[toys.index(r["toy"]), externals.index(r["external"])] = r["tau"]
    fig, ax = plt.subplots(figsize=(1.0 + 0.9 * len(externals), 1.2 + 0.45 * len(toys)))
    image = ax.imshow(grid, cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
    for i in range(len(toys)):
        for j in range(len(externals)):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:+.2f}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(len(externals)), externals, rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(len(toys)), toys, fontsize=7)
    fig.colorbar(image, ax=ax, label="Kendall's tau")
    ax.set_title("toy score (rows) vs external score (columns); blank: every model scores alike", fontsize=8)
    return fig


def write_validity(toy_dirs: list[str], external_dir: str, out: Path, n_boot: int = N_BOOT,
                   hypothesis: Path = HYPOTHESIS) -> Validity:
    """validity.md, validity.csv and validity.png (and .svg) in `out`; the table and its summary."""
    from ..files import write_atomic
    from .figures import save_figure

    stated = read_hypothesis(hypothesis)
    v = validity_table([load_run(d) for d in toy_dirs], load_run(external_dir), stated, n_boot)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "validity.csv", v.table.to_csv(index=False, float_format="%.6g").encode())
    text = validity_markdown(v, toy_dirs, external_dir, n_boot) + "\n![tau heatmap](validity.png)\n"
    write_atomic(out / "validity.md", text.encode())
    import matplotlib.pyplot as plt

    fig = validity_figure(v.table)
    save_figure(fig, out, "validity", tight=True)
    plt.close(fig)
    return v
