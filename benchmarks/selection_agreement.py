"""How many learning-rate choices two runs of one profile agree on, the runs' selections made at
different seeds (one the study, the other `tmem-bench run ... --seed-list 3,4 --selection-only`):
once as each run's first seed alone chooses (a single trial per lr), once as the runs chose,
with a second seed where their best two lrs were close. Searches are matched by task, variant,
model and training level; those either run has not chosen are left out and counted.

    python benchmarks/selection_agreement.py runs/study runs/study-selection-seed3

With one run, what its second selection seed did: of the searches whose best two lrs were close,
how many the first seed alone, and the second seed alone, would have chosen as the mean did.

    python benchmarks/selection_agreement.py docs/runs/study_converge
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tmem_bench.harness.rundir import RunDir
from tmem_bench.harness.selection import one_seed_lr


def load(run_dir: Path) -> dict[tuple, dict]:
    try:
        searches = RunDir(run_dir).selection()
    except ValueError as e:
        sys.exit(f"selection_agreement: {run_dir}: {e}")
    if not searches:
        sys.exit(f"selection_agreement: {run_dir} has no selection.json, or it holds no searches")
    return {(s["task"], s["variant"], s["label"], s["train_level"]): s for s in searches}


def within(run: dict[tuple, dict]) -> None:
    second = {k: s for k, s in run.items() if s.get("second_seed_lrs")}
    close = {k: s for k, s in second.items() if s.get("chosen_lr") is not None}
    print(f"second seed trained in {len(second)} of {len(run)} searches, chosen in {len(close)} of them")
    for name, alone in (("first seed alone", one_seed_lr),
                        ("second seed alone", lambda s: max(s["second_trials"], key=lambda t: t["accuracy"])["lr"])):
        differ = {k: alone(s) for k, s in close.items() if alone(s) != s["chosen_lr"]}
        print(f"{name} chooses as the mean of both: {len(close) - len(differ)} of {len(close)}")
        for (task, variant, label, level), lr in differ.items():
            chosen = close[(task, variant, label, level)]["chosen_lr"]
            print(f"  {task} [{variant}] {label} @ {level}: {lr:g} alone, {chosen:g} by the mean")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_a", type=Path)
    ap.add_argument("run_b", type=Path, nargs="?")
    args = ap.parse_args()
    if args.run_b is None:
        within(load(args.run_a))
        return 0
    a, b = load(args.run_a), load(args.run_b)
    shared = sorted(set(a) & set(b))
    rules = {"first seed alone": one_seed_lr, "as chosen": lambda s: s.get("chosen_lr")}
    for name, rule in rules.items():
        pairs = {key: (rule(a[key]), rule(b[key])) for key in shared}
        decided = {key: p for key, p in pairs.items() if None not in p}
        agree = sum(x == y for x, y in decided.values())
        print(f"{name}: {agree} of {len(decided)} choices agree"
              + (f" ({len(pairs) - len(decided)} not chosen in both)" if len(decided) < len(pairs) else ""))
        for (task, variant, label, level), (x, y) in decided.items():
            if x != y:
                print(f"  {task} [{variant}] {label} @ {level}: {x:g} against {y:g}")
    close = [key for key in shared if a[key].get("second_seed_lrs") or b[key].get("second_seed_lrs")]
    print(f"second seed trained in {len(close)} of {len(shared)} shared searches (in either run); "
          f"{len(set(a) ^ set(b))} searches in only one run")
    return 0


if __name__ == "__main__":
    sys.exit(main())
