"""A profile's estimated wall time from a finished run's own cell times, not this machine's.

The suite's dry run (estimate.py) measures steps here, which on a busy machine says more about the
machine than the profile. This prices each cell of the profile's plan from the run's cells of the
same task, model and training level: its seconds per training step (train time over steps run),
its evaluation (wall time less train time), and an early-stopping check as one pass of that
evaluation. The schedule is the dry run's: at each cell's cap, every possible second selection
seed, on the local pool's workers. Planned for the run's own profile it gives back the run's wall
time, within the scheduler's spread:

    python benchmarks/profile_cost.py docs/runs/study study
    python benchmarks/profile_cost.py docs/runs/study study --seeds 3,4 --selection-only
"""
from __future__ import annotations

import argparse
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from tmem_bench.errors import UsageError
from tmem_bench.harness.dryrun import fmt_duration
from tmem_bench.harness.estimate import Cost, estimate, plan_rows
from tmem_bench.harness.plan import Overrides, plan_run
from tmem_bench.harness.results import steps_run
from tmem_bench.harness.rundir import RunDir
from tmem_bench.levels import level_key


def _key(cell: dict) -> tuple:
    return cell["task"], cell["label"], level_key(cell["train_level"])


class RunCost:
    """Costs from a run's cells: per (task, label, training level), the median of its cells'."""

    def __init__(self, results: list[dict]):
        parts = defaultdict(list)
        for r in results:
            gated = any(e.get("accuracy_memory_off") is not None for e in r["eval"])
            passes = len(r["eval"]) * (2 if gated else 1) + 1  # and the validation set, once
            evaluation = r["wall_time_s"] - r["train_time_s"]
            parts[_key(r["cell"])].append((r["train_time_s"] / max(steps_run(r), 1), evaluation, evaluation / passes))
        self.costs = {k: Cost(0.0, *(statistics.median(p[i] for p in v) for i in range(3))) for k, v in parts.items()}

    def cost(self, cell) -> Cost:
        key = (cell.task, cell.label, level_key(cell.train_level))
        if key not in self.costs:
            raise UsageError(f"the run holds no cell of {cell.task} {cell.label} @ {key[2]} to price it from")
        return self.costs[key]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("profile")
    ap.add_argument("--task", default="all")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seeds", help="a list of seeds, as run's --seeds (0,1,2)")
    ap.add_argument("--selection-only", action="store_true")
    args = ap.parse_args()
    try:
        results, _ = RunDir(args.run_dir).load_cells()
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else None
        plan = plan_run(args.task, args.profile, Overrides(seeds=seeds, selection_only=args.selection_only or None))
        est = estimate(plan_rows(plan.cells, plan.searches), RunCost(results), args.workers)
    except (UsageError, ValueError) as e:
        sys.exit(f"profile_cost: {e}")
    rows = est.rows
    bound = any(r.early_stop for r in rows) or any(r.kind == "second" for r in rows)
    print(f"{args.profile} priced from {args.run_dir}: {est.remaining} cells, {fmt_duration(est.total_s)} of cell "
          f"time, the longest {fmt_duration(est.longest_s)}; on {args.workers} worker(s) "
          f"{'at most ' if bound else ''}about {fmt_duration(est.wall_s)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
