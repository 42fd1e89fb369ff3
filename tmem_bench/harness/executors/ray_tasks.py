"""Ray tasks: one per cell, on an existing cluster or on a local Ray started here (and reaped
with the driver)."""
from __future__ import annotations

import os
from dataclasses import dataclass

from ...errors import UsageError
from .base import TICK_S, Executor, ExecutorOptions, Flag, Sketch, engine, failure, first_line, on_a_cluster
from .reaper import descendants, reap_when_gone


@dataclass(frozen=True)
class RayOptions:
    """--address (--gpus-per-cell, which Slurm takes too, is ExecutorOptions')."""
    address: str | None = None  # an existing cluster; None starts a local Ray

    @classmethod
    def from_args(cls, args) -> RayOptions:
        return cls(address=args.address)

    def given(self) -> list[str]:
        return ["--address"] * (self.address is not None)


@engine
class RayTasks(Executor):
    """One Ray task per cell, on the cluster at `address` or on a local Ray started here."""
    name = "ray"
    summary = "one Ray task per cell"
    slots = None
    flags = (Flag("--address", "the address of a running Ray cluster (default: start a local Ray)",
                  {"metavar": "ADDR"}),
             Flag("--gpus-per-cell", "GPUs each cell gets, may be a fraction", {"type": float, "metavar": "N"}))
    Options = RayOptions
    extra = "ray"

    def __init__(self, address: str | None, cpus: int | None, gpus: float | None):
        import ray

        self.ray, self.address = ray, address
        self.started = not ray.is_initialized()
        self.reaper = None
        if self.started:
            try:
                ray.init(address=address, include_dashboard=False, configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError) as e:
                raise UsageError(f"--address {address!r}: cannot start or reach Ray: {first_line(e)}") from None
            if address is None:
                self.reaper = reap_when_gone(descendants(os.getpid()))
        self.cpus, self.gpus = cpus or 1, gpus or 0
        # Ray gives each task one thread by default (OMP_NUM_THREADS=1): the cell sets its own.
        self.threads = self.cpus

    @classmethod
    def make(cls, o: ExecutorOptions, run_dir, device: str) -> RayTasks:
        return cls((o.own or RayOptions()).address, o.cpus_per_cell, o.gpus_per_cell)

    @classmethod
    def sketch(cls, o: ExecutorOptions, device: str) -> Sketch:
        return on_a_cluster(cls.name, o)

    def describe(self) -> str:
        where = "Ray at " + self.address if self.address else "a local Ray"
        return f"as Ray tasks on {where} ({self.cpus} CPU(s), {self.gpus:g} GPU(s) per cell)"

    def map(self, fn, jobs):
        # max_retries=0: the driver retries a cell the same way whichever executor ran it.
        remote = self.ray.remote(fn).options(num_cpus=self.cpus, num_gpus=self.gpus, max_retries=0)
        refs = {remote.remote(job): job for job in jobs}
        try:
            while refs:
                done, _ = self.ray.wait(list(refs), num_returns=1, timeout=TICK_S)
                if not done:
                    yield None
                for ref in done:
                    job = refs.pop(ref)
                    try:
                        yield job, self.ray.get(ref)
                    except Exception as e:  # noqa: BLE001 - a worker or node was lost
                        yield job, failure(job, e)
        finally:
            for ref in refs:
                self.ray.cancel(ref, force=True)

    def record(self) -> dict:
        return {"address": self.ray.get_runtime_context().gcs_address if self.ray.is_initialized() else None}

    def close(self) -> None:
        if self.started:
            self.ray.shutdown()
        if self.reaper is not None:
            self.reaper.stdin.close()  # Ray has shut its processes down: the reaper ends any straggler
            self.reaper.wait()
