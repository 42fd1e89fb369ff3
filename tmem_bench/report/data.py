"""A run's stored cells as the report's tables, and the labels and orders every view shares."""
from __future__ import annotations

import json
import math
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from ..errors import UsageError
from ..harness.results import gate_rows, history_rows, loop_steps_per_s, rows
from ..harness.rundir import RunDir
from ..levels import where_described
from ..registry import BUILTIN_TASKS
from .selection_recomputed import searches

TASK_ORDER = tuple(BUILTIN_TASKS)
MODEL_ORDER = ("base", "base_wide", "slots")  # the paper's toy-suite attention baselines come first
MAX_MISSING_LISTED = 10


@dataclass
class RunData:
    run_dir: Path
    manifest: dict | None
    table: pd.DataFrame  # one row per cell and evaluation level (results.rows, plus series)
    history: pd.DataFrame  # one row per cell and logged step
    gates: pd.DataFrame  # one row per gated cell, layer and step; step 0 is the initial value
    axes: dict[str, tuple]  # task -> its level axes, in stored order
    problems: list[str] = field(default_factory=list)
    n_cells: int = 0
    task_options: dict[tuple[str, str], dict] = field(default_factory=dict)  # (task, variant) -> its options
    selection: list[dict] = field(default_factory=list)  # the run's learning-rate searches (selection.json)
    state_probe: dict | None = None  # state_probe.json where `tmem-bench probe` was run and it reads
    # learning-rate trials not at the chosen lr (read by the selection only) that a retired rule stopped early
    trials_stopped_too_early: list[dict] = field(default_factory=list)
    # Where a run under way still lacks something, as (task, variant, training level), None where a
    # manifest does not say: a cell planned or chosen with no result yet (missing or failed), and a
    # learning-rate search with no lr chosen yet.
    unfinished: list[tuple | None] = field(default_factory=list)
    unchosen: list[tuple | None] = field(default_factory=list)

    @property
    def dir(self) -> RunDir:
        return RunDir(self.run_dir)

    @property
    def leaking(self) -> dict[str, list[str]]:
        """Model label -> where its causality probe said 'leaking' (marks the model everywhere)."""
        out: dict[str, list[str]] = {}
        if self.table.empty:
            return out
        bad = self.table[self.table["causality"] == "leaking"]
        for (model, task, variant), _ in bad.groupby(["label", "task", "variant"], sort=True):
            out.setdefault(model, []).append(task_label(task, variant))
        return out

    def leak_note(self, models) -> str | None:
        leaks = {m: w for m, w in self.leaking.items() if m in models}
        if not leaks:
            return None
        return "the causality probe found a leak in " + "; ".join(f"{m} ({', '.join(w)})" for m, w in leaks.items())


def load_run(run_dir) -> RunData:
    """Every readable cell of a run; problems name each unreadable, incomplete or missing cell."""
    run_dir = RunDir.existing(run_dir)
    problems, manifest, planned = [], None, {}
    try:
        manifest = run_dir.manifest()
        planned = run_dir.planned(manifest)
    except UsageError as e:
        problems.append(f"{e}; planned cells cannot be checked")

    results, errors = run_dir.load_cells(checks=(history_rows, gate_rows))
    problems.extend(errors)
    selection, left_out, found = searches(run_dir, results, manifest)
    problems.extend(found)
    trials = [row for r in results if r["cell_id"] in left_out for row in rows(r)[:1] if row["stopped_too_early"]]
    results = [r for r in results if r["cell_id"] not in left_out]
    stored_ids = run_dir.stored()
    failures = run_dir.failures()
    missing = []
    for cid, described in planned.items():
        if cid in stored_ids:
            continue
        what = f" ({described})" if described else ""
        if cid in failures:
            f = failures[cid]
            problems.append(f"cell {cid}{what} FAILED after {f.get('attempts', '?')} attempt(s): "
                            f"{f.get('error', '?')} (traceback in failed/{cid}.json)")
        else:
            missing.append((cid, described))
    problems.extend(_missing_lines(missing, len(planned)))
    probe, probe_accuracy, problem = read_state_probe(run_dir)
    problems.extend([problem] if problem else [])
    data = run_data(results, run_dir.path, manifest, problems, probe_accuracy)
    data.selection, data.state_probe, data.trials_stopped_too_early = selection, probe, trials
    data.unfinished, data.unchosen = _lacking(selection, planned, stored_ids, left_out)
    return data


def _lacking(selection: list[dict], planned: dict, stored: set[str], left_out: set[str]) -> tuple[list, list]:
    """RunData.unfinished and .unchosen: the planned cells and, where selection.json is stale, the
    final cells the recomputed choices make, without a result; the searches with no lr chosen, or
    before the first selection.json, the trials left out (one description per search)."""
    def where(record):
        return record["task"], record["variant"], record["train_level"]

    unfinished = {cid: where_described(d) if d else None for cid, d in planned.items() if cid not in stored}
    for record in selection:
        unfinished |= {cid: where(record) for cid in record["final_cells"] if cid not in stored}
    unchosen = [where(r) for r in selection if r["chosen_lr"] is None]
    if not selection:
        unchosen += [where_described(d) for d in sorted({planned.get(cid) or "" for cid in left_out})]
    return list(unfinished.values()), unchosen


def _missing_lines(missing: list[tuple[str, str | None]], planned: int) -> list[str]:
    """A line per planned cell with no file; a run still under way, with more than MAX_MISSING_LISTED
    of them, gets one line counting them by task and model instead of hundreds of lines."""
    if len(missing) <= MAX_MISSING_LISTED:
        return [f"cell {cid}{f' ({d})' if d else ''} is planned in manifest.json but cells/{cid}.json is missing"
                for cid, d in missing]
    groups = Counter((d or "not described").split(" @ ")[0] for _, d in missing)
    return [f"{len(missing)} of {planned} planned cells have no file in cells/ yet (rerunning the run's command "
            f"resumes them): " + ", ".join(f"{g} {n}" for g, n in groups.items())]


def read_state_probe(run_dir: RunDir) -> tuple[dict | None, dict[str, float], str | None]:
    """state_probe.json as `tmem-bench probe` wrote it (None where it was not run), the accuracy by
    cell id of the cells it probed, and the problem where it cannot be read: the one reading behind
    both the verdicts and the report's section."""
    path = run_dir.state_probe_path
    if not path.is_file():
        return None, {}, None
    try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or not isinstance(doc.get("rows"), list):
            raise ValueError("not an object with a list of rows")
        return doc, {str(r["cell_id"]): usable_probe_accuracy(r) for r in doc["rows"]
                     if r.get("status") == "probed" and r.get("probe_accuracy") is not None}, None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        return None, {}, f"state_probe.json is unreadable ({type(e).__name__}: {e}); no verdict uses the state probe"


def usable_probe_accuracy(row: dict) -> float | None:
    """A probed row's accuracy where a verdict may read it, None where the probe cannot tell: the
    row's own readout is not among the members that read the reference state closest to the
    memory's format within the calibration goal (a family with none, or a row settled by an earlier
    rule that took an uncalibrated member's number: `tmem-bench probe RUN_DIR` settles it again), or
    the row carries no calibration (a probe of schema 1, or a task without reference states)."""
    calibration = row.get("calibration")
    if (isinstance(calibration, dict) and calibration.get("usable") is True
            and row.get("readout") in (calibration.get("calibrated") or ())):
        return float(row["probe_accuracy"])
    return None


def run_data(results: list[dict], run_dir=".", manifest: dict | None = None,
             problems: list[str] | None = None, probe: dict[str, float] | None = None) -> RunData:
    """The report's tables built from cell results (already read and checked); `probe`, the state
    probe's accuracy by cell id, becomes the probe_accuracy of each cell's row at its trained level
    (None: probed, but the probe cannot tell, `probe_cannot_tell`)."""
    table_rows, history, gates, axes, axis_is_int, options = [], [], [], {}, {}, {}
    for result in results:
        loop_rate = loop_steps_per_s(result)
        history += history_rows(result)
        gates += gate_rows(result)
        table_rows += [{**row, "loop_steps_per_s": loop_rate} for row in rows(result)]
        cell = result["cell"]
        axes.setdefault(cell["task"], tuple(cell["train_level"]))
        options.setdefault((cell["task"], cell["variant"]), dict(cell.get("task_options") or {}))
        for level in [cell["train_level"]] + [e["level"] for e in result["eval"]]:
            for axis, value in level.items():
                is_int = isinstance(value, int) and not isinstance(value, bool)
                axis_is_int[axis] = axis_is_int.get(axis, True) and is_int

    table = pd.DataFrame(table_rows)
    if not table.empty:
        table["series"] = [series_label(m, v) for m, v in zip(table["label"], table["variant"])]
        probed = [(probe or {}).get(cid, math.nan) if trained else math.nan
                  for cid, trained in zip(table["cell_id"], table["trained_at_level"])]
        table["probe_accuracy"] = [math.nan if p is None else p for p in probed]
        table["probe_cannot_tell"] = [p is None for p in probed]
        for col in ("accuracy_memory_off", "gate_init_mean", "gate_final_mean", "n_params", "wall_time_s",
                    "reach_init", "reach_trained", "state_bytes", "validation_accuracy",
                    "steps_per_s", "loop_steps_per_s"):
            table[col] = pd.to_numeric(table[col], errors="coerce")
        for axis, is_int in axis_is_int.items():
            if is_int:  # rows of other tasks lack the axis, which would turn 50 into 50.0
                table[axis] = table[axis].astype("Int64")
                table[f"train_{axis}"] = table[f"train_{axis}"].astype("Int64")
    return RunData(Path(run_dir), manifest, table, pd.DataFrame(history), pd.DataFrame(gates), axes,
                   list(problems or []), len(results), options)


def series_label(model: str, variant: str) -> str:
    return model if variant == "standard" else f"{model} [{variant}]"


def task_label(task: str, variant: str) -> str:
    return task if variant == "standard" else f"{task} [{variant}]"


def slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9.]+", "_", text).strip("_")


def natural_key(name: str) -> list:
    """Sort key that puts layer2 before layer10."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(name))]


def ordered(values, first=()) -> list:
    values = list(dict.fromkeys(values))
    return sorted(values, key=lambda v: (first.index(v) if v in first else len(first), str(v)))


def task_order(data: RunData) -> list[str]:
    return ordered(data.table["task"], TASK_ORDER) if not data.table.empty else []


def model_order(table: pd.DataFrame) -> list[str]:
    return ordered(table["label"], MODEL_ORDER)


def variant_order(table: pd.DataFrame) -> list[str]:
    return ordered(table["variant"], ("standard",))


def per_seed(rows_: pd.DataFrame, column: str = "accuracy") -> np.ndarray:
    """One value per seed (several rows of one seed, e.g. cells trained at different levels, are averaged)."""
    return rows_.groupby("seed")[column].mean().to_numpy(dtype=float)
