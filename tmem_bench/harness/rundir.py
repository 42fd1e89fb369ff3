"""The run directory: the one owner of its layout, and the only code that reads or writes its files.

    .lock                one writer at a time (below)
    manifest.json        the plan: its settings and every planned cell, those planned once a
                         learning-rate selection chose their lr marked `after_selection`
    cells/<id>.json      a finished cell's result; cells/<id>.safetensors, its weights, is written first
    failed/<id>.json     a cell that kept failing: outside cells/, so nothing takes it for a result
    selection.json       the learning-rate searches
    jobs.json            who runs the cells: the executor, its driver and, on Slurm, the jobs
    slurm/               submitit's job files and logs
    results.csv          the table of every finished cell
    report.md, figures/  the report, built in a .report-* staging folder and then moved into place

Every file is written through the atomic writer, so no reader sees half of one; what a killed
writer leaves (`.*.tmp` files, `.report-*` folders) is removed by the next holder of the lock.
The lock is an advisory `flock` on `.lock`, which the kernel releases when its process dies
however it dies, so a killed run never blocks the next one; the file keeps the holder's PID,
host and start time to name it in the message a second writer gets.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import shutil
import socket
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import pandas as pd

from ..errors import UsageError
from ..files import write_atomic, write_json
from ..schema import describe, violations
from .results import read_cell, read_text, results_table, rows, write_weights


def _me() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": datetime.now(timezone.utc).isoformat()}


def finite_json(obj):
    """`obj` with each nan or inf as None: JSON has no such numbers (json.dumps writes a bare NaN,
    which other readers refuse)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class RunDir:
    """A run directory at `path`. Making one checks nothing and writes nothing (workers make their
    own from the path they are given); `create` and `existing` are the checks a command makes."""

    def __init__(self, path):
        self.path = Path(path)
        self.manifest_path = self.path / "manifest.json"
        self.selection_path = self.path / "selection.json"
        self.jobs_path = self.path / "jobs.json"
        self.table_path = self.path / "results.csv"
        self.report_path = self.path / "report.md"
        self.state_probe_path = self.path / "state_probe.json"  # written by `tmem-bench probe` (probe_run.py)
        self.slurm_folder = self.path / "slurm"
        self._lock_path = self.path / ".lock"
        self._manifest: dict | None = None  # what this process last wrote to manifest.json

    def __fspath__(self) -> str:
        return str(self.path)

    __str__ = __fspath__

    @classmethod
    def create(cls, path) -> RunDir:
        """Create the run directory (or check the existing one) before anything is trained."""
        run_dir = cls(path)
        if run_dir.path.exists() and not run_dir.path.is_dir():
            raise UsageError(f"--out {str(path)!r} exists and is not a directory")
        try:
            run_dir.path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise UsageError(f"--out {str(path)!r} cannot be created: {e.strerror}") from None
        if not os.access(run_dir.path, os.W_OK | os.X_OK):
            raise UsageError(f"--out {str(path)!r} is not writable")
        return run_dir

    @classmethod
    def existing(cls, path) -> RunDir:
        """A run directory to read, or a UsageError saying why `path` is none."""
        run_dir = cls(path)
        if not run_dir.path.exists():
            raise UsageError(f"run directory {str(path)!r} does not exist")
        if not run_dir.path.is_dir():
            raise UsageError(f"run directory {str(path)!r} is not a directory")
        if not run_dir.cells_folder.is_dir() and not run_dir.manifest_path.is_file():
            raise UsageError(f"{str(path)!r} is not a run directory: it has neither manifest.json nor cells/")
        return run_dir

    def check_layout(self) -> None:
        """A UsageError where a folder lies where the run keeps a file, which could never be replaced."""
        for path in (self.manifest_path, self.selection_path, self.jobs_path, self.table_path, self.report_path):
            if path.is_dir():
                raise UsageError(f"run directory {str(self.path)!r}: {path.name} is a folder, where the run keeps a "
                                 "file; move it away and rerun")

    # The layout of cells and failure records.

    @property
    def cells_folder(self) -> Path:
        return self.path / "cells"

    def cell_path(self, cell_id: str) -> Path:
        return self.cells_folder / f"{cell_id}.json"

    def weights_path(self, cell_id: str) -> Path:
        """The trained backbone and adapter weights of a cell (safetensors), beside its result."""
        return self.cells_folder / f"{cell_id}.safetensors"

    def failed_path(self, cell_id: str) -> Path:
        return self.path / "failed" / f"{cell_id}.json"

    # One writer at a time.

    @contextlib.contextmanager
    def lock(self, say=print):
        """Hold the run directory's lock for the duration of the block; a second holder is refused."""
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise UsageError(f"run directory {str(self.path)!r} is in use by {self._holder()}; "
                                 "wait for it to finish or stop it, then rerun to resume") from None
            previous = self._read_holder()
            if previous:
                say(f"taking over the lock of an earlier run that ended without releasing it "
                    f"(pid {previous.get('pid')} on {previous.get('host')})")
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(_me()).encode(), 0)
            try:
                yield self
            finally:
                os.ftruncate(fd, 0)  # released cleanly: an empty lock file names no earlier holder
        finally:
            os.close(fd)  # closing releases the flock

    def in_use(self) -> bool:
        """Whether a process holds the lock now (the kernel drops it when that process dies)."""
        try:
            fd = os.open(self._lock_path, os.O_RDONLY)
        except OSError:
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)  # also releases the shared lock, at once
        return False

    def _read_holder(self) -> dict | None:
        try:
            holder = json.loads(read_text(self._lock_path) or "null")
        except (OSError, json.JSONDecodeError):
            return None
        return holder if isinstance(holder, dict) else None

    def _holder(self) -> str:
        holder = self._read_holder() or {}
        return f"process {holder.get('pid', '?')} on {holder.get('host', '?')} (since {holder.get('since', '?')})"

    def remove_stale(self) -> list[Path]:
        """What a killed writer left: the atomic writer's temporary files and report staging
        folders (only the lock holder may call this)."""
        folders = (self.path, self.cells_folder, self.path / "failed")
        stale = [p for folder in folders for p in folder.glob(".*.tmp")]
        for path in stale:
            path.unlink(missing_ok=True)
        staging = list(self.path.glob(".report-*"))
        for path in staging:
            shutil.rmtree(path, ignore_errors=True)
        return stale + staging

    # The plan.

    def manifest(self) -> dict | None:
        """manifest.json, or None where there is none yet; a UsageError when it is unreadable."""
        try:
            manifest = json.loads(read_text(self.manifest_path))
        except FileNotFoundError:
            return None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UsageError(f"manifest.json is unreadable ({e})") from None
        if not isinstance(manifest, dict):
            raise UsageError("manifest.json is not a run manifest")
        return manifest

    @staticmethod
    def planned(manifest: dict | None) -> dict[str, str | None]:
        """Planned cell id -> its description (None in manifests written before descriptions were stored)."""
        entries = manifest.get("cells", []) if isinstance(manifest, dict) else []
        if not isinstance(entries, list):
            raise UsageError(f"manifest.json: 'cells' must be a list, got {type(entries).__name__}")
        return dict((e["id"], e.get("describe")) if isinstance(e, dict) else (e, None) for e in entries)

    def begin(self, cells, manifest: dict, append: bool) -> None:
        """Write manifest.json: `manifest`'s fields and the planned cells, this plan's and, with
        `append`, those the existing manifest plans. A different plan without `append` is a
        UsageError naming the difference, so results of two plans never mix silently."""
        self.check_layout()
        ours = {c.id: c.describe() for c in cells}
        try:
            earlier = self.manifest()
        except UsageError as e:
            raise UsageError(f"run directory {str(self.path)!r}: {e}; move it away or use another --out") from None
        planned = self.planned(earlier)
        # Cells planned after a learning-rate selection follow from the others' results.
        chosen = {e["id"] for e in (earlier or {}).get("cells", []) if isinstance(e, dict) and e.get("after_selection")}
        if earlier is not None and set(planned) - chosen != set(ours) and not append:
            old, new = earlier.get("settings") or {}, manifest.get("settings") or {}
            changed = [f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in sorted(set(old) | set(new))
                       if old.get(k) != new.get(k)]
            what = "; ".join(changed) or f"{len(set(planned) ^ set(ours))} planned cells differ"
            raise UsageError(f"run directory {str(self.path)!r} holds another plan ({what}); "
                             "use another --out, or --append to add this plan's cells to it")
        kept = [{"id": k, "describe": v, **({"after_selection": True} if k in chosen else {})}
                for k, v in planned.items() if k not in ours]
        # A resume rewrites "started"; the first start stays, since what must precede a run's first cell
        # (a hypothesis, report/validity.py) is judged by it. A manifest written before it was kept has none.
        first = manifest.get("started") if earlier is None else earlier.get("first_started")
        self._manifest = {**manifest, **({"first_started": first} if first else {}),
                          "cells": kept + [{"id": k, "describe": v} for k, v in ours.items()]}
        write_json(self.manifest_path, self._manifest)

    def add_after_selection(self, cells) -> None:
        """Add to the manifest `begin` wrote the cells planned at the lrs a selection chose."""
        known = {e["id"] for e in self._manifest["cells"]}
        self._manifest["cells"] += [{"id": c.id, "describe": c.describe(), "after_selection": True}
                                    for c in cells if c.id not in known]
        write_json(self.manifest_path, self._manifest)

    # Cell results.

    def read_cell(self, cell_id: str) -> dict:
        """A stored result, checked against the cell schema; ValueError names what is wrong."""
        return read_cell(self.cell_path(cell_id))

    def write_cell(self, cell_id: str, result: dict, model) -> None:
        # Weights first: a cell file is the mark of a finished cell, so its weights are there too; it
        # keeps their hash, by which a resume tells them from weights torn or changed since.
        write_weights(self.weights_path(cell_id), model, cell_id, result)
        write_json(self.cell_path(cell_id), {**result, "weights_sha256": sha256(self.weights_path(cell_id))})

    def weights_problem(self, cell_id: str, result: dict) -> str | None:
        """What is wrong with the weights of a finished cell, or None: missing, or not the bytes whose
        hash its result keeps (for a result from before the hash: unreadable, or another cell's)."""
        import safetensors

        path = self.weights_path(cell_id)
        name = f"weights cells/{path.name}"
        if not path.is_file():
            return f"its {name} are missing"
        try:
            if "weights_sha256" in result:
                same = sha256(path) == result["weights_sha256"]
                return None if same else f"its {name} are not those its result records (truncated or changed)"
            with safetensors.safe_open(path, framework="pt") as f:
                owner = (f.metadata() or {}).get("cell_id", cell_id)
        except (OSError, safetensors.SafetensorError) as e:
            return f"its {name} are unreadable ({e})"
        return None if owner == cell_id else f"its {name} are those of cell {owner}"

    def stored(self) -> set[str]:
        """The ids of the cells with a result file, readable or not."""
        try:
            names = os.listdir(self.cells_folder)
        except FileNotFoundError:
            return set()
        return {name[:-5] for name in names if name.endswith(".json") and not name.startswith(".")}

    def cell_mtime(self, cell_id: str) -> int | None:
        try:
            return self.cell_path(cell_id).stat().st_mtime_ns
        except FileNotFoundError:
            return None

    def stored_problem(self, cell_id: str, keep_weightless: bool = False) -> tuple[str | None, bool]:
        """Why a cell is trained (again), None when finished, and whether only its weights file is missing,
        which `keep_weightless` lets pass (a run committed without them); a run and its dry run share it."""
        try:
            result = self.read_cell(cell_id)  # missing, left half-done by a killed run, or edited: never trusted
        except ValueError as e:
            return str(e), False
        absent = not self.weights_path(cell_id).exists()
        return (None if keep_weightless and absent else self.weights_problem(cell_id, result)), absent

    def unfinished(self, cells: list, say=print, keep_weightless: bool = False) -> list:
        """The cells `stored_problem` does not count finished; a failure record of a finished cell is removed."""
        todo, weightless = [], 0
        for cell in cells:
            problem, absent = self.stored_problem(cell.id, keep_weightless)
            weightless += absent
            if not problem:
                self.clear_failure(cell.id)  # finished after its failure was recorded
                continue
            todo.append(cell)
            if self.cell_path(cell.id).exists():
                say(f"{cell.describe()}: {problem}; training it again")
        if weightless:
            say(f"kept {weightless} finished cell(s) without weights (--keep-weightless)" if keep_weightless else
                f"{weightless} of these lack only their weights file: --keep-weightless keeps their results instead")
        if len(todo) < len(cells):
            say(f"resuming: {len(cells) - len(todo)} of {len(cells)} cells already finished in {self.path}")
        return todo

    def load_cells(self, checks=()) -> tuple[list[dict], list[str]]:
        """All readable cell results, and one error line per unreadable file.

        Each of `checks` (functions of a result) must parse it too, so that a malformed
        file is named here instead of failing its reader later.
        """
        results, errors = [], []
        for cell_id in sorted(self.stored()):
            name = f"cell file cells/{cell_id}.json"
            try:
                result = self.read_cell(cell_id)
                for check in (rows, *checks):
                    check(result)
            except ValueError as e:
                errors.append(str(e))
                continue
            except (KeyError, TypeError, AttributeError) as e:
                errors.append(f"{name} is incomplete ({type(e).__name__}: {e})")
                continue
            results.append(result)
        return results, errors

    def cell_state(self, cell_id: str) -> str:
        if self.cell_path(cell_id).exists():
            return "finished"
        return "failed" if self.failed_path(cell_id).exists() else "not finished"

    # Cells that kept failing.

    def record_failure(self, cell_id: str, record: dict) -> None:
        write_json(self.failed_path(cell_id), record)

    def clear_failure(self, cell_id: str) -> None:
        self.failed_path(cell_id).unlink(missing_ok=True)

    def failures(self) -> dict[str, dict]:
        """Cell id -> its failure record (error, traceback, attempts), for every record."""
        found = {}
        for path in sorted((self.path / "failed").glob("*.json")):
            try:
                record = json.loads(read_text(path))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                record = {"error": f"failed/{path.name} is unreadable"}
            found[path.stem] = record if isinstance(record, dict) else {"error": f"failed/{path.name} is malformed"}
        return found

    # Learning-rate selection.

    def selection(self) -> list[dict]:
        """The learning-rate searches of selection.json as written, or none where there is no file; a
        ValueError names what is wrong with one that is unreadable or malformed."""
        try:
            written = json.loads(read_text(self.selection_path))
        except FileNotFoundError:
            return []
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"selection.json is unreadable: {e}") from None
        found = violations(written, "selection")
        if found:
            raise ValueError(f"selection.json is malformed: {describe(found[0])}")
        return written["searches"]

    def write_selection(self, searches: list[dict]) -> None:
        """Write `searches` to selection.json, keeping the earlier searches of cells the manifest `begin`
        wrote still plans and none of `searches` holds (an --append'ed plan's); an unreadable file is
        written anew."""
        ours = {t["cell_id"] for s in searches for t in s["trials"]}
        others = {e["id"] for e in (self._manifest or {}).get("cells", [])} - ours
        try:
            earlier = self.selection()
        except ValueError:
            earlier = []
        kept = [s for s in earlier if {t["cell_id"] for t in s["trials"]} <= others]
        write_json(self.selection_path, {"searches": finite_json(kept + searches)})

    # Who runs the cells.

    def write_jobs(self, executor) -> None:
        """Record `executor` (its name and record()) as running this run's cells, with this process as
        its driver, so that `tmem-bench jobs` can list and cancel them from anywhere."""
        write_json(self.jobs_path, {"executor": executor.name, "driver": _me(), **executor.record()})

    def jobs(self):
        """jobs.json as written (its fields are the executors' to check); a UsageError where there is none."""
        if not self.path.is_dir():
            raise UsageError(f"run directory {str(self.path)!r} does not exist")
        if not self.jobs_path.is_file():
            raise UsageError(f"{str(self.path)!r} has no {self.jobs_path.name}: no executor has run cells there yet")
        try:
            return json.loads(self.jobs_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise UsageError(f"{self.jobs_path} is unreadable: {e}") from None

    # What is made from the cells.

    def table(self) -> pd.DataFrame:
        """The results table: one row per readable cell and evaluation level (without the lr columns
        while selection.json is unreadable: the run's selection writes it again)."""
        try:
            selection = self.selection()
        except ValueError:
            selection = []
        return results_table(self.load_cells()[0], selection)

    def write_table(self) -> None:
        write_atomic(self.table_path, self.table().to_csv(index=False))

    @contextlib.contextmanager
    def report_staging(self):
        """A fresh folder to build a report in, removed afterwards; `publish_report` moves its
        report.md and figures/ into place."""
        staging = Path(tempfile.mkdtemp(dir=self.path, prefix=".report-"))
        try:
            yield staging
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def publish_report(self, staging: Path) -> None:
        # Renames, so a reader sees the old figures or the new ones; the retired ones go with staging.
        figures, retired = self.path / "figures", staging / "figures.old"
        if figures.exists():
            os.replace(figures, retired)
        os.replace(staging / "figures", figures)
        os.replace(staging / "report.md", self.report_path)
