"""The `tmem-bench` command."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import UsageError

DEVICES = ("auto", "cpu", "cuda")


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
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="train and evaluate every cell of a task (or 'all') under a profile")
    run.add_argument("task", help="a task name (see `tmem-bench list`) or 'all'")
    run.add_argument("--profile", default="quick", help="profile name or path to a TOML file (default: quick)")
    run.add_argument("--models", help="comma-separated model names or module:attribute, replacing the profile's")
    run.add_argument("--level", action="append", default=[], metavar="AXIS=V1,V2",
                     help="levels of a sweep axis (repeatable); a model is then trained at each of them")
    run.add_argument("--train-at", metavar="each|AXIS=V", help="train one model per level ('each') or at one level")
    run.add_argument("--seeds", help="number of seeds (3) or a list of seeds (0,1,2)")
    run.add_argument("--steps", type=positive, help="training steps per cell")
    run.add_argument("--batch-size", type=positive, help="training batch size")
    run.add_argument("--device", default="auto", choices=DEVICES, help="auto picks CUDA when available")
    run.add_argument("--out", help="run directory (default runs/TASK-PROFILE); rerunning resumes it")
    run.add_argument("--no-report", action="store_true", help="skip writing report.md and figures/ at the end")

    rep = sub.add_parser("report", help="write report.md and figures/ of a run from its stored cell results")
    rep.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (holds manifest.json and cells/)")

    lst = sub.add_parser("list", help="tasks with their sweep axes and levels, models, profiles")
    lst.add_argument("--params", action="store_true", help="also print each model's parameter count per task")
    return parser


def cmd_run(args) -> int:
    import torch
    from rich.console import Console

    from .plan import Overrides, make_plan
    from .report import summary_table
    from .runner import run_plan

    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is available here; allowed: auto, cpu")
    overrides = Overrides(
        models=args.models.split(",") if args.models else None,
        levels=parse_levels(args.level),
        train_at=parse_train_at(args.train_at),
        seeds=parse_seeds(args.seeds),
        steps=args.steps,
        batch_size=args.batch_size,
    )
    cells = make_plan(args.task, args.profile, overrides)
    profile_stem = Path(args.profile).stem
    run_dir = Path(args.out or f"runs/{args.task}-{profile_stem}")
    if run_dir.exists() and not run_dir.is_dir():
        raise UsageError(f"--out {str(run_dir)!r} exists and is not a directory")
    settings = {"task": args.task, "profile": args.profile, "overrides": vars(overrides), "device": args.device}
    results = run_plan(cells, run_dir, device=args.device, settings=settings)
    Console(width=None if sys.stdout.isatty() else 160).print(summary_table(results))
    print(f"results: {run_dir / 'results.csv'}")
    if not args.no_report:
        from .report import write_report

        print(f"report: {write_report(run_dir).path}")
    return 0


def cmd_report(args) -> int:
    from rich.console import Console

    from .report import summary_rich, write_report

    report = write_report(args.run_dir)
    Console(width=None if sys.stdout.isatty() else 160).print(summary_rich(report.data))
    if report.problems:
        print(f"tmem-bench: warning: {len(report.problems)} problem(s) with cell files (unreadable, incomplete or "
              f"missing), listed in {report.path}", file=sys.stderr)
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
    from .registry import backbone_names, get_task, task_names
    from .task import level_key

    console = Console(highlight=False, soft_wrap=True)
    profiles = {name: load_profile(name) for name in profile_names()}
    console.print("[bold]tasks[/bold] (sweep axis and levels per profile)")
    for name in task_names():
        task = get_task(name)
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
    if args.params:
        _print_params(console, profiles.get("quick", {}))
    console.print("[bold]profiles[/bold]")
    for pname, profile in profiles.items():
        console.print(f"  {pname}: {profile.get('description', '')}")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return {"run": cmd_run, "list": cmd_list, "report": cmd_report}[args.command](args)
    except UsageError as e:
        print(f"tmem-bench: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("tmem-bench: interrupted; rerun the same command to resume", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
