"""A preview: a run's models drawn beside the published board, never into it, in about a minute.

Re-evaluating every published cell on a fresh clone takes most of an hour, and the published
entries passed that validation when the board was built (CI runs it on every pull request), so a
preview re-evaluates only the run's own cells, as `validate` would once it is submitted, and draws
the published entries with the numbers their committed entry.json files give: read as validation
reads a file (guard.py), checked against the board's schema, not re-evaluated. `build --with RUN
--full` validates the whole board first, as `build` does.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import UsageError
from .board import GENERATED, build_pages
from .folder import tidy
from .guard import SCHEMA_FILE, entry_dirs, find_schema, read_entry_json


def preview_entries(run_dir) -> list[tuple[Path, dict, list[dict]]]:
    """A run's models as entries (made from its cells as submit would make them, marked 'preview'),
    with the cell results each was made from, or a one-line error when the run is not one that could
    be submitted."""
    from .submit import make_entries

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise UsageError(f"--with {str(run_dir)!r} is not a run directory")
    return [(Path(f"preview-{slug}"), {**entry, "name": f"{entry['model']['label']} (preview)", "preview": True},
             results) for slug, entry, results in make_entries(run_dir, "preview", weights=False)]


def preview_folder(run_dir, out, leaderboard_dir) -> Path:
    """Where a preview goes (`out`, default RUN_DIR/board-preview): never a leaderboard folder nor a
    folder inside the board's, and never over a README.md that is not a board (`--out .` in a clone)."""
    folder = Path(out) if out is not None else Path(run_dir) / "board-preview"
    where, board = folder.resolve(), Path(leaderboard_dir).resolve()
    if where.is_relative_to(board) or (folder / "entries").is_dir() or (folder / SCHEMA_FILE).is_file():
        raise UsageError(f"--out {str(folder)!r} is {'in ' * (where != board)}the leaderboard folder; a preview "
                         f"is written elsewhere (default RUN_DIR/board-preview), the board only by build")
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--out {str(folder)!r} is a file, not a folder; give a folder for the preview's pages")
    for name in ("README.md", "index.html"):
        if (folder / name).is_dir():
            raise UsageError(f"{folder / name} is in the way: a folder where the preview's {name} goes; remove it "
                             f"or give another folder")
    readme = folder / "README.md"
    if readme.is_file() and GENERATED not in readme.read_text(errors="replace"):
        raise UsageError(f"--out {str(folder)!r} holds a README.md that is not a board; give an empty folder "
                         f"or an earlier preview's")
    return folder


def committed(leaderboard_dir) -> tuple[list[tuple[Path, dict]], list[str]]:
    """(the board's published entries as committed, one line per entry left out): each entry.json read
    as validation reads it and checked against the board's schema; nothing re-evaluated, nothing the
    entries name imported."""
    from jsonschema import Draft202012Validator

    board = Path(leaderboard_dir)
    if not board.is_dir():
        raise UsageError(f"--leaderboard {str(board)!r} is not a leaderboard folder")
    validator = Draft202012Validator(json.loads(find_schema(board).read_text()))
    entries, left_out = [], []
    for entry_dir in entry_dirs(board):
        try:
            entry = read_entry_json(entry_dir)
        except ValueError as e:
            left_out.append(f"{entry_dir.name}: {e}")
            continue
        error = next(iter(validator.iter_errors(entry)), None)
        drawn = {(s["task"], s["variant"]) for s in entry["settings"]} if error is None else set()
        if error is None and any((s["task"], s["variant"]) not in drawn for s in entry["scores"]):
            left_out.append(f"{entry_dir.name}: a score without its settings")
        elif error is not None:
            left_out.append(f"{entry_dir.name}: entry.json schema: {error.message[:200]}")
        else:
            entries.append((entry_dir, entry))
    return entries, left_out


def reevaluate_run(run_dir, previews: list[tuple[Path, dict, list[dict]]], progress: bool = False) -> list[str]:
    """The run's own cells re-evaluated from its weights, as `validate` will re-evaluate them once
    submitted: one line per number the weights do not give back (none: the entry would pass)."""
    from .cache import Recheck
    from .reeval import reevaluate

    run_dir = Path(run_dir)
    lines: list[str] = []
    cells = sum(len(results) for _, _, results in previews)
    note = f"re-evaluating the run's {cells} cells from their weights, as validate will once they are submitted"
    with Recheck(cells, progress, note) as recheck:
        for slug, entry, results in previews:
            def reject(where: str, reason: str, label=entry["model"]["label"]) -> None:
                lines.append(f"{label}: {where}: {reason}")

            recheck.run(run_dir, {k: v for k, v in entry.items() if k != "weights"},
                        {r["cell_id"]: r for r in results}, reject, reevaluate, name=entry["name"])
    return lines


def preview(out: Path, rows: list[tuple[Path, dict]], accepted: list[tuple[Path, dict]],
            banner: str) -> tuple[Path, Path]:
    """The board with a run's preview entries beside the published ones, written to `out` (from
    preview_folder) under `banner`, where what a killed preview left is removed first."""
    if out.is_dir():
        tidy(out)
    return build_pages(out, accepted + rows, banner)


def banner(run_dir, published: int, reevaluated: bool) -> str:
    """What the preview's page says first: that it is a preview, whose rows are the run's, and where
    the published numbers come from."""
    source = ("re-evaluated here from their weights (--full)" if reevaluated else
              "as committed to the board, validated when it was built; not re-evaluated here (--full does)")
    return (f"Preview, not the published board: the models of the run {Path(run_dir).name} (highlighted, "
            f"marked \"preview\") beside {published} published entries, shown {source}. A model with fewer than "
            f"3 seeds is unranked; its rank says where it would stand with 3 seeds at the same score.")
