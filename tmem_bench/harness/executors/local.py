"""The local pool: spawned processes on this machine, each with its own torch threads and, with
GPUs, one device each; a worker that dies fails the cell it ran and the pool is rebuilt for the rest."""
from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from typing import Iterator

from ...errors import UsageError, check_int, positive
from .base import TICK_S, Executor, ExecutorOptions, Flag, Sketch, Step, available_cores, engine, failure

_started = None  # in a worker of a local pool: where it says which cell it starts


def _init_worker(driver_pid: int, gpus, started) -> None:
    global _started
    _started = started
    if sys.platform.startswith("linux"):
        # A worker dies with its driver: a killed driver leaves no orphan writing into the run directory.
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() != driver_pid:
            os._exit(1)
    if gpus is not None:
        # Before anything initialises CUDA in this process, so that it sees its one device as cuda:0.
        os.environ["CUDA_VISIBLE_DEVICES"] = str(gpus.get())


def _announced(fn, job: dict):
    """`fn(job)` in a pool worker that first tells the driver its process id and the cell: when a
    worker dies, its pool fails every cell in it, and this names the one that was running there."""
    _started.put((os.getpid(), job["cell_id"]))
    return fn(job)


def _death(exitcode: int) -> str:
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


def _size(workers: int | None, cpus: int | None, gpus: int, per_gpu: int | None = None) -> tuple[int, int]:
    """(workers, torch threads each): by default a worker per GPU, else per core; `per_gpu`
    workers share each GPU (a small model's cells leave most of a GPU idle)."""
    if per_gpu is not None:
        if workers is not None:
            raise UsageError("give --workers or --workers-per-gpu, not both")
        if not gpus:
            raise UsageError("--workers-per-gpu needs a GPU, and this run has none (no CUDA device, or "
                             "--device cpu); use --workers N")
        workers = per_gpu * gpus
    workers = workers or gpus or available_cores()
    # Unless told, every worker would start a thread per core of the machine, oversubscribing it.
    return workers, cpus or max(1, available_cores() // workers)


def _gpus(device: str) -> int:
    import torch

    return torch.cuda.device_count() if device in ("auto", "cuda") else 0


@dataclass(frozen=True)
class LocalOptions:
    """--workers-per-gpu, checked as it is made (--workers, which Slurm takes too, is ExecutorOptions')."""
    workers_per_gpu: int | None = None  # processes sharing each GPU

    def __post_init__(self):
        if self.workers_per_gpu is not None:
            check_int("--workers-per-gpu", self.workers_per_gpu)

    @classmethod
    def from_args(cls, args) -> LocalOptions:
        return cls(workers_per_gpu=args.workers_per_gpu)

    def given(self) -> list[str]:
        return ["--workers-per-gpu"] * (self.workers_per_gpu is not None)


@engine
class LocalPool(Executor):
    """A pool of spawned processes on this machine; with GPUs, each worker pinned to one of them."""
    name = "local"
    summary = "a process pool"
    flags = (Flag("--workers", "worker processes (default one per GPU, else one per core)",
                  {"type": positive, "metavar": "N"}),
             Flag("--workers-per-gpu", "worker processes sharing each GPU (N times the GPUs; a GPU is needed)",
                  {"type": positive, "metavar": "N"}))
    Options = LocalOptions

    def __init__(self, workers: int | None, cpus: int | None, gpus: int, per_gpu: int | None = None):
        self.gpus = gpus
        self.workers, self.threads = _size(workers, cpus, gpus, per_gpu)
        self.slots = self.workers

    @classmethod
    def make(cls, o: ExecutorOptions, run_dir, device: str) -> LocalPool:
        return cls(o.workers, o.cpus_per_cell, _gpus(device), (o.own or LocalOptions()).workers_per_gpu)

    @classmethod
    def sketch(cls, o: ExecutorOptions, device: str) -> Sketch:
        gpus = _gpus(device)
        workers, threads = _size(o.workers, o.cpus_per_cell, gpus, (o.own or LocalOptions()).workers_per_gpu)
        note = None
        if gpus == 0 and workers * threads > available_cores():
            note = (f"note: {workers} workers x {threads} threads exceed the {available_cores()} cores here; "
                    f"they will run slower than measured")
        elif workers > 1:
            note = ("note: measured one cell at a time; workers running together share memory bandwidth "
                    "and may each run slower")
        return Sketch(f"on a local pool of {workers} worker(s), {threads} thread(s) each", threads, workers, note)

    def describe(self) -> str:
        pinned = f", one GPU each of {self.gpus}" if self.gpus else ""
        return f"on a local pool of {self.workers} worker(s), {self.threads} thread(s) each{pinned}"

    def map(self, fn, jobs):
        pending = list(jobs)
        while pending:
            pending = yield from self._until_broken(fn, pending)

    def _until_broken(self, fn, jobs: list[dict]) -> Iterator[Step]:
        """Run `jobs` on a fresh pool. A worker that dies breaks the pool for every cell in it: the
        cell that worker ran fails, and the others are returned, to go on in the next pool."""
        context = multiprocessing.get_context("spawn")
        gpus = None
        if self.gpus:
            gpus = context.SimpleQueue()
            for i in range(self.workers):
                gpus.put(i % self.gpus)
        started = context.SimpleQueue()
        pool = ProcessPoolExecutor(self.workers, mp_context=context, initializer=_init_worker,
                                   initargs=(os.getpid(), gpus, started))
        futures, processes, broken = {}, {}, []
        try:
            futures = {pool.submit(_announced, fn, job): job for job in jobs}
            while futures:
                done, _ = wait(futures, timeout=TICK_S, return_when=FIRST_COMPLETED)
                processes.update(getattr(pool, "_processes", None) or {})
                if not done:
                    yield None
                for future in done:
                    job = futures.pop(future)
                    try:
                        outcome = future.result()
                    except BrokenProcessPool:
                        broken.append(job)
                        continue
                    except Exception as e:  # noqa: BLE001 - the job or its result could not be pickled
                        outcome = failure(job, e)
                    yield job, outcome
        finally:
            # The driver stopped early (interrupted, or raised): cells still running are abandoned
            # rather than waited for, and a rerun resumes them.
            if futures:
                for process in dict(getattr(pool, "_processes", None) or {}).values():
                    process.terminate()
            # A broken pool is waited for: then every worker's exit code is known.
            pool.shutdown(wait=not futures, cancel_futures=True)
        if not broken:
            return []
        last = {}
        while not started.empty():
            pid, cell_id = started.get()
            last[pid] = cell_id
        # The pool ends the survivors with SIGTERM once one worker died; any other end is the death.
        dead = {last[pid]: p.exitcode for pid, p in processes.items()
                if pid in last and p.exitcode not in (None, -signal.SIGTERM)}
        # A death no worker's cell explains fails every cell it broke, rather than rebuilding forever.
        blamed = [job for job in broken if job["cell_id"] in dead] or broken
        for job in blamed:
            how = _death(dead[job["cell_id"]]) if job["cell_id"] in dead else "a worker of the pool died"
            yield job, failure(job, f"its worker process died ({how}) while running this cell")
        return [job for job in broken if job not in blamed]
