"""The `tmem-bench` command."""
from __future__ import annotations

import argparse
import sys
import traceback
from pathlib import Path

from .cli_leaderboard import add_leaderboard_parser, cmd_leaderboard
from .cli_probe import add_probe_parser, cmd_probe
from .errors import UsageError, storage_error

DEVICES = ("auto", "cpu", "cuda")
MAX_SEEDS = 1000  # seeds per cell from a count; a list may name any seeds


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        # One line, exit 2, no usage dump: the same shape as every other bad-input error.
        print(f"tmem-bench: error: {message}", file=sys.stderr)
        sys.exit(2)


def _number(text: str, what: str):
    try:
        value = float(text)
    except ValueError:
        raise UsageError(f"{what}: {text!r} is not a number") from None
    return int(value) if value.is_integer() and "." not in text and "e" not in text.lower() else value


def parse_levels(items: list[str]) -> dict[str, list]:
    levels = {}
    for item in items:
        axis, sep, values = item.partition("=")
        if not sep or not axis or not values:
            raise UsageError(f"--level {item!r} is malformed; expected AXIS=V1,V2,... (for example n_writes=5,10)")
        if axis in levels:
            raise UsageError(f"--level {axis} is given twice; give all its values once: --level {axis}=V1,V2,...")
        levels[axis] = [_number(v, f"--level {axis}") for v in values.split(",")]
    return levels


def parse_train_at(text: str | None):
    if text is None or text == "each":
        return text
    out = {}
    for item in text.split(","):
        axis, sep, value = item.partition("=")
        if not sep or not axis or not value:
            raise UsageError(f"--train-at {text!r} is malformed; expected 'each' or AXIS=V[,AXIS=V...]")
        out[axis] = _number(value, f"--train-at {axis}")
    return out


def parse_seeds(text: str | None):
    if text is None:
        return None
    parts = text.split(",")
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise UsageError(f"--seeds {text!r} is malformed; expected a count (3) or a list (0,1,2)") from None
    if len(values) == 1:
        if values[0] <= 0:
            raise UsageError(f"--seeds count must be positive, got {values[0]}")
        if values[0] > MAX_SEEDS:
            raise UsageError(f"--seeds count must be at most {MAX_SEEDS}, got {values[0]}")
        return list(range(values[0]))
    return values


def positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tmem-bench", description="Diagnostic toy tasks for memory in sequence models.")
    parser.add_argument("--debug", action="store_true", help="on an error, also print the full traceback")
    # Also accepted after the subcommand; SUPPRESS keeps a subcommand from resetting it to False.
    debug = argparse.ArgumentParser(add_help=False)
    debug.add_argument("--debug", action="store_true", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", parents=[debug],
                         help="train and evaluate every cell of a task (or 'all') under a profile")
    run.add_argument("task", help="a task name (see `tmem-bench list`) or 'all'")
    run.add_argument("--profile", default="quick", help="profile name or path to a TOML file (default: quick)")
    run.add_argument("--models", help="comma-separated model names or module:attribute, replacing the profile's")
    run.add_argument("--level", action="append", default=[], metavar="AXIS=V1,V2",
                     help="levels of a sweep axis (repeatable); a model is then trained at each of them")
    run.add_argument("--train-at", metavar="each|AXIS=V", help="train one model per level ('each') or at one level")
    run.add_argument("--seeds", help="number of seeds (3) or a list of seeds (0,1,2)")
    run.add_argument("--steps", type=positive, help="training steps per cell")
    run.add_argument("--batch-size", type=positive, help="training batch size")
    run.add_argument("--selection-only", action="store_true",
                     help="train only the learning-rate trials and second selection seeds, write selection.json, stop")
    run.add_argument("--device", default="auto", choices=DEVICES, help="auto picks CUDA when available")
    run.add_argument("--out", help="run directory (default runs/TASK-PROFILE); rerunning resumes it")
    run.add_argument("--no-report", action="store_true", help="skip writing report.md and figures/ at the end")
    run.add_argument("--append", action="store_true",
                     help="add this plan's cells to a run directory that holds a different plan")
    run.add_argument("--dry-run", action="store_true",
                     help="print the plan and an estimate of its wall time on this machine and executor, from a "
                          "few measured training steps per shape; nothing is trained or written")
    run.add_argument("--executor", default="serial", metavar="serial|local|ray|slurm",
                     help="where the cells run: serial (in this process, the default), local (a process pool), "
                          "ray (one Ray task per cell), slurm (a job array through submitit)")
    run.add_argument("--workers", type=positive, metavar="N",
                     help="local: worker processes (default one per GPU, else one per core); "
                          "slurm: array tasks at once")
    run.add_argument("--address", metavar="ADDR",
                     help="ray: the address of a running Ray cluster (default: start a local Ray)")
    run.add_argument("--cpus-per-cell", type=positive, metavar="N",
                     help="CPU cores (torch threads) each cell gets; the same count gives the same CPU numbers "
                          "under every executor (default: this process's threads, or the cores split among workers)")
    run.add_argument("--gpus-per-cell", type=float, metavar="N",
                     help="GPUs each cell gets (ray: may be a fraction; slurm: whole)")
    run.add_argument("--retries", type=int, default=1, metavar="N",
                     help="tries after a cell's first failure before it is recorded in failed/ (default 1)")
    run.add_argument("--slurm-partition", metavar="NAME", help="slurm: the partition the jobs are submitted to")
    run.add_argument("--slurm-time", default="240", metavar="TIME",
                     help="slurm: time limit per cell, MINUTES, H:MM:SS or D-HH:MM:SS (default 240 minutes)")
    run.add_argument("--slurm-option", action="append", default=[], metavar="KEY=VALUE",
                     help="slurm: an extra sbatch option (repeatable), e.g. account=proj, qos=high, constraint=a100")
    run.add_argument("--slurm-cluster", default="slurm", metavar="slurm|local",
                     help="slurm: 'local' runs the jobs as processes on this machine through submitit, to try a setup")

    jobs = sub.add_parser("jobs", parents=[debug], help="the jobs running a run's cells; --cancel stops them")
    jobs.add_argument("run_dir", metavar="RUN_DIR", help="a run directory started with --executor slurm (or any)")
    jobs.add_argument("--cancel", action="store_true", help="cancel the run's jobs still queued or running")

    rep = sub.add_parser("report", parents=[debug],
                         help="write report.md and figures/ of a run from its stored cell results")
    rep.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (holds manifest.json and cells/)")

    lst = sub.add_parser("list", help="tasks with their sweep axes and levels, models, profiles")
    lst.add_argument("--params", action="store_true", help="also print each model's parameter count per task")

    chk = sub.add_parser("check", parents=[debug],
                         help="conformance checks a backbone (or with --task, a task) must pass "
                              "(exit 0: all pass, 1: one fails)")
    chk.add_argument("model", metavar="MODEL", nargs="?", help="a registered model name or module:attribute")
    chk.add_argument("--task", metavar="TASK",
                     help="check this task (a registered name or module:attribute) instead of a model")
    chk.add_argument("--d-model", type=positive, default=16, help="model width the checks build (default 16)")
    chk.add_argument("--n-layers", type=positive, default=2, help="layers (default 2)")
    chk.add_argument("--n-heads", type=positive, default=2, help="heads (default 2)")
    chk.add_argument("--seq-len", type=positive, default=16, help="sequence length fed to the model (default 16)")
    chk.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                     help="an option passed to the model's factory (repeatable), e.g. --option kernel=eager; "
                          "with --task, to every variant of the task, e.g. --option n_frames=4")

    add_leaderboard_parser(sub, debug, _Parser)
    add_probe_parser(sub, debug)
    return parser


def cmd_run(args) -> int:
    import torch
    from rich.console import Console

    from .executors import ExecutorOptions, sbatch_options, usable
    from .plan import Overrides, check_sizes, plan_run
    from .report import summary_table
    from .rundir import RunDir
    from .runner import run_plan

    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available here; allowed: auto, cpu")
    if args.models is not None and not all(m.strip() for m in args.models.split(",")):
        raise UsageError(f"--models {args.models!r} names an empty model; give comma-separated names")
    if args.out is not None and not args.out.strip():
        raise UsageError("--out is empty; give a run directory")
    overrides = Overrides(
        models=[m.strip() for m in args.models.split(",")] if args.models is not None else None,
        levels=parse_levels(args.level),
        train_at=parse_train_at(args.train_at),
        seeds=parse_seeds(args.seeds),
        steps=args.steps,
        batch_size=args.batch_size,
        selection_only=args.selection_only or None,
    )
    plan = plan_run(args.task, args.profile, overrides)
    check_sizes(plan.cells, args.device)
    executor = ExecutorOptions(
        kind=args.executor, workers=args.workers, address=args.address, cpus_per_cell=args.cpus_per_cell,
        gpus_per_cell=args.gpus_per_cell, slurm_partition=args.slurm_partition, slurm_time=args.slurm_time,
        slurm_options=sbatch_options(args.slurm_option),
        slurm_cluster=args.slurm_cluster)
    out = Path(args.out or f"runs/{args.task}-{Path(args.profile).stem}")
    if args.dry_run:
        from .dryrun import dry_run

        print(dry_run(plan.cells, plan.searches, out, usable(executor), args.device,
                      what=f"{args.task} under profile {args.profile}"), end="")
        return 0
    # run_plan checks the executor, --retries and the run directory, before anything is written.
    settings = {"task": args.task, "profile": args.profile, "overrides": vars(overrides), "device": args.device}
    results = run_plan(plan, out, device=args.device, settings=settings, append=args.append,
                       executor=executor, retries=args.retries)
    run_dir = RunDir(out)
    Console(width=None if sys.stdout.isatty() else 160).print(summary_table(results))
    planned = {c.id for c in plan.cells} | {r["cell_id"] for r in results}
    failures = {cid: f for cid, f in run_dir.failures().items() if cid in planned}
    for cid, f in failures.items():
        print(f"FAILED {f.get('describe', cid)} after {f.get('attempts', '?')} attempt(s): {f.get('error')} "
              f"(traceback in {run_dir.failed_path(cid)})", file=sys.stderr)
    print(f"results: {run_dir.table_path}")
    if not args.no_report:
        from .report import write_report

        print(f"report: {write_report(run_dir).path}")
    if failures:
        print(f"tmem-bench: {len(failures)} of {plan.n_cells()} cells failed; rerun the same command to try them again",
              file=sys.stderr)
        return 1
    return 0


def cmd_jobs(args) -> int:
    import importlib.util

    from .executors import cancel_jobs, job_states, read_jobs_record
    from .rundir import RunDir

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

    from .report import summary_rich, write_report

    report = write_report(args.run_dir)
    Console(width=None if sys.stdout.isatty() else 160).print(summary_rich(report.data))
    if report.problems:
        print(f"tmem-bench: warning: {len(report.problems)} problem(s) with the run's files (manifest.json, cells/ "
              f"or failed/: unreadable, incomplete or missing), listed in {report.path}", file=sys.stderr)
    print(f"report: {report.path}")
    return 0


def _print_params(console, profile: dict) -> None:
    """Parameters (backbone + task adapter) of every model at each task's quick-profile size."""
    from .registry import backbone_names, get_backbone, get_task, task_names

    console.print("[bold]parameters[/bold] (backbone + task adapter, at each task's quick-profile model size)")
    for name in task_names():
        section = profile.get("tasks", {}).get(name)
        if section is None:
            console.print(f"  {name}: not in the quick profile")
            continue
        size = dict(section.get("model", {}))
        adapter = sum(p.numel() for p in get_task(name).make_adapter(size["d_model"]).parameters())
        console.print(f"  [bold]{name}[/bold]  " + ", ".join(f"{k} {v}" for k, v in size.items()))
        counts = {}
        for model in backbone_names():
            try:
                counts[model] = adapter + sum(p.numel() for p in get_backbone(model, **size).parameters())
            except (TypeError, ValueError) as e:
                counts[model] = f"cannot build: {e}"
        reference = counts.get("tensor")
        for model, count in counts.items():
            if isinstance(count, str):
                console.print(f"    {model:<14}{count}")
                continue
            versus = f"  ({count / reference - 1:+.1%} vs tensor)" if isinstance(reference, int) else ""
            console.print(f"    {model:<14}{count:>12,}{versus}")


def cmd_list(args) -> int:
    from rich.console import Console

    from rich.markup import escape

    from .plan import Overrides, load_profile, plan_task, profile_names
    from .registry import BACKBONES, backbone_names, get_task, task_names
    from .task import level_key

    console = Console(highlight=False, soft_wrap=True)
    profiles = {name: load_profile(name) for name in profile_names()}
    console.print("[bold]tasks[/bold] (sweep axis and levels per profile)")
    for name in task_names():
        try:
            task = get_task(name)
        except (TypeError, UsageError) as e:  # a broken plug-in is named; every other task is still listed
            console.print(escape(f"  {name}  broken: {e}"))
            continue
        console.print(f"  [bold]{name}[/bold]  axes: {', '.join(task.axes) or 'none'}  classes: {task.n_classes}")
        for pname, profile in profiles.items():
            if name not in profile.get("tasks", {}):
                continue
            by_variant: dict[str, list] = {}
            for cell in plan_task(name, profile, Overrides()):
                by_variant.setdefault(cell.variant, []).append(cell)
            for variant, cells in by_variant.items():
                axes = {a: sorted({lv[a] for lv in cells[0].eval_levels}) for a in task.axes}
                grid = " x ".join(f"{a} {','.join(map(str, v))}" for a, v in axes.items()) or "no axis"
                trained = sorted({level_key(c.train_level) for c in cells})
                if not task.axes:
                    where = ""
                elif len(trained) == len(cells[0].eval_levels) > 1:
                    where = "; trained at each level"
                else:
                    where = f"; trained at {' | '.join(trained)}"
                models = ", ".join(dict.fromkeys(c.label for c in cells))
                console.print(escape(f"    {pname} [{variant}]: {grid}{where}; models {models}"))
    console.print("[bold]models[/bold]: " + ", ".join(backbone_names()))
    for name in BACKBONES.plugin_names():
        try:
            BACKBONES.get(name)
        except UsageError as e:
            console.print(escape(f"  {name}  broken: {e}"))
    if args.params:
        _print_params(console, profiles.get("quick", {}))
    console.print("[bold]profiles[/bold]")
    for pname, profile in profiles.items():
        console.print(f"  {pname}: {profile.get('description', '')}")
    return 0


def parse_options(items: list[str]) -> dict:
    """--option KEY=VALUE items -> factory options; numbers and true/false are typed, anything else is a string."""
    options = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise UsageError(f"--option {item!r} is malformed; expected KEY=VALUE (for example kernel=eager)")
        if value.lower() in ("true", "false"):
            options[key] = value.lower() == "true"
        else:
            try:
                options[key] = _number(value, f"--option {key}")
            except UsageError:
                options[key] = value
    return options


def _print_checks(what: str, results) -> int:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=f"conformance of {what}")
    for column in ("check", "result", "detail"):
        table.add_column(column)
    for r in results:
        table.add_row(r.name, "[green]pass[/green]" if r.passed else "[red]FAIL[/red]", escape(r.detail))
    Console(width=None if sys.stdout.isatty() else 160, highlight=False).print(table)
    failed = [r.name for r in results if not r.passed]
    print(f"{what}: {len(results) - len(failed)} of {len(results)} checks pass"
          + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


def cmd_check_task(args) -> int:
    from .conformance_tasks import TaskSpec, run_task_checks
    from .registry import TASKS

    factory = TASKS.get(args.task)  # an unknown name fails here with the list of known ones
    spec = TaskSpec(options=parse_options(args.option), name=args.task)
    try:
        factory(**spec.options)
    except (TypeError, UsageError) as e:  # an option the task refuses: bad input, not a failed check
        raise UsageError(f"task {args.task!r}: {e}") from None
    except Exception:  # noqa: BLE001 - the task's own failure: the `declarations` check reports it
        pass
    return _print_checks(f"task {args.task}", run_task_checks(factory, spec))


def cmd_check(args) -> int:
    from .conformance import Spec, run_checks
    from .registry import BACKBONES

    if (args.model is None) == (args.task is None):
        raise UsageError("check takes a MODEL or --task TASK (one of them)")
    if args.task is not None:
        return cmd_check_task(args)
    try:
        factory = BACKBONES.get(args.model)  # an unknown name fails here with the list of known ones
    except (ImportError, AttributeError) as e:
        raise UsageError(f"cannot load model {args.model!r}: {e}") from None
    spec = Spec(d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads, seq_len=args.seq_len,
                options=parse_options(args.option))
    try:
        factory(d_model=spec.d_model, n_layers=spec.n_layers, n_heads=spec.n_heads, **spec.options)
    except (TypeError, ValueError) as e:  # an option or size the factory refuses: bad input, not a failed check
        raise UsageError(f"model {args.model!r}: {e}") from None
    except Exception:  # noqa: BLE001 - the model's own failure: the `builds` check reports it
        pass
    return _print_checks(args.model, run_checks(factory, spec))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        commands = {"run": cmd_run, "list": cmd_list, "report": cmd_report, "check": cmd_check,
                    "leaderboard": cmd_leaderboard, "jobs": cmd_jobs, "probe": cmd_probe}
        return commands[args.command](args)
    except UsageError as e:
        if args.debug:
            traceback.print_exception(e)
        print(f"tmem-bench: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        message = storage_error(e)
        if message is None:
            raise
        if args.debug:
            traceback.print_exception(e)
        print(f"tmem-bench: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tmem-bench: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
