"""Refresh: an entry's derived numbers rebuilt from its own cells with the installed suite's rules.

Every field `derived` (entry.py) returns is a function of the entry's cells, and validation
rebuilds it and compares. When a rule changes (intervals over seeds follow report/stats.py since
issue 43), a committed entry's stored numbers go stale while its cells, which validation
re-evaluates from the weights, stay right. Refresh rewrites those fields alone, atomically, and
records when and with which suite it did; cells, weights, the submitted time and the entry's
identity (name, model, profile, run, cells) are left as they are. It trusts the cells no more
than submit does: validation then checks the refreshed entry like any other.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path

from ..errors import UsageError
from ..files import write_json
from ..harness.plan import cell_from_dict
from ..harness.results import read_cell
from ..registry import get_task, module_names
from ..version import __version__
from .entry import derived, planned_cells
from .folder import held
from .guard import entry_dirs, find_schema, not_readable, read_entry_json
from .names import refused_names
from .submit import git_commit
from .validate import difference


def rebuilt(entry_dir: Path, validator, allow_module_names: bool = False) -> tuple[dict, dict]:
    """(the entry as stored, its derived fields as its cells give them now); UsageError says in one
    line why the entry cannot be rebuilt (validate says the same of it, and more)."""
    try:
        entry = read_entry_json(entry_dir)
    except ValueError as e:
        raise UsageError(str(e)) from None
    error = next(iter(validator.iter_errors(entry)), None)
    if error is not None:  # the cell ids below name files: only a well-formed entry's are read
        raise UsageError(f"entry.json schema: {error.message[:200]}")
    results = {}
    for cell_id in entry["cells"]:
        path = entry_dir / "cells" / f"{cell_id}.json"
        refused = not_readable(path, entry_dir)
        if refused:
            raise UsageError(f"cells/{path.name} {refused}")
        try:
            results[cell_id] = read_cell(path)
        except ValueError as e:
            raise UsageError(str(e)) from None
    refused = refused_names(entry, results, allow_module_names)
    if refused:  # nothing is planned from a name validation refuses (planning imports it)
        raise UsageError(": ".join(refused[0]))
    for cell_id, result in results.items():
        # What validate checks of each cell before anything else: its id is the hash of its settings,
        # and its task takes its option values (a task refuses a bad one when it is made, as validate
        # makes it to regenerate the evaluation set), so refresh never rewrites an entry validate refuses.
        try:
            if cell_from_dict(result["cell"]).id != cell_id:
                raise UsageError("the file name is not the hash of the cell's settings")
            get_task(result["cell"]["task"], **result["cell"]["task_options"])
        except (KeyError, TypeError, ValueError) as e:  # UsageError is a ValueError
            raise UsageError(f"cells/{cell_id}.json: {e}") from None
    _, shown, _ = planned_cells(entry["run"], entry["profile"], results)
    return entry, derived([r for r in results.values() if r["cell_id"] in shown])


def refresh(leaderboard_dir="leaderboard", slugs: list[str] | None = None,
            allow_module_names: bool = False) -> tuple[list[str], list[str], list[str]]:
    """Rebuild the derived fields of the entries `slugs` (default: every entry) of the board, under
    its lock. Returns (refreshed, unchanged, one line per entry that could not be rebuilt); an entry
    whose stored fields already are what its cells give is not rewritten."""
    from jsonschema import Draft202012Validator

    board = Path(leaderboard_dir)
    if not (board / "entries").is_dir():
        raise UsageError(f"{str(board)!r} is not a leaderboard folder (it has no entries/ folder)")
    schema = json.loads(find_schema(board).read_text())
    validator = Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)
    known = {d.name: d for d in entry_dirs(board)}
    unknown = [s for s in slugs or [] if s not in known]
    if unknown:
        raise UsageError(f"no entry {', '.join(unknown)} in {board / 'entries'}; give entry folder names")
    record = {"at": datetime.now(timezone.utc).isoformat(timespec="seconds"), "tmem_bench_version": __version__,
              "git": git_commit()}
    refreshed, unchanged, failed = [], [], []
    with held(board), module_names(allow_module_names):
        for slug in slugs or sorted(known):
            try:
                entry, fresh = rebuilt(known[slug], validator, allow_module_names)
            except UsageError as e:
                failed.append(f"{slug}: {e}")
                continue
            if all(difference(entry[key], value) is None for key, value in fresh.items()):
                unchanged.append(slug)
                continue
            new = {**entry, **fresh, "refreshed": record}
            error = next(iter(validator.iter_errors(new)), None)
            if error is not None:  # never write an entry validate would refuse by its shape
                failed.append(f"{slug}: the rebuilt entry does not fit the schema: {error.message[:200]}")
                continue
            write_json(known[slug] / "entry.json", new)
            refreshed.append(slug)
    return refreshed, unchanged, failed
