"""What every engine shares: the registry of engines, the flags and options they are given, how
the dry run describes one (`Sketch`), the outcome of a failed cell, and the `Executor` every engine
extends.

An engine is an Executor subclass that declares, in its own module, everything the rest of the
package asks of it: its `name` and `summary` (the `--executor` help), the command-line flags it
takes (`flags`, each a `Flag`), its own options (`Options`, made from the parsed command line), the
package its extra installs (`extra`), whether it can run here (`check`), how it is made (`make`)
and how it describes itself for `--dry-run` without starting (`sketch`). `@engine` registers it;
the command line's engine flags, `make_executor`, `usable` (in the package's __init__, where every
engine is registered), the dry run and the jobs record read ENGINES, never a list of names.
"""
from __future__ import annotations

import importlib.util
import os
import socket
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from ...errors import UsageError, positive

TICK_S = 0.5

Outcome = dict
Step = tuple[dict, Outcome] | None

ENGINES: dict[str, type[Executor]] = {}  # name -> engine, in the order the messages list them


def engine(cls: type[Executor]) -> type[Executor]:
    """Register an engine under its name (the executors package imports every engine module)."""
    ENGINES[cls.name] = cls
    return cls


@dataclass(frozen=True)
class Flag:
    """A flag of `tmem-bench run` that an engine takes: its name, what it means to this engine (the
    help shows "ENGINE: help", joined with what it means to others that take it) and argparse's
    settings, the same in every engine that declares the flag."""
    name: str
    help: str
    settings: dict = field(default_factory=dict)  # type, metavar, default, action


# Every engine takes it (shown without an engine's name): on the CPU a cell's numbers depend on its threads.
CPUS_PER_CELL = Flag("--cpus-per-cell", "CPU cores (torch threads) each cell gets; the same count gives the same "
                     "CPU numbers under every executor (default: this process's threads, or the cores split among "
                     "workers)", {"type": positive, "metavar": "N"})


@dataclass(frozen=True)
class ExecutorOptions:
    """The options every engine is given: those of flags more than one engine takes, and the
    chosen engine's own; each engine reads the flags it declares, and one it does not is refused."""
    kind: str = "serial"
    workers: int | None = None  # local: processes; slurm: array tasks running at once
    cpus_per_cell: int | None = None
    gpus_per_cell: float | None = None
    # The engine's own options (an instance of its `Options`, such as slurm.SlurmOptions); None
    # takes their defaults. The command line passes every engine's (a tuple), so that a flag of one
    # engine given to another is refused by name.
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


class Executor:
    """What every engine extends: its declarations (defaults here) and the calls the driver makes."""
    name: str  # the --executor value
    summary: str  # what --executor's help says of it
    slots: int | None = 1  # cells running at once; None where the cluster decides
    flags: tuple[Flag, ...] = ()  # the flags it takes besides --cpus-per-cell, which every engine takes
    Options: type | None = None  # its own options (a dataclass with `from_args(args)` and `given()`), if any
    extra: str | None = None  # the package its extra (named as the engine) installs, if it needs one
    # Torch threads each cell sets; None leaves the driver's own. On the CPU a cell's numbers depend
    # on them (sums split among threads round differently), so the same count gives the same
    # numbers under every executor.
    threads: int | None = None

    @classmethod
    def takes(cls, flag: str) -> bool:
        return any(f.name == flag for f in cls.flags)

    @classmethod
    def check(cls, o: ExecutorOptions) -> None:
        """A UsageError where the engine cannot run `o` here, its extra not installed for one."""
        if cls.extra and importlib.util.find_spec(cls.extra) is None:
            raise UsageError(f"--executor {cls.name} needs {cls.extra}, which is not installed; "
                             f"install it with: pip install \"tmem-bench[{cls.name}]\"")

    @classmethod
    def make(cls, o: ExecutorOptions, run_dir, device: str) -> Executor:
        raise NotImplementedError

    @classmethod
    def sketch(cls, o: ExecutorOptions, device: str) -> Sketch:
        raise NotImplementedError

    def describe(self) -> str:
        """How the cells run, after "running N cell(s) " in the run's first line."""
        raise NotImplementedError

    def map(self, fn: Callable[[dict], Outcome], jobs: list[dict]) -> Iterator[Step]:
        """`(job, outcome)` as each job's cell finishes, and None while waiting."""
        raise NotImplementedError

    def record(self) -> dict:
        """What jobs.json keeps of this engine besides its name and driver."""
        return {}

    def close(self) -> None:
        pass


def available_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
