"""The `tmem-bench probe` command: the state probe (`tmem_bench.diagnostics.state_probe`) over a finished
run, or with --calibrate over the reference states of known content (diagnostics/probe_references.py)."""
from __future__ import annotations

import sys
import time

from ..errors import UsageError, check_int
from .args import DEVICES, check_device, number


def add_probe_parser(sub, debug) -> None:
    probe = sub.add_parser("probe", parents=[debug],
                           help="train a readout on each memory's frozen final state (RUN_DIR/state_probe.json)")
    probe.add_argument("run_dir", metavar="RUN_DIR", nargs="?",
                       help="a finished run directory (cells/ with their weights); not with --calibrate")
    probe.add_argument("--calibrate", action="store_true",
                       help="train the probe on each reference state of known content and print its accuracy "
                            "per readout beside the state's best possible read")
    probe.add_argument("--level", metavar="AXIS=V,...", default="n_writes=10,noise=0.05",
                       help="with --calibrate: the coordinate_binding level (default n_writes=10,noise=0.05)")
    probe.add_argument("--references", metavar="NAMES", help="with --calibrate: comma-separated references "
                                                             "(default: every one)")
    probe.add_argument("--readouts", metavar="NAMES",
                       help="comma-separated members of the readout family to train (default: every one)")
    probe.add_argument("--weights", action="append", default=[], metavar="DIR",
                       help="a folder holding <cell id>.safetensors for cells whose weights are not in RUN_DIR/cells "
                            "(repeatable), e.g. leaderboard/entries/<slug>/cells")
    probe.add_argument("--models", metavar="LABELS", help="comma-separated labels to probe (default: every model)")
    probe.add_argument("--seed-list", metavar="S1,S2,...", help="the seeds to probe, e.g. 0,2 (default: every seed)")
    probe.add_argument("--tasks", metavar="TASKS", help="comma-separated tasks to probe (default: every task)")
    probe.add_argument("--train-level", action="append", metavar="AXIS=V,...",
                       help="probe only the cells trained at this level, as the report names it, e.g. "
                            "n_writes=20,noise=0.05 (repeatable; default: every level)")
    probe.add_argument("--calibrations", action="append", default=[], metavar="FILE",
                       help="another run's state_probe.json of the same readout settings whose reference "
                            "calibrations to take rather than train again (repeatable)")
    probe.add_argument("--steps", metavar="N",
                       help="readout training steps (default: the readout's own, which state_probe.json records)")
    probe.add_argument("--device", default="auto", choices=DEVICES,
                       help="where the frozen models run and the readouts train; auto picks CUDA when available "
                            "(each row of state_probe.json names the hardware that computed it)")


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


def _check_run(run_dir: str, seeds: list[int] | None) -> set[str]:
    """What would make the probe fail with a traceback or probe nothing, said in one line first: a
    state_probe.json that is not a file, and a --seed-list naming no seed of the run. Returns the
    cells the report leaves out (learning-rate trials at an lr not chosen), which the probe skips:
    no verdict or table reads their state."""
    from ..harness.rundir import RunDir
    from ..report.selection_recomputed import searches

    run = RunDir.existing(run_dir)
    out = run.state_probe_path
    if out.exists() and not out.is_file():
        raise UsageError(f"{out} is not a file; the probe writes its results there, so move it away first")
    results, _ = run.load_cells()
    _, left_out, _ = searches(run, results, run.manifest())
    if seeds is not None:
        known = sorted({r["cell"]["seed"] for r in results})
        missing = sorted(set(seeds) - set(known))
        if missing:
            raise UsageError(f"--seed-list: no cells of seed {', '.join(map(str, missing))} in {run_dir}; its seeds: "
                             f"{', '.join(map(str, known)) or 'none'}")
    return left_out


def cmd_probe(args) -> int:
    from dataclasses import replace

    from ..contracts.device import resolve_device
    from ..diagnostics.state_probe import ReadoutConfig

    device = resolve_device(check_device(args.device))
    config = ReadoutConfig()
    if args.steps is not None:
        config = replace(config, steps=check_int("--steps", args.steps))
    readouts = _list("--readouts", args.readouts)
    if readouts:
        config = replace(config, readouts=tuple(readouts))
    if args.calibrate:
        if args.run_dir is not None:
            raise UsageError("--calibrate probes the reference states, not a run; give no RUN_DIR with it")
        return _calibrate(args, config, device)
    if args.run_dir is None:
        raise UsageError("give a RUN_DIR to probe, or --calibrate")
    from ..harness.probe_run import probe_run, summary

    seeds = _list("--seed-list", args.seed_list, int)
    left_out = _check_run(args.run_dir, seeds)
    try:
        doc = probe_run(args.run_dir, weights=args.weights, labels=_list("--models", args.models),
                        seeds=seeds, config=config, say=lambda line: print(line, file=sys.stderr),
                        tasks=_list("--tasks", args.tasks), leave_out=left_out,
                        calibrations_from=args.calibrations, levels=args.train_level, device=device)
    except ValueError as e:  # a weights file that is truncated or does not fit its model: load_weights names it
        raise UsageError(f"{args.run_dir}: {e}; that cell cannot be probed (remove or replace its weights)") from None
    print(f"{'label':<16} {'level':<24} {'cells':>5} {'model':>7} {'probe':>7}  {'readout':<16} calibration")
    for label, level, n, own, probe, readout, note in summary(doc):
        own = "-" if own is None else f"{own:.3f}"
        probe = f"{probe:.3f}" if isinstance(probe, float) else probe
        print(f"{label:<16} {level:<24} {n:>5} {own:>7} {probe:>7}  {readout:<16} {note}")
    print(f"written: {args.run_dir}/state_probe.json")
    return 0


def _calibrate(args, config, device) -> int:
    from ..contracts.device import hardware
    from ..diagnostics.probe_references import BY_NAME, TASK, calibrate_reference
    from ..harness.probe_run import CALIBRATION_GOAL, family_read
    from ..registry import get_task

    names = _list("--references", args.references) or list(BY_NAME)
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise UsageError(f"--references: unknown {', '.join(unknown)}; known: {', '.join(BY_NAME)}")
    task = get_task(TASK, block_queries=True)
    level = {}
    for item in args.level.split(","):
        axis, sep, value = item.partition("=")
        if not sep or not axis or not value:
            raise UsageError(f"--level {args.level!r} is malformed; expected AXIS=V,AXIS=V "
                             "(for example n_writes=10,noise=0.05)")
        level[axis] = number(value, f"--level {axis}")
    level = task.validate_level(level)
    train_task = get_task(TASK, block_queries=True, n_queries=config.queries)
    columns = list(config.readouts)
    print(f"{TASK} @ {','.join(f'{k}={v}' for k, v in level.items())}, {config.steps} steps of "
          f"{config.batch_size} sequences per readout, readout seed {config.seed}, on {device} ({hardware(device)})")
    print(f"{'reference':<14} {'best':>6} {'kind':<9} " + " ".join(f"{c:>15}" for c in columns)
          + f"  {'best member':<15} {'of best':>7} {'time':>6}")
    for name in names:
        start = time.perf_counter()
        r = calibrate_reference(name, task, level, config, train_task, device)
        seconds = time.perf_counter() - start
        cells = [f"{r['readouts'][c]:.3f}" if c in r["readouts"] else "n/a" for c in columns]
        member, ratio = family_read(r["readouts"], columns, r["best"])  # as a probed cell's calibration reads it
        goal = "" if not r["complete"] else ("  goal met" if ratio >= CALIBRATION_GOAL else "  below goal")
        print(f"{name:<14} {r['best']:>6.3f} {r['best_kind']:<9} " + " ".join(f"{c:>15}" for c in cells)
              + f"  {member:<15} {ratio:>7.0%} {seconds:>5.0f}s{goal}", flush=True)
    return 0
