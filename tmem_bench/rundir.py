"""The run directory as the single source of truth: one writer at a time, one plan per
directory, nothing left half-written.

The lock is an advisory `flock` on `.lock`, which the kernel releases when its process
dies however it dies, so a killed run never blocks the next one; the file keeps the
holder's PID, host and start time to name it in the message a second writer gets.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
from datetime import datetime, timezone
from pathlib import Path

from .errors import UsageError

LOCK_NAME = ".lock"


def prepare_run_dir(run_dir: Path) -> Path:
    """Create the run directory (or check the existing one) before anything is trained."""
    run_dir = Path(run_dir)
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"--out {str(run_dir)!r} exists and is not a directory")
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--out {str(run_dir)!r} cannot be created: {e.strerror}") from None
    if not os.access(run_dir, os.W_OK | os.X_OK):
        raise UsageError(f"--out {str(run_dir)!r} is not writable")
    return run_dir


@contextlib.contextmanager
def run_lock(run_dir: Path, say=print):
    """Hold the run directory's lock for the duration of the block; a second holder is refused."""
    path = Path(run_dir) / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UsageError(f"run directory {str(run_dir)!r} is in use by {_holder(path)}; "
                             "wait for it to finish or stop it, then rerun to resume") from None
        previous = _read_holder(path)
        if previous:
            say(f"taking over the lock of an earlier run that ended without releasing it "
                f"(pid {previous.get('pid')} on {previous.get('host')})")
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                  "since": datetime.now(timezone.utc).isoformat()}).encode(), 0)
        try:
            yield
        finally:
            os.ftruncate(fd, 0)  # released cleanly: an empty lock file names no earlier holder
    finally:
        os.close(fd)  # closing releases the flock


def _read_holder(path: Path) -> dict | None:
    try:
        holder = json.loads(path.read_text() or "null")
    except (OSError, json.JSONDecodeError):
        return None
    return holder if isinstance(holder, dict) else None


def _holder(path: Path) -> str:
    holder = _read_holder(path) or {}
    return f"process {holder.get('pid', '?')} on {holder.get('host', '?')} (since {holder.get('since', '?')})"


def remove_stale_temporaries(run_dir: Path) -> list[Path]:
    """Temporary files of the atomic writer left by a killed process (only the lock holder may call this)."""
    stale = [p for folder in (run_dir, run_dir / "cells") for p in folder.glob(".*.tmp")]
    for path in stale:
        path.unlink(missing_ok=True)
    return stale


def planned_cells(manifest) -> dict[str, str | None]:
    """Planned cell id -> its description (None in manifests written before descriptions were stored)."""
    entries = manifest.get("cells", []) if isinstance(manifest, dict) else []
    if not isinstance(entries, list):
        raise UsageError(f"manifest.json: 'cells' must be a list, got {type(entries).__name__}")
    return dict((e["id"], e.get("describe")) if isinstance(e, dict) else (e, None) for e in entries)


def plan_to_record(run_dir: Path, cells, settings: dict, append: bool) -> list[dict]:
    """The planned cells the manifest is to hold: this plan's, and with `append` also those an
    existing manifest plans. A different plan without `append` is a UsageError naming the
    difference, so results of two plans never mix silently."""
    ours = {c.id: c.describe() for c in cells}
    path = Path(run_dir) / "manifest.json"
    earlier: dict = {}
    chosen: set = set()
    if path.is_file():
        try:
            manifest = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise UsageError(f"{path} is unreadable ({e}); move it away or use another --out") from None
        if not isinstance(manifest, dict):
            raise UsageError(f"{path} is not a run manifest")
        earlier = planned_cells(manifest)
        # Cells planned after a learning-rate selection follow from the others' results.
        chosen = {e["id"] for e in manifest.get("cells", []) if isinstance(e, dict) and e.get("after_selection")}
        if set(earlier) - chosen != set(ours) and not append:
            old = manifest.get("settings") or {}
            changed = [f"{k}: {old.get(k)!r} -> {settings.get(k)!r}" for k in sorted(set(old) | set(settings))
                       if old.get(k) != settings.get(k)]
            what = "; ".join(changed) or f"{len(set(earlier) ^ set(ours))} planned cells differ"
            raise UsageError(f"run directory {str(run_dir)!r} holds another plan ({what}); "
                             "use another --out, or --append to add this plan's cells to it")
    kept = [{"id": k, "describe": v, **({"after_selection": True} if k in chosen else {})}
            for k, v in earlier.items() if k not in ours]
    return kept + [{"id": k, "describe": v} for k, v in ours.items()]
