"""What every executor shares: its options and their checks, the outcome of a failed cell, and the
serial executor the others extend."""
from __future__ import annotations

import importlib.util
import os
import shutil
import socket
import traceback
from dataclasses import dataclass, field
from typing import Callable, Iterator

from ...errors import UsageError, check_float, check_int

EXECUTORS = ("serial", "local", "ray", "slurm")
EXTRAS = {"ray": "ray", "slurm": "submitit"}  # executor -> the package its extra installs
CLUSTERS = ("slurm", "local")
TICK_S = 0.5

Outcome = dict
Step = tuple[dict, Outcome] | None


@dataclass(frozen=True)
class ExecutorOptions:
    kind: str = "serial"
    workers: int | None = None  # local: processes; slurm: array tasks running at once
    address: str | None = None  # ray: an existing cluster; None starts a local Ray
    cpus_per_cell: int | None = None
    gpus_per_cell: float | None = None
    slurm_partition: str | None = None
    slurm_time: str = "240"  # minutes, H:MM:SS or D-HH:MM:SS
    slurm_options: dict = field(default_factory=dict)  # extra sbatch options, KEY -> VALUE
    slurm_cluster: str = "slurm"  # "local" runs the jobs as processes here, through submitit


def usable(options: ExecutorOptions | str | None) -> ExecutorOptions:
    """The options checked, or a UsageError naming what is wrong (including a missing extra)."""
    o = ExecutorOptions(kind=options) if isinstance(options, str) else (options or ExecutorOptions())
    if o.kind not in EXECUTORS:
        raise UsageError(f"--executor {o.kind!r} is unknown; allowed: {', '.join(EXECUTORS)}")
    applies = {
        "--workers": (o.workers is not None, ("local", "slurm")),
        "--address": (o.address is not None, ("ray",)),
        "--gpus-per-cell": (o.gpus_per_cell is not None, ("ray", "slurm")),
        "--slurm-partition": (o.slurm_partition is not None, ("slurm",)),
        "--slurm-option": (bool(o.slurm_options), ("slurm",)),
    }
    for flag, (given, kinds) in applies.items():
        if given and o.kind not in kinds:
            raise UsageError(f"{flag} applies to --executor {' or '.join(kinds)}, not {o.kind}")
    for flag, count in (("--workers", o.workers), ("--cpus-per-cell", o.cpus_per_cell)):
        if count is not None:
            check_int(flag, count)
    if o.gpus_per_cell is not None:
        check_float("--gpus-per-cell", o.gpus_per_cell)
        if o.kind == "slurm" and not float(o.gpus_per_cell).is_integer():
            raise UsageError(f"--gpus-per-cell must be a whole number with --executor slurm, got {o.gpus_per_cell}")
    if o.slurm_cluster not in CLUSTERS:
        raise UsageError(f"--slurm-cluster {o.slurm_cluster!r} is unknown; allowed: {', '.join(CLUSTERS)}")
    minutes(o.slurm_time)
    package = EXTRAS.get(o.kind)
    if package and importlib.util.find_spec(package) is None:
        raise UsageError(f"--executor {o.kind} needs {package}, which is not installed; "
                         f"install it with: pip install \"tmem-bench[{o.kind}]\"")
    if o.kind == "slurm" and o.slurm_cluster == "slurm" and shutil.which("sbatch") is None:
        raise UsageError("--executor slurm: sbatch is not on PATH here; run the driver on a Slurm login node, "
                         "or add --slurm-cluster local to try the jobs on this machine")
    return o

def minutes(text: str) -> int:
    """A Slurm time limit (MINUTES, H:MM:SS or D-HH:MM:SS) in whole minutes, at least one."""
    days, _, clock = str(text).rpartition("-")
    parts = clock.split(":")
    try:
        if not days and len(parts) == 1:
            total = float(parts[0])
        elif len(parts) == 3:
            h, m, s = (int(p) for p in parts)
            total = (int(days or 0) * 24 + h) * 60 + m + s / 60
        else:
            raise ValueError
    except ValueError:
        total = -1
    if total < 1:
        raise UsageError(f"--slurm-time {text!r} must be MINUTES, H:MM:SS or D-HH:MM:SS, at least one minute")
    return max(1, round(total))


def first_line(error: BaseException) -> str:
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[0] if lines else type(error).__name__


def failure(job: dict, error: BaseException | str, trace: str | None = None) -> Outcome:
    """The outcome of a cell that raised, or whose worker, job or node was lost."""
    if isinstance(error, BaseException):
        trace = trace or "".join(traceback.format_exception(error))
        error = f"{type(error).__name__}: {error}".strip()
    first = str(error).strip().splitlines()
    return {"cell_id": job["cell_id"], "ok": False, "error": first[0] if first else "failed",
            "traceback": trace or str(error), "host": socket.gethostname()}


class Executor:
    """Runs cells in this process, one after another."""
    name = "serial"
    slots: int | None = 1  # cells running at once; None where the cluster decides

    def __init__(self, threads: int | None = None):
        # Torch threads each cell sets; None leaves this process's own. On the CPU a cell's
        # numbers depend on them (sums split among threads round differently), so the same
        # count gives the same numbers under every executor.
        self.threads = threads

    def describe(self) -> str:
        threads = f", {self.threads} thread(s)" if self.threads else ""
        return f"one after another in this process{threads}"

    def map(self, fn: Callable[[dict], Outcome], jobs: list[dict]) -> Iterator[Step]:
        import torch

        before = torch.get_num_threads()
        try:
            for job in jobs:
                yield job, fn(job)
        finally:
            torch.set_num_threads(before)  # the driver's own setting outlives its cells

    def record(self) -> dict:
        return {}

    def close(self) -> None:
        pass


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
