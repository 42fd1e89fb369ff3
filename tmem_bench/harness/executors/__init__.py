"""Where the cells of a plan run: in this process, in a local process pool, as Ray tasks or as a
Slurm job array through submitit.

Every executor maps one picklable cell function over plain-data jobs (a cell's settings and the
run directory's path, never a model or a tensor) and yields `(job, outcome)` as cells finish,
and `None` while it waits so that the driver can refresh its display. A worker that dies, a
job the scheduler ends or a lost node becomes a failed outcome here; retries, failure records
and progress are the driver's (runner.py), so every executor behaves the same; the run directory's
files, jobs.json included, are rundir.py's.

Each engine is one module that declares itself to the registry (base.ENGINES; base.py says what an
engine declares); importing it here registers it, in the order the messages list the engines.
`add_flags` puts every engine's flags on `tmem-bench run`, `from_args` reads them back, and
`usable` checks options against every engine registered.
"""
from __future__ import annotations

import argparse
from dataclasses import replace

from ...errors import UsageError, check_float, check_int
from .base import CPUS_PER_CELL, ENGINES, Executor, ExecutorOptions, make_executor
# Importing an engine registers it: in this order, the order the messages list them.
from .serial import Serial
from .local import LocalOptions, LocalPool
from .ray_tasks import RayOptions, RayTasks
from .slurm import SlurmOptions, SubmititJobs, cancel_jobs, job_states, read_jobs_record

__all__ = ["ENGINES", "Executor", "ExecutorOptions", "LocalOptions", "LocalPool", "RayOptions", "RayTasks",
           "Serial", "SlurmOptions", "SubmititJobs", "add_flags", "cancel_jobs", "from_args", "job_states",
           "make_executor", "read_jobs_record", "usable"]


def add_flags(parser: argparse.ArgumentParser) -> None:
    """--executor and every engine's flags, each once, its help what it means to each engine that takes it."""
    summaries = ", ".join(f"{name} ({e.summary})" for name, e in ENGINES.items())
    parser.add_argument("--executor", default="serial", metavar="|".join(ENGINES),
                        help=f"where the cells run: {summaries}")
    parser.add_argument(CPUS_PER_CELL.name, help=CPUS_PER_CELL.help, **CPUS_PER_CELL.settings)
    declared: dict[str, list] = {}
    for name, e in ENGINES.items():
        for flag in e.flags:
            declared.setdefault(flag.name, []).append((name, flag))
    for flag, by in declared.items():
        settings = by[0][1].settings
        if any(f.settings != settings for _, f in by):
            raise TypeError(f"the engines {', '.join(n for n, _ in by)} declare {flag} with different settings")
        parser.add_argument(flag, help="; ".join(f"{n}: {f.help}" for n, f in by), **settings)


def from_args(args: argparse.Namespace) -> ExecutorOptions:
    """The options of a parsed command line, not yet checked by `usable`. Every engine's own options
    are made (each checks its values as it is made, whichever engine runs), so that a flag of one
    engine given to another is refused by name."""
    own = tuple(e.Options.from_args(args) for e in ENGINES.values() if e.Options is not None)
    return ExecutorOptions(kind=args.executor, workers=args.workers, cpus_per_cell=args.cpus_per_cell,
                           gpus_per_cell=args.gpus_per_cell, own=own)


def usable(options: ExecutorOptions | str | None) -> ExecutorOptions:
    """The options checked, with the engine's own options in `own`, or a UsageError naming what is
    wrong (including a missing extra)."""
    o = ExecutorOptions(kind=options) if isinstance(options, str) else (options or ExecutorOptions())
    chosen = ENGINES.get(o.kind)
    if chosen is None:
        raise UsageError(f"--executor {o.kind!r} is unknown; allowed: {', '.join(ENGINES)}")
    owns = o.own if isinstance(o.own, tuple) else () if o.own is None else (o.own,)
    given = [flag for flag, value in (("--workers", o.workers), ("--gpus-per-cell", o.gpus_per_cell))
             if value is not None]
    given += [flag for own in owns for flag in own.given()]
    for flag in given:
        if not chosen.takes(flag):
            kinds = [name for name, e in ENGINES.items() if e.takes(flag)]
            raise UsageError(f"{flag} applies to --executor {' or '.join(kinds)}, not {o.kind}")
    for flag, count in (("--workers", o.workers), ("--cpus-per-cell", o.cpus_per_cell)):
        if count is not None:
            check_int(flag, count)
    if o.gpus_per_cell is not None:
        check_float("--gpus-per-cell", o.gpus_per_cell)
    # Another engine's options, none of their flags given, give way to this one's defaults.
    mine = [own for own in owns if chosen.Options is not None and isinstance(own, chosen.Options)]
    o = replace(o, own=mine[0] if mine else chosen.Options() if chosen.Options is not None else None)
    chosen.check(o)
    return o
