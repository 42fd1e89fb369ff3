"""The `tmem-bench probe` command: the state probe (`tmem_bench.diagnostics.state_probe`) over a finished run."""
from __future__ import annotations

import sys

from ..errors import UsageError, check_int


def add_probe_parser(sub, debug) -> None:
    probe = sub.add_parser("probe", parents=[debug],
                           help="train a readout on each memory's frozen final state (RUN_DIR/state_probe.json)")
    probe.add_argument("run_dir", metavar="RUN_DIR", help="a finished run directory (cells/ with their weights)")
    probe.add_argument("--weights", action="append", default=[], metavar="DIR",
                       help="a folder holding <cell id>.safetensors for cells whose weights are not in RUN_DIR/cells "
                            "(repeatable), e.g. leaderboard/entries/<slug>/cells")
    probe.add_argument("--models", metavar="LABELS", help="comma-separated labels to probe (default: every model)")
    probe.add_argument("--seed-list", metavar="S1,S2,...", help="the seeds to probe, e.g. 0,2 (default: every seed)")
    probe.add_argument("--steps", metavar="N",
                       help="readout training steps (default: the readout's own, which state_probe.json records)")


def _list(flag: str, text: str | None, cast=str):
    if text is None:
        return None
    items = [item.strip() for item in text.split(",")]
    if not all(items):
        raise UsageError(f"{flag} {text!r} has an empty item; expected a comma-separated list")
    try:
        return [cast(item) for item in items]
    except ValueError:
        raise UsageError(f"{flag} {text!r} is malformed; expected integers such as 0,1,2") from None


def _check_run(run_dir: str, seeds: list[int] | None) -> None:
    """What would make the probe fail with a traceback or probe nothing, said in one line first: a
    state_probe.json that is not a file, and a --seed-list naming no seed of the run."""
    from ..harness.rundir import RunDir

    run = RunDir.existing(run_dir)
    out = run.state_probe_path
    if out.exists() and not out.is_file():
        raise UsageError(f"{out} is not a file; the probe writes its results there, so move it away first")
    if seeds is not None:
        results, _ = run.load_cells()
        known = sorted({r["cell"]["seed"] for r in results})
        missing = sorted(set(seeds) - set(known))
        if missing:
            raise UsageError(f"--seed-list: no cells of seed {', '.join(map(str, missing))} in {run_dir}; its seeds: "
                             f"{', '.join(map(str, known)) or 'none'}")


def cmd_probe(args) -> int:
    from dataclasses import replace

    from ..diagnostics.state_probe import ReadoutConfig
    from ..harness.probe_run import probe_run, summary

    config = ReadoutConfig()
    if args.steps is not None:
        config = replace(config, steps=check_int("--steps", args.steps))
    seeds = _list("--seed-list", args.seed_list, int)
    _check_run(args.run_dir, seeds)
    try:
        doc = probe_run(args.run_dir, weights=args.weights, labels=_list("--models", args.models),
                        seeds=seeds, config=config, say=lambda line: print(line, file=sys.stderr))
    except ValueError as e:  # a weights file that is truncated or does not fit its model: load_weights names it
        raise UsageError(f"{args.run_dir}: {e}; that cell cannot be probed (remove or replace its weights)") from None
    print(f"{'label':<16} {'level':<24} {'cells':>5} {'model':>7} {'probe':>7}")
    for label, level, n, own, probe in summary(doc):
        own = "-" if own is None else f"{own:.3f}"
        probe = f"{probe:.3f}" if isinstance(probe, float) else probe
        print(f"{label:<16} {level:<24} {n:>5} {own:>7} {probe:>7}")
    print(f"written: {args.run_dir}/state_probe.json")
    return 0
