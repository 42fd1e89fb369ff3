"""A run's state probe (RUN_DIR/state_probe.json) beside an earlier probe of the same cells, as the
markdown tables of docs/results.md: per model and level, the seeds probed, the model's accuracy,
the earlier probe's number and the new one (the readouts it used), and how many seeds' numbers are
usable (the number is a member's that reads the closest reference within the calibration goal) and the best
read of the other members beside it, read by no verdict; with --rows, one row per cell; with --changed, only the
cells (or models and levels) whose number differs from the earlier probe's. The earlier probe may come from git:

    python benchmarks/probe_table.py docs/runs/capacity_converge --rev 098f58e
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from tmem_bench.harness.probe_run import ROW_FIELDS


def fail(message: str):
    print(f"probe_table: {message}", file=sys.stderr)
    raise SystemExit(1)


def read(run_dir: Path, rev: str | None) -> dict:
    """state_probe.json of `run_dir`, at git revision `rev` where given."""
    path = run_dir / "state_probe.json"
    if rev is None:
        try:
            return json.loads(path.read_text())
        except (OSError, ValueError) as e:
            fail(f"{path} is unreadable ({e})")
    root = subprocess.run(["git", "-C", str(run_dir), "rev-parse", "--show-toplevel"], capture_output=True,
                          text=True).stdout.strip()
    relative = path.resolve().relative_to(Path(root).resolve()) if root else path
    shown = subprocess.run(["git", "-C", root or ".", "show", f"{rev}:{relative}"], capture_output=True, text=True)
    if shown.returncode:
        fail(f"{relative} at {rev}: {shown.stderr.strip()}")
    return json.loads(shown.stdout)


def level(row: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in row.items() if k not in ROW_FIELDS)


def level_order(row: dict) -> tuple:
    return tuple(v for k, v in row.items() if k not in ROW_FIELDS)


def pct(values: list[float]) -> str:
    return f"{100 * sum(values) / len(values):.1f}%" if values else "-"


def calibration(row: dict) -> str:
    c = row.get("calibration") or {}
    if not c.get("reference"):
        return c.get("why", "-")
    member = f"{c['member']} " if c.get("member") else ""
    return f"{c['reference']}: {member}{100 * c['probe']:.1f}% of {100 * c['best']:.1f}% ({100 * c['ratio']:.0f}%)"


def uncalibrated(rows: list[dict]) -> str:
    """The best uncalibrated read beside the number (its mean over the rows that have one), marked."""
    others = [r["uncalibrated"] for r in rows if "uncalibrated" in r]
    if not others:
        return "-"
    names = ", ".join(sorted({u["readout"] for u in others}))
    return f"{pct([u['probe_accuracy'] for u in others])} ({names}; uncalibrated)"


def tables(new: dict, old: dict, rows: bool, changed: bool = False) -> list[str]:
    earlier = {r["cell_id"]: r for r in old.get("rows", [])}
    probed = [r for r in new["rows"] if r.get("status") == "probed"]
    if changed:
        probed = [r for r in probed if earlier.get(r["cell_id"], {}).get("probe_accuracy") != r["probe_accuracy"]]
    if rows:
        out = ["| model | seed | level | model's accuracy | earlier probe | new probe (readout) | best uncalibrated "
               "read | calibration: reference, the family's best read of it | usable | cell wall time |",
               "|---|---|---|---|---|---|---|---|---|---|"]
        for r in sorted(probed, key=lambda r: (r["label"], level_order(r), r["seed"])):
            first = earlier.get(r["cell_id"], {})
            before = "-" if first.get("probe_accuracy") is None else (
                f"{pct([first['probe_accuracy']])} ({first['readout']})")
            out.append(f"| {r['label']} | {r['seed']} | {level(r)} | {pct([r['accuracy']])} | "
                       f"{before} | {pct([r['probe_accuracy']])} ({r['readout']}) | {uncalibrated([r])} | "
                       f"{calibration(r)} | {'yes' if r['calibration'].get('usable') else 'no'} | "
                       f"{r['wall_time_s']:.0f} s |")
        return out
    groups: dict[tuple, list[dict]] = {}
    for r in probed:
        groups.setdefault((r["label"], level_order(r)), []).append(r)
    out = ["| model | level | seeds probed | model's accuracy | earlier probe (same seeds) | new probe | readouts | "
           "usable seeds | new probe, usable seeds only | best uncalibrated read | calibration: the family's best read "
           "of the reference (lowest of the seeds) |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for (label, _), group in sorted(groups.items()):
        where = level(group[0])
        first = [earlier[r["cell_id"]]["probe_accuracy"] for r in group
                 if earlier.get(r["cell_id"], {}).get("probe_accuracy") is not None]
        usable = [r for r in group if r["calibration"].get("usable")]
        worst = min(group, key=lambda r: r["calibration"].get("ratio", -1.0))
        out.append(f"| {label} | {where} | {len(group)} | {pct([r['accuracy'] for r in group])} | "
                   f"{pct(first) if len(first) == len(group) else '-'} | {pct([r['probe_accuracy'] for r in group])} | "
                   f"{', '.join(sorted({r['readout'] for r in group}))} | {len(usable)} of {len(group)} | "
                   f"{pct([r['probe_accuracy'] for r in usable])} | {uncalibrated(group)} | {calibration(worst)} |")
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--rev", help="the git revision whose state_probe.json is the earlier probe (default: none)")
    parser.add_argument("--rows", action="store_true", help="one row per probed cell")
    parser.add_argument("--changed", action="store_true",
                        help="only the cells whose number differs from the earlier probe's")
    args = parser.parse_args(argv)
    new = read(args.run_dir, None)
    old = read(args.run_dir, args.rev) if args.rev else {}
    print("\n".join(tables(new, old, args.rows, args.changed)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
