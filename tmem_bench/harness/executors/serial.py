"""The serial engine: the cells one after another in the driver's own process (the default)."""
from __future__ import annotations

from .base import Executor, ExecutorOptions, Sketch, engine


@engine
class Serial(Executor):
    """Runs cells in this process, one after another."""
    name = "serial"
    summary = "in this process, the default"

    def __init__(self, threads: int | None = None):
        self.threads = threads

    @classmethod
    def make(cls, o: ExecutorOptions, run_dir, device: str) -> Serial:
        return cls(o.cpus_per_cell)

    @classmethod
    def sketch(cls, o: ExecutorOptions, device: str) -> Sketch:
        import torch

        threads = o.cpus_per_cell or torch.get_num_threads()
        return Sketch(f"one after another in this process, {threads} thread(s)", threads, 1)

    def describe(self) -> str:
        threads = f", {self.threads} thread(s)" if self.threads else ""
        return f"one after another in this process{threads}"

    def map(self, fn, jobs):
        import torch

        before = torch.get_num_threads()
        try:
            for job in jobs:
                yield job, fn(job)
        finally:
            torch.set_num_threads(before)  # the driver's own setting outlives its cells
