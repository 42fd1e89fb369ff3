"""The state probe of a run directory (`tmem-bench probe`): each finished cell's model rebuilt from
its weights and probed at the level it was trained at (diagnostics/state_probe.py), one row per
cell in RUN_DIR/state_probe.json, rewritten atomically after each cell so that a stopped probe
resumes where it stopped."""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..diagnostics.state_probe import NO_STATE, PROBED, ReadoutConfig, describe_readout, probe_model, probe_problem
from ..errors import UsageError
from ..files import write_json
from ..levels import level_key
from ..registry import get_task
from .plan import cell_from_dict
from .results import load_weights
from .rundir import RunDir
from .train import build_model

SCHEMA = 1


def probe_cell(result: dict, weights: Path | None, config: ReadoutConfig) -> dict:
    """One stored cell probed at the level it was trained at: its row of state_probe.json."""

    start = time.perf_counter()
    cell = cell_from_dict(result["cell"])
    task = get_task(cell.task, **cell.task_options)
    level = task.validate_level(cell.train_level)
    own = next((e["accuracy"] for e in result["eval"] if e["level_key"] == level_key(level)), None)
    row = {"label": cell.label, "seed": cell.seed, **level, "accuracy": own, "probe_accuracy": None,
           "chance": task.chance(level), "status": NO_STATE}
    model = build_model(cell)
    sample = task.sample(level, 1, torch.Generator().manual_seed(0))
    has_state = bool(model.memory_state(sample))
    problem = probe_problem(task, level, sample) if has_state else None
    if problem:
        row["status"] = problem
    elif has_state and weights is None:
        row["status"] = "no weights"
    elif has_state:
        load_weights(weights, model)
        train_task = task
        if "n_queries" in task.options():
            train_task = get_task(cell.task, **{**cell.task_options, "n_queries": config.queries})
        eval_batch, _ = task.eval_set(level, cell.train["eval_size"])
        row.update(probe_model(model, task, level, eval_batch, config, train_task))
    return {**row, "wall_time_s": time.perf_counter() - start, "cell_id": result["cell_id"]}


def _previous(path: Path, config: ReadoutConfig) -> dict[str, dict]:
    """The rows of an earlier probe of the run with the same readout, by cell id; one with other settings is refused."""
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text())
        rows, settings = doc["rows"], doc["readout_config"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{path} is unreadable ({e}); remove it to probe again") from None
    if settings != asdict(config):
        changed = sorted(k for k in asdict(config) if settings.get(k) != asdict(config)[k])
        raise UsageError(f"{path} holds a probe with other readout settings ({', '.join(changed)}); "
                         "rerun with the same settings to resume, or remove it to probe again")
    return {row["cell_id"]: row for row in rows}


def probe_run(path, weights=(), labels=None, seeds=None, config: ReadoutConfig = ReadoutConfig(), say=print) -> dict:
    """Probe every finished cell of a run directory (those of `labels` and `seeds` where given) and
    write RUN_DIR/state_probe.json after each; cells already probed with the same readout are kept.
    The file is the probe's alone, so the run's lock is not taken (a report may be written meanwhile).
    A cell's weights are read from the run directory, else from the first of the `weights` folders
    that holds `<cell id>.safetensors` (a leaderboard entry's cells/, say)."""
    run_dir = RunDir.existing(path)
    folders = [Path(f) for f in weights]
    for folder in folders:
        if not folder.is_dir():
            raise UsageError(f"--weights {str(folder)!r} is not a folder")
    results, errors = run_dir.load_cells()
    for line in errors:
        say(f"skipped: {line}")
    known = sorted({r["cell"]["label"] for r in results})
    unknown = sorted(set(labels or ()) - set(known))
    if unknown:
        raise UsageError(f"--models: no cells of {', '.join(unknown)} in {run_dir}; its models: {', '.join(known)}")
    chosen = [r for r in results if (not labels or r["cell"]["label"] in labels)
              and (seeds is None or r["cell"]["seed"] in seeds)]
    out = run_dir.state_probe_path
    done = _previous(out, config)
    for result in chosen:
        cell_id = result["cell_id"]
        if done.get(cell_id, {}).get("status") in (PROBED, NO_STATE):
            continue  # probed already; a cell that lacked its weights is tried again
        found = [p for p in [run_dir.weights_path(cell_id), *(f / f"{cell_id}.safetensors" for f in folders)]
                 if p.is_file()]
        row = probe_cell(result, found[0] if found else None, config)
        # Read again before writing: a second probe of the same run may have added rows meanwhile.
        done = {**_previous(out, config), cell_id: row}
        write_json(out, document(done.values(), config))
        numbers = [f"{name} {row[key]:.3f}" for name, key in (("model", "accuracy"), ("probe", "probe_accuracy"))
                   if row[key] is not None]
        say(f"{row['label']} seed {row['seed']} @ {level_key(result['cell']['train_level'])}: "
            f"{', '.join([row['status'], *numbers])} ({row['wall_time_s']:.0f} s)")
    doc = document(done.values(), config)
    write_json(out, doc)
    return doc


def document(rows, config: ReadoutConfig) -> dict:
    """state_probe.json: the readout's paragraph and settings, and the rows by label, level and seed."""
    order = sorted(rows, key=lambda r: (r["label"], tuple(v for k, v in r.items() if k not in ROW_FIELDS), r["seed"]))
    return {"schema": SCHEMA, "readout": describe_readout(config), "readout_config": asdict(config), "rows": order}


ROW_FIELDS = {"label", "seed", "accuracy", "probe_accuracy", "chance", "status", "probe_validation_accuracy",
              "best_step", "state_floats", "wall_time_s", "cell_id"}


def summary(doc: dict) -> list[list]:
    """[label, level, seeds, model accuracy, probe accuracy] per label and level, means over seeds."""
    groups: dict[tuple, list[dict]] = {}
    for row in doc["rows"]:
        level = ",".join(f"{k}={v}" for k, v in row.items() if k not in ROW_FIELDS)
        groups.setdefault((row["label"], level), []).append(row)
    out = []
    for (label, level), rows in groups.items():
        probed = [r["probe_accuracy"] for r in rows if r["probe_accuracy"] is not None]
        own = [r["accuracy"] for r in rows if r["accuracy"] is not None]
        out.append([label, level, len(rows), sum(own) / len(own) if own else None,
                    sum(probed) / len(probed) if probed else rows[0]["status"]])
    return out
