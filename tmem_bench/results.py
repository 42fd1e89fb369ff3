"""Cell results on disk: atomic JSON files, and the results table built from them."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pandas as pd

from .schema import describe, violations


def write_atomic(path: Path, text: str) -> None:
    """Write to a temporary file beside `path`, then rename: readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_json(path: Path, obj) -> None:
    write_atomic(path, json.dumps(obj, indent=1, sort_keys=True) + "\n")


def cell_path(run_dir: Path, cell_id: str) -> Path:
    return Path(run_dir) / "cells" / f"{cell_id}.json"


def failed_path(run_dir: Path, cell_id: str) -> Path:
    """Where a cell that kept failing is recorded: outside cells/, so nothing takes it for a result."""
    return Path(run_dir) / "failed" / f"{cell_id}.json"


def read_failures(run_dir: Path) -> dict[str, dict]:
    """Cell id -> its failure record (error, traceback, attempts), for every readable record."""
    failures = {}
    for path in sorted((Path(run_dir) / "failed").glob("*.json")):
        try:
            record = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError):
            record = {"error": f"failed/{path.name} is unreadable"}
        failures[path.stem] = record if isinstance(record, dict) else {"error": f"failed/{path.name} is malformed"}
    return failures


def read_cell(path: Path) -> dict:
    """A stored cell result, checked against the cell schema; ValueError names the file and
    what is wrong when it is unreadable, incomplete or malformed."""
    path = Path(path)
    name = f"cell file cells/{path.name}"
    try:
        result = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{name} is unreadable: {e}") from None
    found = violations(result, "cell")
    if found:
        kind = "incomplete" if found[0].validator == "required" else "malformed"
        raise ValueError(f"{name} is {kind}: {describe(found[0])}")
    if result["cell_id"] != path.stem:
        raise ValueError(f"{name} holds cell {result['cell_id']}, not {path.stem}")
    return result


def load_cells(run_dir: Path, checks=()) -> tuple[list[dict], list[str]]:
    """All readable cell results of a run, and one error line per unreadable file.

    Each of `checks` (functions of a result) must parse it too, so that a malformed
    file is named here instead of failing its reader later.
    """
    results, errors = [], []
    for path in sorted((Path(run_dir) / "cells").glob("*.json")):
        try:
            result = read_cell(path)
            for check in (rows, *checks):
                check(result)
        except ValueError as e:
            errors.append(str(e))
            continue
        except (KeyError, TypeError, AttributeError) as e:
            errors.append(f"cell file cells/{path.name} is incomplete ({type(e).__name__}: {e})")
            continue
        results.append(result)
    return results, errors


def _mean_gate(gates: dict | None) -> float | None:
    return sum(gates.values()) / len(gates) if gates else None


def rows(result: dict) -> list[dict]:
    """One table row per evaluation level of a cell."""
    cell = result["cell"]
    out = []
    for ev in result["eval"]:
        row = {
            "cell_id": result["cell_id"],
            "task": cell["task"],
            "variant": cell["variant"],
            "model": cell["label"],
            "backbone": cell["model"],
            "seed": cell["seed"],
            "train_level": ",".join(f"{k}={v}" for k, v in cell["train_level"].items()) or "-",
            "level": ev["level_key"],
            "trained_at_level": ev["level"] == cell["train_level"],
            "accuracy": ev["accuracy"],
            "accuracy_memory_off": ev.get("accuracy_memory_off"),
            "chance": ev["chance"],
            "ceiling": ev["ceiling"],
            "n_eval": ev["n"],
            "fingerprint": ev["fingerprint"],
            "n_params": result.get("n_params"),
            "wall_time_s": result.get("wall_time_s"),
            "steps_per_s": result.get("steps_per_s"),
            "steps": cell["train"]["steps"],
            "causality": result.get("causality", {}).get("verdict"),
            "status": result.get("status", "finished"),
            "diverged_at_step": result.get("diverged_at_step"),
            "final_loss": (result.get("history") or [{}])[-1].get("loss"),
            "device": result.get("device"),
        }
        for axis, value in ev["level"].items():
            row[axis] = value
        for axis, value in cell["train_level"].items():
            row[f"train_{axis}"] = value
        row["gate_init_mean"] = _mean_gate(result.get("gate_init"))
        row["gate_final_mean"] = _mean_gate(result.get("gates_final"))
        out.append(row)
    return out


def results_table(results: list[dict]) -> pd.DataFrame:
    return pd.DataFrame([row for result in results for row in rows(result)])


def load_results(run_dir) -> pd.DataFrame:
    results, _ = load_cells(Path(run_dir))
    return results_table(results)
