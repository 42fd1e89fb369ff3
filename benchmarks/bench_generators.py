"""Batch generation time against one training step of the base model on the same batch.

For every task, variant and training level of the quick and paper profiles, at the
profile's model size and batch size: the median time of `task.sample` and of one
base-model training step (forward, backward, AdamW) on that batch, measured side by
side in this process, and their ratio. Generation should cost a small fraction of
a step. The last column is the generation time of the batch over that of a batch of
one: a generator that looped over the batch in Python would take about `batch`
times as long; a vectorised one far less.

    python benchmarks/bench_generators.py [--repeats 7] [--threads 1] [--profiles quick,paper]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from tmem_bench.contracts.model import TaskModel
from tmem_bench.contracts.task import level_key
from tmem_bench.harness.plan import make_plan
from tmem_bench.harness.train import loss_and_accuracy
from tmem_bench.registry import get_backbone, get_task


def median_time(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(cell, repeats: int) -> dict:
    task = get_task(cell.task, **cell.task_options)
    size = {k: cell.model_options[k] for k in ("d_model", "n_layers", "n_heads")}
    torch.manual_seed(0)
    model = TaskModel(task.make_adapter(size["d_model"]), get_backbone("base", **size))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch_size = cell.train["batch_size"]
    generator = torch.Generator().manual_seed(0)
    batch = task.sample(cell.train_level, batch_size, generator)

    def step():
        loss, _ = loss_and_accuracy(model, batch)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    gen = median_time(lambda: task.sample(cell.train_level, batch_size, generator), repeats)
    gen1 = median_time(lambda: task.sample(cell.train_level, 1, generator), repeats)
    return {"gen_s": gen, "gen1_s": gen1, "step_s": median_time(step, repeats)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: stable on a shared CPU)")
    parser.add_argument("--profiles", default="quick,paper")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {args.threads} thread(s), median of {args.repeats}")
    print(f"{'profile':8} {'task':20} {'variant':20} {'level':22} {'batch':>5} {'d,L':>6} "
          f"{'gen ms':>8} {'step ms':>9} {'gen/step':>9} {'gen B/gen 1':>12}")
    for profile in args.profiles.split(","):
        seen = set()
        for cell in make_plan("all", profile):
            key = (cell.task, cell.variant, level_key(cell.train_level), cell.train["batch_size"],
                   cell.model_options["d_model"], cell.model_options["n_layers"])
            if key in seen:
                continue
            seen.add(key)
            m = measure(cell, args.repeats)
            print(f"{profile:8} {cell.task:20} {cell.variant:20} {level_key(cell.train_level):22} "
                  f"{cell.train['batch_size']:>5} {cell.model_options['d_model']:>3},{cell.model_options['n_layers']:<2} "
                  f"{m['gen_s'] * 1e3:8.2f} {m['step_s'] * 1e3:9.1f} {m['gen_s'] / m['step_s']:9.3f} "
                  f"{m['gen_s'] / m['gen1_s']:12.1f}", flush=True)


if __name__ == "__main__":
    main()
