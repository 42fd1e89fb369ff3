"""What may be read of an entry, checked before a byte of it is read: shared by validate, show,
load_entry and fetch, so that none of them reads a file the others refuse.

This module imports neither torch nor the harness: `leaderboard fetch` needs these checks and
nothing that trains or evaluates a model.
"""
from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path

from ..errors import UsageError

SCHEMA_FILE = "entry.schema.json"
MAX_JSON_BYTES = 16 * 2**20  # entry.json and each cell file; the suite's own are well under a megabyte
CELL_ID = re.compile(r"[0-9a-f]{16}")  # the schema's pattern: a cell id names a file, so it may not be a path
SIZE_OPTIONS = ("d_model", "n_layers", "n_heads")  # every backbone factory's required arguments


def not_readable(path: Path, entry_dir: Path, limit: int = MAX_JSON_BYTES) -> str | None:
    """Why a file of an entry is not read, or None: it must be a regular file of the entry's own
    folder, reached through no link (so no message shows what another file holds), and not larger
    than `limit` (so that a huge or sparse file is refused before it is read). A FIFO or a device is
    refused from its stat, never opened (opening a FIFO blocks)."""
    if path.is_symlink():
        return "is a symbolic link; an entry's files are its own, and nothing outside the board is read"
    if not path.resolve().is_relative_to(entry_dir.resolve()):
        return "lies outside the entry's folder; nothing outside the board is read"
    try:
        info = path.stat()
    except OSError as e:
        return f"unreadable ({e.strerror})"
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    if info.st_size > limit:
        return f"is {info.st_size:,} bytes; an entry's file is read up to {limit:,} bytes"
    return None


def entry_folder_refused(entry_dir: Path) -> str | None:
    """Why an entry folder (or its cells/ folder) is not read, or None."""
    for where, path in (("the entry folder", entry_dir), ("its cells folder", entry_dir / "cells")):
        if path.is_symlink():
            return f"{where} is a symbolic link; an entry is a folder of the board, and nothing outside it is read"
    return None


def read_entry_json(entry_dir: Path) -> dict:
    """entry.json of an entry folder, read only past the checks above; ValueError says why not,
    never what the file holds."""
    refused = entry_folder_refused(entry_dir) or not_readable(entry_dir / "entry.json", entry_dir)
    if refused:
        raise ValueError(f"entry.json {refused}" if "folder" not in refused else refused)
    try:
        entry = json.loads((entry_dir / "entry.json").read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"entry.json is unreadable ({type(e).__name__}: {e})") from None
    if not isinstance(entry, dict):
        raise ValueError("entry.json is not a JSON object")
    return entry


def cell_path(entry_dir: Path, cell_id) -> Path:
    """The cell file an entry lists, once its id is a cell id (16 hexadecimal digits) and the file
    is one validation would read; ValueError otherwise."""
    if not isinstance(cell_id, str) or not CELL_ID.fullmatch(cell_id):
        shown = cell_id if isinstance(cell_id, (int, float)) else f"{str(cell_id)[:40]!r}"
        raise ValueError(f"entry.json lists the cell {shown}, which is not a cell id (16 hexadecimal digits)")
    path = entry_dir / "cells" / f"{cell_id}.json"
    refused = not_readable(path, entry_dir)
    if refused:
        raise ValueError(f"cells/{path.name} {refused}")
    return path


def size_problem(model_options) -> str | None:
    """What keeps a cell's model options from building a model (a missing or non-integer size), or
    None: said in one line before a factory is called with them."""
    if not isinstance(model_options, dict):
        return "model_options is not an object"
    for name in SIZE_OPTIONS:
        value = model_options.get(name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            return f"model_options.{name} is {value!r}, not a positive integer"
    return None


def find_schema(path: Path) -> Path:
    """entry.schema.json of the board `path` is (or whose entries folder or entry it is): in the
    board's folder or a folder above it, never in an entry or the entries folder, where an entry
    could ship a schema that admits anything."""
    board = Path(os.path.abspath(path))  # links resolved only above the board: an entry may be one
    if (board / "entry.json").exists() or (board / "entry.json").is_symlink():
        board = board.parent
    if board.name == "entries":
        board = board.parent
    board = board.resolve()
    for folder in [board, *board.parents]:
        if (folder / SCHEMA_FILE).is_file():
            return folder / SCHEMA_FILE
    raise UsageError(f"no {SCHEMA_FILE} in {path} or any folder above it; run from a clone of tmem-bench "
                     f"(it lives in leaderboard/)")


def entry_dirs(path: Path) -> list[Path]:
    """An entry folder itself, or every entry under `path/entries` or `path` (links too: validation
    rejects them by name)."""
    if (path / "entry.json").is_file() or (path / "entry.json").is_symlink():
        return [path]
    root = path / "entries" if (path / "entries").is_dir() else path
    if not root.is_dir():
        raise UsageError(f"{path} is neither an entry, nor an entries folder, nor a leaderboard folder")
    if root != path and root.is_symlink():
        raise UsageError(f"{root} is a symbolic link; a board's entries are a folder of the board, "
                         "and nothing outside the board is read")
    return sorted(p for p in root.iterdir() if (p.is_dir() or p.is_symlink()) and not p.name.startswith("."))
