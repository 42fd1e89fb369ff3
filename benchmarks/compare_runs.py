"""Whether two run directories computed the same numbers for the cells they share.

A cell id is a hash of its settings, so two runs that hold the same id trained the same cell, on
whatever machines ran them. For each shared cell this compares the evaluation accuracies and the
logged training losses to the last bit, and prints how many are identical, the largest difference
of those that are not, and the hardware each run recorded:

    python benchmarks/compare_runs.py docs/runs/capacity runs/capacity
    git worktree add /tmp/old 266bdbf && python benchmarks/compare_runs.py /tmp/old/docs/runs/study docs/runs/study
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from tmem_bench.harness.rundir import RunDir


def load(run_dir: Path) -> dict[str, dict]:
    store = RunDir(run_dir)
    try:
        cells = {cell_id: store.read_cell(cell_id) for cell_id in sorted(store.stored())}
    except ValueError as e:
        sys.exit(f"compare_runs: {run_dir}: {e}")
    if not cells:
        sys.exit(f"compare_runs: {run_dir}/cells holds no cell results")
    return cells


def numbers(result: dict) -> tuple[list[float], list[float]]:
    return [e["accuracy"] for e in result["eval"]], [h["loss"] for h in result.get("history") or []]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    args = ap.parse_args()
    a, b = load(args.a), load(args.b)
    shared = sorted(a.keys() & b.keys())
    print(f"{len(shared)} cells in both ({len(a)} in {args.a}, {len(b)} in {args.b})")
    for name, run in ((args.a, a), (args.b, b)):
        machines = Counter(run[i].get("hardware", "hardware not recorded") for i in shared)
        print(f"  {name}: " + "; ".join(f"{h} ({n})" for h, n in machines.most_common()))
    differ, per_seed = [], {}
    for cell_id in shared:
        (acc_a, loss_a), (acc_b, loss_b) = numbers(a[cell_id]), numbers(b[cell_id])
        how = "identical" if (acc_a, loss_a) == (acc_b, loss_b) else "accuracy" if acc_a != acc_b else "loss"
        per_seed.setdefault(a[cell_id]["cell"]["seed"], Counter())[how] += 1
        if how != "identical":
            gap = max((abs(x - y) for x, y in zip(acc_a, acc_b)), default=0.0)
            differ.append((gap, how, cell_id, a[cell_id]["cell"]))
    print(f"identical to the last bit (every accuracy and logged loss): {len(shared) - len(differ)} of {len(shared)}")
    for seed, n in sorted(per_seed.items()):
        print(f"  seed {seed}: {n['identical']} of {n.total()} identical, {n['accuracy']} differ in an accuracy, "
              f"{n['loss']} in a logged loss only")
    for gap, how, cell_id, cell in sorted(differ, key=lambda d: (-d[0], d[2])):
        what = f"largest accuracy difference {100 * gap:.2f} points" if how == "accuracy" else \
            "the same accuracies, a logged loss differs"
        print(f"  differs: {cell_id} {cell['task']} [{cell['variant']}] {cell['label']} seed {cell['seed']}, "
              f"lr {cell['train'].get('lr')}: {what}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
