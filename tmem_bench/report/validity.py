"""External validity: does the toy suite's ranking of memories predict their ranking elsewhere?

For each toy diagnostic score and each external score, Kendall's tau between the two rankings of
the models both runs trained, with a percentile bootstrap interval from resampling each model's
seeds (`tmem-bench validity TOY_RUN... EXTERNAL_RUN`).

A score is one number per model and seed:
- toy: accuracy at the level a model was trained at, in every memory-forcing variant of a toy run
  (coordinate binding, occlusion, map building in the study; coordinate binding at each W, trained
  at each, in the capacity run), one score per task and training level;
- external: at each environment and difficulty a model was trained at, oracle-action accuracy and
  the normalised return it earned acting in the environment; and the mean normalised return over
  the environments, per seed.
Rows come from the runs' own reports' loading (`report.data.load_run`), so only the cells at the
learning rate each search chose count.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import UsageError
from ..registry import variant_forces_memory
from .data import RunData, load_run, natural_key
from .stats import BOOT_SEED, CI_LEVEL

# Fewer resamples than the reports' intervals (stats.N_BOOT): each one ranks every model again for
# each pair of scores; the committed table (docs/runs/external/validity) was made with this many.
N_BOOT = 2000


@dataclass(frozen=True)
class Score:
    """One measure of every model: `values[label]` has one number per seed."""
    name: str
    kind: str  # "toy" or "external"
    values: dict[str, tuple[float, ...]]

    def means(self, labels) -> np.ndarray:
        return np.array([np.mean(self.values[label]) for label in labels])


def kendall_tau(x, y) -> float:
    """Kendall's tau-b of two equally long sequences: (concordant - discordant pairs) over the
    geometric mean of the pairs not tied in x and not tied in y; nan where either has no untied pair.
    scipy.stats.kendalltau gives the same (tested) but checks its input on every call, several times
    slower over critical_tau's n! orderings and the bootstrap's resamples, so this one is vectorised here."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError(f"kendall_tau needs two 1-D sequences of one length, got {x.shape} and {y.shape}")
    i, j = np.triu_indices(len(x), k=1)
    sx, sy = np.sign(x[i] - x[j]), np.sign(y[i] - y[j])
    untied_x, untied_y = np.count_nonzero(sx), np.count_nonzero(sy)
    if untied_x == 0 or untied_y == 0:
        return math.nan
    return float((sx * sy).sum() / math.sqrt(untied_x * untied_y))


def critical_tau(n: int, alpha: float = 0.05) -> float:
    """The smallest |tau| that a two-sided exact permutation test at level `alpha` tells from no
    relation, for n untied models (every ordering of n enumerated; n <= 9)."""
    if not 2 <= n <= 9:
        raise ValueError(f"critical_tau enumerates n! orderings, for 2 <= n <= 9; got {n}")
    taus = np.round([kendall_tau(range(n), p) for p in itertools.permutations(range(n))], 12)
    for t in sorted(set(np.abs(taus))):
        if np.mean(np.abs(taus) >= t) <= alpha:
            return float(t)
    return math.nan


def tau_interval(a: Score, b: Score, n_boot: int = N_BOOT, seed: int = BOOT_SEED,
                 level: float = CI_LEVEL) -> dict:
    """tau between two scores' rankings of the models they share (from each model's mean over its
    seeds), and its percentile bootstrap interval: each resample draws every model's seeds with
    replacement, in each score on its own. A resample with no untied pair is left out of the
    interval and counted."""
    labels = sorted(set(a.values) & set(b.values))
    out = {"toy": a.name, "external": b.name, "models": labels, "n_models": len(labels),
           "tau": math.nan, "low": math.nan, "high": math.nan, "undefined_resamples": 0}
    if len(labels) < 2:
        return out
    out["tau"] = kendall_tau(a.means(labels), b.means(labels))
    rng = np.random.default_rng(seed)

    def resampled(score: Score) -> np.ndarray:  # (n_boot, n_models)
        columns = []
        for label in labels:
            v = np.asarray(score.values[label], dtype=float)
            columns.append(v[rng.integers(0, len(v), (n_boot, len(v)))].mean(axis=1))
        return np.stack(columns, axis=1)

    xa, xb = resampled(a), resampled(b)
    taus = np.array([kendall_tau(p, q) for p, q in zip(xa, xb)])
    defined = taus[~np.isnan(taus)]
    out["undefined_resamples"] = int(n_boot - len(defined))
    if len(defined):
        out["low"], out["high"] = (float(v) for v in np.percentile(defined, [50 * (1 - level), 50 * (1 + level)]))
    return out


def _by_seed(rows: pd.DataFrame, column: str) -> dict[str, tuple[float, ...]]:
    rows = rows.dropna(subset=[column])
    return {label: tuple(float(v) for v in g.sort_values("seed")[column]) for label, g in rows.groupby("label")}


def _trained(data: RunData) -> pd.DataFrame:
    table = data.table
    if table.empty:
        raise UsageError(f"run {data.run_dir} has no finished cells")
    return table[table["trained_at_level"].astype(bool) & (table["status"] == "finished")]


def toy_scores(data: RunData) -> list[Score]:
    """Accuracy at the trained level in each memory-forcing variant, per task and training level."""
    scores = []
    run = Path(data.run_dir).name
    groups = _trained(data).groupby(["task", "variant", "train_level"])
    for (task, variant, train_level), rows in sorted(groups, key=lambda g: (g[0][0], g[0][1], natural_key(g[0][2]))):
        options = data.task_options.get((task, variant), {})
        if not variant_forces_memory(task, variant, options):
            continue
        scores.append(Score(f"{run}: {task} @ {train_level}", "toy", _by_seed(rows, "accuracy")))
    return scores


def external_scores(data: RunData) -> list[Score]:
    """Accuracy and normalised return at each environment and trained difficulty, and the mean
    normalised return over the environments (per seed, over those a model has at that seed)."""
    rows = _trained(data)
    if "normalised_return" not in rows or rows["normalised_return"].isna().all():
        raise UsageError(f"run {data.run_dir} has no closed-loop returns; give a run of the external profile "
                         "(tmem-bench run all --profile external) as EXTERNAL_RUN")
    rows = rows.dropna(subset=["normalised_return"])
    scores = []
    for (task, train_level), group in rows.groupby(["task", "train_level"], sort=True):
        where = f"{task.removeprefix('popgym_')} @ {train_level}"
        scores.append(Score(f"{where} accuracy", "external", _by_seed(group, "accuracy")))
        scores.append(Score(f"{where} return", "external", _by_seed(group, "normalised_return")))
    mean = rows.groupby(["label", "seed"])["normalised_return"].mean().reset_index()
    scores.append(Score("mean return over environments", "external", _by_seed(mean, "normalised_return")))
    return scores


def validity_table(toy_runs: list[RunData], external: RunData, n_boot: int = N_BOOT) -> pd.DataFrame:
    """One row per (toy score, external score): tau, its interval and the models it ranks."""
    toys = [s for data in toy_runs for s in toy_scores(data)]
    if not toys:
        raise UsageError("the toy runs have no memory-forcing variant; give runs such as docs/runs/study_converge "
                         "and docs/runs/capacity_converge as TOY_RUN")
    rows = [tau_interval(t, e, n_boot) for t in toys for e in external_scores(external)]
    table = pd.DataFrame(rows)
    table["models"] = [" ".join(m) for m in table["models"]]
    return table


def tau_text(row) -> str:
    if math.isnan(row["tau"]):
        return "-"
    interval = "" if math.isnan(row["low"]) else f" [{row['low']:+.2f}, {row['high']:+.2f}]"
    return f"{row['tau']:+.2f}{interval}"


def _critical_note(table: pd.DataFrame) -> str:
    n = int(table["n_models"].max()) if len(table) else 0
    if not 2 <= n <= 9:
        return ""
    t = critical_tau(n)
    if math.isnan(t):
        return f" With {n} models no tau is told from 0 at the 5% level by an exact permutation test."
    return (f" With {n} models an exact permutation test tells a tau from 0 at the 5% level only where "
            f"|tau| >= {t:.2f}; the intervals also carry the seeds' noise.")


def validity_markdown(table: pd.DataFrame, toy_dirs: list[str], external_dir: str, n_boot: int) -> str:
    """The table as markdown (made with `n_boot` resamples): a row per toy score, a column per external score."""
    externals = list(dict.fromkeys(table["external"]))
    lines = [
        "# External validity: Kendall's tau between toy and external rankings", "",
        f"Toy runs: {', '.join(toy_dirs)}. External run: {external_dir}. Each entry is Kendall's tau-b between "
        f"the models' rankings by the two scores (mean over seeds), with its {CI_LEVEL:.0%} percentile bootstrap "
        f"interval from resampling each model's seeds ({n_boot} resamples, seeded). +1: the toy score orders the "
        "models as the external one does; 0: no relation; -1: the reverse." + _critical_note(table), "",
        "| toy score | " + " | ".join(externals) + " |",
        "|---|" + "---|" * len(externals),
    ]
    for toy, group in table.groupby("toy", sort=False):
        by_external = {r["external"]: tau_text(r) for _, r in group.iterrows()}
        lines.append(f"| {toy} | " + " | ".join(by_external.get(e, "-") for e in externals) + " |")
    models = sorted({m for ms in table["models"] for m in ms.split()})
    lines += ["", f"Models ranked (those both runs trained): {', '.join(models)}.", ""]
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
    ax.set_title("toy score (rows) vs external score (columns)", fontsize=8)
    return fig


def write_validity(toy_dirs: list[str], external_dir: str, out: Path, n_boot: int = N_BOOT) -> pd.DataFrame:
    """validity.md, validity.csv and validity.png (and .svg) in `out`; the table."""
    from ..files import write_atomic
    from .figures import save_figure

    table = validity_table([load_run(d) for d in toy_dirs], load_run(external_dir), n_boot)
    out.mkdir(parents=True, exist_ok=True)
    write_atomic(out / "validity.csv", table.to_csv(index=False, float_format="%.6g").encode())
    text = validity_markdown(table, toy_dirs, external_dir, n_boot) + "\n![tau heatmap](validity.png)\n"
    write_atomic(out / "validity.md", text.encode())
    import matplotlib.pyplot as plt

    fig = validity_figure(table)
    save_figure(fig, out, "validity", tight=True)
    plt.close(fig)
    return table
