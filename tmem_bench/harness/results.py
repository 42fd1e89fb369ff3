"""Cell results as files and as rows: a cell file read and checked, weights, the rows a cell gives
(evaluation, training curve, gates) and the results table; a run's files read only where they are
regular files. Where each file lies in a run directory is rundir.py's."""
from __future__ import annotations

import errno
import json
import math
import os
import stat
from pathlib import Path
from typing import BinaryIO

import pandas as pd

from ..diagnostics.convergence import judge_cell
from ..files import write_atomic
from ..levels import level_key
from ..schema import describe, violations


def write_weights(path: Path, module, cell_id: str, result: dict | None = None) -> None:
    """A cell's weights; with its `result`, the file names its model, the cell's settings, the
    model's configuration and the suite version in its own metadata, so that it says alone what
    to build it into (safetensors metadata holds strings only: the dicts as JSON)."""
    import safetensors.torch  # here, not at the top: reading results needs no torch

    about = {"cell_id": cell_id}
    if result is not None:
        about |= {"model": result["cell"]["model"], "label": result["cell"]["label"],
                  "cell": json.dumps(result["cell"], sort_keys=True),
                  "model_config": json.dumps(result.get("model_config"), sort_keys=True),
                  "tmem_bench_version": result["tmem_bench_version"], "torch_version": result["torch_version"]}
    # Copies: safetensors refuses tensors that share storage, and a copy is cheap at these sizes.
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in module.state_dict().items()}
    write_atomic(path, canonical_safetensors(safetensors.torch.save(tensors, metadata=about)))


def canonical_safetensors(blob: bytes) -> bytes:
    """The same file with its JSON header's keys sorted: safetensors writes the header from hash maps,
    in an order that changes from one process to the next, and a cell's weights must be the same
    bytes on every run (offsets in the header are relative to the data, so only the header moves)."""
    n = int.from_bytes(blob[:8], "little")
    header = json.dumps(json.loads(blob[8:8 + n]), sort_keys=True, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)  # safetensors aligns the data to 8 bytes with trailing spaces
    return len(header).to_bytes(8, "little") + header + blob[8 + n:]


def open_regular(path) -> BinaryIO:
    """`path` opened for binary reading, or an OSError when it is not a regular file. It is opened
    without waiting (a plain open() of a FIFO blocks until something writes to it) and checked
    before anything is read, so a FIFO, device or folder put where a run keeps a file is refused."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file (a FIFO, device or folder is never read)", str(path))
    return os.fdopen(fd, "rb")


def read_text(path) -> str:
    """The text of a regular file (open_regular)."""
    with open_regular(path) as f:
        return f.read().decode()


def load_weights(path: Path, module) -> None:
    """Load a cell's weights into a module (torch.nn.Module) built from the cell's settings;
    ValueError names the file when it is unreadable, larger than the module's weights can be
    (checked before it is read), or does not fit the module."""
    import safetensors
    import safetensors.torch

    path = Path(path)
    state = module.state_dict()
    # safetensors' header is a few dozen bytes a tensor; this allows many times that
    limit = 2**16 + 2**10 * len(state) + sum(t.numel() * t.element_size() for t in state.values())
    try:
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            data = f.read(limit + 1) if size <= limit else None  # read to the limit: the file may grow
        if data is None or len(data) > limit:
            raise ValueError(f"weights file cells/{path.name} is {max(size, len(data or b'')):,} bytes, more than "
                             f"the {limit:,} its cell's model's weights can take; it was not read")
        tensors = safetensors.torch.load(data)
    except (OSError, safetensors.SafetensorError) as e:
        raise ValueError(f"weights file cells/{path.name} is unreadable: {e}") from None
    try:
        module.load_state_dict(tensors)
    except RuntimeError as e:
        raise ValueError(f"weights file cells/{path.name} does not fit its cell's model: "
                         f"{str(e).splitlines()[0]}") from None


def read_cell(path: Path) -> dict:
    """A stored cell result, checked against the cell schema; ValueError names the file and
    what is wrong when it is unreadable, incomplete or malformed."""
    path = Path(path)
    name = f"cell file cells/{path.name}"
    try:
        result = json.loads(read_text(path))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{name} is unreadable: {e}") from None
    found = violations(result, "cell")
    if found:
        kind = "incomplete" if found[0].validator == "required" else "malformed"
        raise ValueError(f"{name} is {kind}: {describe(found[0])}")
    if result["cell_id"] != path.stem:
        raise ValueError(f"{name} holds cell {result['cell_id']}, not {path.stem}")
    return result


def steps_run(result: dict) -> int:
    """The training steps a cell ran: its own record (early stopping may end it before its cap),
    else, for a cell from before cells recorded it, its budget or the steps before it diverged."""
    ran = result.get("steps_run")
    if isinstance(ran, int) and not isinstance(ran, bool):
        return ran
    diverged = result.get("diverged_at_step")
    if isinstance(diverged, int) and not isinstance(diverged, bool):
        return diverged - 1
    return result["cell"]["train"]["steps"]


def loop_steps_per_s(result: dict) -> float:
    """Training-loop speed from the logged windows; the cell's own steps_per_s also counts model
    building and the causality probe, which dominate short runs."""
    seconds, last = 0.0, 0
    for h in result.get("history") or []:
        if h.get("steps_per_s"):
            seconds += (h["step"] - last) / h["steps_per_s"]
        last = h["step"]
    return last / seconds if seconds > 0 else result.get("steps_per_s", math.nan)


def _cell_keys(result: dict) -> dict:
    cell = result["cell"]
    return {
        "cell_id": result["cell_id"], "task": cell["task"], "variant": cell["variant"], "label": cell["label"],
        "seed": cell["seed"], "train_level": level_key(cell["train_level"]),
    }


def history_rows(result: dict) -> list[dict]:
    keys = _cell_keys(result)
    return [{**keys, "step": h["step"], "loss": h["loss"], "train_acc": h["train_acc"]}
            for h in result.get("history") or []]


def gate_rows(result: dict) -> list[dict]:
    init = result.get("gate_init")
    if not init:
        return []
    keys = _cell_keys(result)
    out = [{**keys, "layer": layer, "step": 0, "gate": value} for layer, value in init.items()]
    for h in result.get("history") or []:
        for layer, value in (h.get("gates") or {}).items():
            out.append({**keys, "layer": layer, "step": h["step"], "gate": value})
    return out


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
            "label": cell["label"],
            "model": cell["model"],
            "seed": cell["seed"],
            "train_level": level_key(cell["train_level"]),
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
            "steps_run": steps_run(result),
            # A cell from before early stopping ran its fixed budget, or diverged.
            "stopped": result.get("stopped") or ("diverged" if result.get("status") == "diverged" else "cap"),
            "stopped_too_early": None,  # both filled in below, once per cell
            "causality": result.get("causality", {}).get("verdict"),
            "status": result.get("status", "finished"),
            "diverged_at_step": result.get("diverged_at_step"),
            "final_loss": (result.get("history") or [{}])[-1].get("loss"),
            "lr": cell["train"].get("lr"),
            "validation_accuracy": (result.get("validation") or {}).get("accuracy"),
            "converged": None,
            "state_bytes": result.get("state_bytes"),
            "reach_init": ((result.get("reach") or {}).get("init") or {}).get("ratio"),
            "reach_trained": ((result.get("reach") or {}).get("trained") or {}).get("ratio"),
            "device": result.get("device"),
            "hardware": result.get("hardware"),
        }
        if ev.get("closed_loop"):  # a task with an environment: the model acting in it (harness.closed_loop)
            row["normalised_return"] = ev["closed_loop"]["mean_return"]
        for axis, value in ev["level"].items():
            row[axis] = value
        for axis, value in cell["train_level"].items():
            row[f"train_{axis}"] = value
        row["gate_init_mean"] = _mean_gate(result.get("gate_init"))
        row["gate_final_mean"] = _mean_gate(result.get("gates_final"))
        out.append(row)
    judged = judge_cell(result)  # a replay of the cell's checks: once per cell, not per level
    for row in out:
        row.update(judged)
    return out


def results_table(results: list[dict], selection: list[dict] = ()) -> pd.DataFrame:
    """One row per cell and evaluation level; with a run's learning-rate searches, each cell of a
    search also gets its grid (`lr_grid`) and the lr chosen on validation data (`lr_chosen`)."""
    chosen = {}
    for search in selection:
        grid = " ".join(f"{lr:g}" for lr in search.get("grid", []))
        trials = search.get("trials", []) + search.get("second_trials", [])
        for cid in [t["cell_id"] for t in trials] + search.get("final_cells", []):
            chosen[cid] = {"lr_grid": grid, "lr_chosen": search.get("chosen_lr")}
    return pd.DataFrame([{**row, **chosen.get(row["cell_id"], {})} for result in results for row in rows(result)])
