"""Run a plan: the cells mapped over an executor, results written atomically, failed cells retried
then recorded, resume for free."""
from __future__ import annotations

import socket
import sys
import threading
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable

import torch
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

from ..contracts.device import resolve_device
from ..errors import check_int
from ..registry import module_names, module_names_allowed
from ..version import __version__
from .executors import make_executor, usable
from .executors.base import Executor, ExecutorOptions, failure
from .plan import Cell, Plan, cell_from_dict
from .rundir import RunDir
from .selection import choose
from .train import train_cell


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
    cells: list[Cell] | Plan,
    run_dir: Path | RunDir,
    device: str = "auto",
    settings: dict | None = None,
    console: Console | None = None,
    append: bool = False,
    *,
    executor: ExecutorOptions | str | None = None,
    retries: int = 1,
    announce: Callable[[], None] | None = None,
    keep_weightless: bool = False,
) -> list[dict]:
    """Run every cell not yet finished in `run_dir` on `executor` (serial by default); a cell that
    raises is tried `retries` more times, then recorded in failed/<id>.json. A plan's learning-rate
    searches run in two stages: their trials beside the fixed cells, then, once every trial of a
    search has a result, its remaining seeds at the lr chosen on validation data (recorded in
    selection.json). The finished cells' results. The executor options, `retries` and the run
    directory are checked here, before anything is written. `announce` (the plan's estimate, say)
    is called once they pass and the directory is this run's, before the first cell."""
    console = console or Console(stderr=True)
    options = usable(executor)
    retries = check_int("--retries", retries, minimum=0)
    run_dir = RunDir.create(run_dir)
    plan = cells if isinstance(cells, Plan) else Plan(list(cells))
    with run_dir.lock(say=console.print):
        run_dir.begin(plan.cells, {
            "tmem_bench_version": __version__,
            "torch_version": torch.__version__,
            "command": command_as_typed(),
            "device": str(resolve_device(device)),
            "started": datetime.now(timezone.utc).isoformat(),
            "settings": settings or {},
        }, append)
        for path in run_dir.remove_stale():
            console.print(f"removed {path.name}, a temporary file left by a killed run")
        if announce is not None:
            announce()
        executor = None
        try:
            stages = [plan.cells]
            if plan.searches:
                # A second pass once the second selection seeds some searches needed have their results.
                passes = 2 if any(s.second_seed is not None for s in plan.searches) else 1
                stages += [lambda: _select(plan, run_dir, console)] * passes
            wanted = set()
            for stage in stages:
                cells = stage if isinstance(stage, list) else [c for c in stage() if c.id not in wanted]
                wanted |= {c.id for c in cells}
                todo = run_dir.unfinished(cells, say=lambda line: console.print(escape(line)),
                                          keep_weightless=keep_weightless)
                if todo:
                    executor = executor or make_executor(options, run_dir, device)
                    run_dir.write_jobs(executor)
                    console.print(escape(f"running {len(todo)} cell(s) {executor.describe()}"))
                    _run_cells(todo, run_dir, device, executor, retries, console)
        finally:
            if executor is not None:
                executor.close()
        run_dir.write_table()
        results, _ = run_dir.load_cells()
        return [r for r in results if r["cell_id"] in wanted]


def _select(plan: Plan, run_dir: RunDir, console: Console) -> list[Cell]:
    """Choose each search's lr from its trials' results, record the choices in selection.json and
    the cells they plan in the manifest; the cells to train next: a second selection seed where a
    choice needs one, the remaining seeds at the chosen lrs."""
    results = {r["cell_id"]: r for r in run_dir.load_cells()[0]}
    records, after = [], []
    for search in plan.searches:
        record = choose(search, results)
        records.append(record)
        after += search.cells_after(record)
        waiting = set(record.get("missing", [])) - {c.id for c in after}
        if record["chosen_lr"] is None and waiting:
            console.print(f"no lr chosen for {escape(search.trials[0].describe())}: "
                          f"{len(waiting)} trial(s) without a result")
    run_dir.write_selection(records)
    run_dir.add_after_selection(after)
    chosen = sum(r["chosen_lr"] is not None for r in records)
    second = sum(bool(r.get("second_seed_lrs")) for r in records)
    console.print(f"learning rates chosen on validation data for {chosen} of {len(records)} searches "
                  f"({sum(bool(r['at_edge']) for r in records)} at an edge of the grid"
                  + (f"; {second} within the margin, trained at a second seed" if second else "") + ")")
    return after


def run_job(job: dict) -> dict:
    """The cell function every executor maps, in whatever process or machine runs it: train one
    cell from its plain-data description, write its result into the run directory through the
    atomic writer, and say how it went (an exception becomes a failed outcome, not a crash)."""
    if job.get("threads"):
        torch.set_num_threads(job["threads"])
    start = time.perf_counter()
    try:
        # The driver's trust in module:attribute names, which a worker process does not inherit.
        with module_names(job.get("module_names", False)):
            cell = cell_from_dict(job["cell"])
            result, model = train_cell(cell, job["device"])
        # On the CPU the numbers depend on the thread count too: kept to explain a difference.
        result["torch_threads"] = torch.get_num_threads()
        RunDir(job["run_dir"]).write_cell(job["cell_id"], result, model)
    except Exception as e:  # noqa: BLE001 - the cell's own failure, recorded by the driver
        return failure(job, e)
    return {"cell_id": job["cell_id"], "ok": True, "host": socket.gethostname(),
            "seconds": time.perf_counter() - start}


def _run_cells(todo: list[Cell], run_dir: RunDir, device: str, executor: Executor, retries: int,
               console: Console) -> None:
    jobs = {c.id: {"cell_id": c.id, "cell": asdict(c), "run_dir": str(run_dir), "device": device,
                   "threads": executor.threads, "module_names": module_names_allowed()} for c in todo}
    described = {c.id: c.describe() for c in todo}
    attempts = dict.fromkeys(jobs, 0)
    with CellProgress(run_dir, list(jobs), console, executor.slots) as progress:
        round_, failed = list(jobs), {}
        for _ in range(retries + 1):
            failed = {}
            progress.start(len(round_))
            for step in executor.map(run_job, [jobs[cid] for cid in round_]):
                progress.poll()
                if step is None:
                    continue
                job, outcome = step
                cid = job["cell_id"]
                attempts[cid] += 1
                outcome = _seen_here(run_dir, outcome) if outcome["ok"] else outcome
                progress.ended()
                if outcome["ok"]:
                    run_dir.clear_failure(cid)
                    run_dir.write_table()
                    progress.console.print(escape(_done_line(described[cid], outcome["result"])))
                    continue
                last = attempts[cid] > retries or outcome.get("retry") is False
                failed[cid] = outcome
                what = "giving up" if last else "it will be retried"
                progress.console.print(escape(f"FAILED {described[cid]} (attempt {attempts[cid]} of {retries + 1}, "
                                              f"on {outcome.get('host', '?')}): {outcome['error']}; {what}"))
                if last:
                    progress.gave_up()
                    _record_failure(run_dir, jobs[cid], described[cid], attempts[cid], outcome, executor)
            round_ = [cid for cid in failed if attempts[cid] <= retries and failed[cid].get("retry") is not False]
            if not round_:
                break


def _seen_here(run_dir: RunDir, outcome: dict) -> dict:
    """The outcome of a worker that says it finished, once its cell file is read back here: a worker
    writing where the driver cannot see (a node's own disk) is a failure, not a finished cell."""
    try:
        return {**outcome, "result": run_dir.read_cell(outcome["cell_id"])}
    except ValueError as e:
        return {**outcome, "ok": False, "retry": False, "traceback": str(e),
                "error": f"{e} after its worker on {outcome.get('host', '?')} finished it; the run directory "
                         "must be on a filesystem the workers share with the driver"}


def _done_line(describe: str, result: dict) -> str:
    """The cell's accuracy where the report reads it first: at the level it was trained at."""
    trained = [e for e in result["eval"] if e["level_key"] == result["validation"]["level_key"]]
    if trained:
        accuracy = f"eval accuracy {trained[0]['accuracy']:.1%} at its trained level"
    else:  # trained over a mix of levels, or read only elsewhere
        accuracy = "eval accuracy " + ", ".join(f"{e['accuracy']:.1%} at {e['level_key']}" for e in result["eval"])
    diverged = (f", DIVERGED at step {result['diverged_at_step']} (non-finite loss)"
                if result["status"] == "diverged" else "")
    return (f"done {describe}: {result['wall_time_s']:.0f}s, {accuracy}, "
            f"probe {result['causality']['verdict']}{diverged}")


def _record_failure(run_dir: RunDir, job: dict, describe: str, attempts: int, outcome: dict,
                    executor: Executor) -> None:
    run_dir.record_failure(job["cell_id"], {
        "cell_id": job["cell_id"],
        "describe": describe,
        "cell": job["cell"],
        "attempts": attempts,
        "executor": executor.name,
        "host": outcome.get("host"),
        "error": outcome["error"],
        "traceback": outcome["traceback"],
        "failed_at": datetime.now(timezone.utc).isoformat(),
    })


# Off a terminal (a log file, a CI job) the bar does not redraw: a plain line this often instead.
PLAIN_EVERY_S = 30.0


class CellProgress:
    """The driver's display, the same for every executor: cells done, running and failed, and the
    time left. Done is counted from the cell files in cells/, so cells that workers on other
    machines finish count as soon as their files appear. Off a terminal it prints a plain line at
    least every PLAIN_EVERY_S while cells run."""

    def __init__(self, run_dir: RunDir, ids: list[str], console: Console, slots: int | None):
        self.slots = slots  # cells that can run at once, where the executor knows it
        self.run_dir = run_dir
        self.ids = set(ids)
        # A cell retrained over a torn or edited file is done once that file is replaced.
        self.before = {i: run_dir.cell_mtime(i) for i in ids}
        self.running = self.failed = 0
        self.progress = Progress(
            TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
            TextColumn("{task.fields[state]}"), TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(),
            console=console, transient=False)
        self.console = self.progress.console
        self.started = time.monotonic()
        self.line = ""
        self.stop = threading.Event()
        self.plain = None if self.console.is_terminal else threading.Thread(target=self._plain_lines, daemon=True)

    def __enter__(self) -> "CellProgress":
        self.progress.__enter__()
        self.task = self.progress.add_task("cells", total=len(self.ids), state="")
        if self.plain is not None:
            self.plain.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.poll()
        self.progress.__exit__(*exc)

    def start(self, n: int) -> None:
        self.running = n
        self.poll()

    def ended(self) -> None:
        self.running -= 1

    def gave_up(self) -> None:
        self.failed += 1

    def poll(self) -> None:
        stored = self.run_dir.stored()
        done = sum(1 for i in self.ids if i in stored
                   and (self.before[i] is None or self.run_dir.cell_mtime(i) != self.before[i]))
        if self.slots is None:
            state = f"{self.running} queued or running"
        else:
            running = min(self.running, self.slots)
            state = f"{running} running" + (f", {self.running - running} queued" if self.running > running else "")
        failed = f", [red]{self.failed} failed[/red]" if self.failed else ""
        self.progress.update(self.task, completed=done, state=state + failed)
        self.line = f"{done}/{len(self.ids)} cells done, {state}{failed}"

    def _plain_lines(self) -> None:
        """A plain line every PLAIN_EVERY_S, from a thread of its own: the serial engine trains in
        the driver's thread, which polls only between cells."""
        while not self.stop.wait(PLAIN_EVERY_S):
            elapsed = int(time.monotonic() - self.started)
            self.console.print(f"{self.line}, {elapsed // 3600}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d} elapsed")

