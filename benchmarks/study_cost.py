"""What a profile like a finished run's would cost on this machine, from its cells' own wall times.

Each (task, label) costs the median wall time of its cells trained at seeds other than the
selection seed (trials and finals at one setting cost alike, and seed 0 may have run elsewhere),
scaled linearly with steps, times the cells it has in the run. Dropping a model or changing a
task's steps gives the cost of a smaller study before running it:

    python benchmarks/study_cost.py docs/runs/study --drop occlusion:tensor_local --steps map_building=1000
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir", type=Path)
    ap.add_argument("--drop", action="append", default=[], metavar="TASK:LABEL", help="leave this model out")
    ap.add_argument("--steps", action="append", default=[], metavar="TASK=N", help="train this task for N steps")
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    cells = [json.loads(p.read_text()) for p in sorted((args.run_dir / "cells").glob("*.json"))]
    if not cells:
        sys.exit(f"study_cost: {args.run_dir}/cells holds no cell results")
    try:
        drop = {tuple(d.split(":", 1)) for d in args.drop}
        steps = {t: int(n) for t, n in (s.split("=", 1) for s in args.steps)}
    except ValueError:
        sys.exit("study_cost: --drop takes TASK:LABEL and --steps TASK=N")
    times, counts, trained = defaultdict(list), defaultdict(int), {}
    for c in cells:
        key = (c["cell"]["task"], c["cell"]["label"])
        counts[key] += 1
        trained[key] = c["cell"]["train"]["steps"]
        if c["cell"]["seed"] != 0:
            times[key].append(c["wall_time_s"])
    total = 0.0
    for key, n in sorted(counts.items()):
        if key in drop or not times[key]:
            continue
        total += n * statistics.median(times[key]) * steps.get(key[0], trained[key]) / trained[key]
    print(f"{total:,.0f} cell-seconds, about {total / args.workers / 60:.0f} min on {args.workers} workers "
          f"(cells left out: {', '.join(':'.join(k) for k in sorted(drop)) or 'none'}; "
          f"steps: {', '.join(f'{t}={n}' for t, n in steps.items()) or 'as run'})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
