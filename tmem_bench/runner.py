"""Run a plan: each cell trained in turn, results written atomically, resume for free."""
from __future__ import annotations

import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from . import __version__
from .plan import Cell
from .results import cell_path, load_cells, read_cell, results_table, write_atomic, write_json
from .train import resolve_device, run_cell


def write_table(run_dir: Path) -> None:
    results, _ = load_cells(run_dir)
    write_atomic(run_dir / "results.csv", results_table(results).to_csv(index=False))


def command_as_typed(argv: list[str] | None = None, module: str | None = None) -> list[str]:
    """The command line as the user typed it, without the machine's paths: `tmem-bench run ...`,
    `python cli.py run ...` or, for `module`, `python -m tmem_bench.cli run ...`. By default
    this process's own command."""
    if argv is None:
        argv = sys.argv
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        module = spec.name.removesuffix(".__main__") if spec is not None else None
    if module:  # python -m: argv[0] is the module's absolute file path
        program = ["python", "-m", module]
    elif argv[0].endswith(".py"):
        program = ["python", Path(argv[0]).name]
    else:
        program = [Path(argv[0]).name]
    return program + list(argv[1:])


def run_plan(
    cells: list[Cell],
    run_dir: Path,
    device: str = "auto",
    settings: dict | None = None,
    console: Console | None = None,
) -> list[dict]:
    console = console or Console(stderr=True)
    run_dir = Path(run_dir)
    resolved = resolve_device(device)
    write_json(run_dir / "manifest.json", {
        "tmem_bench_version": __version__,
        "torch_version": torch.__version__,
        "command": command_as_typed(),
        "device": str(resolved),
        "started": datetime.now(timezone.utc).isoformat(),
        "settings": settings or {},
        "cells": [{"id": c.id, "describe": c.describe()} for c in cells],
    })
    todo = []
    for cell in cells:
        path = cell_path(run_dir, cell.id)
        try:
            read_cell(path)
        except ValueError:
            todo.append(cell)  # missing, or left half-done by a killed run: train it again
    if len(todo) < len(cells):
        console.print(f"resuming: {len(cells) - len(todo)} of {len(cells)} cells already finished in {run_dir}")
    columns = (
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
        TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
    )
    with Progress(*columns, console=console, transient=False) as progress:
        overall = progress.add_task("cells", total=len(todo))
        for cell in todo:
            steps = progress.add_task(f"  {cell.describe()}", total=cell.train["steps"])
            t0 = time.perf_counter()
            result = run_cell(cell, resolved, on_step=lambda s, n: progress.update(steps, completed=s))
            write_json(cell_path(run_dir, cell.id), result)
            write_table(run_dir)
            progress.remove_task(steps)
            progress.advance(overall)
            best = max(e["accuracy"] for e in result["eval"])
            progress.console.print(
                f"done {cell.describe()}: {time.perf_counter() - t0:.0f}s, "
                f"best eval accuracy {best:.1%}, probe {result['causality']['verdict']}"
            )
    write_table(run_dir)
    results, _ = load_cells(run_dir)
    wanted = {c.id for c in cells}
    return [r for r in results if r["cell_id"] in wanted]

