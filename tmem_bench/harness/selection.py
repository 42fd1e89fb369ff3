"""Learning-rate selection, the rule (one of three modules, named by what each does): this one chooses
each search's lr during a run (the runner and the leaderboard's entries call `choose`);
report/selection_recomputed.py makes the choices again from a run's cells for the report, by this rule;
report/selection_table.py draws the report's table of them.

Each search's lr is chosen from its trials' accuracy on the validation set (never the evaluation
sets), the same rule for every model, as zoology reports each model at its best of a learning-rate
grid. Where a search has a second selection seed and its best two lrs
are within the margin of thresholds.toml's [selection], one seed cannot tell them apart: both are
trained at the second seed too and the mean over the two seeds chooses."""
from __future__ import annotations

from ..contracts.task import level_key
from ..thresholds import thresholds
from .plan import Cell, LRSearch


def load_margin() -> float:
    return float(thresholds()["selection"]["second_seed_margin"])


def _trial(cell: Cell, results: dict[str, dict]) -> dict:
    result = results.get(cell.id)
    validation = (result or {}).get("validation") or {}
    return {"lr": cell.train["lr"], "cell_id": cell.id, "accuracy": validation.get("accuracy"),
            "loss": validation.get("loss"), "status": (result or {}).get("status")}


def _rank(t: dict) -> tuple:
    """Best first: a diverged trial below every finished one, then the higher validation accuracy,
    the lower validation loss, the smaller lr."""
    return t["status"] == "diverged", -t["accuracy"], t["loss"], t["lr"]


def choose(search: LRSearch, results: dict[str, dict], margin: float | None = None) -> dict:
    """The selection record of one search from the finished cell results (id -> result): the
    validation accuracy at every lr, the lr chosen and whether it lies at an edge of the grid.
    The best validation accuracy wins (see _rank). With a second selection seed, where the best
    two are both finished and within `margin` (thresholds.toml's by default) of each other, those two
    (`second_seed_lrs`) are trained at it as well and ranked by their mean over both seeds.
    `chosen_lr` is None while a trial it needs has no result (`missing`)."""
    first = search.trials[0]
    trials = [_trial(cell, results) for cell in search.trials]
    record = {
        "task": first.task, "variant": first.variant, "label": first.label, "model": first.model,
        "train_level": level_key(first.train_level), "grid": sorted(search.grid), "selection_seed": first.seed,
        "seeds": list(search.seeds), "trials": trials, "chosen_lr": None, "at_edge": None, "final_cells": [],
    }
    if any(t["accuracy"] is None for t in trials):
        record["missing"] = [t["cell_id"] for t in trials if t["accuracy"] is None]
        return record
    best, runner_up = sorted(trials, key=_rank)[:2]
    if search.second_seed is not None:
        margin = load_margin() if margin is None else margin
        close = ("diverged" not in (best["status"], runner_up["status"])
                 and best["accuracy"] - runner_up["accuracy"] <= margin)
        lrs = sorted((best["lr"], runner_up["lr"])) if close else []
        record.update(second_seed=search.second_seed, second_seed_margin=margin, second_seed_lrs=lrs)
        if close:
            second = [_trial(cell, results) for cell in search.second_trials(lrs)]
            record["second_trials"] = second
            if any(t["accuracy"] is None for t in second):
                record["missing"] = [t["cell_id"] for t in second if t["accuracy"] is None]
                return record
            means = [_mean([t for t in trials if t["lr"] == lr][0], s) for lr, s in zip(lrs, second)]
            record["second_seed_means"] = means
            best = min(means, key=_rank)
    record["chosen_lr"] = best["lr"]
    record["at_edge"] = best["lr"] in (min(search.grid), max(search.grid))
    record["final_cells"] = [c.id for c in search.finals(best["lr"])]
    return record


def one_seed_lr(record: dict) -> float | None:
    """The lr a selection record's first seed chooses alone (what a search without a second
    seed chooses), from the trials it holds; None while one has no result."""
    trials = record.get("trials") or []
    if not trials or any(t.get("accuracy") is None for t in trials):
        return None
    return min(trials, key=_rank)["lr"]


def _mean(a: dict, b: dict) -> dict:
    """Two seeds' trials at one lr as one: their mean validation accuracy and loss, diverged where
    either diverged."""
    return {"lr": a["lr"], "accuracy": (a["accuracy"] + b["accuracy"]) / 2, "loss": (a["loss"] + b["loss"]) / 2,
            "status": "diverged" if "diverged" in (a["status"], b["status"]) else a["status"]}
