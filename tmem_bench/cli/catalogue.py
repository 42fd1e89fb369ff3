"""`tmem-bench list` and `check`: what is registered, and whether a model or task meets the suite's contracts."""
from __future__ import annotations

import sys

from ..errors import UsageError
from .args import parse_options


def _print_params(console, profile: dict) -> None:
    """Parameters (backbone + task adapter) of every model at each task's quick-profile size."""
    from ..registry import backbone_names, get_backbone, get_task, task_names

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

    from ..contracts.task import level_key
    from ..harness.plan import Overrides, plan_task
    from ..harness.profiles import load_profile, profile_names
    from ..registry import BACKBONES, TASKS, backbone_names, get_task, task_names

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
    for extra, names in TASKS.missing_extras.items():
        console.print(escape(f"  ({len(names)} {extra} tasks need the {extra} extra: pip install -e \".[{extra}]\")"))
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
    from ..diagnostics.conformance_tasks import TaskSpec, run_task_checks
    from ..registry import TASKS

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
    from ..diagnostics.conformance import Spec, run_checks
    from ..harness.plan import profile_state_lengths
    from ..registry import BACKBONES

    if (args.model is None) == (args.task is None):
        raise UsageError("check takes a MODEL or --task TASK (one of them)")
    if args.task is not None:
        return cmd_check_task(args)
    try:
        factory = BACKBONES.get(args.model)  # an unknown name fails here with the list of known ones
    except (ImportError, AttributeError) as e:
        raise UsageError(f"cannot load model {args.model!r}: {e}") from None
    spec = Spec(d_model=args.d_model, n_layers=args.n_layers, n_heads=args.n_heads, seq_len=args.seq_len,
                options=parse_options(args.option), state_lengths=profile_state_lengths())
    try:
        factory(d_model=spec.d_model, n_layers=spec.n_layers, n_heads=spec.n_heads, **spec.options)
    except (TypeError, ValueError) as e:  # an option or size the factory refuses: bad input, not a failed check
        raise UsageError(f"model {args.model!r}: {e}") from None
    except Exception:  # noqa: BLE001 - the model's own failure: the `builds` check reports it
        pass
    return _print_checks(args.model, run_checks(factory, spec))
