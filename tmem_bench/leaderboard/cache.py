"""Incremental validation: an entry is re-evaluated only when something its verdict depends on changed.

A record says: an entry whose folder hashes to KEY was valid on this machine. KEY hashes every file
of the entry's folder (entry.json, cell files, held weights; referenced weights count through the
sha256 that entry.json records) with everything else the verdict depends on: the suite's version
and source (a changed task or model may move a number), the board's schema, torch's version and
the CPU and instruction set, which set how close a re-evaluation comes to the stored numbers
(reeval.py), the validation's own options, and the installed version and source of a plug-in
model or task. The entry's name and place do not count: a copy of a board shares its records.

The records are this machine's, in the user's cache folder (validation.json beside the weights
cache, TMEM_BENCH_CACHE), never in the board. A record says only "this exact content was valid",
so a record that came with the repository would let a pull request mark a forged entry valid:
nothing of the board, nor anything a pull request can edit, is ever read as a record. Validating
writes nothing into the board, and a fresh machine (CI) re-evaluates everything; --full, for CI
and the test of the committed board, reads no record at all.
"""
from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from ..files import write_json
from .progress import ReevalProgress
from .weights import MAX_WEIGHTS_BYTES, Unreachable, cache_root, locate, metadata_mismatch, record_problems

CACHE_FILE = "validation.json"
MAX_RECORDS = 20_000  # a few MB; the oldest go first
MAX_ENTRY_BYTES = 16 << 20  # entry.json read for its plug-in names; validation refuses larger ones anyway
SOURCE_SUFFIXES = (".py", ".toml", ".json", ".c", ".so")  # .so: the native scan, built for this machine


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _folder_digest(folder: Path) -> str | None:
    """Every file under `folder` by relative path and content, a link by its target (never followed);
    None for what validation refuses unread (a linked folder, a special file, a file past the
    weights' bound), which is then never looked up, nor recorded."""
    if folder.is_symlink():
        return None
    digest = hashlib.sha256()
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for name in sorted(files + [d for d in dirs if os.path.islink(os.path.join(root, d))]):
            path = Path(root, name)
            rel = path.relative_to(folder).as_posix()
            if path.is_symlink():
                digest.update(f"{rel}\0link {os.readlink(path)}\n".encode())
                continue
            info = path.stat()
            if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_WEIGHTS_BYTES:
                return None
            digest.update(f"{rel}\0file {_file_digest(path)}\n".encode())
    return digest.hexdigest()


def source_digest() -> str:
    """The installed suite's own code: the package and its tasks and baselines, wherever installed."""
    import importlib.util

    folders = []
    for name in ("tmem_bench", "tmem_bench.tasks", "tmem_bench.baselines"):
        spec = importlib.util.find_spec(name)
        folders += list(spec.submodule_search_locations or []) if spec else []
    digest = hashlib.sha256()
    for folder in dict.fromkeys(Path(f).resolve() for f in folders):
        for path in sorted(folder.rglob("*")):
            if path.suffix in SOURCE_SUFFIXES and "__pycache__" not in path.parts and path.is_file():
                digest.update(f"{folder.name}/{path.relative_to(folder).as_posix()}\0{_file_digest(path)}\n".encode())
    return digest.hexdigest()


def environment(schema: Path) -> dict:
    """What a verdict depends on besides the entry's own files."""
    import torch

    from ..contracts.device import hardware
    from ..version import __version__

    return {"tmem_bench_version": __version__, "source": source_digest(), "schema": _file_digest(schema),
            "torch_version": torch.__version__, "hardware": hardware(torch.device("cpu"))}


def _plugins(entry: dict) -> list[str]:
    """The version and source of any plug-in model or task the entry names: their code is not the
    suite's. Found on sys.path without importing anything: the entry is not validated yet."""
    from importlib import metadata

    from ..registry import BUILTIN_MODELS, BUILTIN_TASKS
    from .names import is_module_name

    try:
        wanted = {("tmem_bench.models", entry["model"]["name"]),
                  *(("tmem_bench.tasks", setting["task"]) for setting in entry["settings"])}
    except (KeyError, TypeError):
        return []  # validation rejects the entry, so no record is ever written for this key
    out = []
    for group, name in sorted(wanted, key=str):
        if not isinstance(name, str) or name in BUILTIN_MODELS or name in BUILTIN_TASKS:
            continue
        if ":" in name and not is_module_name(name):
            out.append(f"{name} refused")  # validation refuses it; no file it names is opened (a path)
            continue
        found = [(name, name.partition(":")[0], None)] if ":" in name else [
            (ep.value, ep.module, ep.dist) for ep in metadata.entry_points(group=group, name=name)]
        for value, module, dist in found:
            source = _module_file(module)
            out.append(f"{value} {dist.name if dist else None} {dist.version if dist else None} "
                       f"{_file_digest(source) if source else None}")
    return out


def _module_file(module: str) -> Path | None:
    for base in sys.path:
        stem = Path(base or ".", *module.split("."))
        for path in (stem.with_suffix(".py"), stem / "__init__.py"):
            if path.is_file():
                return path
    return None


class ValidationCache:
    """This machine's records; with `full`, none is read (they are still written). `options`: the
    validation's own settings that change a verdict (a record holds for the same ones only)."""

    def __init__(self, schema: Path, full: bool = False, options: dict | None = None, say=None):
        self.path = cache_root() / CACHE_FILE
        self.full = full
        self._say = say or (lambda line: print(line, file=sys.stderr))
        self._env = {**environment(Path(schema)), "options": options or {}}
        self._keys: dict[Path, tuple[str | None, dict | None]] = {}
        self._new: dict[str, dict] = {}
        self._told: set[str] = set()
        self._records = self._load(tell=True)

    def _tell(self, line: str) -> None:
        if line not in self._told:
            self._told.add(line)
            self._say(f"validation records: {line}")

    def _load(self, tell: bool = False) -> dict:
        """The records on disk that have the shape validation writes; any other is treated as absent
        (its entry is validated again), and, with `tell`, said so in one line."""
        if not self.path.exists() and not self.path.is_symlink():
            return {}
        problem, records = None, {}
        if not self.path.is_file():
            problem = f"{self.path} is not a file; every entry is validated again, and no record is written"
        else:
            try:
                records = json.loads(self.path.read_text()).get("records")
            except (OSError, UnicodeDecodeError, ValueError, AttributeError) as e:
                problem = f"{self.path} is unreadable ({type(e).__name__}); every entry is validated again"
            if not isinstance(records, dict):
                records, problem = {}, problem or f"{self.path} holds no records; every entry is validated again"
        good = {key: summary for key, summary in records.items() if _well_formed(summary)}
        if len(good) < len(records):
            problem = (f"{len(records) - len(good)} of the {len(records)} records in {self.path} are malformed and "
                       f"treated as absent (their entries are validated again)")
        if problem and tell:
            self._tell(problem)
        return good

    def _key(self, entry_dir: Path) -> tuple[str | None, dict | None]:
        """(the key of the entry's content or None, the entry as read while hashing it)."""
        if entry_dir not in self._keys:
            folder = _folder_digest(entry_dir)
            path = entry_dir / "entry.json"
            try:
                small = folder is not None and not path.is_symlink() and path.stat().st_size <= MAX_ENTRY_BYTES
                entry = json.loads(path.read_bytes()) if small else None
            except (OSError, ValueError):
                entry = None
            parts = {"env": self._env, "entry": folder, "plugins": _plugins(entry) if isinstance(entry, dict) else []}
            key = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest() if folder else None
            self._keys[entry_dir] = (key, entry)
        return self._keys[entry_dir]

    def get(self, entry_dir: Path) -> tuple[dict, dict] | None:
        """(the entry, what its validation recomputed) when this content was validated here before."""
        if self.full:
            return None
        key, entry = self._key(entry_dir)
        summary = self._records.get(key) if key else None
        return (entry, summary) if isinstance(summary, dict) and isinstance(entry, dict) else None

    def put(self, entry_dir: Path, summary: dict) -> None:
        """Record a valid entry, on disk at once: a validation interrupted later keeps it, and the
        next one resumes after it."""
        key, _ = self._key(entry_dir)
        if key is not None and summary.get("complete"):
            self._new[key] = summary
            self.save()

    def save(self) -> None:
        """Add this validation's records to those on disk now (another validation may have written
        since), the oldest dropped past MAX_RECORDS; written atomically."""
        if not self._new:
            return
        if self.path.exists() and not self.path.is_file():
            self._tell(f"{self.path} is not a file; the verdicts of this validation are not recorded")
            return
        records = {k: v for k, v in {**self._load(), **self._new}.items() if isinstance(v, dict)}
        kept = sorted(records.items(), key=lambda item: str(item[1].get("validated")), reverse=True)[:MAX_RECORDS]
        write_json(self.path, {"about": "tmem-bench leaderboard validate: entries valid on this machine "
                                        "(tmem_bench/leaderboard/cache.py)", "records": dict(kept)})


# A record as Recheck writes it: the fields describe() reads, with their types.
RECORD_FIELDS = {"cells": int, "accuracies": int, "losses": int, "accuracy": (int, float), "loss": (int, float),
                 "seconds": (int, float), "validated": str}


def _well_formed(summary) -> bool:
    return (isinstance(summary, dict) and summary.get("complete") is True
            and all(isinstance(summary.get(name), kind) and not isinstance(summary.get(name), bool)
                    for name, kind in RECORD_FIELDS.items()))


class Recheck:
    """Each cell of an entry re-evaluated from its weights, and what that recomputed; with `show`,
    its progress on stderr (progress.py): `note` first, then a bar on a terminal, a line per entry
    off one."""

    def __init__(self, cells: int, show: bool = False, note: str | None = None, console=None):
        self.summaries: dict[str, dict] = {}
        self.progress = ReevalProgress(cells, show, note, console)

    def __enter__(self) -> Recheck:
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def run(self, entry_dir: Path, entry: dict, results: dict[str, dict], reject, reevaluate,
            name: str | None = None) -> None:
        """`reevaluate(result, weights, reject)` for each cell whose weights are here; the cells whose
        referenced weights are not fetched make the entry "not re-evaluated", a rejection. `name`:
        what the progress calls the entry (default its folder's name)."""
        name = name or entry_dir.name
        start, missing = time.perf_counter(), []
        summary = {"cells": 0, "accuracies": 0, "losses": 0, "accuracy": 0.0, "loss": 0.0, "complete": True}
        for problem in record_problems(entry):
            reject("weights", problem)
        for cell_id, result in sorted(results.items()):
            self.progress.cell(name, cell_id)
            weights = mismatch = None
            try:
                weights = locate(entry_dir, entry, cell_id)
                regular = weights.is_file() and not weights.is_symlink()  # re-evaluation refuses the others
                mismatch = metadata_mismatch(weights, result) if regular else None
            except Unreachable as e:
                missing.append(str(e))
                weights = None
            except (OSError, ValueError) as e:
                reject("weights", str(e))
                weights = None
            if mismatch:
                reject(f"cells/{cell_id}.safetensors", mismatch)
            elif weights is not None:
                _measure(summary, result, reevaluate(result, weights, reject))
            self.progress.advance()
        if missing:
            reject("not re-evaluated", f"{len(missing)} of its {len(results)} weights files are not here, e.g. "
                                       f"{missing[0]}; run `tmem-bench leaderboard fetch`")
        summary["seconds"] = round(time.perf_counter() - start, 1)
        summary["validated"] = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.summaries[name] = summary
        self.progress.entry_done(name, len(results), summary["seconds"])


def _measure(summary: dict, result: dict, recomputed: dict | None) -> None:
    """Count what was recomputed and keep the largest difference from the stored numbers."""
    summary["cells"] += 1
    if not recomputed:
        summary["complete"] = False  # nothing came back to compare: never recorded as re-evaluated
        return
    stored = {ev["level_key"]: ev for ev in result["eval"]}
    pairs = [(stored[ev["level_key"]], ev) for ev in recomputed["eval"]]
    if recomputed.get("validation") is not None:
        pairs.append((result["validation"], recomputed["validation"]))
    for old, new in pairs:
        summary["accuracies"] += 1
        summary["accuracy"] = max(summary["accuracy"], abs(new["accuracy"] - old["accuracy"]))
        if "loss" in old and "loss" in new:
            summary["losses"] += 1
            summary["loss"] = max(summary["loss"], abs(new["loss"] - old["loss"]))


def describe(summary: dict) -> str:
    """One line: what a validation recomputed and how far from the stored numbers it came."""
    if not summary.get("accuracies"):
        return f"{summary.get('cells', 0)} cells checked, no number recomputed from weights"
    return (f"{summary['cells']} cells re-evaluated from their weights ({summary['accuracies']} accuracies, "
            f"{summary['losses']} losses) in {summary.get('seconds', 0):.1f} s; largest difference from the stored "
            f"numbers: accuracy {summary['accuracy']:.3g}, loss {summary['loss']:.3g}")


def cell_count(entry_dirs: list[Path]) -> int:
    """The cell files of the entries to validate: the progress bar's total (no link followed)."""
    return sum(len(list((d / "cells").glob("*.json"))) for d in entry_dirs
               if not d.is_symlink() and not (d / "cells").is_symlink() and (d / "cells").is_dir())
