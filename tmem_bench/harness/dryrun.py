"""The printed dry run (`tmem-bench run --dry-run`, and what `tmem-bench run` prints before it
trains): the plan as a table per task and variant, and the estimate of estimate.py on the chosen
executor. Nothing is trained; only the step timings measured are written (timings.py)."""
from __future__ import annotations

import math
import os
from pathlib import Path

from .estimate import Estimate, MeasuredCost, Meter, Row, estimate, plan_rows
from .timings import Timings
from .plan import Cell


def fmt_duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.1f}s"
    minutes = round(seconds / 60)
    if minutes < 60:
        return f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours}h{minutes:02d}m"
    return f"{hours / 24:.1f} days"


def _fmt_values(values) -> str:
    return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def fmt_levels(levels: dict[str, dict]) -> str:
    """Training levels (by their keys) compactly: 'n_writes=5,10,20 noise=0.05' when they are a grid,
    else each key."""
    first = next(iter(levels.values()), None)
    if not first:
        return "-"
    values = {a: list(dict.fromkeys(lv[a] for lv in levels.values())) for a in first}
    if math.prod(len(v) for v in values.values()) == len(levels):
        return " ".join(f"{a}={_fmt_values(v)}" for a, v in values.items())
    return "; ".join(levels)


def _fmt_seeds(seeds: list[int]) -> str:
    if len(seeds) > 2 and seeds == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(map(str, seeds))


def _columns(header: list[str], body: list[list[str]], right: set[int]) -> list[str]:
    widths = [max(len(str(r[i])) for r in [header] + body) for i in range(len(header))]

    def line(r):
        return "  ".join(str(v).rjust(w) if i in right else str(v).ljust(w)
                         for i, (v, w) in enumerate(zip(r, widths))).rstrip()
    return [line(header)] + [line(r) for r in body]


def render_plan(rows: list[Row]) -> list[str]:
    out = []
    for (task, variant) in dict.fromkeys((r.task, r.variant) for r in rows):
        these = [r for r in rows if (r.task, r.variant) == (task, variant)]
        cells = sum(len(r.cells) for r in these)
        out += ["", f"{task} [{variant}]: {cells} cell{'' if cells == 1 else 's'}"]
        body = []
        for r in these:
            lr = {"finals": "chosen", "second": "best two"}.get(r.kind, _fmt_values(r.lrs))
            what = {"cells": "", "trials": "lr trials", "second": "second seed, where the best two are close",
                    "finals": "after selection"}[r.kind]
            low, high = (fmt_duration(min(r.seconds)), fmt_duration(max(r.seconds))) if r.seconds else ("-", "-")
            per_cell = low if low == high else f"{low}-{high}"
            steps = f"<={r.steps}" if r.early_stop else str(r.steps)
            body.append([r.label, fmt_levels(r.levels), steps, str(r.batch_size), lr, _fmt_seeds(r.seeds),
                         str(len(r.cells)), str(r.finished), per_cell, what])
        header = ["model", "training levels", "steps", "batch", "lr", "seeds", "cells", "finished", "per cell", ""]
        out += ["  " + line for line in _columns(header, body, right={2, 3, 6, 7, 8})]
    return out


def render(est: Estimate, *, what: str, run_dir: Path, run_dir_exists: bool, executor: str, measured: str,
           parallel_note: str | None = None, dry: bool = True) -> str:
    """The printed dry run (or, not `dry`, the plan a run is about to train): the plan, then the estimate."""
    rows = est.rows
    n_cells = sum(len(r.cells) for r in rows)
    finished = sum(r.finished for r in rows)
    trials = sum(len(r.cells) for r in rows if r.kind == "trials")
    finals = sum(len(r.cells) for r in rows if r.kind == "finals")
    where = (f"{finished} already finished in {run_dir}" if run_dir_exists
             else f"{run_dir} does not exist yet")
    second = sum(len(r.cells) for r in rows if r.kind == "second")
    parts = f"{trials} trials + " + (f"{second} second-seed trials at most + " if second else "") + f"{finals} finals"
    selection = f", of which {trials + second + finals} in learning-rate selection ({parts})" if trials else ""
    head = f"{n_cells} cell{'' if n_cells == 1 else 's'}{selection}; {where}."
    out = [f"dry run of {what}: {head} Nothing is trained; only the step timings it measures are written." if dry else f"plan of {what}: {head}"]
    out += render_plan(rows)
    out += ["", f"estimate: {est.remaining} cell(s) to run, {fmt_duration(est.total_s)} of cell time "
                f"(the longest cell {fmt_duration(est.longest_s)}); {measured}"]
    bounds = ["early-stopping cells (steps <=N) at their cap, with every validation check"] * any(
        r.early_stop for r in rows) + ["a second selection seed wherever one could be needed"] * bool(second)
    if bounds:
        out.append(f"an upper bound: it counts {' and '.join(bounds)}")
    if est.wall_s is not None:
        out.append(f"wall time {executor}: {'at most ' if bounds else ''}about {fmt_duration(est.wall_s)}")
    else:
        out.append(f"{executor}: the wall time depends on how many cells the cluster runs at once; with K at "
                   f"once it is at least the longer of {fmt_duration(est.total_s)} / K and the longest cell")
    if parallel_note:
        out.append(parallel_note)
    return "\n".join(out) + "\n"


def dry_run(cells: list[Cell], searches, run_dir: Path, options, device: str, what: str,
            meter: Meter | None = None, dry: bool = True, keep_weightless: bool = False) -> str:
    """The plan and its estimated wall time on the executor of `options` (executors.ExecutorOptions),
    from the step timings stored for this machine, measuring (and storing) those it lacks; reads
    `run_dir` if it exists (counting its finished cells as a run with `keep_weightless` would) and
    writes nothing there."""
    import torch

    from ..contracts.device import hardware, resolve_device
    from ..version import __version__
    from .executors import ENGINES
    from .executors.base import available_cores

    resolved = resolve_device(device)
    sketch = ENGINES[options.kind].sketch(options, device)
    threads, note = sketch.threads, sketch.note
    machine = f"{resolved.type}: {hardware(resolved)}; {threads} thread(s); torch {torch.__version__}; tmem-bench {__version__}"
    meter = meter or MeasuredCost(resolved, threads, timings=Timings(machine))
    run_dir_exists = Path(run_dir).is_dir()
    rows = plan_rows(cells, searches, Path(run_dir) if run_dir_exists else None, keep_weightless)
    measured = "per cell: setup + steps x the step time (+ validation checks) + evaluation"
    if isinstance(meter, MeasuredCost):
        meter.prepare(c for row in rows for c in row.cells)
    est = estimate(rows, meter, sketch.workers)
    timings = getattr(meter, "timings", None)
    if timings is not None:
        timings.save()
    if isinstance(meter, MeasuredCost) and not meter.measured and timings is not None:
        measured += (f", from the step timings of {resolved} ({hardware(resolved)}) with {threads} thread(s) "
                     f"measured here before and kept in {timings.path} (delete it to measure again)")
    elif isinstance(meter, MeasuredCost):
        sizes = "8 and 32" if resolved.type == "cpu" else "16 and the cell's batch"
        measured += (f", measured here on {resolved} ({hardware(resolved)}) with {threads} thread(s): "
                     f"{meter.measured} shapes (training steps and forward passes, at each model's shortest and "
                     f"longest sequence, interpolated between) timed at batch sizes {sizes}, each after "
                     f"{meter.warmup} warm-up, fitted and extrapolated to each cell's "
                     f"({fmt_duration(meter.seconds)} of measuring)")
        if timings is not None:
            measured += f"; kept in {timings.path} for the next estimate on this machine"
        load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
        if resolved.type == "cpu" and load > available_cores():
            # Other processes' work is in every measured step: the estimate is for a machine this busy.
            busy = (f"note: the load average here is {load:.1f} on {available_cores()} cores, so the measured "
                    f"times include waiting for a core; on an idle machine the run is faster")
            note = f"{note}\n{busy}" if note else busy
    return render(est, what=what, run_dir=Path(run_dir), run_dir_exists=run_dir_exists, executor=sketch.text,
                  measured=measured, parallel_note=note, dry=dry)
