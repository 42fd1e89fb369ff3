"""Where the cells of a plan run: in this process, in a local process pool, as Ray tasks or as a
Slurm job array through submitit.

Every executor maps one picklable cell function over plain-data jobs (a cell's settings and the
run directory's path, never a model or a tensor) and yields `(job, outcome)` as cells finish,
and `None` while it waits so that the driver can refresh its display. A worker that dies, a
job the scheduler ends or a lost node becomes a failed outcome here; retries, failure records
and progress are the driver's (runner.py), so every executor behaves the same; the run directory's
files, jobs.json included, are rundir.py's.

Each engine is one module that declares itself to the registry (base.ENGINES; base.py says what an
engine declares); importing it here registers it, in the order the messages list the engines, and
`usable` checks options against every engine registered.
"""
from __future__ import annotations

from dataclasses import replace

from ...errors import UsageError, check_float, check_int
from .base import ENGINES, Executor, ExecutorOptions, make_executor
from .local import LocalPool
from .ray_tasks import RayTasks
from .slurm import SlurmOptions, SubmititJobs, cancel_jobs, job_states, read_jobs_record

__all__ = ["ENGINES", "Executor", "ExecutorOptions", "LocalPool", "RayTasks", "SlurmOptions", "SubmititJobs",
           "cancel_jobs", "job_states", "make_executor", "read_jobs_record", "usable"]


def usable(options: ExecutorOptions | str | None) -> ExecutorOptions:
    """The options checked, with the engine's own options in `own`, or a UsageError naming what is
    wrong (including a missing extra)."""
    o = ExecutorOptions(kind=options) if isinstance(options, str) else (options or ExecutorOptions())
    chosen = ENGINES.get(o.kind)
    if chosen is None:
        raise UsageError(f"--executor {o.kind!r} is unknown; allowed: {', '.join(ENGINES)}")
    shared = {"--workers": o.workers, "--workers-per-gpu": o.workers_per_gpu, "--address": o.address,
              "--gpus-per-cell": o.gpus_per_cell}
    given = [flag for flag, value in shared.items() if value is not None]
    given += o.own.given() if o.own is not None else []
    for flag in given:
        if flag not in chosen.flags:
            kinds = [name for name, e in ENGINES.items() if flag in e.flags]
            raise UsageError(f"{flag} applies to --executor {' or '.join(kinds)}, not {o.kind}")
    for flag, count in (("--workers", o.workers), ("--workers-per-gpu", o.workers_per_gpu),
                        ("--cpus-per-cell", o.cpus_per_cell)):
        if count is not None:
            check_int(flag, count)
    if o.gpus_per_cell is not None:
        check_float("--gpus-per-cell", o.gpus_per_cell)
    if chosen.Options is None:
        o = replace(o, own=None)
    elif not isinstance(o.own, chosen.Options):
        o = replace(o, own=chosen.Options())  # another engine's, none of its flags given: this one's defaults
    chosen.check(o)
    return o
