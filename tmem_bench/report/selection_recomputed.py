"""The learning-rate choices a report shows, made again from the run's cells (harness/selection.py
chooses during the run; report/selection_table.py draws the table).

selection.json says which cells are the trials of which search; every choice is then recomputed
from those trials' results by the rule the run chose with (selection.choose), as resume and submit
do, so that an edited or stale file never makes the report show a trial that was not chosen. A
file the cells cannot check (malformed, naming trials its grid does not plan, or missing where the
manifest planned cells after a selection) is refused with one line. Before a run's first selection
writes the file, its searches' trials are told apart by the plan alone (`_unchosen_trials`).
"""
from __future__ import annotations

import json
from dataclasses import replace
from typing import TYPE_CHECKING

from ..errors import UsageError
from ..harness.rundir import RunDir, finite_json

if TYPE_CHECKING:
    from ..harness.plan import LRSearch

REWRITE = "rerun the run's command to write it again from the cells"
UNCHOSEN = "no learning rate chosen yet for"  # opens each problem line of a search still choosing


def _name(record: dict) -> str:
    variant = "" if record["variant"] == "standard" else f" [{record['variant']}]"
    return f"the search of {record['task']}{variant} {record['label']} @ {record['train_level']}"


def _search(record: dict, by_id: dict[str, dict]) -> LRSearch | None:
    """The search a record stands for, its trials planned from one of them that has a result (they
    differ in their lr alone); None where none has."""
    from ..harness.plan import LRSearch, cell_from_dict

    stored = [t["cell_id"] for t in record["trials"] if t["cell_id"] in by_id]
    if not stored:
        return None
    try:
        anchor = cell_from_dict(by_id[stored[0]]["cell"])
    except TypeError as e:
        raise UsageError(f"cell file cells/{stored[0]}.json does not describe a cell of this suite ({e})") from None
    trials = tuple(replace(anchor, train={**anchor.train, "lr": t["lr"]}) for t in record["trials"])
    unplanned = [t["cell_id"] for t, cell in zip(record["trials"], trials) if t["cell_id"] != cell.id]
    if unplanned:
        raise UsageError(f"selection.json: {_name(record)} lists trial(s) {', '.join(unplanned)}, not the cells its "
                         f"grid plans from its trial {stored[0]}; {REWRITE}")
    return LRSearch(trials, tuple(record["seeds"]), second_seed=record.get("second_seed"))


def _unchosen_trials(results: list[dict], entries: list) -> tuple[set[str], list[str]]:
    """The trials of searches with no lr chosen yet, and a line for each, in a run that has no
    selection.json: cells the manifest plans under one description, which the finished ones show to
    differ in their lr alone. Left in, the trials of one model would read as seeds of one point."""
    planned: dict[str, list[str]] = {}
    for e in entries:
        if isinstance(e, dict) and not e.get("after_selection") and isinstance(e.get("describe"), str):
            planned.setdefault(e["describe"], []).append(e.get("id"))
    by_id = {r["cell_id"]: r for r in results}
    left_out, problems = set(), []
    for described, ids in planned.items():
        finished = [by_id[i]["cell"] for i in ids if i in by_id]
        without_lr = {json.dumps({**c, "train": {k: v for k, v in c["train"].items() if k != "lr"}}, sort_keys=True)
                      for c in finished}
        if len(ids) > 1 and finished and len(without_lr) == 1:
            left_out |= {i for i in ids if i in by_id}
            problems.append(f"{UNCHOSEN} the search of {described} (selection.json is written "
                            f"once the run's trials are finished): its {len(finished)} finished trial(s) are left out")
    return left_out, problems


def searches(run_dir: RunDir, results: list[dict], manifest: dict | None) -> tuple[list[dict], set[str], list[str]]:
    """(each search's record as its trials' results make it; the cells the report leaves out, every
    cell of a search at an lr not chosen; one problem line per search that selection.json states
    otherwise, or that has no lr chosen yet)."""
    try:
        written = run_dir.selection()
    except ValueError as e:
        raise UsageError(f"{e}; the report cannot tell the learning-rate trials from the chosen cells: "
                         f"{REWRITE}") from None
    by_id = {r["cell_id"]: r for r in results}
    records, left_out, explained, problems = [], set(), set(), []
    for record in written:
        search = _search(record, by_id)
        if search is None:
            problems.append(f"no trial of {_name(record)} has a readable result: its cells are left out")
            left_out |= set(record["final_cells"])
            explained |= set(record["final_cells"])
            records.append({**record, "chosen_lr": None, "at_edge": None, "final_cells": []})
            continue
        from ..harness.selection import choose

        chosen = finite_json(choose(search, by_id, margin=record.get("second_seed_margin")))
        differs = [k for k in dict.fromkeys([*chosen, *record]) if chosen.get(k) != record.get(k)]
        lr = "none yet" if chosen["chosen_lr"] is None else f"lr {chosen['chosen_lr']:g}"
        if differs:
            problems.append(f"selection.json disagrees with the cells on {_name(record)} ({', '.join(differs)}): "
                            f"the report shows the choice its trials' results make ({lr}); {REWRITE}")
        if chosen["chosen_lr"] is None:
            problems.append(f"{UNCHOSEN} {_name(record)}: its trials are left out")
        seeds = (*search.seeds, *([search.second_seed] if search.second_seed is not None else []))
        later = {replace(trial, seed=seed).id for trial in search.trials for seed in seeds}
        shown = {c.id for c in search.trials if c.train["lr"] == chosen["chosen_lr"]} | set(chosen["final_cells"])
        left_out |= ({c.id for c in search.trials} | later) - shown
        explained |= later
        records.append(chosen)
    entries = manifest.get("cells") if isinstance(manifest, dict) else None
    entries = entries if isinstance(entries, list) else []
    if not written and not run_dir.selection_path.exists():
        unchosen, lines = _unchosen_trials(results, entries)
        left_out |= unchosen
        problems += lines
    after = {e["id"] for e in entries if isinstance(e, dict) and e.get("after_selection")}
    if after - explained:
        what = "is missing" if not written and not run_dir.selection_path.exists() else "records no search of them"
        raise UsageError(f"manifest.json plans {len(after - explained)} cell(s) after a learning-rate selection, but "
                         f"selection.json {what}: the report cannot tell the trials from the chosen cells; {REWRITE}")
    return records, left_out, problems
