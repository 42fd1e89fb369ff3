"""`tmem-bench run`, `jobs` and `report`: train a plan's cells, follow a run's Slurm jobs, write a run's report."""
from __future__ import annotations

import sys
import traceback
from pathlib import Path

from ..errors import UsageError
from .args import check_device, parse_levels, parse_seeds, parse_train_at


def cmd_run(args) -> int:
    from ..harness.executors import from_args, usable
    from ..harness.profiles import check_names, entry_labels, load_profile

    if args.models is not None and not all(m.strip() for m in args.models.split(",")):
        raise UsageError(f"--models {args.models!r} names an empty model; give comma-separated names")
    if args.out is not None and not args.out.strip():
        raise UsageError("--out is empty; give a run directory")
    models = [m.strip() for m in args.models.split(",")] if args.models is not None else None
    levels, train_at = parse_levels(args.level), parse_train_at(args.train_at)
    seeds = parse_seeds(args.seeds, args.seed_list)
    # Every argument is parsed and checked before anything is planned.
    executor = usable(from_args(args))
    check_names(args.task, models, entry_labels(load_profile(args.profile)))
    from rich.console import Console

    from ..harness.plan import Overrides, plan_run
    from ..harness.plan_checks import check_sizes
    from ..harness.rundir import RunDir
    from ..harness.runner import run_plan
    from ..report import run_data, summary_rich

    check_device(args.device, args.tf32)
    overrides = Overrides(models=models, levels=levels, train_at=train_at, seeds=seeds, steps=args.steps,
                          batch_size=args.batch_size, selection_only=args.selection_only or None,
                          tf32=args.tf32 or None)
    plan = plan_run(args.task, args.profile, overrides)
    check_sizes(plan.cells, args.device)
    out = Path(args.out or f"runs/{args.task}-{Path(args.profile).stem}")
    if args.dry_run:
        from ..harness.dryrun import dry_run

        print(dry_run(plan.cells, plan.searches, out, executor, args.device,
                      what=f"{args.task} under profile {args.profile}", keep_weightless=args.keep_weightless), end="")
        return 0
    # run_plan checks --retries and the run directory before anything is written, and tells the cost
    # once they pass: a refusal comes first, in one line.
    settings = {"task": args.task, "profile": args.profile, "overrides": vars(overrides), "device": args.device}
    results = run_plan(plan, out, device=args.device, settings=settings, append=args.append,
                       executor=executor, retries=args.retries, keep_weightless=args.keep_weightless,
                       announce=lambda: tell_cost(plan, out, executor, args))
    run_dir = RunDir(out)
    Console(width=None if sys.stdout.isatty() else 160).print(summary_rich(run_data(results)))
    planned = {c.id for c in plan.cells} | {r["cell_id"] for r in results}
    failures = {cid: f for cid, f in run_dir.failures().items() if cid in planned}
    for cid, f in failures.items():
        print(f"FAILED {f.get('describe', cid)} after {f.get('attempts', '?')} attempt(s): {f.get('error')} "
              f"(traceback in {run_dir.failed_path(cid)})", file=sys.stderr)
    print(f"results: {run_dir.table_path}")
    if not args.no_report:
        from ..report import write_report

        print(f"report: {write_report(run_dir).path}")
    if failures:
        print(f"tmem-bench: {len(failures)} of {plan.n_cells()} cells failed; rerun the same command to try them again",
              file=sys.stderr)
        return 1
    return 0


def tell_cost(plan, out: Path, executor, args) -> None:
    """The plan and its estimate, before training: from the step timings stored for this machine,
    measuring those it lacks (once). A plug-in's code runs in its cells only (one may hang or end its
    process), so a plan with one is estimated by `--dry-run` alone; a measurement that fails leaves
    the run to train without an estimate."""
    from ..harness.dryrun import dry_run
    from ..registry import BUILTIN_MODELS, BUILTIN_TASKS, OPTIONAL_TASKS

    built_in = {*BUILTIN_TASKS, *(t for _, tasks in OPTIONAL_TASKS.values() for t in tasks), *BUILTIN_MODELS}
    plugins = sorted({name for c in plan.cells for name in (c.task, c.model) if name not in built_in})
    if plugins:
        print(f"no estimate before training: the plan runs plug-in code ({', '.join(plugins)}); "
              "--dry-run measures it")
        return
    try:
        print(dry_run(plan.cells, plan.searches, out, executor, args.device,
                      what=f"{args.task} under profile {args.profile}", dry=False,
                      keep_weightless=args.keep_weightless), end="", flush=True)
    except Exception as e:  # an estimate is advice: training goes on without it; --debug shows where
        if args.debug:
            traceback.print_exception(e)
        print(f"no estimate before training: measuring a step raised {type(e).__name__}: {e}", flush=True)


def cmd_jobs(args) -> int:
    import importlib.util

    from ..harness.executors.slurm import cancel_jobs, job_states, read_jobs_record
    from ..harness.rundir import RunDir

    run_dir = RunDir(args.run_dir)
    record = read_jobs_record(run_dir)
    driver = record["driver"]
    if record["executor"] != "slurm":
        where = f"process {driver['pid']} on {driver['host']} (since {driver.get('since')})"
        if not run_dir.in_use():
            print(f"{record['executor']} executor: no driver is running; the last one was {where}"
                  + ("; nothing to cancel" if args.cancel else ""))
            return 0
        if args.cancel:
            raise UsageError(f"--cancel: the cells of {str(run_dir)!r} run under their driver, {where}; "
                             "stop that process to cancel them")
        print(f"{record['executor']} executor: the cells run under their driver, {where}")
        return 0
    if record["cluster"] == "slurm" and importlib.util.find_spec("submitit") is None:
        raise UsageError(f"the jobs of {str(run_dir)!r} are Slurm jobs, which need submitit to list or cancel; "
                         'install it with: pip install "tmem-bench[slurm]"')
    rows = job_states(run_dir, record)
    for row in rows:
        print(f"{row['job']:>14}  {row['state']:<12}  cell {row['cell']} {run_dir.cell_state(row['cell'])}")
    print(f"{len(rows)} job(s) on {record['cluster']}, submitted by process {driver['pid']} "
          f"on {driver['host']}; logs in {run_dir.path / record['folder']}")
    if args.cancel:
        cancelled = cancel_jobs(run_dir, record, rows)
        print(f"cancelled {len(cancelled)} job(s) still queued or running; rerun the run's command to resume")
    return 0


def cmd_report(args) -> int:
    from rich.console import Console

    from ..report import summary_rich, write_report

    report = write_report(args.run_dir)
    Console(width=None if sys.stdout.isatty() else 160).print(summary_rich(report.data))
    if report.problems:
        print(f"tmem-bench: warning: {len(report.problems)} problem(s) with the run's files (manifest.json, cells/ "
              f"or failed/: unreadable, incomplete or missing), listed in {report.path}", file=sys.stderr)
    print(f"report: {report.path}")
    return 0
