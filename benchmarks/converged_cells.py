"""How many of a run's cells converged (the current convergence rule, early stopping's patience rule, read
again from each cell's checks or train loss, as the reports read it), per task and model,
with the steps they ran, why they stopped and their wall time; several runs side by side, so that a
profile trained to a fixed budget and the same profile trained to convergence can be compared.

    python benchmarks/converged_cells.py docs/runs/study docs/runs/study_converge
"""
from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

from tmem_bench.diagnostics.convergence import convergence
from tmem_bench.harness.results import steps_run
from tmem_bench.harness.rundir import RunDir


def tally(run_dir: Path) -> dict[tuple[str, str], dict]:
    """(task, model label) -> cells, converged, not converged, unknown, steps, stopped reasons, wall s."""
    results, errors = RunDir.existing(run_dir).load_cells()
    for line in errors:
        print(f"skipped: {line}", file=sys.stderr)
    out: dict[tuple[str, str], dict] = defaultdict(lambda: {"cells": 0, True: 0, False: 0, None: 0, "steps": [],
                                                            "stopped": defaultdict(int), "wall_s": 0.0})
    for r in results:
        row = out[(r["cell"]["task"], r["cell"]["label"])]
        row["cells"] += 1
        row[None if r.get("status") == "diverged" else
            convergence(r.get("history") or [], r.get("validation_checks"))["converged"]] += 1
        row["steps"].append(steps_run(r))
        row["stopped"][r.get("stopped") or "fixed budget"] += 1
        row["wall_s"] += float(r.get("wall_time_s") or 0.0)
    return dict(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, nargs="+")
    args = ap.parse_args()
    for run in args.runs:
        rows = tally(run)
        known = sum(r[True] + r[False] for r in rows.values())
        print(f"\n{run}: {sum(r[True] for r in rows.values())} of {known} cells converged "
              f"({sum(r[None] for r in rows.values())} more record no verdict), "
              f"{sum(r['wall_s'] for r in rows.values()) / 60:.0f} min of cell wall time")
        print("| task | model | cells | converged | not | unknown | steps | stopped | wall min |")
        print("|---|---|---|---|---|---|---|---|---|")
        for (task, label), r in sorted(rows.items()):
            steps = "-".join(f"{s:,}" for s in dict.fromkeys((min(r["steps"]), max(r["steps"]))))
            stopped = ", ".join(f"{k} {v}" for k, v in sorted(r["stopped"].items()))
            print(f"| {task} | {label} | {r['cells']} | {r[True]} | {r[False]} | {r[None]} | {steps} | {stopped} "
                  f"| {r['wall_s'] / 60:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
