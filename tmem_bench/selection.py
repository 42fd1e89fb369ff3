"""Learning-rate selection: each search's lr chosen from its trials' accuracy on the validation
set (never the evaluation sets), the same rule for every model, as zoology reports each model at
its best of a learning-rate grid."""
from __future__ import annotations

from .plan import LRSearch
from .task import level_key


def choose(search: LRSearch, results: dict[str, dict]) -> dict:
    """The selection record of one search from the finished cell results (id -> result): the
    validation accuracy at every lr, the lr chosen and whether it lies at an edge of the grid.
    The best validation accuracy wins; a trial that diverged ranks below every finished one; ties
    go to the lower validation loss, then to the smaller lr. `chosen_lr` is None while a trial
    has no result."""
    first = search.trials[0]
    trials = []
    for cell in search.trials:
        result = results.get(cell.id)
        validation = (result or {}).get("validation") or {}
        trials.append({"lr": cell.train["lr"], "cell_id": cell.id, "accuracy": validation.get("accuracy"),
                       "loss": validation.get("loss"), "status": (result or {}).get("status")})
    record = {
        "task": first.task, "variant": first.variant, "label": first.label, "model": first.model,
        "train_level": level_key(first.train_level), "grid": sorted(search.grid), "selection_seed": first.seed,
        "seeds": list(search.seeds), "trials": trials, "chosen_lr": None, "at_edge": None, "final_cells": [],
    }
    if any(t["accuracy"] is None for t in trials):
        record["missing"] = [t["cell_id"] for t in trials if t["accuracy"] is None]
        return record
    best = min(trials, key=lambda t: (t["status"] == "diverged", -t["accuracy"], t["loss"], t["lr"]))
    record["chosen_lr"] = best["lr"]
    record["at_edge"] = best["lr"] in (min(search.grid), max(search.grid))
    record["final_cells"] = [c.id for c in search.finals(best["lr"])]
    return record
