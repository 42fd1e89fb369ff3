"""Where the cells of a plan run: in this process, in a local process pool, as Ray tasks or as a
Slurm job array through submitit.

Every executor maps one picklable cell function over plain-data jobs (a cell's settings and the
run directory's path, never a model or a tensor) and yields `(job, outcome)` as cells finish,
and `None` while it waits so that the driver can refresh its display. A worker that dies, a
job the scheduler ends or a lost node becomes a failed outcome here; retries, failure records
and progress are the driver's (runner.py), so every executor behaves the same; the run directory's
files, jobs.json included, are rundir.py's.

Each engine is one module that declares itself to the registry (base.ENGINES, base.py says what an
engine declares); importing it here registers it, in the order the messages list the engines.
"""
from __future__ import annotations

from ..rundir import RunDir
from .base import ENGINES, Executor, ExecutorOptions, usable
from .local import LocalPool
from .ray_tasks import RayTasks
from .slurm import SlurmOptions, SubmititJobs, cancel_jobs, job_states, read_jobs_record

__all__ = ["ENGINES", "Executor", "ExecutorOptions", "LocalPool", "RayTasks", "SlurmOptions", "SubmititJobs",
           "cancel_jobs", "job_states", "make_executor", "read_jobs_record", "usable"]


def make_executor(o: ExecutorOptions, run_dir: RunDir, device: str) -> Executor:
    """The engine of options checked by `usable`, started."""
    return ENGINES[o.kind].make(o, run_dir, device)
