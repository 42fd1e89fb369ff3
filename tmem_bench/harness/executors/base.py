"""What every engine shares: the registry of engines, the options they are given, how the dry run
describes one (`Sketch`), the outcome of a failed cell, and the serial engine the others extend.

An engine is an Executor subclass that declares, in its own module, everything the rest of the
package asks of it: its `name`, the flags it takes (`flags`), its own options (`Options`), the
package its extra installs (`extra`), whether it can run here (`check`), how it is made (`make`)
and how it describes itself for `--dry-run` without starting (`sketch`). `@engine` registers it;
`make_executor`, `usable` (in the package's __init__, where every engine is registered), the dry
run and the jobs record read ENGINES, never a list of names.
"""
from __future__ import annotations

import importlib.util
import os
import socket
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from ...errors import UsageError

TICK_S = 0.5

Outcome = dict
Step = tuple[dict, Outcome] | None

ENGINES: dict[str, type[Executor]] = {}  # name -> engine, in the order the messages list them


def engine(cls: type[Executor]) -> type[Executor]:
    """Register an engine under its name (the executors package imports every engine module)."""
    ENGINES[cls.name] = cls
    return cls


@dataclass(frozen=True)
class ExecutorOptions:
    """The options every engine is given; each takes the flags it declares and ignores the rest."""
    kind: str = "serial"
    workers: int | None = None  # local: processes; slurm: array tasks running at once
    workers_per_gpu: int | None = None  # local: processes sharing each GPU
    address: str | None = None  # ray: an existing cluster; None starts a local Ray
    cpus_per_cell: int | None = None
    gpus_per_cell: float | None = None
    # The engine's own options (an instance of its `Options`, such as slurm.SlurmOptions); None
    # takes their defaults. The command line passes Slurm's whichever engine runs, so that a Slurm
    # flag given to another engine is refused by name.
    own: Any = None


@dataclass(frozen=True)
class Sketch:
    """How an engine would run the cells, told without starting it (the dry run's estimate)."""
    text: str  # follows "wall time" in the dry run
    threads: int  # torch threads per cell, which the estimate measures with
    workers: int | None  # cells at once; None where the cluster decides
    note: str | None = None


def make_executor(o: ExecutorOptions, run_dir, device: str) -> Executor:
    """The engine of options checked by `usable`, started."""
    return ENGINES[o.kind].make(o, run_dir, device)


def on_a_cluster(name: str, o: ExecutorOptions) -> Sketch:
    """The dry run of an engine whose cluster decides how many cells run at once."""
    threads = o.cpus_per_cell or 1
    return Sketch(f"--executor {name} ({threads} CPU(s) per cell)", threads, None)


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


@engine
class Executor:
    """Runs cells in this process, one after another: the serial engine, and what every engine extends."""
    name = "serial"
    slots: int | None = 1  # cells running at once; None where the cluster decides
    flags: tuple[str, ...] = ()  # the flags it takes besides --cpus-per-cell, which every engine takes
    Options: type | None = None  # its own options (a dataclass with `given()`, the flags given), if any
    extra: str | None = None  # the package its extra (named as the engine) installs, if it needs one

    def __init__(self, threads: int | None = None):
        # Torch threads each cell sets; None leaves this process's own. On the CPU a cell's
        # numbers depend on them (sums split among threads round differently), so the same
        # count gives the same numbers under every executor.
        self.threads = threads

    @classmethod
    def check(cls, o: ExecutorOptions) -> None:
        """A UsageError where the engine cannot run `o` here, its extra not installed for one."""
        if cls.extra and importlib.util.find_spec(cls.extra) is None:
            raise UsageError(f"--executor {cls.name} needs {cls.extra}, which is not installed; "
                             f"install it with: pip install \"tmem-bench[{cls.name}]\"")

    @classmethod
    def make(cls, o: ExecutorOptions, run_dir, device: str) -> Executor:
        return cls(o.cpus_per_cell)

    @classmethod
    def sketch(cls, o: ExecutorOptions, device: str) -> Sketch:
        import torch

        threads = o.cpus_per_cell or torch.get_num_threads()
        return Sketch(f"one after another in this process, {threads} thread(s)", threads, 1)

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
