"""The state probe of a run directory (`tmem-bench probe`): each finished cell's model rebuilt from
its weights and probed at the level it was trained at (diagnostics/state_probe.py), one row per
cell in RUN_DIR/state_probe.json, rewritten atomically after each cell so that a stopped probe
resumes where it stopped.

Beside each probe number, its calibration: every member of the readout family trained the same
way on the reference state closest to the memory's format (diagnostics/probe_references.py) at the
same task and level, and its accuracy there against the reference's best possible read. A probe
number comes from the members of the family that read that reference within CALIBRATION_GOAL of
its best (the one best on the probe's own validation sequences among them) and only then is usable
(`calibration.usable`); the verdicts read no other. The best read of the other members is kept
beside it (`uncalibrated`), read by no verdict. Each reference's calibration is kept in the file
once trained, and may be taken from another run's file of the same settings."""
from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path

import torch

from ..contracts.device import hardware
from ..diagnostics import probe_references
from ..diagnostics.state_probe import (NO_STATE, PROBED, ReadoutConfig, chosen_readout, describe_readout, probe_model,
                                      probe_problem)
from ..errors import UsageError
from ..files import write_json
from ..levels import level_key
from ..registry import get_task
from .plan import cell_from_dict
from .results import load_weights
from .rundir import RunDir
from .train import build_model

SCHEMA = 2
CALIBRATION_GOAL = 0.9  # a probe number is read only where its readout reads the closest reference this well


def probe_cell(result: dict, weights: Path | None, config: ReadoutConfig, calibrations: dict | None = None,
               device: torch.device = torch.device("cpu")) -> dict:
    """One stored cell probed on `device` at the level it was trained at: its row of
    state_probe.json, naming what computed it (`hardware`). `calibrations` (by `calibration_key`)
    holds the references' calibrations trained so far, and gains the one this cell needed."""

    start = time.perf_counter()
    cell = cell_from_dict(result["cell"])
    task = cell.task_object()
    level = task.validate_level(cell.train_level)
    own = next((e["accuracy"] for e in result["eval"] if e["level_key"] == level_key(level)), None)
    row = {"label": cell.label, "seed": cell.seed, **level, "accuracy": own, "probe_accuracy": None,
           "chance": task.chance(level), "status": NO_STATE}
    model = build_model(cell)
    sample = task.sample(level, 1, torch.Generator().manual_seed(0))
    state = model.memory_state(sample)
    has_state = bool(state)
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
        row.update(probe_model(model, task, level, eval_batch, config, train_task, device))
        row["wall_time_s"], row["hardware"] = time.perf_counter() - start, hardware(device)
        fmt = probe_references.state_format(cell.model, model.backbone, state)
        row = settle(row, calibration(task, level, fmt, config, train_task,
                                      {} if calibrations is None else calibrations, device))
    return {**row, "wall_time_s": row.get("wall_time_s", time.perf_counter() - start), "cell_id": result["cell_id"]}


def calibration_key(task, level, name: str) -> str:
    options = ",".join(f"{k}={v}" for k, v in sorted(task.options().items()))
    return f"{task.name}[{options}]@{level_key(level)}|{name}"


def calibration(task, level, fmt: str, config: ReadoutConfig, train_task, calibrations: dict,
                device: torch.device = torch.device("cpu")) -> dict:
    """How well each readout reads the reference closest to format `fmt` at this task and level,
    training the reference (every readout, on `device`) where `calibrations` lacks it."""
    name = probe_references.closest_reference(fmt)
    if task.name != probe_references.TASK or name is None:
        return {"format": fmt, "reference": None, "usable": False,
                "why": f"no reference states for task {task.name!r}" if name else f"no reference of format {fmt!r}"}
    key = calibration_key(task, level, name)
    if key not in calibrations:
        calibrations[key] = probe_references.calibrate_reference(name, task, level, config, train_task, device)
    ref = calibrations[key]
    return {"format": fmt, "reference": name, "best": ref["best"], "readouts": dict(ref["readouts"])}


def settle(row: dict, calibration: dict) -> dict:
    """`row` (a probed cell, every member's numbers in row["readouts"]) with its number chosen and its
    `calibration` completed: the members that read the reference within the goal (`calibrated`),
    the family's best member's read (`member`, `probe`, `ratio`) and the chosen member's
    (`chosen_probe`). The number (`readout`, `probe_accuracy`) is the member best on the probe's own
    validation sequences among the calibrated ones, and usable: a member that misreads the
    memory's format may read more of this state, but its number is backed by nothing a reference
    showed it can find, so no verdict reads it; it stays beside the number as `uncalibrated`, the
    best of the others on validation. Without a calibrated member the number is the family's best
    on validation and the probe cannot tell. A stored row settled by an earlier rule is settled
    again from its stored numbers (`_previous`)."""
    family = list(row["readouts"])
    reads = calibration.get("readouts") or {}
    calibrated = [n for n in family if n in reads and reads[n] / calibration["best"] >= CALIBRATION_GOAL]
    others = [n for n in family if n not in calibrated]
    row = {k: v for k, v in row.items() if k != "uncalibrated"}
    row = {**row, **chosen_readout({n: row["readouts"][n] for n in calibrated or family})}
    if calibration.get("reference") is None:
        return {**row, "calibration": calibration}
    if calibrated and others:
        # Chosen on validation, as the number is: the evaluation set chooses nothing.
        name = chosen_readout({n: row["readouts"][n] for n in others})["readout"]
        row["uncalibrated"] = {"readout": name, "probe_accuracy": row["readouts"][name]["evaluation"],
                               "ratio": reads[name] / calibration["best"] if name in reads else None}
    member, ratio = family_read(reads, [n for n in family if n in reads], calibration["best"])
    return {**row, "calibration": {**calibration, "member": member, "probe": reads[member], "ratio": ratio,
                                   "calibrated": calibrated, "usable": bool(calibrated),
                                   "chosen_probe": reads.get(row["readout"])}}


def family_read(reads: dict[str, float], family: list[str], best: float) -> tuple[str, float]:
    """How a readout family reads a reference, from each member's accuracy on it (`reads`): its best
    member (on a tie, the first in the family's order) and that member's accuracy as a fraction of
    the reference's best possible read `best`, the fraction CALIBRATION_GOAL is held to."""
    member = max(family, key=lambda n: (reads[n], -family.index(n)))
    return member, reads[member] / best


def _previous(path: Path, config: ReadoutConfig, taken: bool = False) -> tuple[dict[str, dict], dict[str, dict]]:
    """The rows (by cell id) and reference calibrations (by key) of an earlier probe of the run with
    the same readout, or of another run's file whose calibrations are `taken`; one with other
    settings, or of an earlier schema, is refused."""
    other = "give a file of this probe's settings, or leave --calibrations out to train them"
    if not path.is_file():
        return {}, {}
    try:
        doc = json.loads(path.read_text())
        rows, settings, schema = doc["rows"], doc["readout_config"], doc["schema"]
        calibrations = doc.get("calibrations", {})
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise UsageError(f"{path} is unreadable ({e}); {other if taken else 'remove it to probe again'}") from None
    if schema != SCHEMA:
        raise UsageError(f"{path} holds a probe of schema {schema} (this probe writes {SCHEMA}, with a readout "
                         f"family and its calibration); {other if taken else 'move it aside to probe again'}")
    current = json.loads(json.dumps(asdict(config)))  # tuples as lists, as the file holds them
    if settings != current:
        changed = sorted(k for k in current if settings.get(k) != current[k])
        raise UsageError(f"{path} holds a probe with other readout settings ({', '.join(changed)}); " + (
            other if taken else "rerun with the same settings to resume, or remove it to probe again"))
    return {row["cell_id"]: _settled(row) for row in rows}, calibrations


def _settled(row: dict) -> dict:
    """A stored row settled by the current rule from its stored numbers (every member's read of the
    state and of its reference), so that a file written under an earlier choice of readout is
    rewritten under this one on resume, with no readout trained again."""
    if row.get("status") != PROBED or not isinstance(row.get("calibration"), dict) or "readouts" not in row:
        return row
    return settle(row, row["calibration"])


def probe_run(path, weights=(), labels=None, seeds=None, config: ReadoutConfig = ReadoutConfig(), say=print,
              tasks=None, leave_out=frozenset(), calibrations_from=(), levels=None,
              device: torch.device = torch.device("cpu")) -> dict:
    """Probe every finished cell of a run directory (those of `labels`, `seeds`, `tasks` and
    training `levels` (level keys) where given, none of `leave_out`: the learning-rate trials no
    report reads) and write RUN_DIR/state_probe.json after each; cells already probed with the same
    readout are kept with their stored numbers, settled again by the current rule (`_settled`).
    The reference calibrations of the `calibrations_from` files (other runs' state_probe.json, of
    the same readout settings) are taken rather than trained again: a calibration depends on the
    task, level and settings alone. Readouts train on `device`; each row names the hardware that
    computed it. The file is the probe's alone, so the run's lock is not
    taken (a report may be written meanwhile).
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
    unknown = sorted(set(tasks or ()) - {r["cell"]["task"] for r in results})
    if unknown:
        raise UsageError(f"--tasks: no cells of {', '.join(unknown)} in {run_dir}; its tasks: "
                         f"{', '.join(sorted({r['cell']['task'] for r in results}))}")
    unknown = sorted(set(levels or ()) - {level_key(r["cell"]["train_level"]) for r in results})
    if unknown:
        raise UsageError(f"--train-level: no cells trained at {'; '.join(unknown)} in {run_dir}; its levels: "
                         f"{'; '.join(sorted({level_key(r['cell']['train_level']) for r in results}))}")
    chosen = [r for r in results if (not labels or r["cell"]["label"] in labels)
              and (not levels or level_key(r["cell"]["train_level"]) in levels)
              and (seeds is None or r["cell"]["seed"] in seeds) and (not tasks or r["cell"]["task"] in tasks)
              and r["cell_id"] not in leave_out]
    out = run_dir.state_probe_path
    taken = {}
    for other in calibrations_from:
        other = Path(other)
        if not other.is_file():
            raise UsageError(f"--calibrations {str(other)!r} is not a file; give another run's state_probe.json")
        taken.update(_previous(other, config, taken=True)[1])
    done, calibrations = _previous(out, config)
    calibrations = {**taken, **calibrations}
    for result in chosen:
        cell_id = result["cell_id"]
        if done.get(cell_id, {}).get("status") in (PROBED, NO_STATE):
            continue  # probed already; a cell that lacked its weights is tried again
        found = [p for p in [run_dir.weights_path(cell_id), *(f / f"{cell_id}.safetensors" for f in folders)]
                 if p.is_file()]
        row = probe_cell(result, found[0] if found else None, config, calibrations, device)
        # Read again before writing: a second probe of the same run may have added rows meanwhile.
        done, earlier = _previous(out, config)
        calibrations = {**earlier, **calibrations}
        done[cell_id] = row
        write_json(out, document(done.values(), config, calibrations))
        numbers = [f"{name} {row[key]:.3f}" for name, key in (("model", "accuracy"), ("probe", "probe_accuracy"))
                   if row[key] is not None]
        if row.get("calibration", {}).get("reference"):
            c = row["calibration"]
            numbers.append(f"{row['readout']} chosen; the family reads {c['reference']} at {c['probe']:.3f} of "
                           f"{c['best']:.3f} ({c['member']})"
                           f"{'' if c['usable'] else ': the probe cannot tell'}")
            if "uncalibrated" in row:
                u = row["uncalibrated"]
                numbers.append(f"uncalibrated: {u['readout']} {u['probe_accuracy']:.3f}")
        say(f"{row['label']} seed {row['seed']} @ {level_key(result['cell']['train_level'])}: "
            f"{', '.join([row['status'], *numbers])} ({row['wall_time_s']:.0f} s)")
    doc = document(done.values(), config, calibrations)
    write_json(out, doc)
    return doc


def document(rows, config: ReadoutConfig, calibrations: dict | None = None) -> dict:
    """state_probe.json: the readout family's paragraph and settings, the rows by label, level and
    seed, and the reference calibrations they read."""
    order = sorted(rows, key=lambda r: (r["label"], tuple(v for k, v in r.items() if k not in ROW_FIELDS), r["seed"]))
    return {"schema": SCHEMA, "readout": describe_readout(config), "readout_config": asdict(config),
            "calibration_goal": CALIBRATION_GOAL, "rows": order, "calibrations": dict(sorted((calibrations or {}).items()))}


ROW_FIELDS = {"label", "seed", "accuracy", "probe_accuracy", "chance", "status", "probe_validation_accuracy",
              "best_step", "state_floats", "wall_time_s", "cell_id", "readout", "readouts", "calibration", "hardware",
              "uncalibrated"}


def summary(doc: dict) -> list[list]:
    """[label, level, seeds, model accuracy, probe accuracy, readouts chosen, calibration] per label and
    level, means over seeds; the calibration is the family's reading of the closest reference (its
    best member's) as a fraction of its best possible read (the lowest over seeds), or why there is
    none, and the mean of the best uncalibrated reads where the seeds have one."""
    groups: dict[tuple, list[dict]] = {}
    for row in doc["rows"]:
        level = ",".join(f"{k}={v}" for k, v in row.items() if k not in ROW_FIELDS)
        groups.setdefault((row["label"], level), []).append(row)
    out = []
    for (label, level), rows in groups.items():
        probed = [r for r in rows if r["probe_accuracy"] is not None]
        own = [r["accuracy"] for r in rows if r["accuracy"] is not None]
        readouts = ",".join(sorted({r["readout"] for r in probed if r.get("readout")})) or "-"
        calibrated = [r["calibration"] for r in probed if r.get("calibration")]
        if not calibrated:
            note = "-"
        elif all(c.get("reference") for c in calibrated):
            worst = min(calibrated, key=lambda c: c["ratio"])
            note = f"{worst['reference']} {worst['ratio']:.0%}{'' if worst['usable'] else ' (cannot tell)'}"
        else:
            note = next(c["why"] for c in calibrated if not c.get("reference"))
        others = [r["uncalibrated"]["probe_accuracy"] for r in probed if "uncalibrated" in r]
        if others:
            note += (f"; the best uncalibrated read {sum(others) / len(others):.3f} ({len(others)} of {len(probed)} "
                     "seeds, read by no verdict)")
        out.append([label, level, len(rows), sum(own) / len(own) if own else None,
                     sum(r["probe_accuracy"] for r in probed) / len(probed) if probed else rows[0]["status"],
                     readouts, note])
    return out
