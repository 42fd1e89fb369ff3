"""`tmem-bench leaderboard fetch`: the weights a board's entries reference, into the local cache.

Only an entry that its schema admits is fetched for, so that every record names a hash and a
size before a byte is downloaded; `validate` then judges the entry whole. Fetching needs no model:
this module imports neither torch nor the harness (guard.py, weights.py).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..errors import UsageError
from .guard import entry_dirs, find_schema, not_readable
from .weights import fetch, weights_cache


def fetch_board(path="leaderboard", allow_file_urls: bool = False) -> int:
    """Fetch for every entry under `path` (a board, its entries folder or one entry); prints a line
    per entry that references weights and one per failure (stderr). Exit status 1 on a failure."""
    from jsonschema import Draft202012Validator

    path = Path(path)
    if not path.exists():
        raise UsageError(f"{path} does not exist; give a leaderboard folder, an entries folder or an entry")
    validator = Draft202012Validator(json.loads(find_schema(path).read_text()))
    failed = held = 0
    for entry_dir in entry_dirs(path):
        refused = not_readable(entry_dir / "entry.json", entry_dir)
        try:
            entry = None if refused else json.loads((entry_dir / "entry.json").read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            refused = f"unreadable ({type(e).__name__})"
        error = None if refused else next(iter(validator.iter_errors(entry)), None)
        if refused or error is not None:
            print(f"{entry_dir.name}: entry.json {refused or 'schema: ' + error.message}; nothing fetched",
                  file=sys.stderr)
            failed += 1
            continue
        if not any("url" in r for r in (entry.get("weights") or {}).values()):
            held += 1
            continue
        fetched, cached, failures = fetch(entry, allow_file_urls)
        print(f"{entry_dir.name}: {fetched} fetched, {cached} in the cache"
              + (f", {len(failures)} failed" if failures else ""))
        for line in failures:
            print(f"{entry_dir.name}: {line}", file=sys.stderr)
        failed += bool(failures)
    if held:
        print(f"{held} entr{'y holds' if held == 1 else 'ies hold'} {'its' if held == 1 else 'their'} weights "
              f"in {'its' if held == 1 else 'their'} folder: nothing to fetch")
    print(f"weights cache: {weights_cache()}")
    return 1 if failed else 0
