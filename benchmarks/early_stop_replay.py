"""Which of a run's early-stopped cells the current early-stopping rule (thresholds.toml's [early_stop])
would have trained longer: each cell's stored validation checks are replayed under the current rule,
and a cell that stopped ("converged") at a step where that rule would not yet have stopped is listed,
with its task, variant, model, training level and seed, so that the verdicts reading those points can
be named. A cell that ran to its cap ran as long as the current rule allows.

    python benchmarks/early_stop_replay.py docs/runs/study_converge
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from tmem_bench.diagnostics.convergence import load_early_stop, should_stop
from tmem_bench.harness.rundir import RunDir
from tmem_bench.levels import level_key


def first_stop(checks: list[dict], chance: float, rule) -> int | None:
    """The step of the first check at which `rule` stops, or None."""
    return next((c["step"] for i, c in enumerate(checks) if should_stop(checks[:i + 1], chance, rule)), None)


def longer(run_dir: Path) -> tuple[list[dict], Counter]:
    """(the stopped cells the current rule would have trained on, a tally of every cell by how it ended)."""
    rule = load_early_stop()
    results, errors = RunDir.existing(run_dir).load_cells()
    for line in errors:
        print(f"skipped: {line}", file=sys.stderr)
    out, tally = [], Counter()
    for r in results:
        stopped = r.get("stopped") or "fixed budget"
        tally[stopped] += 1
        checks = r.get("validation_checks") or []
        if stopped != "converged" or not checks:
            continue
        chance = r["eval"][0]["chance"] if r["cell"]["train_level"] == r["eval"][0]["level"] else next(
            e["chance"] for e in r["eval"] if e["level"] == r["cell"]["train_level"])
        if first_stop(checks, chance, rule) is None:
            cell = r["cell"]
            out.append({"task": cell["task"], "variant": cell["variant"], "label": cell["label"],
                        "level": level_key(cell["train_level"]), "seed": cell["seed"], "lr": cell["train"]["lr"],
                        "stopped_at": checks[-1]["step"], "cap": cell["train"]["steps"],
                        "last_losses": [round(c["loss"], 4) for c in checks[-3:]]})
    return out, tally


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path)
    args = ap.parse_args()
    cells, tally = longer(args.run)
    print(f"{args.run}: " + ", ".join(f"{n} {k}" for k, n in sorted(tally.items())) + f"; under the current rule "
          f"{len(cells)} of the {tally['converged']} stopped cells would have trained longer")
    for c in sorted(cells, key=lambda c: (c["task"], c["variant"], c["label"], c["level"], c["seed"], c["lr"])):
        print(f"  {c['task']} [{c['variant']}] {c['label']} @ {c['level']} seed {c['seed']} lr {c['lr']:g}: "
              f"stopped at {c['stopped_at']} of {c['cap']} (last validation losses {c['last_losses']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
